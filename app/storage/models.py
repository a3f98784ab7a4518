"""The database schema as SQLAlchemy 2.0 typed models.

Every datetime is a timezone-aware UTC `UTCDateTime`. Rows that belong to a stream (alarms,
checkpoint, readings) go with it when the stream is deleted. `migrations/` must describe exactly
this schema (a test compares them).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.storage.types import BigIntegerPK, UTCDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STREAM_ID_LENGTH = 128
NAME_LENGTH = 128
MODEL_NAME_LENGTH = 133  # a trained model's name, or "auto." and a stream's id (a learned one's)
DETECTOR_LENGTH = 64

AlarmState = Literal["open", "closed"]


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        datetime: UTCDateTime(),
        float: Double(),
        dict[str, Any]: JSON(),
        list[str]: JSON(),
        bytes: LargeBinary(),
    }


class ModelEntry(Base):
    """A forecaster artifact the service has loaded, as it was when last loaded."""

    __tablename__ = "models"

    name: Mapped[str] = mapped_column(String(MODEL_NAME_LENGTH), primary_key=True)
    version: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]]
    metrics: Mapped[dict[str, Any]]
    thresholds: Mapped[dict[str, Any]]
    loaded_at: Mapped[datetime]
    # The version streams run unless they name one (`Stream.model_version`): the one the models
    # directory holds. None for "auto" (each stream learns its own).
    active_version: Mapped[int | None]


ModelStatus = Literal["candidate", "active", "retired"]


class ModelVersion(Base):
    """One numbered version of a model: its artifact (a directory in the artifact store, named
    by its manifest's hash), where it came from, its metrics and thresholds, and its status:
    `active` while it is the name's default or a stream runs it, `candidate` before any stream
    has, `retired` once none does."""

    __tablename__ = "model_versions"

    name: Mapped[str] = mapped_column(
        String(MODEL_NAME_LENGTH), ForeignKey("models.name", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer(), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    artifact_sha256: Mapped[str] = mapped_column(String(64))
    # {"directory": path} for a models directory's; {"stream", "since", "until"} for a job's.
    source: Mapped[dict[str, Any]]
    metrics: Mapped[dict[str, Any]]
    thresholds: Mapped[dict[str, Any]]
    calibration: Mapped[dict[str, Any]]  # how the thresholds were set
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    status: Mapped[str] = mapped_column(String(16))

    __table_args__ = (
        CheckConstraint("status IN ('candidate', 'active', 'retired')", name="status_valid"),
        CheckConstraint("version >= 1", name="version_positive"),
    )


class ModelSwitch(Base):
    """A stream switched from one model version to another at a sample (a promotion or a
    rollback): the audit of what ran when, and where a rollback goes back to."""

    __tablename__ = "model_switches"

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True)
    stream_id: Mapped[str] = mapped_column(
        String(STREAM_ID_LENGTH), ForeignKey("streams.id", ondelete="CASCADE"), index=True
    )
    at_sample: Mapped[int] = mapped_column(BigInteger())
    from_model: Mapped[str] = mapped_column(String(MODEL_NAME_LENGTH))
    from_version: Mapped[str] = mapped_column(String(64))
    to_model: Mapped[str] = mapped_column(String(MODEL_NAME_LENGTH))
    to_version: Mapped[int] = mapped_column(Integer())
    switched_at: Mapped[datetime]
    # Why: None for a switch asked for (the API, the page); a relearned candidate's proof.
    reason: Mapped[str | None] = mapped_column(String(500))


class Shadow(Base):
    """A candidate version that shadows what a stream runs, from sample `from_sample` on: it
    sees the same readings (replayed from storage when compared) and raises nothing."""

    __tablename__ = "shadows"

    stream_id: Mapped[str] = mapped_column(
        String(STREAM_ID_LENGTH), ForeignKey("streams.id", ondelete="CASCADE"), primary_key=True
    )
    model_name: Mapped[str] = mapped_column(String(MODEL_NAME_LENGTH))
    model_version: Mapped[int] = mapped_column(Integer())
    from_sample: Mapped[int] = mapped_column(BigInteger())
    started_at: Mapped[datetime]


JobPhase = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_PHASES = ("queued", "running", "succeeded", "failed", "cancelled")
JOB_KINDS = ("retrain", "recalibrate", "learn", "revise", "relearn", "prove")
"""Asked for by a user, or a learned stream's scheduled relearning (each run in a process of its
own); a learning stream's first fit, the revisions of its thresholds and the proof of a relearned
candidate (run in the service's learner thread, app/streams/learner.py)."""
LEARNER_JOBS = ("learn", "revise", "prove")


class Job(Base):
    """Work on a stream's stored readings that makes a model version: asked for by `POST
    /v1/streams/{id}/jobs` and run in a process of its own (app/jobs/), or a learning stream's
    fit or revision, which the stream runs once it is made (app/streams/learner.py). `result`
    names the version it made; `error` says why it made none."""

    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True)
    stream_id: Mapped[str] = mapped_column(
        String(STREAM_ID_LENGTH), ForeignKey("streams.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16))
    params: Mapped[dict[str, Any]]
    phase: Mapped[str] = mapped_column(String(16))
    progress: Mapped[dict[str, Any]]
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    error: Mapped[str | None] = mapped_column(String(2000))
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    __table_args__ = (
        CheckConstraint(f"kind IN {JOB_KINDS!r}", name="kind_valid"),
        CheckConstraint(f"phase IN {JOB_PHASES!r}", name="phase_valid"),
    )


class Stream(Base):
    """A sensor (or sensor group) of one machine and where its processing has got to."""

    __tablename__ = "streams"

    id: Mapped[str] = mapped_column(String(STREAM_ID_LENGTH), primary_key=True)
    model_name: Mapped[str] = mapped_column(
        String(NAME_LENGTH), ForeignKey("models.name", ondelete="RESTRICT"), index=True
    )
    # The version of `model_name` it runs (set by a promotion or rollback); None: the model's
    # active version.
    model_version: Mapped[int | None]
    channels: Mapped[list[str]]
    # None: a learning stream's period, inferred from its readings when the learning ends.
    sample_period_s: Mapped[float | None]
    has_reference: Mapped[bool] = mapped_column(Boolean())
    detector_overrides: Mapped[dict[str, Any]]
    # A stream of model "auto": how long it learns ({"readings": n} or {"duration_s": s}) and
    # its false-alarm budget.
    learning: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    false_alarms_per_day: Mapped[float] = mapped_column(Double(), default=1.0)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    # Time of the last accepted reading and how many readings were accepted, as of the
    # stream's last checkpoint (written with it).
    last_t: Mapped[datetime | None]
    sample_count: Mapped[int] = mapped_column(BigInteger(), default=0)

    __table_args__ = (
        CheckConstraint("sample_period_s > 0", name="sample_period_positive"),
        CheckConstraint("false_alarms_per_day > 0", name="false_alarms_per_day_positive"),
    )


class Incident(Base):
    """Alarms of one stream that overlap or follow each other closely (app/monitoring/
    incidents.py): what an operator acknowledges. Open while any of its alarms is."""

    __tablename__ = "incidents"

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True)
    stream_id: Mapped[str] = mapped_column(
        String(STREAM_ID_LENGTH), ForeignKey("streams.id", ondelete="CASCADE")
    )
    state: Mapped[str] = mapped_column(String(8))
    opened_at: Mapped[datetime]
    opened_sample: Mapped[int] = mapped_column(BigInteger())
    closed_at: Mapped[datetime | None]
    closed_sample: Mapped[int | None] = mapped_column(BigInteger())
    acknowledged_at: Mapped[datetime | None]
    acknowledged_by: Mapped[str | None] = mapped_column(String(NAME_LENGTH))

    __table_args__ = (
        CheckConstraint("state IN ('open', 'closed')", name="state_valid"),
        Index("ix_incidents_opened_at_id", "opened_at", "id"),
        Index("ix_incidents_stream_id_opened_sample", "stream_id", "opened_sample"),
    )


class Alarm(Base):
    """One alarm event of one detector on one stream, from opening to closing."""

    __tablename__ = "alarms"

    id: Mapped[int] = mapped_column(BigIntegerPK, primary_key=True, autoincrement=True)
    stream_id: Mapped[str] = mapped_column(
        String(STREAM_ID_LENGTH), ForeignKey("streams.id", ondelete="CASCADE")
    )
    incident_id: Mapped[int | None] = mapped_column(
        BigInteger(), ForeignKey("incidents.id", ondelete="SET NULL"), index=True
    )
    # Per channel of a stream of several, what made the peak: {channel: its part}.
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # A re-opened alarm's quiet spells, [closed_sample, reopened_sample) each.
    gaps: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True))
    detector: Mapped[str] = mapped_column(String(DETECTOR_LENGTH))
    state: Mapped[str] = mapped_column(String(8))
    opened_at: Mapped[datetime]
    opened_sample: Mapped[int] = mapped_column(BigInteger())
    closed_at: Mapped[datetime | None]
    closed_sample: Mapped[int | None] = mapped_column(BigInteger())
    peak: Mapped[float]
    threshold: Mapped[float]
    model_name: Mapped[str] = mapped_column(String(MODEL_NAME_LENGTH))
    model_version: Mapped[str] = mapped_column(String(64))
    acknowledged_at: Mapped[datetime | None]
    acknowledged_by: Mapped[str | None] = mapped_column(String(NAME_LENGTH))

    __table_args__ = (
        CheckConstraint("state IN ('open', 'closed')", name="state_valid"),
        CheckConstraint(
            "(state = 'open' AND closed_at IS NULL AND closed_sample IS NULL)"
            " OR (state = 'closed' AND closed_at IS NOT NULL AND closed_sample IS NOT NULL)",
            name="closed_consistent",
        ),
        # The listing's keyset order, newest first.
        Index("ix_alarms_opened_at_id", "opened_at", "id"),
        Index("ix_alarms_stream_id_detector_state", "stream_id", "detector", "state"),
        # At most one open alarm per stream and detector.
        Index(
            "uq_alarms_one_open",
            "stream_id",
            "detector",
            unique=True,
            sqlite_where=text("state = 'open'"),
            postgresql_where=text("state = 'open'"),
        ),
    )


class LearnedModel(Base):
    """What a learning stream learned: its model and detectors (`app.learning.learn`), from its
    first `learned_from` readings; monitoring starts at that sample. `error` instead of `model`
    when the readings could not teach a model."""

    __tablename__ = "learned_models"

    stream_id: Mapped[str] = mapped_column(
        String(STREAM_ID_LENGTH), ForeignKey("streams.id", ondelete="CASCADE"), primary_key=True
    )
    learned_from: Mapped[int] = mapped_column(BigInteger())
    fitted_at: Mapped[datetime]
    model: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    error: Mapped[str | None] = mapped_column(String(1000))
    # Its thresholds revised since (app/learning/adapt.py), oldest first:
    # [{"from_sample": n, "monitor": MonitorConfig JSON}].
    revisions: Mapped[list[Any]] = mapped_column(JSON(), default=list)
    # Relearning (app/learning/relearn.py), on the readings' clock: where its history began
    # (the schedule counts from there; None: never scheduled), when the next one is due (None:
    # never), the span of history the last one learned on (seconds), and when the candidate
    # shadowing the stream has proved itself long enough to be decided on.
    history_from: Mapped[datetime | None]
    relearn_at: Mapped[datetime | None]
    relearned_s: Mapped[float | None] = mapped_column(Double())
    prove_at: Mapped[datetime | None]


class StreamCheckpoint(Base):
    """The engine's serialised per-stream state after `sample_count` readings."""

    __tablename__ = "stream_checkpoints"

    stream_id: Mapped[str] = mapped_column(
        String(STREAM_ID_LENGTH), ForeignKey("streams.id", ondelete="CASCADE"), primary_key=True
    )
    sample_count: Mapped[int] = mapped_column(BigInteger())
    last_t: Mapped[datetime | None]
    state_version: Mapped[int] = mapped_column(Integer())
    state: Mapped[bytes]
    updated_at: Mapped[datetime]


class ReadingBatch(Base):
    """The readings one request brought to one stream, packed: enough to rebuild the stream's
    state (a restart replays the batches after the last checkpoint, as they arrived) and to
    recognise re-sends.

    One row per batch, not per reading: 1,000 readings are one row of three arrays, one insert
    instead of a thousand (docs/benchmarks.md); a stream's rows of a few readings are packed
    together at its checkpoints (`readings.pack`). `times` are int64 microseconds since
    the Unix epoch, `channel_values` float64 (count x channels, row-major, in the stream's
    channel order) and `reference_values` float64 or NULL for a stream without references; all
    little-endian, NaN for a missing number (accepted numbers are finite). A stream's channels
    cannot change once it has readings, so the channel count is the stream's.
    """

    __tablename__ = "reading_batches"

    stream_id: Mapped[str] = mapped_column(
        String(STREAM_ID_LENGTH), ForeignKey("streams.id", ondelete="CASCADE"), primary_key=True
    )
    first_sample: Mapped[int] = mapped_column(BigInteger(), primary_key=True)
    count: Mapped[int] = mapped_column(Integer())
    first_t: Mapped[datetime]
    last_t: Mapped[datetime]
    times: Mapped[bytes]
    channel_values: Mapped[bytes]
    reference_values: Mapped[bytes | None]

    __table_args__ = (
        CheckConstraint("count > 0", name="count_positive"),
        # Re-sends look batches up by time.
        Index("ix_reading_batches_stream_id_last_t", "stream_id", "last_t"),
    )


class BusPartition(Base):
    """A bus partition's fence (`app/storage/repositories/bus.py`): how many times a worker
    took it. A worker that takes the partition's lease counts one more and commits for it only
    while the count is still its own, so one that lost the lease while paused cannot write
    after the partition's new owner took it."""

    __tablename__ = "bus_partitions"

    partition: Mapped[int] = mapped_column(Integer(), primary_key=True, autoincrement=False)
    epoch: Mapped[int] = mapped_column(BigInteger())


class BusChange(Base):
    """A change of a stream a worker made (`app/api/changes.py`), by its message's id, with the
    answer it gave: a message delivered again (its worker stopped after the commit, before the
    acknowledgement) is answered the same, not made twice."""

    __tablename__ = "bus_changes"

    message_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    status: Mapped[int] = mapped_column(Integer())
    body: Mapped[bytes] = mapped_column(LargeBinary())
    media_type: Mapped[str] = mapped_column(String(100))
    made_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
