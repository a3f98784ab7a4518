from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from app.errors import DataError
from app.monitoring.alarms import AlarmEvent, AlarmPolicy, AlarmRule, RuleState


def stepped(
    rule: AlarmRule, flags: list[bool | None], state: RuleState | None = None
) -> tuple[list[AlarmEvent], list[AlarmEvent]]:
    """Feed exceedance flags one reading at a time (None: no statistic), with statistic =
    sample index + 1."""
    state = state or RuleState()
    opened: list[AlarmEvent] = []
    closed: list[AlarmEvent] = []
    for sample, flag in enumerate(flags):
        if flag is None:
            continue
        o, c = rule.observe(state, [sample], [float(sample + 1)], [0] if flag else [])
        opened += o
        closed += c
    return opened, closed


def rule(
    k: int = 1, n: int = 1, m: int = 3, direction: str = "above", clear: float = 1.0
) -> AlarmRule:
    policy = AlarmPolicy(k=k, n=n, m=m, clear=clear)
    return AlarmRule("point", policy, threshold=1.0, direction=direction)  # type: ignore[arg-type]


def test_persistence_opens_on_the_kth_exceedance_within_n() -> None:
    opened, _ = stepped(rule(k=2, n=3), [True, False, True])
    assert [e.start for e in opened] == [2]
    opened, _ = stepped(rule(k=2, n=3), [True, False, False, True])  # 4 apart: never 2 in 3
    assert opened == []
    opened, _ = stepped(rule(k=3, n=3), [True, True, True])
    assert [e.start for e in opened] == [2]


def test_clear_needs_exactly_m_quiet_readings() -> None:
    _, closed = stepped(rule(m=3), [True, False, False])
    assert closed == []  # two quiet readings: still open
    _, closed = stepped(rule(m=3), [True, False, False, False])
    assert closed == [AlarmEvent("point", 0, 1, 1.0, 1.0, cleared_at=3)]
    # An exceedance on the m-th reading keeps the same event going.
    opened, closed = stepped(rule(m=3), [True, False, False, True, False, False, False])
    assert len(opened) == 1
    assert closed == [AlarmEvent("point", 0, 4, 4.0, 1.0, cleared_at=6)]


def test_readings_without_statistic_neither_clear_nor_fill_the_window() -> None:
    _, closed = stepped(rule(m=2), [True, None, None, False, None, False])
    assert closed == [AlarmEvent("point", 0, 1, 1.0, 1.0, cleared_at=5)]
    opened, _ = stepped(rule(k=2, n=2), [True, None, None, True])
    assert [e.start for e in opened] == [3]  # the gap is skipped: the two are adjacent


def test_peak_is_the_most_extreme_statistic_in_the_alarming_direction() -> None:
    below = rule(direction="below", m=1)
    state = RuleState()
    _, closed = below.observe(state, [0, 1, 2, 3], [0.5, 0.1, 0.3, 2.0], [0, 1, 2])
    assert closed[0].peak == 0.1 and closed[0].end == 3


def test_policy_validation() -> None:
    with pytest.raises(ValidationError):
        AlarmPolicy(k=3, n=2)
    with pytest.raises(ValidationError):
        AlarmPolicy(m=0)
    with pytest.raises(ValidationError):
        AlarmPolicy(n=1_000_000_000)


class PlainRule:
    """The rule written the plainest way, one reading at a time, counting every reading with a
    statistic: what `AlarmRule` must match, however its readings are grouped."""

    def __init__(self, k: int, n: int, m: int) -> None:
        self.k, self.n, self.m = k, n, m
        self.ordinal = 0
        self.exceedances: list[int] = []
        self.open: dict[str, float] | None = None
        self.events: list[AlarmEvent] = []

    def reading(self, sample: int, statistic: float, over: bool, near: bool = False) -> None:
        """`near`: inside the threshold, not yet within its clear share (holds an open alarm)."""
        ordinal, self.ordinal = self.ordinal, self.ordinal + 1
        if near and not over:
            if self.open is not None:
                self.open.update(last=ordinal, last_sample=sample)
        elif over:
            self.exceedances.append(ordinal)
            recent = [o for o in self.exceedances if o > ordinal - self.n]
            if self.open is not None:
                self.open.update(
                    last=ordinal, last_sample=sample, peak=max(self.open["peak"], statistic)
                )
            elif len(recent) >= self.k:
                self.open = {
                    "start": sample,
                    "peak": statistic,
                    "last": ordinal,
                    "last_sample": sample,
                }
        elif self.open is not None and ordinal - self.open["last"] >= self.m:
            event = self.open
            self.events.append(
                AlarmEvent(
                    "point",
                    int(event["start"]),
                    int(event["last_sample"]) + 1,
                    event["peak"],
                    1.0,
                    sample,
                )
            )
            self.open = None


@pytest.mark.parametrize(
    ("k", "n", "m", "clear"),
    [
        (1, 1, 1, 1.0),
        (1, 1, 20, 1.0),
        (2, 3, 5, 1.0),
        (3, 10, 2, 1.0),
        (1, 1, 5, 0.6),
        (2, 3, 3, 0.8),
    ],
)
def test_any_grouping_of_readings_gives_the_plain_rules_events(
    k: int, n: int, m: int, clear: float
) -> None:
    rng = np.random.default_rng(k * 100 + n * 10 + m)
    count = 3000
    statistics = rng.exponential(size=count).tolist()
    limit = float(rng.choice([1.0, 2.5, 4.0]))
    samples = np.sort(rng.choice(np.arange(2 * count), size=count, replace=False)).tolist()
    plain = PlainRule(k, n, m)
    for sample, statistic in zip(samples, statistics, strict=True):
        plain.reading(sample, statistic, statistic > limit, statistic > clear * limit)

    states = []
    for sizes in ([count], [1] * count, rng.integers(1, 200, size=count).tolist()):
        tested, state, closed = rule(k, n, m, clear=clear), RuleState(), []
        start = 0
        for size in sizes:
            part = slice(start, min(count, start + size))
            chunk = statistics[part]
            _, ended = tested.observe(
                state,
                samples[part],
                chunk,
                [i for i, x in enumerate(chunk) if x > limit],
                lingering=[i for i, x in enumerate(chunk) if clear * limit < x <= limit],
            )
            closed += ended
            start = part.stop
            if start >= count:
                break
        assert closed == plain.events
        assert (tested.current(state) is None) == (plain.open is None)
        states.append(state.to_json())
    assert states[0] == states[1] == states[2]  # the same state, however grouped


def test_an_idle_rule_forgets_its_count() -> None:
    state = RuleState()
    stepped(rule(m=2), [True, False, False], state)
    assert state.idle and state.to_json() == RuleState().to_json()
    stepped(rule(m=2), [False] * 50, state)  # quiet readings of an idle rule change nothing
    assert state.to_json() == RuleState().to_json()


def test_state_round_trip_mid_event() -> None:
    flags = [True, False, True, False, False, False, True]
    policy = AlarmPolicy(k=2, n=3, m=3)
    original = RuleState()
    stepped(rule(k=2, n=3, m=3), flags[:3], original)
    restored = RuleState.from_json(original.to_json(), policy, "point")
    for sample in range(3, len(flags)):
        flag = [0] if flags[sample] else []
        assert rule(k=2, n=3, m=3).observe(original, [sample], [1.0], flag) == rule(
            k=2, n=3, m=3
        ).observe(restored, [sample], [1.0], flag)
    with pytest.raises(DataError):
        RuleState.from_json({"seen": 1, "recent": [5], "open": None}, policy, "point")
    with pytest.raises(DataError):
        RuleState.from_json({"seen": 1}, policy, "point")


def test_a_statistic_hovering_about_its_threshold_is_one_alarm_with_hysteresis() -> None:
    hovering = [2.0, 0.9, 0.8, 1.1, 0.95, 0.7, 1.2, 0.85, 0.9, 0.9, 0.75] + [0.1] * 5
    for clear, alarms in ((1.0, 3), (0.6, 1)):
        tested, state, opened = rule(m=2, clear=clear), RuleState(), []
        for sample, statistic in enumerate(hovering):
            o, _ = tested.observe(
                state,
                [sample],
                [statistic],
                [0] if statistic > 1 else [],
                lingering=[0] if clear < statistic <= 1 else [],
            )
            opened += o
        assert len(opened) == alarms
        assert tested.current(state) is None  # closed once the statistic fell below 0.6
