from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import pytest

from app.errors import ArtifactError, DataError
from app.monitoring import monitor as monitor_module
from app.monitoring.alarms import AlarmEvent, AlarmPolicy
from app.monitoring.monitor import (
    CusumConfig,
    LevelConfig,
    MahalanobisConfig,
    Monitor,
    MonitorConfig,
    PointConfig,
    RollingRMSConfig,
    VarianceFloorConfig,
)


@pytest.fixture
def monitor_module_few(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Set below how many monitors `update_many` steps them one by one (0: always numpy)."""

    def set_few(few: int) -> None:
        monkeypatch.setattr(monitor_module, "FEW_MONITORS", few)

    return set_few


def config(channels: int = 1, policy: AlarmPolicy | None = None) -> MonitorConfig:
    detectors: list[object] = [
        PointConfig(threshold=2.5),
        RollingRMSConfig(threshold=1.3, window=30),
        VarianceFloorConfig(threshold=0.45, window=8, alarm=AlarmPolicy(k=2, n=4, m=6)),
        CusumConfig(threshold=9.0, sigma=1.0, kappa=1.4, clip=9.0),
        LevelConfig(threshold=0.3, window=5),
    ]
    if channels > 1:
        detectors.append(MahalanobisConfig(threshold=12.0, covariance=[[1.0, 0.6], [0.6, 1.0]]))
    return MonitorConfig.model_validate(
        {
            "channels": channels,
            "alarm": (policy or AlarmPolicy(k=1, n=1, m=10)).model_dump(),
            "detectors": [d.model_dump() for d in detectors],  # type: ignore[attr-defined]
        }
    )


def random_stream(seed: int, count: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Heavy-tailed residuals with bursts, calm stretches, missing readings and missing refs."""
    rng = np.random.default_rng(seed)
    residuals = rng.standard_t(4, size=(count, channels))
    residuals[count // 3 : count // 3 + 80] *= 2.5  # a burst of energy
    residuals[count // 2 : count // 2 + 60, 0] = 0.01 * rng.standard_normal(60)  # frozen-ish
    residuals[rng.random(count) < 0.03, 0] = np.nan
    gaps = 0.1 * rng.standard_normal(count)
    gaps[2 * count // 3 : 2 * count // 3 + 50] += 0.8  # an offset the reference sees
    gaps[rng.random(count) < 0.05] = np.nan
    return (residuals[:, 0] if channels == 1 else residuals), gaps


def step_all(
    monitor: Monitor, residuals: np.ndarray, gaps: np.ndarray
) -> tuple[dict[str, np.ndarray], list[AlarmEvent], list[AlarmEvent]]:
    stats: dict[str, list[float]] = {k: [] for k in monitor.detectors}
    opened: list[AlarmEvent] = []
    closed: list[AlarmEvent] = []
    for residual, gap in zip(residuals, gaps, strict=True):
        value = float(residual) if np.ndim(residual) == 0 else residual.tolist()
        step = monitor.update(value, reference_gap=None if math.isnan(gap) else float(gap))
        for kind, statistic in step.statistics.items():
            stats[kind].append(math.nan if statistic is None else statistic)
        opened += step.opened
        closed += step.closed
    return {k: np.array(v) for k, v in stats.items()}, opened, closed


@pytest.mark.parametrize(("seed", "channels"), [(0, 1), (1, 1), (2, 2)])
def test_update_and_run_agree_exactly_on_every_sample(seed: int, channels: int) -> None:
    residuals, gaps = random_stream(seed, 3000, channels)
    stepped_stats, opened, closed = step_all(Monitor(config(channels)), residuals, gaps)
    batch_monitor = Monitor(config(channels))
    run = batch_monitor.run(residuals, gaps)
    for kind, values in stepped_stats.items():
        assert np.array_equal(run.statistics[kind], values, equal_nan=True), kind
    assert sorted(run.opened, key=repr) == sorted(opened, key=repr)
    assert sorted(run.closed, key=repr) == sorted(closed, key=repr)
    assert len(run.opened) > 10  # the stream does alarm: this is not a vacuous comparison
    assert {e.detector for e in run.opened} >= {"point", "rolling_rms", "cusum", "level"}


@pytest.mark.parametrize("few", [0, monitor_module.FEW_MONITORS], ids=["numpy", "default"])
@pytest.mark.parametrize("channels", [1, 2])
def test_many_monitors_stepped_together_equal_each_stepped_alone(
    channels: int, few: int, monitor_module_few: Callable[[int], None]
) -> None:
    """Streams at different ages (warming up, alarming, quiet), one reading each per tick:
    through numpy across the streams, and by default (one by one while they are few)."""
    monitor_module_few(few)
    streams = 12
    records = [random_stream(10 + i, 900, channels) for i in range(streams)]
    shared = config(channels)
    alone = [Monitor(shared) for _ in range(streams)]
    together = [Monitor(shared) for _ in range(streams)]
    expected = [step_all(m, r[:900], g[:900]) for m, (r, g) in zip(alone, records, strict=True)]
    stats: list[dict[str, list[float]]] = [{k: [] for k in together[0].detectors} for _ in together]
    opened: list[list[AlarmEvent]] = [[] for _ in together]
    closed: list[list[AlarmEvent]] = [[] for _ in together]
    for tick in range(900 + 60 * streams):
        # Stream i starts at tick 60 i: every tick mixes streams of different ages.
        active = [i for i in range(streams) if 0 <= tick - 60 * i < 900]
        rows = np.array([records[i][0][tick - 60 * i] for i in active], dtype=np.float64)
        gaps = np.array([records[i][1][tick - 60 * i] for i in active], dtype=np.float64)
        steps = Monitor.update_many([together[i] for i in active], rows, gaps)
        assert steps.still_open == {
            row for row, i in enumerate(active) if together[i].open_events()
        }  # the rows whose results need `open_events`, and only those
        for i, step in zip(active, steps, strict=True):
            assert step.sample == tick - 60 * i
            for kind, statistic in step.statistics.items():
                stats[i][kind].append(math.nan if statistic is None else statistic)
            opened[i] += step.opened
            closed[i] += step.closed
    for i in range(streams):
        expected_stats, expected_opened, expected_closed = expected[i]
        for kind, values in expected_stats.items():
            assert np.array_equal(np.array(stats[i][kind]), values, equal_nan=True), (i, kind)
        assert opened[i] == expected_opened
        assert closed[i] == expected_closed
        assert together[i].state_dict() == alone[i].state_dict()
    assert sum(len(events) for events in opened) > 10 * streams  # they do alarm


@pytest.mark.parametrize("few", [0, monitor_module.FEW_MONITORS], ids=["numpy", "default"])
def test_many_monitors_refuse_an_infinite_residual_before_changing_any(
    few: int, monitor_module_few: Callable[[int], None]
) -> None:
    monitor_module_few(few)
    monitors = [Monitor(config()) for _ in range(3)]
    before = [m.state_dict() for m in monitors]
    with pytest.raises(DataError, match="sample 0: the residual is infinite"):
        Monitor.update_many(monitors, np.array([0.1, np.inf, 0.2]), np.zeros(3))
    assert [m.state_dict() for m in monitors] == before


def test_many_monitors_must_share_one_configuration() -> None:
    with pytest.raises(ValueError, match="one configuration"):
        Monitor.update_many([Monitor(config()), Monitor(config(2))], np.zeros((2, 1)))


def test_a_batch_replay_can_be_continued_one_reading_at_a_time() -> None:
    residuals, gaps = random_stream(4, 2000, 1)
    whole = Monitor(config())
    whole_stats, whole_opened, whole_closed = step_all(whole, residuals, gaps)
    resumed = Monitor(config())
    run = resumed.run(residuals[:1234], gaps[:1234])
    rest_stats, rest_opened, rest_closed = step_all(resumed, residuals[1234:], gaps[1234:])
    for kind in whole_stats:
        combined = np.concatenate([run.statistics[kind], rest_stats[kind]])
        assert np.array_equal(combined, whole_stats[kind], equal_nan=True)
    assert run.opened + rest_opened == whole_opened
    assert run.closed + rest_closed == whole_closed  # same events, closed at the same samples
    assert resumed.state_dict() == whole.state_dict()


def test_state_saved_mid_stream_as_json_gives_an_identical_continuation() -> None:
    residuals, gaps = random_stream(5, 2000, 2)
    original = Monitor(config(2))
    step_all(original, residuals[:1000], gaps[:1000])
    cut = 1000
    while len(original.open_events()) < 2:  # cut where events are open: the hard case
        step_all(original, residuals[cut : cut + 1], gaps[cut : cut + 1])
        cut += 1
    saved = json.loads(json.dumps(original.state_dict(), allow_nan=False))
    restored = Monitor.from_state(config(2), saved)
    assert restored.open_events() == original.open_events()
    a = step_all(original, residuals[cut:], gaps[cut:])
    b = step_all(restored, residuals[cut:], gaps[cut:])
    assert a[2]  # the open events do close after the cut
    for kind in a[0]:
        assert np.array_equal(a[0][kind], b[0][kind], equal_nan=True)
    assert a[1:] == b[1:]
    assert original.state_dict() == restored.state_dict()


def test_an_empty_batch_changes_nothing() -> None:
    monitor = Monitor(config())
    monitor.run(np.ones(100))
    before = monitor.state_dict()
    run = monitor.run(np.zeros(0))
    assert run.opened == run.closed == [] and monitor.state_dict() == before


def test_state_size_does_not_grow_with_the_stream() -> None:
    residuals, gaps = random_stream(6, 4000, 1)
    monitor = Monitor(config())
    monitor.run(residuals[:1000], gaps[:1000])
    size = len(json.dumps(monitor.state_dict()))
    monitor.run(residuals[1000:], gaps[1000:])
    assert len(json.dumps(monitor.state_dict())) < size + 200


def test_state_for_another_configuration_is_refused() -> None:
    saved = Monitor(config(2)).state_dict()
    with pytest.raises(DataError, match="detectors"):
        Monitor.from_state(config(1), saved)
    with pytest.raises(DataError, match="version"):
        Monitor.from_state(config(2), {**saved, "version": 99})


def test_a_missing_reading_is_skipped_and_never_poisons_a_statistic() -> None:
    rng = np.random.default_rng(7)
    clean = rng.standard_normal(300)
    with_gaps = np.insert(clean, [50, 120, 120, 200], np.nan)
    a = Monitor(config()).run(clean)
    b = Monitor(config()).run(with_gaps)
    missing = np.isnan(with_gaps)
    for kind in ("point", "rolling_rms", "variance_floor", "cusum"):
        assert np.all(np.isnan(b.statistics[kind][missing]))  # no statistic at a missing sample
        # ... and the others are exactly those of the record without the missing readings.
        assert np.array_equal(b.statistics[kind][~missing], a.statistics[kind], equal_nan=True)
        assert not b.exceeded[kind][missing].any()
    step = Monitor(config()).update(math.nan)
    assert all(v is None for v in step.statistics.values())


def test_an_infinite_residual_is_refused_and_leaves_the_state_untouched() -> None:
    monitor = Monitor(config())
    monitor.run(np.ones(40))
    before = monitor.state_dict()
    with pytest.raises(DataError, match="sample 40: the residual is infinite"):
        monitor.update(math.inf)
    with pytest.raises(DataError, match="sample 42: the residual is infinite"):
        monitor.run(np.array([1.0, 1.0, -math.inf]))
    with pytest.raises(DataError, match="reference gap is infinite"):
        monitor.update(1.0, reference_gap=math.inf)
    assert monitor.state_dict() == before


def test_no_alarm_before_a_window_is_full() -> None:
    monitor = Monitor(config())
    residuals = np.full(29, 100.0)  # huge, but the 30-sample RMS window is not full yet
    run = monitor.run(residuals)
    assert np.all(np.isnan(run.statistics["rolling_rms"]))
    assert not any(e.detector == "rolling_rms" for e in run.opened)
    assert monitor.update(100.0).exceeded["rolling_rms"]  # the 30th sample fills it


def test_level_is_silent_without_a_reference() -> None:
    monitor = Monitor(config())
    run = monitor.run(np.zeros(100))
    assert np.all(np.isnan(run.statistics["level"]))
    step = monitor.update(0.0)
    assert step.statistics["level"] is None and not step.exceeded["level"]
    for _ in range(5):
        step = monitor.update(0.0, reference_gap=0.8)
    assert step.exceeded["level"]


def test_level_keeps_a_sustained_offset_open_for_its_whole_duration() -> None:
    rng = np.random.default_rng(8)
    gaps = 0.07 * rng.standard_normal(600)
    gaps[200:300] += 0.8
    run = Monitor(config()).run(0.3 * rng.standard_normal(600), gaps)
    events = [e for e in run.closed if e.detector == "level"]
    assert len(events) == 1
    assert events[0].start <= 202 and events[0].end is not None and events[0].end >= 299


def test_mahalanobis_sees_a_broken_correlation_each_channel_alone_does_not() -> None:
    rng = np.random.default_rng(9)
    covariance = [[1.0, 0.9], [0.9, 1.0]]
    holdout = rng.multivariate_normal([0, 0], covariance, size=5000)
    estimated = np.cov(holdout, rowvar=False)
    marginal = 1.1 * np.abs(holdout).max(axis=0)  # each channel's own hold-out range
    d2 = np.einsum("ij,jk,ik->i", holdout, np.linalg.inv(estimated), holdout)
    cfg = MonitorConfig(
        channels=2,
        detectors=[
            PointConfig(threshold=float(marginal[0])),
            MahalanobisConfig(threshold=1.1 * float(d2.max()), covariance=estimated.tolist()),
        ],
    )
    monitor = Monitor(cfg)
    monitor.run(holdout[:100])
    broken = [1.5, -1.5]  # each well inside its marginal range, but against the correlation
    assert np.all(np.abs(broken) < marginal)
    step = monitor.update(broken)
    assert step.exceeded["mahalanobis"] and not step.exceeded["point"]
    assert [e.detector for e in step.opened] == ["mahalanobis"]


def test_config_from_manifest() -> None:
    cfg = config(2)
    assert MonitorConfig.from_manifest({"thresholds": cfg.model_dump(mode="json")}) == cfg
    with pytest.raises(ArtifactError, match="twinwatch calibrate"):
        MonitorConfig.from_manifest({})
    broken = cfg.model_dump(mode="json")
    broken["detectors"][0]["threshold"] = "high"
    with pytest.raises(ArtifactError, match="thresholds are invalid"):
        MonitorConfig.from_manifest({"thresholds": broken})


def test_wrong_number_of_channels_is_refused() -> None:
    with pytest.raises(DataError, match="2 residual channel"):
        Monitor(config(1)).update([1.0, 2.0])
    with pytest.raises(DataError, match="watches 2"):
        Monitor(config(2)).run(np.zeros(5))
