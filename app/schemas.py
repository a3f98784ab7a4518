"""Request and response bodies of API v1 (pydantic v2). Datetimes are RFC 3339 UTC."""

from __future__ import annotations

import re
from datetime import datetime
from http import HTTPStatus
from typing import Annotated, Any, Literal, Self

from fastapi.openapi.constants import REF_TEMPLATE
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from app.learning.learn import DEFAULT_LEARNING_READINGS
from app.monitoring.alarms import AlarmPolicy
from app.monitoring.detectors import DETECTORS
from app.registry import MODEL_NAME_PATTERN, NAME_PATTERN, RegisteredModel
from app.storage.models import Alarm, Incident, Job, ModelVersion, Stream

STREAM_ID_PATTERN = NAME_PATTERN
"""Stream ids are path segments and metric labels: short, and no characters that need escaping."""

CHANNEL_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
RESERVED_CHANNELS = frozenset({"t", "reference"})
MAX_CHANNELS = 128

StreamId = Annotated[str, StringConstraints(pattern=STREAM_ID_PATTERN)]
ModelName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
"""Every number a body gives (a reading, a threshold, a period): a finite JSON number, never a
string or true/false coerced into one."""
Count = Annotated[int, Field(strict=True)]
"""Every count a body gives: a JSON integer, never a string, a boolean or 2.0."""
Flag = Annotated[bool, Field(strict=True)]
"""Every yes-or-no a body gives: true or false, never "yes", "1" or 1."""
PositiveSeconds = Annotated[Number, Field(gt=0)]
SHORTEST_PERIOD_S, LONGEST_PERIOD_S = 0.001, 86_400.0
SamplePeriod = Annotated[Number, Field(ge=SHORTEST_PERIOD_S, le=LONGEST_PERIOD_S)]
HIGHEST_THRESHOLD = 1e9
"""A threshold no statistic reaches in practice (a billion times a learned threshold, or a
billion units of a residual): a higher one is a detector switched off in disguise; say
`"enabled": false` instead."""
LATEST_EPOCH_S = 2e10
"""The latest time a number may give (seconds since the epoch: the year 2603). Larger numbers
look like milliseconds, which are refused rather than guessed."""
EARLIEST_READING_S = 631_152_000.0
"""The earliest time a reading may carry (1990-01-01 UTC). Earlier ones are nearly always
seconds since a recording started rather than since 1970 (t = 0, 0.1, ...), refused rather than
stored as readings of 1970."""


def _known_channel(name: str) -> str:
    if name in RESERVED_CHANNELS:
        raise ValueError(f"{name!r} is reserved (readings carry 't' and 'reference' themselves)")
    return name


ChannelName = Annotated[
    str, StringConstraints(pattern=CHANNEL_PATTERN), AfterValidator(_known_channel)
]


def _known_detector(name: str) -> str:
    if name not in DETECTORS:
        raise ValueError(f"unknown detector {name!r}; known: {', '.join(sorted(DETECTORS))}")
    return name


DetectorName = Annotated[
    str,
    AfterValidator(_known_detector),
    WithJsonSchema({"type": "string", "enum": sorted(DETECTORS)}),
]


def _unique(names: list[str]) -> list[str]:
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"duplicate channel(s): {', '.join(duplicates)}")
    return names


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- problems (documentation of the error bodies) --------------------------------------------


class FieldProblem(BaseModel):
    field: str = Field(description="Dotted path of the offending field, e.g. body.channels.0")
    message: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details: every error the API returns has this shape."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldProblem] | None = Field(
        None, description="Validation errors only: every offending field."
    )


PROBLEM_MEDIA_TYPE = "application/problem+json"

_PROBLEM_DESCRIPTIONS = {
    400: "Malformed JSON: the body does not parse",
    401: "The bearer token is missing or wrong",
    413: "The body (or the number of readings in it) is over the limit",
    422: "Invalid request or data; a validation error lists every offending field in `errors`",
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting problem answers.

    The schema is referenced rather than given as `model`: FastAPI would file a model under the
    route's own media type (application/json). `app.api.openapi.document_schemas` registers it.
    """
    content = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": REF_TEMPLATE.format(model="Problem")}}}
    return {
        status: {
            "description": _PROBLEM_DESCRIPTIONS.get(status, HTTPStatus(status).phrase),
            "content": content,
        }
        for status in statuses
    }


# --- streams -----------------------------------------------------------------------------------


class DetectorOverride(_Body):
    """Per-stream changes to a detector's calibrated configuration."""

    enabled: Flag = True
    threshold: Number | None = Field(
        None,
        gt=0,
        le=HIGHEST_THRESHOLD,
        description="Replaces the calibrated threshold (positive: every statistic is a size; "
        "at most 1e9; for `missing`, below 1: its statistic is 1 for a missing reading). A "
        "learning "
        "stream's statistics are multiples of its learned thresholds: 1.5 alarms at one and a "
        "half times them.",
    )
    policy: AlarmPolicy | None = Field(None, description="k-of-n to open, m quiet to close.")


class RelearnConfig(_Body):
    """When a learned stream learns again on its stored history, and how long the candidate
    shadows it before it is promoted or discarded."""

    after_s: list[PositiveSeconds] = Field(
        default_factory=lambda: [86_400.0, 604_800.0],
        max_length=20,
        description="Learn again once the stream's readings span each of these many seconds "
        "(by default a day and a week).",
    )
    every_s: PositiveSeconds | None = Field(
        604_800.0, description="Then again every this many seconds (a week; null: no more)."
    )
    proving_s: PositiveSeconds = Field(
        86_400.0,
        description="Seconds of readings the candidate runs beside the stream's model before "
        "it takes over, only if its forecast error is clearly lower and it raised no more "
        "incidents (a day).",
    )


class LearningConfig(_Body):
    """How long a stream of model "auto" learns before it monitors: a number of readings or a
    duration (whichever is given; neither: 1,000 readings); and when it learns again."""

    readings: Count | None = Field(
        None, ge=100, le=10_000_000, description="Learn from this many first readings."
    )
    duration_s: PositiveSeconds | None = Field(
        None, description="Learn from the readings of this many seconds (at least 100)."
    )

    relearn: RelearnConfig | Literal[False] | None = Field(
        None,
        description="When it learns again on its history, the candidate proven before it "
        "takes over (omitted: after a day and a week of readings, then weekly, each candidate "
        "proven for a day); false: never. The service's TWINWATCH_RELEARNING=false turns it "
        "off for every stream.",
    )

    @model_validator(mode="after")
    def _one_of(self) -> LearningConfig:
        if self.readings is not None and self.duration_s is not None:
            raise ValueError("give readings or duration_s, not both")
        return self

    def as_json(self) -> dict[str, Any]:
        if self.duration_s is not None:
            plan: dict[str, Any] = {"duration_s": self.duration_s}
        else:
            plan = {"readings": self.readings or DEFAULT_LEARNING_READINGS}
        if self.relearn is False:
            plan["relearn"] = False
        elif self.relearn is not None:
            plan["relearn"] = self.relearn.model_dump(mode="json")
        return plan


class StreamConfig(_Body):
    """The body of `PUT /v1/streams/{stream_id}`."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model": "auto",
                    "channels": ["flow", "pressure"],
                    "learning": {"readings": 1000},
                    "false_alarms_per_day": 1,
                },
                {
                    "model": "lstm-stateful-day-seed3",
                    "sample_period_s": 0.1,
                    "has_reference": True,
                    "detectors": {"point": {"threshold": 0.6}, "cusum": {"enabled": False}},
                },
            ]
        }
    )

    model: ModelName | None = Field(
        None,
        description='A loaded model\'s name, or "auto": the stream learns its own model and '
        "thresholds from its first readings. The server's default model when omitted.",
    )
    channels: (
        Annotated[
            list[ChannelName],
            Field(min_length=1, max_length=MAX_CHANNELS),
            AfterValidator(_unique),
        ]
        | None
    ) = Field(
        None,
        description="Channel 0 is the one forecast; as many channels as the model takes. "
        'Defaults to the model\'s own channel names ("value" for a learning stream, which '
        "forecasts every channel).",
    )
    learning: LearningConfig | None = Field(
        None, description='Model "auto" only: how long the stream learns (1,000 readings).'
    )
    false_alarms_per_day: Number = Field(
        1.0,
        gt=0,
        le=10_000,
        description='Model "auto" only: the false alarms a day its thresholds allow.',
    )
    sample_period_s: SamplePeriod | None = Field(
        None,
        description="Nominal time between readings, 1 ms to 1 day: 0.1 s for a named model "
        "when omitted; a learning stream infers it (the median step of its learning readings).",
    )
    has_reference: Flag = Field(
        False, description="Readings carry a redundant healthy sensor's value as `reference`."
    )
    detectors: dict[DetectorName, DetectorOverride] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _missing_threshold_below_one(self) -> Self:
        missing = self.detectors.get("missing")
        if missing is not None and missing.threshold is not None and missing.threshold >= 1:
            raise ValueError(
                "the missing detector's threshold must be below 1 (its statistic is 1 for a "
                "missing reading, 0 otherwise): it would never alarm"
            )
        return self


MAX_STREAMS_A_REQUEST = 100_000


class StreamConfigItem(StreamConfig):
    """One stream of `PUT /v1/streams`: its id and its configuration, as its own PUT takes."""

    id: StreamId = Field(description="The stream's id.")


class StreamsConfig(_Body):
    """The body of `PUT /v1/streams`: many streams created or reconfigured at once."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "streams": [
                        {"id": "pump-1", "model": "auto"},
                        {"id": "pump-2", "model": "auto", "channels": ["flow", "pressure"]},
                    ]
                }
            ]
        }
    )

    streams: list[StreamConfigItem] = Field(
        min_length=1,
        max_length=MAX_STREAMS_A_REQUEST,
        description=f"Each stream at most once; at most {MAX_STREAMS_A_REQUEST:,} a request.",
    )


class StreamsConfigured(BaseModel):
    created: list[str] = Field(description="The streams this request created.")
    updated: list[str] = Field(description="The streams whose configuration it replaced.")


class AlarmOut(BaseModel):
    id: int
    stream: str
    detector: str
    state: Literal["open", "closed"]
    opened_at: datetime
    opened_sample: int
    closed_at: datetime | None
    closed_sample: int | None
    peak: float
    threshold: float
    model: str
    model_version: str
    acknowledged_at: datetime | None
    acknowledged_by: str | None
    incident: int | None = Field(None, description="The incident the alarm belongs to.")
    gaps: list[tuple[int, int]] | None = Field(
        None,
        description="A re-opened alarm's spells back inside its threshold: [closed_sample, "
        "reopened_sample) each (it was closed then, and re-opened within the quiet window).",
    )
    channels: dict[str, float] | None = Field(
        None,
        description="A stream of several channels: what each channel made of the peak (its "
        "statistic against its threshold, or its part of the Mahalanobis distance); the "
        "largest contributed most.",
    )

    @classmethod
    def of(cls, alarm: Alarm) -> AlarmOut:
        return cls(
            id=alarm.id,
            stream=alarm.stream_id,
            detector=alarm.detector,
            state="open" if alarm.state == "open" else "closed",
            opened_at=alarm.opened_at,
            opened_sample=alarm.opened_sample,
            closed_at=alarm.closed_at,
            closed_sample=alarm.closed_sample,
            peak=alarm.peak,
            threshold=alarm.threshold,
            model=alarm.model_name,
            model_version=alarm.model_version,
            acknowledged_at=alarm.acknowledged_at,
            acknowledged_by=alarm.acknowledged_by,
            incident=alarm.incident_id,
            gaps=None if alarm.gaps is None else [(int(a), int(b)) for a, b in alarm.gaps],
            channels=alarm.detail,
        )


class IncidentDetectorOut(BaseModel):
    first_alarm_at: datetime
    first_alarm_sample: int
    peak: float
    threshold: float
    peak_over_threshold: float | None = Field(
        description="How far past its threshold the detector went (peak / threshold)."
    )


class IncidentOut(BaseModel):
    id: int
    stream: str
    state: Literal["open", "closed"]
    opened_at: datetime
    opened_sample: int
    closed_at: datetime | None
    closed_sample: int | None
    acknowledged_at: datetime | None
    acknowledged_by: str | None
    detectors: dict[str, IncidentDetectorOut] = Field(
        description="Each detector that alarmed: its first alarm and its highest peak."
    )
    alarms: list[int] = Field(description="Its alarms' ids, in the order they opened.")

    @classmethod
    def of(cls, incident: Incident, alarms: list[Alarm]) -> IncidentOut:
        detectors: dict[str, IncidentDetectorOut] = {}
        for alarm in alarms:
            known = detectors.get(alarm.detector)
            kind = DETECTORS.get(alarm.detector)
            below = kind is not None and kind.direction == "below"
            farther = known is None or (
                alarm.peak < known.peak if below else alarm.peak > known.peak
            )
            peak = alarm.peak if farther or known is None else known.peak
            threshold = alarm.threshold if farther or known is None else known.threshold
            detectors[alarm.detector] = IncidentDetectorOut(
                first_alarm_at=alarm.opened_at if known is None else known.first_alarm_at,
                first_alarm_sample=alarm.opened_sample
                if known is None
                else known.first_alarm_sample,
                peak=peak,
                threshold=threshold,
                peak_over_threshold=peak / threshold if threshold else None,
            )
        return cls(
            id=incident.id,
            stream=incident.stream_id,
            state="open" if incident.state == "open" else "closed",
            opened_at=incident.opened_at,
            opened_sample=incident.opened_sample,
            closed_at=incident.closed_at,
            closed_sample=incident.closed_sample,
            acknowledged_at=incident.acknowledged_at,
            acknowledged_by=incident.acknowledged_by,
            detectors=detectors,
            alarms=[alarm.id for alarm in alarms],
        )


class IncidentPageOut(BaseModel):
    items: list[IncidentOut]
    next_cursor: str | None = Field(
        description="Pass as `cursor` (with the same filters) for the next page; null at the end."
    )


class DetectorLive(BaseModel):
    statistic: float | None = Field(description="Last statistic; null while warming up.")
    threshold: float
    active: bool = Field(description="An alarm of this detector is open.")


class StreamLive(BaseModel):
    """The engine's view of a stream: what it has seen and what it currently thinks."""

    warmup_remaining: int = Field(description="Readings still needed before detectors can alarm.")
    last_forecast: float | None
    last_residual: float | None
    detectors: dict[str, DetectorLive]


class LearningOut(BaseModel):
    readings: int | None = Field(description="Learning readings asked for.")
    duration_s: float | None = Field(description="Learning seconds asked for.")
    fitting: bool = Field(description="The learning readings are in: the model is being fitted.")
    error: str | None = Field(
        description="Why the last fit failed (the stream keeps learning; a PUT retries)."
    )


class ChannelModelOut(BaseModel):
    kind: str = Field(
        description="level, naive, seasonal-naive, ar (autoregression), ar-differenced "
        "(autoregression of the changes) or lstm-stateful (a network, when it was tried and "
        "forecast clearly better)."
    )
    period: int | None = Field(description="The seasonal period in readings, if it uses one.")
    validation_rmse: float | None = Field(
        description="Its one-step error on the held-out last quarter of the learning readings."
    )
    naive_rmse: float | None = Field(description="The naive forecast's error there (last value).")
    residual_scale: float = Field(description="The typical size of its residuals.")
    constant: bool = Field(
        False,
        description="It did not move while the stream learned: it is watched by itself, "
        "for any change, and left out of the distance that watches the channels together.",
    )
    linear: str | None = Field(
        None, description="For a network: the linear model it was chosen over."
    )
    linear_rmse: float | None = Field(None, description="That linear model's error there.")


class ProvingOut(BaseModel):
    name: str
    version: int = Field(description="The relearned candidate shadowing the stream.")
    from_sample: int = Field(description="The first reading it saw.")
    decide_at: datetime | None = Field(
        description="When (on the readings' clock) its proving period ends and it is promoted "
        "or discarded."
    )


class RelearningOut(BaseModel):
    next_at: datetime | None = Field(
        description="When (on the readings' clock) it learns again on its history; null: never "
        "(its learning.relearn is false, or the service's TWINWATCH_RELEARNING)."
    )
    proving: ProvingOut | None = Field(description="The candidate proving itself, if any.")
    last: dict[str, Any] | None = Field(
        description="The last relearning or proof (a job): its id, kind and phase, why it "
        "failed (a relearning refused on a slow fault says so), or a proof's figures: both "
        "models' forecast error and incidents over the proving readings, and the verdict."
    )


class LearnedModelOut(BaseModel):
    learned_from: int = Field(description="Readings it learned from; monitoring starts after.")
    fitted_at: datetime
    sample_period_s: float
    seasons: list[int] = Field(description="Seasonal periods found (readings).")
    channels: dict[str, ChannelModelOut]
    lstm: str = Field(
        "",
        description="What became of the stateful LSTM candidate: chosen, not chosen (both "
        "errors), or why it was not tried.",
    )
    revisions: int = Field(0, description="Times its thresholds were fitted again since.")
    thresholds_from: int | None = Field(
        None, description="The sample its current thresholds apply from."
    )
    relearning: RelearningOut | None = Field(
        None, description="How it keeps learning: its next relearning, a candidate's proof."
    )


class StreamOut(BaseModel):
    id: str
    model: str
    channels: list[str]
    sample_period_s: float | None = Field(
        description="Null while a learning stream has not inferred it yet."
    )
    model_version: int | None = Field(
        description="The version of `model` it runs once a promotion or rollback named one; "
        "null: the model's active version. A stream of model `auto`: the version of its "
        "learned models (`auto.<stream id>`) it runs; null while it learns."
    )
    previous_model: ModelChoice | None = Field(
        None,
        description="What it ran before its last switch (a rollback's target; shown by GET "
        "/v1/streams/{id} and the switch's answer); null if it never switched.",
    )
    switch_reason: str | None = Field(
        None,
        description="Why its last switch was made: a relearned candidate's proof (its figures); "
        "null for one asked for (a promotion, a rollback).",
    )
    has_reference: bool
    phase: Literal["learning", "monitoring"] = "monitoring"
    learning_remaining: int = Field(0, description="Readings still to learn from.")
    learning: LearningOut | None = None
    false_alarms_per_day: float | None = Field(None, description="A learning stream's budget.")
    learned_model: LearnedModelOut | None = None
    detectors: dict[str, DetectorOverride]
    created_at: datetime
    updated_at: datetime
    samples_seen: int
    last_t: datetime | None = Field(description="Time of the last accepted reading.")
    stale_after_s: float | None = Field(
        None,
        description="Seconds without a reading arriving after which the stream gets a stale "
        "alarm: TWINWATCH_STALE_PERIODS sample periods (10), and at least "
        "TWINWATCH_STALE_MIN_S (30 s). Null while its period is not known, or with no "
        "stale timer.",
    )
    open_alarms: list[AlarmOut]
    live: StreamLive | None = Field(
        None, description="The engine's current state; null until the stream has an engine."
    )

    @classmethod
    def of(
        cls,
        stream: Stream,
        *,
        open_alarms: list[Alarm],
        live: StreamLive | None = None,
        position: tuple[int, datetime | None] | None = None,
    ) -> StreamOut:
        """`position`: (readings seen, last time) from the engine, ahead of the stream's row
        (which moves at checkpoints)."""
        samples, last_t = position if position is not None else (stream.sample_count, stream.last_t)
        return cls(
            id=stream.id,
            model=stream.model_name,
            model_version=stream.model_version,
            channels=list(stream.channels),
            sample_period_s=stream.sample_period_s,
            has_reference=stream.has_reference,
            detectors={
                name: DetectorOverride.model_validate(value)
                for name, value in stream.detector_overrides.items()
            },
            created_at=stream.created_at,
            updated_at=stream.updated_at,
            samples_seen=samples,
            last_t=last_t,
            open_alarms=[AlarmOut.of(alarm) for alarm in open_alarms],
            live=live,
        )


class StreamList(BaseModel):
    items: list[StreamOut]
    next_cursor: str | None = Field(
        None, description="Pass as `cursor` for the next page; null on the last."
    )


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


class ReadingIn(_Body):
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


class ReadingsIn(_Body):
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


class StreamReadingsIn(_Body):
    stream: StreamId = Field(description="The stream these readings belong to.")
    readings: list[ReadingIn] = Field(description="In increasing time order.")


class ManyReadingsIn(_Body):
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


# --- alarms ------------------------------------------------------------------------------------


class AlarmPageOut(BaseModel):
    items: list[AlarmOut]
    next_cursor: str | None = Field(
        description="Pass as `cursor` (with the same filters) for the next page; null at the end."
    )


class AcknowledgeIn(_Body):
    model_config = ConfigDict(json_schema_extra={"examples": [{"by": "jane"}]})

    by: Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=1, max_length=128, pattern=r"\S"),
    ] = Field(description="Who acknowledges (a person or a system): not only blanks.")


# --- models and health -------------------------------------------------------------------------


class ModelOut(BaseModel):
    name: str
    version: str
    kind: str
    window: int
    horizon: int
    n_channels: int
    manifest_sha256: str
    loaded_at: datetime
    metrics: dict[str, Any]
    thresholds: dict[str, Any]

    @classmethod
    def of(cls, model: RegisteredModel) -> ModelOut:
        forecaster = model.forecaster
        return cls(
            name=model.name,
            version=model.version,
            kind=model.kind,
            window=forecaster.window,
            horizon=forecaster.horizon,
            n_channels=forecaster.n_channels,
            manifest_sha256=model.manifest_sha256,
            loaded_at=model.loaded_at,
            metrics=model.metrics,
            thresholds=model.thresholds,
        )


class ModelList(BaseModel):
    items: list[ModelOut]


class ModelVersionOut(BaseModel):
    """One version of a model, as the catalogue keeps it."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "lstm-seed0",
                    "version": 1,
                    "kind": "lstm",
                    "artifact_sha256": "9f2c" + "0" * 60,
                    "status": "active",
                    "source": {"directory": "/srv/twinwatch/models/lstm-seed0"},
                    "metrics": {"rmse": 0.133},
                    "thresholds": {"detectors": [{"kind": "point", "threshold": 0.525}]},
                    "calibration": {},
                    "created_by": "models directory",
                    "created_at": "2026-12-01T23:00:00Z",
                }
            ]
        }
    )

    name: str
    version: int
    kind: str
    artifact_sha256: str = Field(
        description="Its manifest's hash: the artifact's name in the store."
    )
    status: Literal["candidate", "active", "retired"] = Field(
        description="active: the model's default version, or one a stream runs; candidate: no "
        "stream has run it yet; retired: no stream runs it any more."
    )
    source: dict[str, Any] = Field(description="Where it came from (a models directory).")
    metrics: dict[str, Any]
    thresholds: dict[str, Any]
    calibration: dict[str, Any] = Field(description="How its thresholds were set.")
    created_by: str
    created_at: datetime

    @classmethod
    def of(cls, row: ModelVersion) -> ModelVersionOut:
        return cls.model_validate(row, from_attributes=True)


class ModelDetail(ModelOut):
    active_version: int = Field(description="The version streams run unless they name one.")
    versions: list[ModelVersionOut] = Field(description="Every version, oldest first.")


class ModelChoice(_Body):
    """A model version for a stream to run from its next reading on."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"name": "lstm-seed0", "version": 2},
                {"name": "auto.pump-7", "version": 5},
            ]
        },
    )

    name: str = Field(
        pattern=MODEL_NAME_PATTERN,
        max_length=133,
        description="The model's name (a stream's learned models: `auto.<stream id>`).",
    )
    version: Count = Field(ge=1, le=2**31 - 1, description="One of its versions.")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    status: Literal["ready"] = "ready"
    checks: dict[str, str]


# --- jobs --------------------------------------------------------------------------------------


class JobIn(_Body):
    """Work on the stream's stored readings that makes a candidate version of its model."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "kind": "recalibrate",
                    "since": "2026-11-30T00:00:00Z",
                    "until": "2026-12-01T00:00:00Z",
                    "false_alarms_per_day": 1.0,
                },
                {"kind": "retrain", "since": 1764460800, "epochs": 20},
            ]
        },
    )

    kind: Literal["retrain", "recalibrate"] = Field(
        description="recalibrate: new thresholds for the version the stream runs, from the "
        "period's readings (taken as normal operation). retrain: the same kind of model "
        "trained on the period's first 80%, its thresholds from the last 20%; on a stream that "
        "learns its own model, the stream learned afresh from the period, as its first fit."
    )
    since: ReadingTime | None = Field(
        None, description="The period's start (default: the first stored reading)."
    )
    until: ReadingTime | None = Field(
        None, description="The period's end, excluded (default: after the last)."
    )
    false_alarms_per_day: Number | None = Field(
        None,
        gt=0,
        le=10_000,
        description="The false alarms a day the thresholds allow (default: a learned "
        "stream's own budget, 1 for a trained model).",
    )
    epochs: Count | None = Field(
        None,
        ge=1,
        le=1000,
        description="A retrain's training epochs (default: the model's own; not for a stream "
        "that learns its own model).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError("until must be after since")
        if self.epochs is not None and self.kind != "retrain":
            raise ValueError("epochs are for a retrain")
        return self

    def params(self) -> dict[str, Any]:
        """As the job row keeps them (times in epoch seconds)."""
        return {
            "since": None if self.since is None else self.since.timestamp(),
            "until": None if self.until is None else self.until.timestamp(),
            "false_alarms_per_day": self.false_alarms_per_day,
            "epochs": self.epochs,
        }


class JobOut(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 7,
                    "stream": "pump-1",
                    "kind": "retrain",
                    "params": {
                        "since": 1764460800.0,
                        "until": None,
                        "false_alarms_per_day": 1.0,
                        "epochs": 20,
                    },
                    "phase": "succeeded",
                    "progress": {"step": "calibrating"},
                    "result": {"name": "pump-a", "version": 3, "calibration": {}},
                    "error": None,
                    "created_at": "2026-12-01T23:00:00Z",
                    "started_at": "2026-12-01T23:00:01Z",
                    "finished_at": "2026-12-01T23:04:10Z",
                }
            ]
        }
    )

    id: int
    stream: str
    kind: Literal["retrain", "recalibrate", "learn", "revise", "relearn", "prove"] = Field(
        description="Asked for: `retrain`, `recalibrate`. A learning stream's own: its first "
        "fit (`learn`), each revision of its thresholds (`revise`), each time it learns again "
        "on its history (`relearn`, which makes a candidate) and each candidate's proof "
        "(`prove`: its result holds both models' figures and the verdict)."
    )
    params: dict[str, Any]
    phase: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    progress: dict[str, Any] = Field(
        description="While it runs: its step, a retrain's epoch and loss."
    )
    result: dict[str, Any] | None = Field(
        None, description="Once it succeeded: the candidate version it made (name, version)."
    )
    error: str | None = Field(None, description="Why it failed.")
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            id=job.id,
            stream=job.stream_id,
            kind=job.kind,
            params=job.params,
            phase=job.phase,
            progress=job.progress,
            result=job.result,
            error=job.error,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
        )


class JobList(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = Field(None, description="Pass as `cursor` for the next page.")


# --- shadows -----------------------------------------------------------------------------------


class Detection(BaseModel):
    detector: str
    start_t: float = Field(description="Epoch seconds of its first reading.")
    end_t: float | None = Field(description="Of its last exceedance; null while open.")
    peak: float


class ShadowSide(BaseModel):
    model: str
    version: str
    residual_rmse: float | None = Field(description="Where the detectors saw the residual.")
    monitored: int = Field(description="Readings whose residual the detectors saw.")
    alarms: int = Field(description="Alarms it raised, or would have raised.")
    alarms_per_day: float | None
    detections: list[Detection] = Field(description="The latest 100, oldest first.")


class ShadowOut(BaseModel):
    """A candidate version beside the version the stream runs, over the same stored readings
    since the shadow started (the latest million at most): what each forecast, and the alarms
    each raised or would raise. The candidate raises nothing."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "stream": "pump-1",
                    "started_at": "2026-12-01T00:00:00Z",
                    "from_sample": 864000,
                    "readings": 864000,
                    "since_t": 1764547200.0,
                    "until_t": 1764633599.9,
                    "active": {
                        "model": "pump-a",
                        "version": "2",
                        "residual_rmse": 0.041,
                        "monitored": 863700,
                        "alarms": 3,
                        "alarms_per_day": 3.0,
                        "detections": [
                            {
                                "detector": "rolling_rms",
                                "start_t": 1764590000.0,
                                "end_t": 1764590012.3,
                                "peak": 0.31,
                            }
                        ],
                    },
                    "candidate": {
                        "model": "pump-a",
                        "version": "3",
                        "residual_rmse": 0.038,
                        "monitored": 863700,
                        "alarms": 1,
                        "alarms_per_day": 1.0,
                        "detections": [],
                    },
                }
            ]
        }
    )

    stream: str
    started_at: datetime
    from_sample: int = Field(description="The stream's reading the shadow started at.")
    readings: int = Field(description="Readings compared.")
    since_t: float | None = Field(description="Epoch seconds of the first reading compared.")
    until_t: float | None = Field(description="Of the last.")
    active: ShadowSide = Field(description="The version the stream runs now.")
    candidate: ShadowSide
