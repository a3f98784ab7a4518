"""Background jobs (retrain, recalibrate, relearn) asked for and reported."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from app.schemas.common import Count, Number, StrictBody
from app.schemas.readings import ReadingTime
from app.storage.models import Job

# --- jobs --------------------------------------------------------------------------------------


class JobIn(StrictBody):
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
