"""Readings in (one stream's, or a gateway's many) and what the service answers, and a stored
range's recomputed history."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    model_validator,
)

from app.schemas.alarms import AlarmOut
from app.schemas.common import EARLIEST_READING_S, LATEST_EPOCH_S, Number, StreamId, StrictBody

# --- readings ----------------------------------------------------------------------------------


def _reading_time(value: Any) -> Any:
    """Refuse what pydantic would guess at: a number too large to be seconds (it would read it
    as milliseconds), true/false, a number in a string."""
    if isinstance(value, bool):
        raise ValueError("a time is an RFC 3339 string or seconds since the Unix epoch")
    if isinstance(value, int | float) and not 0 <= value < LATEST_EPOCH_S:
        raise ValueError(
            f"a time given as a number is seconds since the Unix epoch, from 0 to "
            f"{LATEST_EPOCH_S:.0e} (the year 2603); {value!r} is not (milliseconds? divide "
            "by 1,000)"
        )
    if isinstance(value, str) and _NUMERIC.fullmatch(value.strip()):
        raise ValueError(
            "a time given as a string is RFC 3339 with its offset; seconds since the epoch "
            "are a JSON number"
        )
    return value


def query_time(value: Any) -> Any:
    """A time in a query string: RFC 3339 with its offset, or seconds since the epoch (never
    milliseconds: a number too large to be seconds is refused, as in a reading)."""
    if isinstance(value, str) and _NUMERIC.fullmatch(value.strip()):
        return _reading_time(float(value))
    return value


QueryTime = Annotated[
    AwareDatetime,
    BeforeValidator(query_time),
    WithJsonSchema({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "number"}]}),
]


_NUMERIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")

ReadingTime = Annotated[
    AwareDatetime,
    BeforeValidator(_reading_time),
    # What pydantic accepts, not only the string it would generate a schema for.
    WithJsonSchema({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "number"}]}),
]


def _not_before_1990(moment: datetime) -> datetime:
    if moment.timestamp() < EARLIEST_READING_S:
        raise ValueError(
            f"a reading's time is 1990 or later; {moment.isoformat()} looks like time since a "
            "recording started: add the recording's start (seconds since the Unix epoch)"
        )
    return moment


SensorTime = Annotated[ReadingTime, AfterValidator(_not_before_1990)]


class ReadingIn(StrictBody):
    """One reading. `t`: RFC 3339 with a time zone, or seconds since the Unix epoch."""

    t: SensorTime = Field(
        description="When the sensor read the value: an RFC 3339 time with its offset, or "
        "seconds since the Unix epoch (UTC); 1990 or later.",
        examples=["2026-01-01T00:00:00.1Z", 1767225600.1],
    )
    value: Number | None = Field(
        None, description="The reading of a single-channel stream; null when it is missing."
    )
    values: dict[str, Number | None] | None = Field(
        None, description="A multi-channel stream's readings by channel name (null: missing)."
    )
    reference: Number | None = Field(
        None,
        description="A reference that does not move with the sensor (a redundant sensor or "
        "the twin's physics prediction), for streams with has_reference.",
    )

    @model_validator(mode="after")
    def _one_way_of_giving_values(self) -> ReadingIn:
        if self.value is not None and self.values is not None:
            raise ValueError("give either 'value' (one channel) or 'values' (by channel), not both")
        return self


class ReadingsIn(StrictBody):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "readings": [
                        {"t": "2026-01-01T00:00:00Z", "value": 1.02, "reference": 1.0},
                        {"t": "2026-01-01T00:00:00.1Z", "value": None, "reference": 1.03},
                    ]
                },
                {"readings": [{"t": 1767225600.2, "value": 1.07}]},
            ]
        }
    )

    readings: list[ReadingIn] = Field(description="In increasing time order.")


class StreamReadingsIn(StrictBody):
    stream: StreamId = Field(description="The stream these readings belong to.")
    readings: list[ReadingIn] = Field(description="In increasing time order.")


class ManyReadingsIn(StrictBody):
    """Readings of many streams in one request (a gateway's tick): one transaction."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "streams": [
                        {"stream": "pump-1", "readings": [{"t": 1767225600.2, "value": 1.07}]},
                        {"stream": "pump-2", "readings": [{"t": 1767225600.2, "value": 0.98}]},
                    ]
                }
            ]
        }
    )

    streams: list[StreamReadingsIn] = Field(description="Each stream at most once.")


class ReadingResult(BaseModel):
    t: datetime
    forecast: float | None = Field(description="Null while the stream warms up.")
    residual: float | None = Field(description="Reading minus forecast.")
    imputed: bool = Field(False, description="The reading was null; its forecast stands in.")
    statistics: dict[str, float | None]


class ReadingsOut(BaseModel):
    accepted: int = Field(description="New readings processed and committed.")
    duplicates: int = Field(description="Re-sent readings already accepted (not re-processed).")
    results: list[ReadingResult] = Field(
        description="One per accepted reading, in order (none when asked with results=false)."
    )
    opened: list[AlarmOut]
    closed: list[AlarmOut]


class StreamReadingsOut(ReadingsOut):
    stream: str


class ManyReadingsOut(BaseModel):
    streams: list[StreamReadingsOut] = Field(description="In the order of the request.")


Column = list[float | None]


class Spread(BaseModel):
    """Per time bucket: the least, greatest and mean of a column (null: no number there)."""

    min: Column
    max: Column
    mean: Column


class ReadingsHistory(BaseModel):
    """Stored readings with what the stream's model and detectors make of them, as columns (a
    chart's series). Raw: one entry per reading. With `step_s`: one per time bucket that holds
    readings, each column's least, greatest and mean in it."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "stream": "pump-1",
                    "model": "lstm-seed0",
                    "model_version": "2",
                    "step_s": None,
                    "t": [1767225600.0, 1767225600.1],
                    "value": [1.02, 1.05],
                    "forecast": [1.01, 1.03],
                    "residual": [0.01, 0.02],
                    "statistics": {"point": [0.01, 0.02]},
                    "thresholds": {"point": 0.525},
                    "count": None,
                    "buckets": None,
                }
            ]
        }
    )

    stream: str
    model: str
    model_version: str = Field(description="The version whose forecasts these are.")
    step_s: float | None = Field(None, description="The buckets' width; null: every reading.")
    t: list[float] = Field(description="Epoch seconds: each reading's, or each bucket's start.")
    value: Column | None = Field(None, description="The readings (the first channel); raw only.")
    forecast: Column | None = Field(None, description="Raw only; null while warming up.")
    residual: Column | None = Field(None, description="Raw only.")
    statistics: dict[str, Column] | None = Field(None, description="Each detector's; raw only.")
    thresholds: dict[str, float] = Field(description="Each detector's, as the stream runs now.")
    count: list[int] | None = Field(None, description="Readings in each bucket; bucketed only.")
    buckets: dict[str, Spread] | None = Field(
        None, description="value, forecast, residual and each detector's statistic; bucketed only."
    )


class ForecastOut(BaseModel):
    stream: str
    model: str
    after_t: datetime | None = Field(description="Time of the last reading the forecast uses.")
    sample_period_s: float
    horizon: int
    forecast: list[float] = Field(description="Forecasts of the next `horizon` readings.")
