"""`twinwatch demo`: what it concludes from the alarms, and a shortened real run."""

from __future__ import annotations

import io
import socket
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from app.cli import cli
from app.settings import Settings
from app.simulation.faults import LAB_FAULTS, Fault, FaultType
from app.twin.client import Batch
from app.twin.demo import (
    AlarmSpan,
    Recorder,
    catches,
    false_alarms,
    run_demo,
    serve_in_thread,
)
from app.twin.schedule import build_scenario

SPIKE, OFFSET, EXCITATION, STUCK = LAB_FAULTS


def span(detector: str, opened: int, closed: int | None = None, id_: int = 0) -> AlarmSpan:
    return AlarmSpan(id_, detector, opened, closed, peak=1.0, threshold=0.5)


def test_catches_apply_the_labs_window_and_report_the_first_delay() -> None:
    spans = [
        span("rolling_rms", 7104, 7170),
        span("point", 7100, 7120),
        span("point", 7350 + 19, 7400),  # inside [start, end + 20): counts for the offset
        span("cusum", 7350 + 20, 7400),  # one sample later: does not
        span("variance_floor", 7870, 7969),
    ]
    found = {c.fault.type: c for c in catches(LAB_FAULTS, spans)}
    assert found[FaultType.SPIKE].caught_by == ["point", "rolling_rms"]  # detector order
    assert found[FaultType.SPIKE].first_delay == 0 and found[FaultType.SPIKE].alarms == 2
    assert found[FaultType.OFFSET].caught_by == ["point"]
    assert found[FaultType.OFFSET].first_delay == 119
    assert found[FaultType.EXCITATION].caught_by == []
    assert found[FaultType.EXCITATION].first_delay is None
    assert found[FaultType.STUCK].first_delay == 20


def test_false_alarms_are_those_opening_outside_every_fault_and_its_recovery() -> None:
    spans = [span("point", 7000), span("point", 7101 + 69), span("point", 7101 + 70)]
    assert [s.opened for s in false_alarms(LAB_FAULTS, spans)] == [7000, 7171]


def test_the_recorder_files_results_and_alarms_by_sample() -> None:
    scenario = build_scenario(0, 7840, 20, LAB_FAULTS, run_length=8000)
    recorder = Recorder(scenario, {"point": 0.5, "variance_floor": 0.03})
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    times = [t0 + timedelta(seconds=0.1 * k) for k in range(20)]
    sample_of = {t: 7840 + k for k, t in enumerate(times)}
    alarm = {
        "id": 7,
        "detector": "variance_floor",
        "opened_at": times[15].isoformat(),
        "closed_at": None,
        "peak": 0.01,
        "threshold": 0.03,
    }
    lines = recorder.add(
        Batch(
            first=0,
            samples=list(range(7840, 7860)),
            times=times,
            answer={
                "results": [
                    {"t": t.isoformat(), "residual": 0.1 * k, "statistics": {"point": 0.1 * k}}
                    for k, t in enumerate(times)
                ],
                "opened": [alarm],
                "closed": [],
            },
            lag_s=0.0,
        ),
        sample_of,
    )
    assert recorder.residuals[7845] == pytest.approx(0.5)
    assert np.isnan(recorder.residuals[7839])
    assert recorder.statistics["point"][7859] == pytest.approx(1.9)
    assert [s.opened for s in recorder.alarm_spans()] == [7855]
    assert recorder.open_detectors() == {"variance_floor"}
    assert [line.plain for line in lines] == [
        "7850  stuck fault starts",
        "7855  variance_floor alarm OPENED (peak 0.01, threshold 0.03)",
    ]
    closing = {**alarm, "closed_at": times[19].isoformat()}
    recorder.add(
        Batch(0, [], [], {"results": [], "opened": [], "closed": [closing]}, 0.0), sample_of
    )
    assert recorder.open_detectors() == set()
    assert recorder.alarm_spans()[0].closed == 7859
    record = recorder.monitored_record()
    assert [(e.detector, e.start, e.end) for e in record.events] == [("variance_floor", 7855, 7859)]
    # Re-opened moments later: the same row, logged where it re-opened, not as new at 7855.
    reopened = {**alarm, "closed_at": None}
    later = recorder.add(
        Batch(0, [7870], [], {"results": [], "opened": [reopened], "closed": []}, 0.0), sample_of
    )
    assert [line.plain for line in later] == ["7870  variance_floor alarm re-opened (since 7855)"]
    assert recorder.open_detectors() == {"variance_floor"}


def test_a_short_demo_run_catches_the_stuck_sensor_draws_it_and_cleans_up(
    models_dir: Path, tmp_path: Path
) -> None:
    output = io.StringIO()
    result = run_demo(
        settings=Settings(
            models_dir=models_dir, default_model="lstm-seed0", host="127.0.0.1", port=0
        ),
        out_dir=tmp_path / "out",
        console=Console(file=output, width=120),
        speed=100.0,
        start=7760,
        samples=240,
    )
    text = output.getvalue()
    assert result.report.sent == 240 and not result.report.stopped
    (stuck,) = result.catches  # the only fault inside samples 7760..7999
    assert stuck.fault.type is FaultType.STUCK
    assert "variance_floor" in stuck.caught_by  # the only residual detector that sees it
    assert stuck.first_delay is not None and stuck.first_delay <= 30
    assert result.false_alarms == []
    assert result.figure == tmp_path / "out" / "demo.png"
    assert result.figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"figure: {result.figure}" in text
    assert "variance_floor alarm OPENED" in text  # the event log off a terminal
    assert "stuck" in text and "missed" not in text
    assert result.data_dir is None  # the temporary database is gone ...
    assert not any(
        t.name == "twinwatch-demo-server" for t in threading.enumerate()
    )  # ... and so is the server


def test_demo_keep_leaves_the_database(models_dir: Path, tmp_path: Path) -> None:
    result = run_demo(
        settings=Settings(
            models_dir=models_dir, default_model="lstm-seed0", host="127.0.0.1", port=0
        ),
        out_dir=tmp_path,
        console=Console(file=io.StringIO()),
        speed=100.0,
        start=7900,
        samples=40,
        keep=True,
    )
    assert result.data_dir is not None and (result.data_dir / "twinwatch.db").is_file()


def test_the_demo_command_runs_and_exits_zero(
    models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TWINWATCH_MODELS_DIR", str(models_dir))
    monkeypatch.setenv("TWINWATCH_DEFAULT_MODEL", "lstm-seed0")
    result = CliRunner().invoke(
        cli,
        ["demo", "--speed", "100", "--start", "7900", "--samples", "30", "--out", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "demo.png").is_file()


def test_the_server_thread_refuses_a_busy_port(models_dir: Path) -> None:
    from app.errors import AppError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        settings = Settings(
            models_dir=models_dir, default_model="lstm-seed0", host="127.0.0.1", port=port
        )
        with pytest.raises(AppError, match="cannot listen"), serve_in_thread(settings):
            pass


def test_faults_outside_the_sent_samples_are_left_out_of_the_summary() -> None:
    scenario = build_scenario(
        0, 7000, 200, [*LAB_FAULTS[:1], Fault(type="stuck", start=10, end=20)], run_length=8000
    )  # type: ignore[arg-type]
    assert [f.type for f in scenario.sent_faults()] == [FaultType.SPIKE]
