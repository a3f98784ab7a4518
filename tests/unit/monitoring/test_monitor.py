from __future__ import annotations

import json
import math

import numpy as np
import pytest

from app.errors import ArtifactError, DataError
from app.monitoring.alarms import AlarmEvent, AlarmPolicy
from app.monitoring.config import (
    CusumConfig,
    LevelConfig,
    MahalanobisConfig,
    MonitorConfig,
    PointConfig,
    RollingRMSConfig,
    VarianceFloorConfig,
)
from app.monitoring.monitor import Monitor, MonitorState


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
    return residuals, gaps


Outcome = tuple[dict[str, np.ndarray], list[AlarmEvent], list[AlarmEvent]]


def run(
    monitor: Monitor,
    state: MonitorState,
    residuals: np.ndarray,
    gaps: np.ndarray | None = None,
    first: int = 0,
) -> Outcome:
    """One stream's readings in one block: (statistics, opened, closed)."""
    block = monitor.advance(
        [state],
        np.asarray(residuals, dtype=np.float64).reshape(1, len(residuals), -1),
        None if gaps is None else gaps[None],
        first_samples=[first],
    )
    statistics = {kind: values[0] for kind, values in block.statistics.items()}
    return statistics, block.opened.get(0, []), block.closed.get(0, [])


def in_blocks(
    monitor: Monitor,
    residuals: np.ndarray,
    gaps: np.ndarray,
    sizes: list[int],
    state: MonitorState | None = None,
) -> Outcome:
    state = state or monitor.new_state()
    statistics: dict[str, list[np.ndarray]] = {kind: [] for kind in monitor.kinds}
    opened: list[AlarmEvent] = []
    closed: list[AlarmEvent] = []
    start = 0
    for size in sizes:
        if start >= len(residuals):
            break
        stop = min(len(residuals), start + size)
        got, o, c = run(monitor, state, residuals[start:stop], gaps[start:stop], start)
        for kind, values in got.items():
            statistics[kind].append(values)
        opened += o
        closed += c
        start = stop
    return {k: np.concatenate(v) for k, v in statistics.items()}, opened, closed


@pytest.mark.parametrize(("seed", "channels"), [(0, 1), (1, 1), (2, 2)])
def test_any_grouping_of_readings_gives_the_same_statistics_and_events(
    seed: int, channels: int
) -> None:
    residuals, gaps = random_stream(seed, 3000, channels)
    monitor = Monitor(config(channels))
    whole = in_blocks(monitor, residuals, gaps, [3000])
    rng = np.random.default_rng(seed)
    for sizes in ([1] * 3000, rng.integers(1, 300, size=100).tolist()):
        other = in_blocks(monitor, residuals, gaps, sizes)
        for kind in monitor.kinds:
            assert np.array_equal(other[0][kind], whole[0][kind], equal_nan=True)  # exactly
        assert other[1] == whole[1]
        assert other[2] == whole[2]
    assert whole[1] and whole[2]  # the stream does raise and clear alarms


def test_many_streams_in_one_block_equal_each_stream_alone() -> None:
    monitor = Monitor(config())
    streams = [random_stream(seed, 700, 1) for seed in range(30)]
    alone_states = [monitor.new_state() for _ in streams]
    alone = [
        in_blocks(monitor, r, g, [700], state)
        for (r, g), state in zip(streams, alone_states, strict=True)
    ]
    states = [monitor.new_state() for _ in streams]
    opened: dict[int, list[AlarmEvent]] = {}
    for t in range(0, 700, 35):  # ticks of 35 readings of every stream
        block = monitor.advance(
            states,
            np.stack([r[t : t + 35] for r, _ in streams]),
            np.stack([g[t : t + 35] for _, g in streams]),
            first_samples=[t] * len(streams),
        )
        for row, events in block.opened.items():
            opened.setdefault(row, []).extend(events)
        for row, (statistics, _, _) in enumerate(alone):
            for kind, values in block.statistics.items():
                assert np.array_equal(values[row], statistics[kind][t : t + 35], equal_nan=True)
    for row, (_, alone_opened, _) in enumerate(alone):
        assert opened.get(row, []) == alone_opened
        assert monitor.state_to_json(states[row]) == monitor.state_to_json(alone_states[row])


def test_an_infinite_residual_is_refused_and_changes_nothing() -> None:
    monitor = Monitor(config())
    state = monitor.new_state()
    run(monitor, state, np.ones(40))
    before = monitor.state_to_json(state)
    with pytest.raises(DataError, match="sample 42: the residual is infinite"):
        run(monitor, state, np.array([1.0, 1.0, -math.inf]), first=40)
    with pytest.raises(DataError, match="reference gap is infinite"):
        run(monitor, state, np.array([1.0]), np.array([math.inf]), first=40)
    assert monitor.state_to_json(state) == before


def test_state_saved_mid_stream_as_json_gives_an_identical_continuation() -> None:
    residuals, gaps = random_stream(4, 2000, 1)
    monitor = Monitor(config())
    state = monitor.new_state()
    run(monitor, state, residuals[:1234], gaps[:1234])
    saved = json.loads(json.dumps(monitor.state_to_json(state), allow_nan=False))
    resumed = monitor.state_from_json(saved)
    a = run(monitor, state, residuals[1234:], gaps[1234:], 1234)
    b = run(monitor, resumed, residuals[1234:], gaps[1234:], 1234)
    for kind in monitor.kinds:
        assert np.array_equal(a[0][kind], b[0][kind], equal_nan=True)
    assert a[1:] == b[1:]


def test_state_size_does_not_grow_with_the_stream() -> None:
    monitor = Monitor(config())
    state = monitor.new_state()
    sizes = []
    for start in range(0, 5000, 1000):
        residuals, gaps = random_stream(start, 1000, 1)
        run(monitor, state, residuals, gaps, start)
        sizes.append(len(json.dumps(monitor.state_to_json(state))))
    assert max(sizes) < 1.5 * min(sizes)  # numbers' digits vary; the count does not


def test_state_for_another_configuration_is_refused() -> None:
    monitor = Monitor(config())
    saved = monitor.state_to_json(monitor.new_state())
    other = Monitor(MonitorConfig(detectors=[PointConfig(threshold=1.0)]))
    with pytest.raises(DataError, match="detectors"):
        other.state_from_json(saved)
    narrower = config().model_copy(
        update={"detectors": [RollingRMSConfig(threshold=1.0, window=10)]}
    )
    with pytest.raises(DataError):
        Monitor(narrower).state_from_json(
            Monitor(
                MonitorConfig(detectors=[RollingRMSConfig(threshold=1.0, window=12)])
            ).state_to_json(
                Monitor(
                    MonitorConfig(detectors=[RollingRMSConfig(threshold=1.0, window=12)])
                ).new_state()
            )
        )


def test_a_missing_reading_is_skipped_and_never_poisons_a_statistic() -> None:
    clean, _ = random_stream(5, 800, 1)
    clean = clean[:, 0]
    clean = clean[~np.isnan(clean)]
    with_gaps = np.insert(clean, [100, 100, 400], np.nan)
    a = run(Monitor(config()), Monitor(config()).new_state(), clean)[0]
    b = run(Monitor(config()), Monitor(config()).new_state(), with_gaps)[0]
    for kind in ("point", "rolling_rms", "variance_floor", "cusum"):
        assert np.array_equal(b[kind][~np.isnan(with_gaps)], a[kind], equal_nan=True)
        assert np.all(np.isnan(b[kind][np.isnan(with_gaps)]))


def test_no_alarm_before_a_window_is_full() -> None:
    monitor = Monitor(config())
    state = monitor.new_state()
    statistics, opened, _ = run(monitor, state, np.full(29, 100.0))  # 30-reading RMS window
    assert np.all(np.isnan(statistics["rolling_rms"]))
    assert not any(e.detector == "rolling_rms" for e in opened)
    _, opened, _ = run(monitor, state, np.array([100.0]), first=29)  # the 30th fills it
    assert "rolling_rms" in {e.detector for e in opened}


def test_level_is_silent_without_a_reference() -> None:
    monitor = Monitor(config())
    state = monitor.new_state()
    statistics, _, _ = run(monitor, state, np.zeros(100))
    assert np.all(np.isnan(statistics["level"]))
    _, opened, _ = run(monitor, state, np.zeros(5), np.full(5, 0.8), first=100)
    assert "level" in {e.detector for e in opened}


def test_level_keeps_a_sustained_offset_open_for_its_whole_duration() -> None:
    rng = np.random.default_rng(8)
    gaps = 0.07 * rng.standard_normal(600)
    gaps[200:300] += 0.8
    monitor = Monitor(config())
    _, _, closed = run(monitor, monitor.new_state(), 0.3 * rng.standard_normal(600), gaps)
    events = [e for e in closed if e.detector == "level"]
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
    state = monitor.new_state()
    run(monitor, state, holdout[:100])
    broken = np.array([[1.5, -1.5]])  # each inside its marginal range, against the correlation
    assert np.all(np.abs(broken) < marginal)
    _, opened, _ = run(monitor, state, broken, first=100)
    assert [e.detector for e in opened] == ["mahalanobis"]


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
    monitor = Monitor(config(1))
    with pytest.raises(DataError, match="watches 1"):
        run(monitor, monitor.new_state(), np.zeros((3, 2)))


def test_a_rolling_rms_hovering_about_its_threshold_is_one_alarm_once_it_knows_its_rest() -> None:
    """Noise whose energy sits about the threshold: closing on the threshold itself opens an
    alarm each time it crosses; measured from where the RMS rests, one alarm, closed once the
    energy is back down."""
    rng = np.random.default_rng(3)
    quiet = rng.standard_normal(200)
    rough = 1.35 * rng.standard_normal(600)  # the RMS of 50 hovers about the threshold
    residuals = np.concatenate([quiet, rough, quiet])
    counts = {}
    for resting in (None, 0.8):
        detector = RollingRMSConfig(threshold=1.25, window=50, resting=resting)
        monitor = Monitor(
            MonitorConfig(
                channels=1, alarm=AlarmPolicy(k=1, n=1, m=5, clear=0.6), detectors=[detector]
            )
        )
        state = monitor.new_state()
        _, opened, closed = run(monitor, state, residuals)
        counts[resting] = len(opened)
        assert monitor.open_events(state) == []  # closed once the energy is back
        assert all(e.cleared_at is not None and e.cleared_at < 1000 for e in closed)
    assert counts[None] > 1 and counts[0.8] == 1, counts


def test_a_rolling_rms_rest_lies_below_its_threshold_and_is_written_only_when_known() -> None:
    # (earlier releases refuse a field they do not know, even a null one)
    assert "resting" not in RollingRMSConfig(threshold=1.0).model_dump()
    assert "resting" not in json.loads(RollingRMSConfig(threshold=1.0).model_dump_json())
    assert RollingRMSConfig(threshold=1.0, resting=0.5).model_dump()["resting"] == 0.5
    with pytest.raises(ValueError, match="below the threshold"):
        RollingRMSConfig(threshold=1.0, resting=1.0)
    with pytest.raises(ValueError):
        RollingRMSConfig(threshold=1.0, resting=-0.1)
