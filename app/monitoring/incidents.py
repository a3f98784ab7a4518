"""Alarm hygiene: when two alarms are one.

- An alarm that closes and opens again within `QUIET_TO_JOIN` readings is the same alarm,
  extended (the row is re-opened, its first reading kept): a fault whose statistic dips under
  the threshold for a moment is not two alarms.
- The alarms of one stream that overlap, touch or follow each other within the same quiet
  window form an incident: the unit an operator acknowledges. One fault usually trips several
  detectors (its edges the point detector, its duration the shift or RMS detector); it is one
  incident.

The rule is written once here: `joins` decides as alarms arrive (the database's alarm and
incident rows), `group` over a finished record (the benchmark and the evaluations).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.monitoring.alarms import AlarmEvent

QUIET_TO_JOIN = 20
"""Readings between an alarm closing and the next opening under which the two are joined."""


def joins(closed_sample: int | None, opening_sample: int, quiet: int = QUIET_TO_JOIN) -> bool:
    """Whether an alarm opening at `opening_sample` continues one that closed at
    `closed_sample` (None: still open)."""
    return closed_sample is None or opening_sample - closed_sample <= quiet


def group(
    spans: Iterable[tuple[int, int | None]], quiet: int = QUIET_TO_JOIN
) -> list[tuple[int, int | None]]:
    """Incidents from alarm spans [opened, closed) (closed None: still open), in order."""
    incidents: list[list[int | None]] = []
    for start, stop in sorted(spans, key=lambda span: span[0]):
        if incidents and joins(incidents[-1][1], start, quiet):
            end = incidents[-1][1]
            incidents[-1][1] = None if end is None or stop is None else max(end, stop)
        else:
            incidents.append([start, stop])
    return [(int(start or 0), stop) for start, stop in incidents]


def alarm_spans(
    events: Sequence[AlarmEvent], quiet: int = QUIET_TO_JOIN
) -> list[tuple[str, int, int | None]]:
    """The alarms (detector, opened, closed) a record's events make once each detector's
    re-openings within the quiet window are joined: what the service's alarm rows hold."""
    out: list[tuple[str, int, int | None]] = []
    for detector in sorted({event.detector for event in events}):
        spans = [(e.start, e.cleared_at) for e in events if e.detector == detector]
        out += [(detector, start, stop) for start, stop in group(spans, quiet)]
    return sorted(out, key=lambda span: (span[1], span[0]))


def incident_spans(
    events: Sequence[AlarmEvent], quiet: int = QUIET_TO_JOIN
) -> list[tuple[int, int | None]]:
    """The incidents (opened, closed) a record's events make."""
    return group([(e.start, e.cleared_at) for e in events], quiet)
