"""Alarm rows: opened and closed as streams move, listed and acknowledged through the API."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from app.errors import NotFoundError
from app.monitoring.alarms import AlarmEvent
from app.monitoring.detectors import DETECTORS
from app.monitoring.incidents import QUIET_TO_JOIN, joins
from app.storage.models import Alarm, AlarmState, Incident
from app.storage.repositories.pages import Page, newest_first, opened_filters

log = logging.getLogger(__name__)

NEVER_REJOINED = ("stale",)
"""Each silence of a stream is its own stale alarm (it lasts as long as the silence)."""
MAX_GAPS = 100
"""A re-opened alarm remembers its latest 100 quiet spells."""


def create(
    session: Session,
    *,
    stream_id: str,
    detector: str,
    opened_at: datetime,
    opened_sample: int,
    peak: float,
    threshold: float,
    model_name: str,
    model_version: str,
) -> Alarm:
    """Open an alarm. A second open alarm of the same stream and detector violates a unique
    index: the engine closes before it re-opens."""
    alarm = Alarm(
        stream_id=stream_id,
        detector=detector,
        state="open",
        opened_at=opened_at,
        opened_sample=opened_sample,
        closed_at=None,
        closed_sample=None,
        peak=peak,
        threshold=threshold,
        model_name=model_name,
        model_version=model_version,
        acknowledged_at=None,
        acknowledged_by=None,
    )
    session.add(alarm)
    session.flush()
    return alarm


def close(
    session: Session,
    alarm: Alarm,
    *,
    closed_at: datetime,
    closed_sample: int,
    peak: float | None = None,
) -> Alarm:
    """An alarm never closes before it opened: a stale alarm opens on the readings' clock at
    its stream's last reading plus the silence allowed, and late readings can be older."""
    if alarm.state != "open":
        raise ValueError(f"alarm {alarm.id} is already closed")
    alarm.state = "closed"
    alarm.closed_at = max(closed_at, alarm.opened_at)
    alarm.closed_sample = closed_sample
    if peak is not None:
        alarm.peak = peak
    session.flush()
    return alarm


@dataclass
class Applied:
    """What `apply` did: the alarm rows opened (or re-opened) and closed, and how many incidents
    it opened (or re-opened) and closed."""

    opened: list[Alarm]
    closed: list[Alarm]
    incidents_opened: int = 0
    incidents_closed: int = 0
    new: list[Alarm] = field(default_factory=list)  # the opened rows that are new alarms


def apply(
    session: Session,
    *,
    stream_id: str,
    opened: Sequence[AlarmEvent],
    closed: Sequence[AlarmEvent],
    peaks: Mapping[str, float],
    time_of: Callable[[int], datetime],
    model_name: str,
    model_version: str,
    channels: Sequence[str] = (),
    quiet: int = QUIET_TO_JOIN,
    open_alarms: Sequence[Alarm] | None = None,
) -> Applied:
    """A stream's alarm transitions, in sample order, with the incidents they make
    (app/monitoring/incidents.py): an alarm opening within `quiet` readings of its detector's
    last closing re-opens that row; every alarm joins the stream's open incident, or the last
    one if it closed within `quiet` readings, or a new one; an incident closes with its last
    open alarm. The peak of every alarm still open (`peaks`, by detector) is brought up to
    date; `channels` name the parts of a multi-channel event's detail. `open_alarms`: the
    stream's open alarms, if the caller read them already (`OpenAlarms`, for many streams)."""
    actions = sorted(
        [(event.start, 1, event) for event in opened]
        + [(event.cleared_at or 0, 0, event) for event in closed],
        key=lambda action: (action[0], action[1]),
    )
    if open_alarms is None:
        open_alarms = list_open(session, stream_id=stream_id)
    rows: dict[str, Alarm] = {a.detector: a for a in open_alarms}
    done = Applied([], [])
    for sample, is_opening, event in actions:
        if is_opening:
            superseded = None
            if event.detector in rows:  # left open by an earlier configuration
                superseded = rows.pop(event.detector)
                done.closed.append(
                    close(session, superseded, closed_at=time_of(sample), closed_sample=sample)
                )
                _close_incident(session, superseded, done, rows.values())
            row = None
            if superseded is None and event.detector not in NEVER_REJOINED:
                row = _reopened(session, stream_id, event, quiet, (model_name, model_version))
            if row is None:
                row = create(
                    session,
                    stream_id=stream_id,
                    detector=event.detector,
                    opened_at=time_of(event.start),
                    opened_sample=event.start,
                    peak=event.peak,
                    threshold=event.threshold,
                    model_name=model_name,
                    model_version=model_version,
                )
                done.new.append(row)
            row.detail = _detail(event, channels) or row.detail
            if row.incident_id is None:
                row.incident_id = _incident(session, stream_id, row, event.start, quiet, done)
            else:  # a re-opened alarm re-opens its incident
                _reopen_incident(session, row.incident_id, done)
            rows[event.detector] = row
            done.opened.append(row)
            continue
        still_open = rows.pop(event.detector, None)
        if still_open is None:
            log.warning("no open alarm row for %s/%s", stream_id, event.detector)
            continue
        done.closed.append(
            close(
                session,
                still_open,
                closed_at=time_of(sample),
                closed_sample=sample,
                peak=_extreme(event.detector, still_open.peak, event.peak),
            )
        )
        still_open.detail = _detail(event, channels) or still_open.detail
        _close_incident(session, still_open, done, rows.values())
    for detector, peak in peaks.items():
        held = rows.get(detector)
        if held is not None:
            peak = _extreme(detector, held.peak, peak)
            if held.peak != peak:
                held.peak = peak
    session.flush()
    return done


def _extreme(detector: str, a: float, b: float) -> float:
    """The farther of two peaks on the detector's alarming side."""
    kind = DETECTORS.get(detector)
    below = kind is not None and kind.direction == "below"
    return min(a, b) if below else max(a, b)


def _detail(event: AlarmEvent, channels: Sequence[str]) -> dict[str, float] | None:
    if event.detail is None or len(event.detail) != len(channels):
        return None
    return dict(zip(channels, event.detail, strict=True))


def _reopened(
    session: Session, stream_id: str, event: AlarmEvent, quiet: int, model: tuple[str, str]
) -> Alarm | None:
    """The detector's last alarm if it closed within `quiet` readings of this opening and the
    same model version raised it: opened again, the same alarm extended. (An alarm of another
    version, closed by a switch, stays closed: each alarm names the version that raised it.)"""
    last = session.scalars(
        select(Alarm)
        .where(Alarm.stream_id == stream_id, Alarm.detector == event.detector)
        .order_by(Alarm.opened_sample.desc(), Alarm.id.desc())
        .limit(1)
    ).first()
    if last is None or last.state != "closed" or not joins(last.closed_sample, event.start, quiet):
        return None
    if (last.model_name, last.model_version) != model:
        return None
    last.gaps = [*(last.gaps or []), [last.closed_sample, event.start]][-MAX_GAPS:]
    last.state = "open"
    last.closed_at = None
    last.closed_sample = None
    last.peak = _extreme(event.detector, last.peak, event.peak)
    session.flush()
    return last


def _incident(
    session: Session, stream_id: str, alarm: Alarm, start: int, quiet: int, done: Applied
) -> int:
    """The incident an alarm opening at `start` belongs to (opened or re-opened if need be)."""
    last = session.scalars(
        select(Incident)
        .where(Incident.stream_id == stream_id)
        .order_by(Incident.opened_sample.desc(), Incident.id.desc())
        .limit(1)
    ).first()
    if last is not None and joins(last.closed_sample, start, quiet):
        if last.state == "closed":
            last.state, last.closed_at, last.closed_sample = "open", None, None
            done.incidents_opened += 1
        return last.id
    incident = Incident(
        stream_id=stream_id,
        state="open",
        opened_at=alarm.opened_at,
        opened_sample=alarm.opened_sample,
        closed_at=None,
        closed_sample=None,
        acknowledged_at=None,
        acknowledged_by=None,
    )
    session.add(incident)
    session.flush()
    done.incidents_opened += 1
    return incident.id


def _reopen_incident(session: Session, incident_id: int, done: Applied) -> None:
    incident = session.get(Incident, incident_id)
    if incident is not None and incident.state == "closed":
        incident.state, incident.closed_at, incident.closed_sample = "open", None, None
        done.incidents_opened += 1


def _close_incident(
    session: Session, alarm: Alarm, done: Applied, still_open: Iterable[Alarm]
) -> None:
    """Close the alarm's incident if no alarm of it is open any more (an incident is one
    stream's: `still_open`, the stream's open alarms, says)."""
    if alarm.incident_id is None:
        return
    if any(other.incident_id == alarm.incident_id for other in still_open):
        return
    incident = session.get(Incident, alarm.incident_id)
    if incident is not None and incident.state == "open":
        incident.state = "closed"
        incident.closed_at = alarm.closed_at
        incident.closed_sample = alarm.closed_sample
        done.incidents_closed += 1


def get(session: Session, alarm_id: int) -> Alarm | None:
    return session.get(Alarm, alarm_id)


def require(session: Session, alarm_id: int) -> Alarm:
    alarm = session.get(Alarm, alarm_id)
    if alarm is None:
        raise NotFoundError(f"alarm {alarm_id} does not exist", alarm=alarm_id)
    return alarm


def spans(session: Session, *, stream_id: str) -> list[tuple[int, int | None]]:
    """Every alarm of the stream as [opened_sample, closed_sample) (None: still open), gaps
    included: the readings its alarms covered."""
    statement = select(Alarm.opened_sample, Alarm.closed_sample).where(Alarm.stream_id == stream_id)
    return [(int(a), None if b is None else int(b)) for a, b in session.execute(statement)]


def list_open(
    session: Session, *, stream_id: str | None = None, stream_ids: Sequence[str] | None = None
) -> list[Alarm]:
    """Open alarms (of one stream, of some, or of all), one per stream and detector at most."""
    statement = select(Alarm).where(Alarm.state == "open")
    if stream_id is not None:
        statement = statement.where(Alarm.stream_id == stream_id)
    if stream_ids is not None:
        statement = statement.where(Alarm.stream_id.in_(stream_ids))
    return list(session.scalars(statement.order_by(Alarm.stream_id, Alarm.detector)))


@dataclass
class OpenAlarms:
    """The open alarms of many streams, read together, and their incidents (loaded into the
    session, where `apply` finds them): two queries for a request's streams instead of two a
    stream, when a tick closes the alarms of many (a gateway back after a silence)."""

    by_stream: dict[str, list[Alarm]]
    incidents: list[Incident]

    @classmethod
    def read(cls, session: Session, stream_ids: Sequence[str]) -> OpenAlarms:
        by_stream: dict[str, list[Alarm]] = {stream_id: [] for stream_id in stream_ids}
        incidents: list[Incident] = []
        for start in range(0, len(stream_ids), READ_TOGETHER):
            alarms = list_open(session, stream_ids=stream_ids[start : start + READ_TOGETHER])
            for alarm in alarms:
                by_stream[alarm.stream_id].append(alarm)
            ids = sorted({a.incident_id for a in alarms if a.incident_id is not None})
            if ids:
                incidents += session.scalars(select(Incident).where(Incident.id.in_(ids)))
        return cls(by_stream, incidents)


READ_TOGETHER = 500  # streams a query (within every database's limit on bound parameters)


def acknowledge(session: Session, alarm_id: int, *, by: str, now: datetime) -> Alarm:
    """Mark the alarm acknowledged. Idempotent: the first acknowledgement is kept."""
    first_acknowledgement(session, Alarm, Alarm.id == alarm_id, by=by, now=now)
    alarm = session.get(Alarm, alarm_id, populate_existing=True)
    if alarm is None:
        raise NotFoundError(f"alarm {alarm_id} does not exist", alarm=alarm_id)
    return alarm


def first_acknowledgement(
    session: Session,
    table: type[Alarm] | type[Incident],
    which: ColumnElement[bool],
    *,
    by: str,
    now: datetime,
) -> None:
    """Acknowledge the rows `which` selects that no one acknowledged yet, in one conditional
    UPDATE: of concurrent acknowledgements the first wins on every database (a row lock read
    first is no lock at all on SQLite), and the others read what it stored."""
    session.execute(
        update(table)
        .where(which, table.acknowledged_at.is_(None))
        .values(acknowledged_at=now, acknowledged_by=by)
        .execution_options(synchronize_session=False)
    )


def page(
    session: Session,
    *,
    stream_id: str | None = None,
    detector: str | None = None,
    state: AlarmState | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> Page[Alarm]:
    """Alarms newest first with `since <= opened_at < until` (`pages.newest_first`)."""
    conditions = opened_filters(Alarm, stream_id=stream_id, state=state, since=since, until=until)
    if detector is not None:
        conditions.append(Alarm.detector == detector)
    return newest_first(session, Alarm, conditions, limit=limit, cursor=cursor)
