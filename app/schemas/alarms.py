"""Alarms and incidents, and their acknowledgement."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
)

from app.monitoring.detectors import DETECTORS
from app.schemas.common import StrictBody
from app.storage.models import Alarm, Incident


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


# --- alarms ------------------------------------------------------------------------------------


class AlarmPageOut(BaseModel):
    items: list[AlarmOut]
    next_cursor: str | None = Field(
        description="Pass as `cursor` (with the same filters) for the next page; null at the end."
    )


class AcknowledgeIn(StrictBody):
    model_config = ConfigDict(json_schema_extra={"examples": [{"by": "jane"}]})

    by: Annotated[
        str,
        StringConstraints(strip_whitespace=True, min_length=1, max_length=128, pattern=r"\S"),
    ] = Field(description="Who acknowledges (a person or a system): not only blanks.")
