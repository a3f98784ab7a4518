"""A candidate version beside what a stream runs: their comparison."""

from __future__ import annotations

from datetime import datetime

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

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
