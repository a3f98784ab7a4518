from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from app.errors import DataError
from app.monitoring.alarms import AlarmEvent, AlarmPolicy, AlarmRule


def stepped(rule: AlarmRule, flags: list[bool | None]) -> tuple[list[AlarmEvent], list[AlarmEvent]]:
    """Feed exceedance flags (None: no statistic) with statistic = sample index + 1."""
    opened: list[AlarmEvent] = []
    closed: list[AlarmEvent] = []
    for sample, flag in enumerate(flags):
        if flag is None:
            continue
        o, c = rule.observe(sample, float(sample + 1), flag)
        opened += [o] if o else []
        closed += [c] if c else []
    return opened, closed


def rule(k: int = 1, n: int = 1, m: int = 3, direction: str = "above") -> AlarmRule:
    return AlarmRule("point", AlarmPolicy(k=k, n=n, m=m), threshold=1.0, direction=direction)  # type: ignore[arg-type]


def test_persistence_opens_on_the_kth_exceedance_within_n() -> None:
    opened, _ = stepped(rule(k=2, n=3), [True, False, True])
    assert [e.start for e in opened] == [2]
    opened, _ = stepped(rule(k=2, n=3), [True, False, False, True])  # 4 apart: never 2 in 3
    assert opened == []
    opened, _ = stepped(rule(k=3, n=3), [True, True, True])
    assert [e.start for e in opened] == [2]


def test_clear_needs_exactly_m_quiet_samples() -> None:
    _, closed = stepped(rule(m=3), [True, False, False])
    assert closed == []  # two quiet samples: still open
    _, closed = stepped(rule(m=3), [True, False, False, False])
    assert closed == [AlarmEvent("point", 0, 1, 1.0, 1.0, cleared_at=3)]
    # An exceedance on the m-th sample keeps the same event going.
    opened, closed = stepped(rule(m=3), [True, False, False, True, False, False, False])
    assert len(opened) == 1
    assert closed == [AlarmEvent("point", 0, 4, 4.0, 1.0, cleared_at=6)]


def test_samples_without_statistic_neither_clear_nor_fill_the_window() -> None:
    _, closed = stepped(rule(m=2), [True, None, None, False, None, False])
    assert closed == [AlarmEvent("point", 0, 1, 1.0, 1.0, cleared_at=5)]
    opened, _ = stepped(rule(k=2, n=2), [True, None, None, True])
    assert [e.start for e in opened] == [3]  # the gap is skipped: the two are adjacent


def test_peak_is_the_most_extreme_statistic_in_the_alarming_direction() -> None:
    below = rule(direction="below", m=1)
    below.observe(0, 0.5, True)
    below.observe(1, 0.1, True)
    below.observe(2, 0.3, True)
    _, closed = below.observe(3, 2.0, False)
    assert closed is not None and closed.peak == 0.1 and closed.end == 3


def test_policy_validation() -> None:
    with pytest.raises(ValidationError):
        AlarmPolicy(k=3, n=2)
    with pytest.raises(ValidationError):
        AlarmPolicy(m=0)


@pytest.mark.parametrize(("k", "n", "m"), [(1, 1, 1), (1, 1, 20), (2, 3, 5), (3, 10, 2)])
def test_batch_equals_incremental(k: int, n: int, m: int) -> None:
    rng = np.random.default_rng(k * 100 + n * 10 + m)
    count = 3000
    statistics = rng.exponential(size=count)
    flags = statistics > rng.choice([1.0, 2.5, 4.0])
    samples = np.sort(rng.choice(np.arange(2 * count), size=count, replace=False))
    one, other = rule(k, n, m), rule(k, n, m)
    opened, closed = [], []
    for s, x, f in zip(samples.tolist(), statistics.tolist(), flags.tolist(), strict=True):
        o, c = one.observe(s, x, f)
        opened += [o] if o else []
        closed += [c] if c else []
    cut = count // 3
    o1, c1 = other.run(samples[:cut], statistics[:cut], flags[:cut])
    o2, c2 = other.run(samples[cut:], statistics[cut:], flags[cut:])
    assert [*o1, *o2] == opened
    assert [*c1, *c2] == closed
    assert one.state_dict() == other.state_dict()
    assert one.current() == other.current()


def test_state_round_trip_mid_event() -> None:
    flags = [True, False, True, False, False, False, True]
    original = rule(k=2, n=3, m=3)
    stepped(original, flags[:3])
    restored = rule(k=2, n=3, m=3)
    restored.load_state_dict(original.state_dict())
    for sample in range(3, len(flags)):
        assert original.observe(sample, 1.0, flags[sample]) == restored.observe(
            sample, 1.0, flags[sample]
        )
    with pytest.raises(DataError):
        restored.load_state_dict({"seen": 1, "recent": [5], "open": None})
    with pytest.raises(DataError):
        restored.load_state_dict({"seen": 1})
