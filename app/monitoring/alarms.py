"""Alarm events: exceedances of one detector turned into events with a start, an end and a peak.

Persistence: an event opens on the sample that brings the number of exceedances among the last
`n` samples to `k`. Clear: it closes once `m` consecutive samples are back inside the threshold;
its `end` is one past its last exceedance and `cleared_at` the sample that closed it. Counting is
per event, never per sample. The defaults (k = n = 1) open on every single-sample exceedance, as
the lab counted, and m = 20 (two periods of the machine's ~11-sample oscillation) keeps one
disturbance, a spike and its echo in the next forecast, one event.

Samples without a statistic (warm-up, a missing reading, no reference) are no evidence either way:
the rule skips them, so they neither fill a slot among the last `n` nor count toward clearing.

The rule is a state machine advanced one sample at a time by the live engine, and over a whole
record by the batch form, which visits only the exceedances (everything between two of them is
quiet, and quiet samples can only close an event): same code, same events, far fewer steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.errors import DataError
from app.monitoring.detectors import Direction


class AlarmPolicy(BaseModel):
    """k exceedances in the last n samples open an event; m samples back inside close it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(default=1, ge=1)
    n: int = Field(default=1, ge=1)
    m: int = Field(default=20, ge=1)

    @model_validator(mode="after")
    def _k_within_n(self) -> AlarmPolicy:
        if self.k > self.n:
            raise ValueError(f"k ({self.k}) cannot exceed n ({self.n})")
        return self


@dataclass(frozen=True)
class AlarmEvent:
    """One alarm: `end` is one past the last exceedance; None (and `cleared_at` None) while open."""

    detector: str
    start: int
    end: int | None
    peak: float
    threshold: float
    cleared_at: int | None = None

    @property
    def is_open(self) -> bool:
        return self.end is None

    def as_json(self) -> dict[str, Any]:
        return {
            "detector": self.detector,
            "start": self.start,
            "end": self.end,
            "peak": self.peak,
            "threshold": self.threshold,
            "cleared_at": self.cleared_at,
        }


@dataclass
class _Open:
    start: int
    peak: float
    last: int  # ordinal (among samples with a statistic) of the last exceedance
    last_sample: int  # its sample index


class AlarmRule:
    """The persistence and clear rule of one detector, with its running state."""

    def __init__(
        self, detector: str, policy: AlarmPolicy, *, threshold: float, direction: Direction
    ) -> None:
        self.detector = detector
        self.policy = policy
        self.threshold = threshold
        self.direction = direction
        self._seen = 0  # samples with a statistic so far (the ordinal of the next one)
        # Ordinals of exceedances among the last n: a list (at most n, usually 1 entry), not a
        # deque, whose first block alone is 0.6 KiB per rule and stream.
        self._recent: list[int] = []
        self._open: _Open | None = None

    # -- the state machine (shared by both forms) --

    def _more_extreme(self, statistic: float, peak: float) -> bool:
        return statistic > peak if self.direction == "above" else statistic < peak

    def _close_if_quiet(self, ordinal: int, sample_of: Any) -> AlarmEvent | None:
        """Close if the samples up to `ordinal` hold m quiet ones after the last exceedance."""
        event = self._open
        if event is None or ordinal - event.last < self.policy.m:
            return None
        self._open = None
        return AlarmEvent(
            detector=self.detector,
            start=event.start,
            end=event.last_sample + 1,
            peak=event.peak,
            threshold=self.threshold,
            cleared_at=int(sample_of(event.last + self.policy.m)),
        )

    def _exceed(self, ordinal: int, sample: int, statistic: float) -> AlarmEvent | None:
        """Record an exceedance; the event if it opens one."""
        self._recent.append(ordinal)
        while self._recent[0] <= ordinal - self.policy.n:
            del self._recent[0]
        event = self._open
        if event is not None:
            event.last, event.last_sample = ordinal, sample
            if self._more_extreme(statistic, event.peak):
                event.peak = statistic
            return None
        if len(self._recent) < self.policy.k:
            return None
        self._open = _Open(start=sample, peak=statistic, last=ordinal, last_sample=sample)
        return self.current()

    def _forget_old(self) -> None:
        while self._recent and self._recent[0] <= self._seen - 1 - self.policy.n:
            del self._recent[0]

    # -- incremental --

    def observe(
        self, sample: int, statistic: float, exceeded: bool
    ) -> tuple[AlarmEvent | None, AlarmEvent | None]:
        """One sample with a statistic: (opened, closed) events, either possibly None."""
        if not exceeded and self._open is None:  # the common case: nothing to open or close
            self._seen += 1
            if self._recent:
                self._forget_old()
            return None, None
        ordinal = self._seen
        self._seen += 1
        opened = closed = None
        if exceeded:
            opened = self._exceed(ordinal, sample, statistic)
        else:
            closed = self._close_if_quiet(ordinal, lambda _: sample)
        self._forget_old()
        return opened, closed

    @staticmethod
    def observe_many(
        rules: Sequence[AlarmRule],
        rows: Sequence[int],
        samples: Sequence[int],
        statistics: Sequence[float],
        exceeded: Sequence[bool],
        *,
        opened: dict[int, list[AlarmEvent]],
        closed: dict[int, list[AlarmEvent]],
        still_open: set[int],
    ) -> None:
        """`observe` on many rules (one per stream, each with its own sample): the events each
        opens or closes go to `opened`/`closed` under its row, and the rows left with an open
        event into `still_open`. A NaN statistic is no sample (the rule is skipped)."""
        for rule, row, sample, statistic, is_over in zip(
            rules, rows, samples, statistics, exceeded, strict=True
        ):
            if not is_over and rule._open is None and not rule._recent:
                if statistic == statistic:  # not NaN
                    rule._seen += 1  # the common case of `observe`, without its call
                continue
            if math.isnan(statistic):  # no sample: the rule holds
                if rule._open is not None:
                    still_open.add(row)
                continue
            event_opened, event_closed = rule.observe(sample, statistic, is_over)
            if event_opened is not None:
                opened.setdefault(row, []).append(event_opened)
            if event_closed is not None:
                closed.setdefault(row, []).append(event_closed)
            if rule._open is not None:
                still_open.add(row)

    # -- batch --

    def run(
        self,
        samples: NDArray[np.int64],
        statistics: NDArray[np.float64],
        exceeded: NDArray[np.bool_],
    ) -> tuple[list[AlarmEvent], list[AlarmEvent]]:
        """Many samples with a statistic: (opened, closed) events in order, as `observe` would."""
        base = self._seen
        count = int(samples.shape[0])

        def sample_of(ordinal: int) -> int:
            return int(samples[ordinal - base])

        opened: list[AlarmEvent] = []
        closed: list[AlarmEvent] = []
        for index in np.flatnonzero(exceeded).tolist():
            ordinal = base + index
            event = self._close_if_quiet(ordinal - 1, sample_of)
            if event is not None:
                closed.append(event)
            event = self._exceed(ordinal, int(samples[index]), float(statistics[index]))
            if event is not None:
                opened.append(event)
        self._seen = base + count
        if count:
            event = self._close_if_quiet(self._seen - 1, sample_of)
            if event is not None:
                closed.append(event)
        self._forget_old()
        return opened, closed

    # -- state --

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def current(self) -> AlarmEvent | None:
        """The open event (peak so far), if any."""
        event = self._open
        if event is None:
            return None
        return AlarmEvent(self.detector, event.start, None, event.peak, self.threshold)

    def state_dict(self) -> dict[str, Any]:
        event = self._open
        return {
            "seen": self._seen,
            "recent": list(self._recent),
            "open": None
            if event is None
            else {
                "start": event.start,
                "peak": event.peak,
                "last": event.last,
                "last_sample": event.last_sample,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            seen = int(state["seen"])
            recent = [int(x) for x in state["recent"]]
            raw = state["open"]
            event = (
                None
                if raw is None
                else _Open(
                    start=int(raw["start"]),
                    peak=float(raw["peak"]),
                    last=int(raw["last"]),
                    last_sample=int(raw["last_sample"]),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"alarm state of {self.detector} is malformed: {exc!r}") from None
        if seen < 0 or any(not (seen - self.policy.n <= x < seen) for x in recent):
            raise DataError(f"alarm state of {self.detector} is inconsistent")
        if event is not None and not (0 <= event.last < seen):
            raise DataError(f"alarm state of {self.detector} is inconsistent")
        self._seen = seen
        self._recent = recent
        self._open = event
