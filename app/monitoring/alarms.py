"""Alarm events: exceedances of one detector turned into events with a start, an end and a peak.

Persistence: an event opens on the reading that brings the number of exceedances among the last
`n` readings to `k`. Clear: it closes once `m` consecutive readings are back inside the
threshold; its `end` is one past its last exceedance and `cleared_at` the reading that closed
it. Counting is per event, never per reading. The defaults (k = n = 1) open on every single
exceedance, and m = 20 keeps one disturbance (a spike and its echo in the next forecasts) one
event.

Readings without a statistic (warm-up, a missing reading, no reference) are no evidence either
way: the rule skips them, so they neither fill a slot among the last `n` nor count toward
clearing.

The rule is a state machine over the readings that have a statistic, and it visits only the
exceedances of a block (between two of them every reading is quiet, and quiet readings can only
close an event). A rule with nothing open and no exceedance among its last `n` readings is
*idle*: it forgets its count, so its state is the same however the readings were grouped into
blocks, and a block in which an idle rule sees no exceedance costs nothing.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.errors import DataError
from app.monitoring.detectors import Direction

MAX_ALARM_WINDOW = 100_000
"""The longest alarm window (`n`) and clearing run (`m`): ~3 hours at 10 Hz, a day at 1 s."""


class AlarmPolicy(BaseModel):
    """k exceedances in the last n readings open an alarm; m readings back inside close it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    k: int = Field(strict=True, default=1, ge=1, le=MAX_ALARM_WINDOW)
    n: int = Field(strict=True, default=1, ge=1, le=MAX_ALARM_WINDOW)
    m: int = Field(strict=True, default=20, ge=1, le=MAX_ALARM_WINDOW)
    clear: float = Field(
        default=1.0,
        strict=True,
        gt=0,
        le=1,
        description="A reading of an open alarm counts as back inside only once its statistic "
        "is within this share of the way from where it rests in normal operation to the "
        "threshold (for detectors whose resting value is known: the point, shift, level, CUSUM "
        "and Mahalanobis statistics, and a learned stream's rolling RMS): 1 closes on the "
        "threshold itself, less keeps a fault whose statistic hovers about its threshold one "
        "alarm.",
    )

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
    detail: tuple[float, ...] | None = None  # per channel, what made the peak (see Monitor)

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
            "detail": None if self.detail is None else list(self.detail),
        }


@dataclass(slots=True)
class OpenAlarm:
    start: int  # sample of the reading that opened it
    peak: float
    last: int  # ordinal of its last exceedance
    last_sample: int  # that exceedance's sample
    detail: tuple[float, ...] | None = None  # per channel, at the peak


@dataclass(slots=True)
class RuleState:
    """One stream's state of one detector's rule. Ordinals count the readings with a statistic
    since the rule was last idle (the first exceedance after idling is ordinal 0)."""

    seen: int = 0  # the ordinal of the next reading with a statistic
    recent: list[int] = field(default_factory=list)  # ordinals of exceedances among the last n
    open: OpenAlarm | None = None

    @property
    def idle(self) -> bool:
        return self.open is None and not self.recent

    def copy(self) -> RuleState:
        """An independent copy (`AlarmRule.observe` changes a state in place)."""
        event = self.open
        return RuleState(
            self.seen,
            list(self.recent),
            None if event is None else copy.copy(event),
        )

    def to_json(self) -> dict[str, Any]:
        event = self.open
        return {
            "seen": self.seen,
            "recent": list(self.recent),
            "open": None
            if event is None
            else {
                "start": event.start,
                "peak": event.peak,
                "last": event.last,
                "last_sample": event.last_sample,
                "detail": None if event.detail is None else list(event.detail),
            },
        }

    @classmethod
    def from_json(cls, saved: Any, policy: AlarmPolicy, detector: str) -> RuleState:
        return cls.parse(saved, detector).checked(policy, detector)

    @classmethod
    def parse(cls, saved: Any, detector: str) -> RuleState:
        """What `to_json` wrote, not yet checked against a rule (`checked`)."""
        try:
            raw = saved["open"]
            event = (
                None
                if raw is None
                else OpenAlarm(
                    start=int(raw["start"]),
                    peak=float(raw["peak"]),
                    last=int(raw["last"]),
                    last_sample=int(raw["last_sample"]),
                    detail=None
                    if raw.get("detail") is None
                    else tuple(float(x) for x in raw["detail"]),
                )
            )
            return cls(int(saved["seen"]), [int(x) for x in saved["recent"]], event)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"alarm state of {detector} is malformed: {exc!r}") from None

    def checked(self, policy: AlarmPolicy, detector: str) -> RuleState:
        """This state (just read back: it is not copied), if a rule of `policy` can continue
        from it (a DataError if not)."""
        seen, recent, event = self.seen, self.recent, self.open
        consistent = seen >= 0 and all(seen - policy.n <= x < seen for x in recent)
        if event is not None:
            consistent = consistent and 0 <= event.last < seen and math.isfinite(event.peak)
        if not consistent:
            raise DataError(f"alarm state of {detector} is inconsistent")
        if self.idle:
            self.seen = 0
        return self


class AlarmRule:
    """The persistence and clear rule of one detector (shared by every stream configured alike;
    each stream has its own `RuleState`)."""

    def __init__(
        self, detector: str, policy: AlarmPolicy, *, threshold: float, direction: Direction
    ) -> None:
        self.detector = detector
        self.policy = policy
        self.threshold = threshold
        self.direction = direction

    def current(self, state: RuleState) -> AlarmEvent | None:
        """The open event with its peak so far, if any."""
        event = state.open
        if event is None:
            return None
        return AlarmEvent(
            self.detector, event.start, None, event.peak, self.threshold, detail=event.detail
        )

    def observe(
        self,
        state: RuleState,
        samples: Sequence[int],
        statistics: Sequence[float],
        exceedances: Sequence[int],
        details: Sequence[Sequence[float]] | None = None,
        lingering: Sequence[int] = (),
    ) -> tuple[list[AlarmEvent], list[AlarmEvent]]:
        """Advance `state` by a block of readings with a statistic (their `samples` and
        `statistics`, in order; `exceedances`: the positions among them that are on the alarming
        side; `details`: per exceedance, what it is made of per channel, if anything;
        `lingering`: the positions inside the threshold but not yet back within its `clear`
        share, which keep an open alarm open and open none). Returns the events opened and
        closed, in order."""
        opened: list[AlarmEvent] = []
        closed: list[AlarmEvent] = []
        policy = self.policy
        base = state.seen  # the ordinal of samples[0]
        marks = [(index, number) for number, index in enumerate(exceedances)]
        if lingering:
            marks = sorted([*marks, *((index, -1) for index in lingering)])
        for index, number in marks:
            if number < 0:  # lingering: it only holds an open alarm open
                if state.open is not None:
                    self._settle(state, base + index - 1, base, samples, closed)
                    still = state.open
                    if still is not None:
                        still.last, still.last_sample = base + index, samples[index]
                continue
            if state.idle:
                base = -index  # an idle rule counts from its next exceedance
            else:
                self._settle(state, base + index - 1, base, samples, closed)
                if state.idle:
                    base = -index
            ordinal = base + index
            state.recent.append(ordinal)
            while state.recent[0] <= ordinal - policy.n:
                del state.recent[0]
            statistic = statistics[index]
            detail = None if details is None else tuple(details[number])
            event = state.open
            if event is not None:
                event.last, event.last_sample = ordinal, samples[index]
                if statistic > event.peak if self.direction == "above" else statistic < event.peak:
                    event.peak, event.detail = statistic, detail
            elif len(state.recent) >= policy.k:
                state.open = OpenAlarm(samples[index], statistic, ordinal, samples[index], detail)
                opened.append(
                    AlarmEvent(
                        self.detector,
                        samples[index],
                        None,
                        statistic,
                        self.threshold,
                        detail=detail,
                    )
                )
        if not state.idle and samples:
            self._settle(state, base + len(samples) - 1, base, samples, closed)
        if state.idle:
            state.seen = 0
        elif samples:
            state.seen = base + len(samples)
        return opened, closed

    def _settle(
        self,
        state: RuleState,
        through: int,
        base: int,
        samples: Sequence[int],
        closed: list[AlarmEvent],
    ) -> None:
        """Apply the quiet readings up to ordinal `through` (the last exceedance came before
        them): close the open event after m of them, forget exceedances older than n."""
        policy = self.policy
        event = state.open
        if event is not None and through - event.last >= policy.m:
            at = event.last + policy.m
            closed.append(
                AlarmEvent(
                    self.detector,
                    event.start,
                    event.last_sample + 1,
                    event.peak,
                    self.threshold,
                    cleared_at=samples[at - base],
                    detail=event.detail,
                )
            )
            state.open = None
        while state.recent and state.recent[0] <= through - policy.n:
            del state.recent[0]
