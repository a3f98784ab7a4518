"""One labelled file through twinwatch as a user would run it: the stream learns from the file's
normal prefix only, then every row is monitored in order.

In-process (`run_in_process`), the code is the service's own: `app.learning.learn` for the fit,
then `monitor_revising` (the recurrence with the learning readings silent, as `handover.adopt`
runs it, and the thresholds revised every ten learning periods, as `Learner.revise` does; the
service applies a revision from whichever reading its background job reaches, this from the
revision point). Over HTTP (`run_over_http`), a stream of model "auto" is created on a running
service, every row is posted, and its alarms are read back.

Either way the result is the alarm state of every row, as the service said it at that reading:
alarmed from the reading that opened an alarm up to the one that closed it, except where a
re-opened alarm had closed for a while (its `gaps`, app/monitoring/incidents.py).

A reference detector (`run_reference`, app/benchmark/reference.py) goes the in-process way from
its alarm events on: the same alarm state, the same incidents.

A stream that cannot learn (or take the file) raises: the caller records it as the file's error.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.benchmark.datasets import LabelledFile
from app.benchmark.reference import Reference, alarm_events, tail_probability
from app.errors import AppError, DataError
from app.learning.learn import LearnedModel, learn, sample_period
from app.monitoring.alarms import AlarmEvent
from app.monitoring.incidents import incident_spans
from app.streams.blocks import Readings
from app.streams.learning import monitor_revising
from app.twin.client import ServiceClient

POST_BATCH = 1000


@dataclass
class FileRun:
    alarmed: np.ndarray  # (rows,) bool
    incidents: list[tuple[int, int | None]] = field(default_factory=list)  # [opened, closed)
    events: list[dict[str, Any]] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)  # channel -> model kind
    sample_period_s: float = math.nan
    threshold: float | None = None  # a reference's, on its statistic


def _span(alarmed: np.ndarray, start: int, stop: int | None) -> None:
    alarmed[start : alarmed.shape[0] if stop is None else stop] = True


def _from_events(rows: int, events: list[AlarmEvent], sample_period_s: float) -> FileRun:
    """The alarm state and incidents of a record's events (samples: row numbers)."""
    alarmed = np.zeros(rows, dtype=bool)
    for event in events:  # what the service said at each reading (a re-opened alarm's gaps too)
        _span(alarmed, event.start, event.cleared_at)
    return FileRun(
        alarmed,
        incidents=incident_spans(events),
        events=[
            {"detector": e.detector, "opened": e.start, "closed": e.cleared_at, "peak": e.peak}
            for e in sorted(events, key=lambda e: e.start)
        ],
        sample_period_s=sample_period_s,
    )


def run_in_process(
    labelled: LabelledFile, learn_rows: int, *, false_alarms_per_day: float = 1.0
) -> FileRun:
    learned: LearnedModel = learn(
        labelled.times[:learn_rows],
        labelled.values[:learn_rows],
        false_alarms_per_day=false_alarms_per_day,
    )
    events, _ = monitor_revising(
        learned, Readings.of_one(labelled.times, labelled.values), learned_from=learn_rows
    )
    run = _from_events(labelled.rows, events, learned.sample_period_s)
    run.models = dict(zip(labelled.channels, learned.kinds, strict=True))
    return run


def run_reference(
    reference: Reference,
    labelled: LabelledFile,
    learn_rows: int,
    *,
    false_alarms_per_day: float = 1.0,
) -> FileRun:
    """A reference detector on one file, learning from the same rows under the same budget."""
    tail = tail_probability(labelled.times, learn_rows, false_alarms_per_day)
    statistic = reference.statistic(labelled.values, learn_rows, tail)
    events = alarm_events(statistic.values, statistic.threshold, reference.name)
    run = _from_events(labelled.rows, events, sample_period(labelled.times[:learn_rows]))
    run.threshold = statistic.threshold
    return run


def _body(labelled: LabelledFile, start: int, stop: int) -> list[dict[str, Any]]:
    return [
        {
            "t": int(t) / 1e6,
            "values": {
                name: None if math.isnan(v) else float(v)
                for name, v in zip(labelled.channels, row.tolist(), strict=True)
            },
        }
        for t, row in zip(labelled.times[start:stop], labelled.values[start:stop], strict=True)
    ]


def run_over_http(
    client: ServiceClient,
    labelled: LabelledFile,
    learn_rows: int,
    *,
    false_alarms_per_day: float = 1.0,
    keep: bool = False,
    timeout_s: float = 600.0,
) -> FileRun:
    stream_id = f"benchmark-{uuid.uuid4().hex[:12]}"
    client.put_stream(
        stream_id,
        {
            "model": "auto",
            "channels": labelled.channels,
            "learning": {"readings": learn_rows},
            "false_alarms_per_day": false_alarms_per_day,
        },
    )
    try:
        for start in range(0, labelled.rows, POST_BATCH):
            client.post_readings(stream_id, _body(labelled, start, start + POST_BATCH))
        deadline = time.monotonic() + timeout_s
        while True:
            stream = client.get_stream(stream_id) or {}
            learning = stream.get("learning") or {}
            if stream.get("phase") == "monitoring" or learning.get("error"):
                break
            if time.monotonic() > deadline:
                raise AppError(f"{labelled.name}: the stream did not learn in {timeout_s:g} s")
            time.sleep(0.05)
        if learning.get("error"):
            raise DataError(f"the stream could not learn: {learning['error']}")
        alarmed = np.zeros(labelled.rows, dtype=bool)
        alarms = client.alarms(stream_id)
        for alarm in alarms:  # its span, but for the gaps while it had closed
            own = np.zeros(labelled.rows, dtype=bool)
            _span(own, alarm["opened_sample"], alarm["closed_sample"])
            for low, high in alarm.get("gaps") or []:
                own[low:high] = False
            alarmed |= own
        incidents = sorted(
            (i["opened_sample"], i["closed_sample"]) for i in client.incidents(stream_id)
        )
        learned = stream.get("learned_model") or {}
        return FileRun(
            alarmed,
            incidents=incidents,
            events=[
                {
                    "detector": a["detector"],
                    "opened": a["opened_sample"],
                    "closed": a["closed_sample"],
                    "peak": a["peak"],
                }
                for a in sorted(alarms, key=lambda a: a["opened_sample"])
            ],
            models={name: c["kind"] for name, c in learned.get("channels", {}).items()},
            sample_period_s=float(stream.get("sample_period_s") or math.nan),
        )
    finally:
        if not keep:
            client.delete_stream(stream_id)
