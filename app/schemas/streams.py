"""A stream's configuration (PUT) and what is known of it (GET)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from app.learning.learn import DEFAULT_LEARNING_READINGS
from app.monitoring.alarms import AlarmPolicy
from app.schemas.alarms import AlarmOut
from app.schemas.common import (
    HIGHEST_THRESHOLD,
    MAX_CHANNELS,
    ChannelName,
    Count,
    DetectorName,
    Flag,
    ModelName,
    Number,
    PositiveSeconds,
    SamplePeriod,
    StreamId,
    StrictBody,
    unique_names,
)
from app.schemas.models import ModelChoice
from app.storage.models import Alarm, Stream

# --- streams -----------------------------------------------------------------------------------


class DetectorOverride(StrictBody):
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


class RelearnConfig(StrictBody):
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


class LearningConfig(StrictBody):
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


class StreamConfig(StrictBody):
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
            AfterValidator(unique_names),
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


class StreamsConfig(StrictBody):
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
