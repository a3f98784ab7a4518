from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.forecasting.artifacts import load_model
from app.forecasting.base import Forecaster
from app.forecasting.linear_ar import LinearAR
from app.monitoring.alarms import AlarmEvent, AlarmPolicy
from app.monitoring.calibration import HoldOut, calibrate_margins
from app.monitoring.config import MonitorConfig, PointConfig
from app.monitoring.evaluation import (
    MonitoredRecord,
    normal_day_false_alarms,
    score_faults,
    stream_record,
)
from app.monitoring.incidents import alarm_spans, incident_spans
from app.monitoring.monitor import Monitor
from app.monitoring.plots import plot_record
from app.monitoring.workflow import WATCH_ONLY
from app.registry import SHIPPED_MODELS_DIR
from app.series import Series
from app.simulation.faults import LAB_FAULTS, Fault, FaultType, load_schedule

Lab = tuple[MonitorConfig, MonitoredRecord, list[Fault]]
MODELS = SHIPPED_MODELS_DIR


def monitor_record(config: MonitorConfig, residuals: np.ndarray) -> MonitoredRecord:
    """The monitor over given residuals, as a record."""
    monitor = Monitor(config)
    state = monitor.new_state()
    block = monitor.advance([state], residuals[None], None, first_samples=[0])
    statistics = {kind: values[0] for kind, values in block.statistics.items()}
    return MonitoredRecord(
        residuals=residuals,
        inputs=residuals,
        reference_gaps=None,
        statistics=statistics,
        exceeded={d.kind: d.exceeds(statistics[d.kind]) for d in monitor.detectors},
        events=block.closed.get(0, []) + monitor.open_events(state),
    )


def lab_thresholds(forecaster: Forecaster, series: Series) -> MonitorConfig:
    """Margins on the lab's hold-out 6000..6999, as `twinwatch calibrate` computes them."""
    inputs = stream_record(
        forecaster, WATCH_ONLY, series.head(7000), ["value"], sample_period_s=0.1
    )
    return calibrate_margins(HoldOut(inputs.inputs, inputs.reference_gaps, 6000, 7000))


def test_counting_rules_detection_window_recovery_and_precision() -> None:
    residuals = np.zeros(1000)
    faults = [Fault(type=FaultType.SPIKE, start=300, end=301)]
    residuals[[300, 301]] = 5.0  # one event (m = 10 merges the pair), delay 0
    residuals[318] = 5.0  # a second event still inside [start, end + 20)
    residuals[340] = 5.0  # inside the 70 recovery samples: neither caught nor false
    residuals[[600, 700]] = 5.0  # two false alarms on normal samples
    residuals[50] = 5.0  # before scoring starts: ignored
    config = MonitorConfig(alarm=AlarmPolicy(m=10), detectors=[PointConfig(threshold=1.0)])
    record = monitor_record(config, residuals)
    report = score_faults(record, faults, score_from=100, sample_period_s=0.1)
    point = report["faults"][0]["detectors"]["point"]
    assert point == {"events": 2, "alarm_samples": 3, "first_delay": 0}
    assert report["faults"][0]["caught_by"] == ["point"]
    assert report["normal_samples"] == 900 - 71
    assert report["false_alarm_events"]["point"] == 2
    assert report["false_alarm_events_per_day"]["point"] == pytest.approx(2 / (829 * 0.1 / 86400))
    assert report["precision"]["point"] == pytest.approx(2 / 4)


def test_a_missed_fault_has_no_delay() -> None:
    config = MonitorConfig(detectors=[PointConfig(threshold=1.0)])
    record = monitor_record(config, np.zeros(500))
    faults = [Fault(type=FaultType.OFFSET, start=200, end=300)]
    report = score_faults(record, faults, score_from=0, sample_period_s=0.1)
    assert report["faults"][0]["detectors"]["point"]["first_delay"] is None
    assert report["precision"]["point"] is None  # no events at all: undefined, not 0 or 1


def test_incidents_join_alarms_that_overlap_or_follow_within_the_quiet_window() -> None:
    events = [
        AlarmEvent("point", 10, 12, 1.0, 0.5, cleared_at=20),
        AlarmEvent("cusum", 11, 30, 9.0, 5.0, cleared_at=35),
        AlarmEvent("point", 50, 51, 1.0, 0.5, cleared_at=60),  # 15 after: the same incident
        AlarmEvent("level", 90, None, 1.0, 0.1),  # 30 after: another
    ]
    assert incident_spans(events, quiet=20) == [(10, 60), (90, None)]
    assert alarm_spans(events, quiet=20) == [
        ("point", 10, 20),
        ("cusum", 11, 35),
        ("point", 50, 60),  # 30 after the point alarm closed: a new alarm (same incident)
        ("level", 90, None),
    ]
    again = [AlarmEvent("point", 10, 12, 1.0, 0.5, 20), AlarmEvent("point", 35, 36, 2.0, 0.5, 45)]
    assert alarm_spans(again, quiet=20) == [("point", 10, 45)]  # re-opened: one alarm, extended


@pytest.fixture(scope="module")
def lab_record(seed0: Series, seed0_lab: Series) -> Lab:
    forecaster = LinearAR().fit(seed0.matrix(["value"]), train_end=6000)
    config = lab_thresholds(forecaster, seed0_lab)
    record = stream_record(forecaster, config, seed0_lab, ["value"], sample_period_s=0.1)
    return config, record, list(LAB_FAULTS)


def test_the_lab_scenario_with_the_default_model(seed0_lab: Series, data_dir: Path) -> None:
    """The lab's four faults with the shipped LSTM (trained up to sample 6000), thresholds at
    the default margins on hold-out 6000..6999."""
    loaded = load_model(MODELS / "lstm-seed0")
    config = lab_thresholds(loaded.forecaster, seed0_lab)
    assert config.thresholds()["point"] == pytest.approx(0.525, rel=0.05)  # 4 sigma, sigma 0.131
    record = stream_record(loaded.forecaster, config, seed0_lab, ["value"], sample_period_s=0.1)
    faults = load_schedule(data_dir / "twin_seed0_lab_faults.faults.json")
    report = score_faults(record, faults, score_from=7000, sample_period_s=0.1)
    spike, offset, excitation, stuck = (f["detectors"] for f in report["faults"])
    assert spike["point"]["first_delay"] == 0
    assert offset["point"]["first_delay"] == 0
    assert offset["point"]["events"] == 2  # both edges of the offset, nothing in between
    assert excitation["rolling_rms"]["first_delay"] <= 110
    assert excitation["cusum"]["first_delay"] < excitation["rolling_rms"]["first_delay"]
    assert 15 <= stuck["variance_floor"]["first_delay"] <= 25
    assert stuck["point"]["first_delay"] == 100  # a frozen sensor shows only on release
    assert report["normal_samples"] == 239
    assert report["false_alarm_events"]["total"] == 0
    # The level detector holds the offset alarm for the offset's whole duration.
    level = [e for e in record.events if e.detector == "level" and 7250 <= e.start < 7370]
    assert len(level) == 1 and level[0].start <= 7252
    assert level[0].end is not None and level[0].end >= 7350


def test_plot_is_written(lab_record: Lab, tmp_path: Path) -> None:
    config, record, faults = lab_record
    path = plot_record(record, config, faults, tmp_path / "plots" / "monitor.png", start=6000)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000


def test_clean_simulated_days_count_false_alarm_events_per_day(
    lab_record: Lab, seed0: Series
) -> None:
    config, _, _ = lab_record
    forecaster = LinearAR().fit(seed0.matrix(["value"]), train_end=6000)
    report = normal_day_false_alarms(forecaster, config, ["value"], days=0.02, seed=3)
    assert report["samples"] == 17280
    counts = report["false_alarm_events"]
    assert counts["total"] == sum(counts[k] for k in config.thresholds())
    assert counts["any"] <= counts["total"]
    assert report["false_alarm_events_per_day"]["total"] == pytest.approx(
        counts["total"] / ((17280 - 64) * 0.1 / 86400)
    )
    first, last = report["residual_std_first_last_tenth"]
    assert last == pytest.approx(first, rel=0.2)  # the rising level does not inflate residuals


def test_normal_samples_start_where_the_model_stopped_training(seed0_lab: Series) -> None:
    from app.forecasting.artifacts import LoadedModel
    from app.forecasting.baselines import Naive
    from app.monitoring.workflow import unseen_from

    def model(train_end: int, data_sha256: str = "elsewhere") -> LoadedModel:
        manifest = {"training": {"train_end": train_end, "data_sha256": data_sha256}}
        return LoadedModel(forecaster=Naive(window=64), manifest=manifest, directory=Path("."))

    assert unseen_from(model(6000), seed0_lab) == 6000  # the record may be its training data
    assert unseen_from(model(864_000), seed0_lab) == 0  # trained on a longer, other record
    assert unseen_from(model(864_000, seed0_lab.sha256()), seed0_lab) == len(seed0_lab)
