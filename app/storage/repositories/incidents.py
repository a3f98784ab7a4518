"""Incident rows (app/monitoring/incidents.py): listed, read and acknowledged through the API.
They are opened and closed with their alarms by `alarms.apply`."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.errors import NotFoundError
from app.storage.models import Alarm, AlarmState, Incident
from app.storage.repositories.alarms import first_acknowledgement
from app.storage.repositories.pages import Page, newest_first, opened_filters


def get(session: Session, incident_id: int) -> Incident | None:
    return session.get(Incident, incident_id)


def require(session: Session, incident_id: int) -> Incident:
    incident = session.get(Incident, incident_id)
    if incident is None:
        raise NotFoundError(f"incident {incident_id} does not exist", incident=incident_id)
    return incident


def alarms_of(session: Session, incident_ids: list[int]) -> dict[int, list[Alarm]]:
    """Each incident's alarms, in the order they opened."""
    if not incident_ids:
        return {}
    statement = (
        select(Alarm)
        .where(Alarm.incident_id.in_(incident_ids))
        .order_by(Alarm.opened_sample, Alarm.id)
    )
    out: dict[int, list[Alarm]] = {i: [] for i in incident_ids}
    for alarm in session.scalars(statement):
        assert alarm.incident_id is not None
        out[alarm.incident_id].append(alarm)
    return out


def open_counts(session: Session) -> dict[str, int]:
    """Open incidents by stream."""
    statement = (
        select(Incident.stream_id, func.count())
        .where(Incident.state == "open")
        .group_by(Incident.stream_id)
    )
    return {stream: int(count) for stream, count in session.execute(statement)}


def acknowledge(session: Session, incident_id: int, *, by: str, now: datetime) -> Incident:
    """Mark the incident (and its alarms not yet acknowledged) acknowledged. Idempotent."""
    first_acknowledgement(session, Incident, Incident.id == incident_id, by=by, now=now)
    incident = session.get(Incident, incident_id, populate_existing=True)
    if incident is None:
        raise NotFoundError(f"incident {incident_id} does not exist", incident=incident_id)
    first_acknowledgement(session, Alarm, Alarm.incident_id == incident_id, by=by, now=now)
    return incident


def page(
    session: Session,
    *,
    stream_id: str | None = None,
    state: AlarmState | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> Page[Incident]:
    """Incidents newest first with `since <= opened_at < until` (`pages.newest_first`)."""
    conditions = opened_filters(
        Incident, stream_id=stream_id, state=state, since=since, until=until
    )
    return newest_first(session, Incident, conditions, limit=limit, cursor=cursor)
