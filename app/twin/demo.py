"""`twinwatch demo`: the service on SQLite and the twin with the lab's faults, in one process.

The service runs in a background thread (a real uvicorn server on a loopback port, so the twin
talks HTTP exactly as it would to a deployment); the twin runs in the main thread, accelerated,
and every answered batch feeds a `Recorder`. The recorder is the live view's model, the source of
the summary (which detectors caught which fault, after how long) and of the PNG.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from app.errors import AppError
from app.figures import INSTALL, have_matplotlib
from app.logs import configure_logging
from app.monitoring.alarms import AlarmEvent
from app.monitoring.config import DETECTOR_ORDER, MonitorConfig
from app.monitoring.evaluation import DETECTION_MARGIN, RECOVERY, MonitoredRecord
from app.registry import AUTO, model_directories
from app.settings import Settings
from app.simulation.faults import LAB_FAULTS, Fault
from app.twin.client import Batch, Retry, ServiceClient, TwinReport, run_twin, stop_on_signals
from app.twin.schedule import FloatArray, Scenario, Timeline, build_scenario

DEMO_STREAM = "demo-pump"
TWIN_MODEL = "lstm-stateful-day-seed3"
"""The shipped model trained on the twin (app/shipped_models/README.md)."""
DEMO_START = 6800  # 30 s of normal operation before the spike at 7100
DEMO_SAMPLES = 1200  # to 8000: the lab run, all four faults and their recovery
DEMO_SPEED = 3.0  # 120 s of machine time in 40 s
LAB_RUN = 8000  # the lab's run: its faults sit in samples 7000..7999
STARTUP_LIMIT_S = 120.0
SPARK = "▁▂▃▄▅▆▇█"


# --- what happened: alarms against faults (pure) -------------------------------------------------


@dataclass(frozen=True)
class AlarmSpan:
    """An alarm in scenario sample indices; `closed` is None while it is open."""

    id: int
    detector: str
    opened: int
    closed: int | None
    peak: float
    threshold: float


@dataclass(frozen=True)
class FaultCatch:
    fault: Fault
    caught_by: list[str]  # detectors with an alarm opening in [start, end + DETECTION_MARGIN)
    first_delay: int | None  # samples from the fault's start to the first such alarm
    alarms: int


def catches(faults: Sequence[Fault], spans: Sequence[AlarmSpan]) -> list[FaultCatch]:
    """Each fault's detectors and delay, counting the alarms that open in
    [start, end + DETECTION_MARGIN)."""
    order = {kind: i for i, kind in enumerate(DETECTOR_ORDER)}
    out = []
    for fault in faults:
        inside = [s for s in spans if fault.start <= s.opened < fault.end + DETECTION_MARGIN]
        detectors = sorted({s.detector for s in inside}, key=lambda d: order.get(d, len(order)))
        first = min((s.opened for s in inside), default=None)
        out.append(
            FaultCatch(
                fault=fault,
                caught_by=detectors,
                first_delay=None if first is None else first - fault.start,
                alarms=len(inside),
            )
        )
    return out


def false_alarms(faults: Sequence[Fault], spans: Sequence[AlarmSpan]) -> list[AlarmSpan]:
    """Alarms opening on normal samples: outside every fault and its recovery."""
    return [s for s in spans if not any(f.start <= s.opened < f.end + RECOVERY for f in faults)]


# --- the run as it arrives ----------------------------------------------------------------------


@dataclass
class Recorder:
    """Residuals, statistics and alarms of the demo stream, indexed by scenario sample."""

    scenario: Scenario
    thresholds: dict[str, float]
    residuals: FloatArray = field(init=False)
    statistics: dict[str, FloatArray] = field(init=False)
    spans: dict[int, AlarmSpan] = field(default_factory=dict)
    log: deque[Text] = field(default_factory=lambda: deque(maxlen=8))
    last_sample: int | None = None
    last_lag_s: float = 0.0

    def __post_init__(self) -> None:
        n = self.scenario.stop
        self.residuals = np.full(n, np.nan)
        self.statistics = {kind: np.full(n, np.nan) for kind in self.thresholds}

    def add(self, batch: Batch, sample_of: dict[datetime, int]) -> list[Text]:
        """Take one answered batch; returns the log lines it produced (faults, alarms)."""
        answer = batch.answer
        for result in answer.get("results", []):
            sample = sample_of.get(datetime.fromisoformat(result["t"]))
            if sample is None:
                continue
            if result.get("residual") is not None:
                self.residuals[sample] = result["residual"]
            for kind, value in result.get("statistics", {}).items():
                if kind in self.statistics and value is not None:
                    self.statistics[kind][sample] = value
        timed: list[tuple[int, int, Text]] = []
        for sample in batch.samples:
            for fault in self.scenario.faults:
                if sample == fault.start:
                    timed.append(
                        (
                            sample,
                            0,
                            Text(f"{sample}  {fault.type.value} fault starts", "bold yellow"),
                        )
                    )
        # A batch may both open and close alarms (a short one inside it): replay them in order.
        for alarm, opened in [(a, True) for a in answer.get("opened", [])] + [
            (a, False) for a in answer.get("closed", [])
        ]:
            span = self._span(alarm, sample_of)
            if opened and span.id in self.spans:  # re-opened: the same row, its first sample
                self.spans[span.id] = span
                at = batch.samples[0] if batch.samples else span.opened
                line = Text(f"{at}  {span.detector} alarm re-opened (since {span.opened})", "red")
                timed.append((at, 1, line))
            elif opened:
                self.spans[span.id] = span
                line = Text(
                    f"{span.opened}  {span.detector} alarm OPENED "
                    f"(peak {span.peak:.3g}, threshold {span.threshold:.3g})",
                    "bold red",
                )
                timed.append((span.opened, 1, line))
            else:
                self.spans[span.id] = span
                closed = span.closed if span.closed is not None else span.opened
                timed.append((closed, 2, Text(f"{closed}  {span.detector} alarm closed", "green")))
        timed.sort(key=lambda item: (item[0], item[1]))
        lines = [line for _, _, line in timed]
        self.log.extend(lines)
        if batch.samples:
            self.last_sample = batch.samples[-1]
        self.last_lag_s = batch.lag_s
        return lines

    def _span(self, alarm: dict[str, Any], sample_of: dict[datetime, int]) -> AlarmSpan:
        def sample(key: str) -> int | None:
            value = alarm.get(key)
            if value is None:
                return None
            return sample_of.get(datetime.fromisoformat(value))

        opened = sample("opened_at")
        known = self.spans.get(int(alarm["id"]))
        if opened is None:  # opened before this run's first reading (a resumed stream)
            opened = known.opened if known is not None else self.scenario.start
        return AlarmSpan(
            id=int(alarm["id"]),
            detector=str(alarm["detector"]),
            opened=opened,
            closed=sample("closed_at"),
            peak=float(alarm["peak"]),
            threshold=float(alarm["threshold"]),
        )

    def alarm_spans(self) -> list[AlarmSpan]:
        return sorted(self.spans.values(), key=lambda s: (s.opened, s.detector))

    def open_detectors(self) -> set[str]:
        return {s.detector for s in self.spans.values() if s.closed is None}

    # -- the live view --

    def render(self, title: str, width: int = 120) -> RenderableType:
        current = self.last_sample
        header = Text()
        if current is None:
            header.append("waiting for the first answer ...")
        else:
            sent = current - self.scenario.start + 1
            header.append(f"sample {current}  ({sent}/{self.scenario.samples} sent)")
            fault = self.scenario.fault_at(current)
            if fault is not None:
                header.append(f"   {fault.type.value} fault in progress", "bold yellow")
        return Panel(
            Group(header, self._sparkline(max(10, width - 24)), self._detector_table(), *self.log),
            title=title,
            border_style="red" if self.open_detectors() else "green",
        )

    def _sparkline(self, width: int = 100) -> Text:
        if self.last_sample is None:
            return Text("")
        stop = self.last_sample + 1
        recent = self.residuals[max(self.scenario.start, stop - width) : stop]
        scale = self.thresholds.get("point", float(np.nanmax(np.abs(recent), initial=1.0)))
        text = Text("|residual| ")
        for value in recent:
            if np.isnan(value):
                text.append(" ")
                continue
            level = min(len(SPARK) - 1, int(abs(value) / scale * (len(SPARK) - 1)))
            text.append(SPARK[level], "red" if abs(value) > scale else "cyan")
        last = recent[-1] if recent.size else np.nan
        text.append(f"  {last:+.3f}" if not np.isnan(last) else "")
        return text

    def _detector_table(self) -> Table:
        table = Table(expand=False, box=None, pad_edge=False)
        for column in ("detector", "statistic", "threshold", "state", "alarms"):
            table.add_column(column, justify="left" if column in ("detector", "state") else "right")
        open_now = self.open_detectors()
        counts = {kind: 0 for kind in self.thresholds}
        for span in self.spans.values():
            counts[span.detector] = counts.get(span.detector, 0) + 1
        for kind, threshold in self.thresholds.items():
            values = self.statistics[kind][: (self.last_sample or 0) + 1]
            finite = values[~np.isnan(values)]
            statistic = f"{finite[-1]:.4g}" if finite.size else "-"
            state = Text("ALARM", "bold red") if kind in open_now else Text("ok", "green")
            table.add_row(kind, statistic, f"{threshold:.4g}", state, str(counts[kind]))
        return table

    # -- the figure --

    def monitored_record(self) -> MonitoredRecord:
        """The run as `plot_record` draws offline evaluations (samples before start are NaN)."""
        events = [
            AlarmEvent(
                detector=s.detector,
                start=s.opened,
                end=s.closed,
                peak=s.peak,
                threshold=s.threshold,
                cleared_at=s.closed,
            )
            for s in self.alarm_spans()
        ]
        return MonitoredRecord(
            residuals=self.residuals,
            inputs=self.residuals,
            reference_gaps=None,
            statistics=self.statistics,
            exceeded={kind: np.zeros(self.scenario.stop, dtype=bool) for kind in self.statistics},
            events=events,
        )


# --- the service in a thread --------------------------------------------------------------------


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # the demo's main thread owns the signals
        pass


@contextmanager
def serve_in_thread(settings: Settings) -> Iterator[str]:
    """Run the app on `settings.host:settings.port` (0: any free port); yields its base URL."""
    from app.main import create_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.host, settings.port))
    except OSError as exc:
        sock.close()
        raise AppError(f"cannot listen on {settings.host}:{settings.port}: {exc}") from None
    host, port = sock.getsockname()[:2]
    # The live view owns the console: warnings and errors only, in the configured format.
    configure_logging(settings.model_copy(update={"log_level": "warning"}))
    config = uvicorn.Config(create_app(settings), log_config=None, lifespan="on", access_log=False)
    server = _Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="twinwatch-demo-server", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + STARTUP_LIMIT_S
        while not server.started:
            if not thread.is_alive():
                raise AppError("the service failed to start (see the log above)")
            if time.monotonic() > deadline:
                raise AppError(f"the service did not start within {STARTUP_LIMIT_S:.0f} s")
            time.sleep(0.05)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


# --- the demo -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoResult:
    report: TwinReport
    catches: list[FaultCatch]
    false_alarms: list[AlarmSpan]
    figure: Path | None  # none without matplotlib (the `plots` extra)
    data_dir: Path | None  # kept with --keep-database


def _thresholds(client: ServiceClient, model: str) -> MonitorConfig:
    for item in client.models():
        if item["name"] == model:
            thresholds = item.get("thresholds") or {}
            if not thresholds:
                raise AppError(
                    f"model {model!r} has no detector thresholds: run `twinwatch calibrate "
                    f"--model models/{model} --data <normal data CSV> --holdout START:STOP`"
                )
            return MonitorConfig.model_validate(thresholds)
    raise AppError(f"model {model!r} is not loaded (check TWINWATCH_MODELS_DIR)")


def summary_table(found: Sequence[FaultCatch], period_s: float) -> Table:
    table = Table(title="what the detectors caught (alarm opening in [start, end + 20))")
    for column in ("fault", "samples", "caught by", "first alarm after", "alarms"):
        table.add_column(column)
    for item in found:
        fault = item.fault
        delay = (
            Text("missed", "bold red")
            if item.first_delay is None
            else f"{item.first_delay} samples ({item.first_delay * period_s:.1f} s)"
        )
        table.add_row(
            fault.type.value,
            f"{fault.start}..{fault.end - 1}",
            ", ".join(item.caught_by) or "-",
            delay,
            str(item.alarms),
        )
    return table


def run_demo(
    *,
    settings: Settings,
    out_dir: Path,
    console: Console,
    speed: float = DEMO_SPEED,
    start: int = DEMO_START,
    samples: int = DEMO_SAMPLES,
    seed: int = 0,
    keep: bool = False,
    faults: Sequence[Fault] = LAB_FAULTS,
) -> DemoResult:
    """Serve on a fresh SQLite database, send the scenario, summarise, draw; always clean up."""
    scenario = build_scenario(
        seed, start, samples, faults, run_length=max(LAB_RUN, start + samples)
    )
    timeline = Timeline(samples=scenario.samples, rate_hz=10.0, speed=speed)
    data_dir = Path(tempfile.mkdtemp(prefix="twinwatch-demo-"))
    settings = settings.model_copy(
        update={"data_dir": data_dir, "database_url": f"sqlite:///{data_dir / 'twinwatch.db'}"}
    )
    stop, abort = threading.Event(), threading.Event()
    try:
        console.print(
            f"starting the service on {data_dir / 'twinwatch.db'} "
            f"(models from {', '.join(map(str, model_directories(settings)))}) ...",
            highlight=False,
        )
        # The demo shows the twin's own trained model unless a deployment names another.
        model = TWIN_MODEL if settings.default_model == AUTO else settings.default_model
        with serve_in_thread(settings) as url, ServiceClient(url) as client:
            config = _thresholds(client, model)
            recorder = Recorder(scenario, config.thresholds())
            sample_of: dict[datetime, int] = {}
            title = (
                f"twinwatch demo: stream {DEMO_STREAM}, model {model}, {url}, {speed:g}x real time"
            )
            console.print(
                f"the twin sends samples {scenario.start}..{scenario.stop - 1} "
                f"({scenario.samples / 10 / speed:.0f} s at {speed:g}x); Ctrl-C stops early",
                highlight=False,
            )
            with (
                stop_on_signals(stop, abort),
                Live(
                    recorder.render(title, console.width),
                    console=console,
                    auto_refresh=False,
                    transient=False,
                ) as live,
            ):
                rendered = 0.0

                def on_batch(batch: Batch) -> None:
                    nonlocal rendered
                    sample_of.update(zip(batch.times, batch.samples, strict=True))
                    lines = recorder.add(batch, sample_of)
                    if not console.is_terminal:
                        for line in lines:
                            console.print(line)
                    if time.monotonic() - rendered > 0.1:
                        live.update(
                            recorder.render(title, console.width), refresh=console.is_terminal
                        )
                        rendered = time.monotonic()

                report = run_twin(
                    client,
                    DEMO_STREAM,
                    scenario,
                    timeline,
                    model=model,
                    stop=stop,
                    abort=abort,
                    retry=Retry(attempts=3),
                    on_batch=on_batch,
                )
                live.update(recorder.render(title, console.width), refresh=True)
            if not console.is_terminal:
                console.line()  # the last frame ends without one off a terminal
        spans = recorder.alarm_spans()
        last = recorder.last_sample if recorder.last_sample is not None else scenario.start - 1
        reached = [f for f in scenario.sent_faults() if f.start <= last]  # stopped early?
        found = catches(reached, spans)
        wrong = false_alarms(scenario.faults, spans)
        console.print(summary_table(found, 1.0 / timeline.rate_hz))
        console.print(
            f"false alarms (opening outside every fault and its {RECOVERY}-sample recovery): "
            f"{len(wrong)}",
            highlight=False,
        )
        figure = None
        if have_matplotlib():  # the `plots` extra: the demo runs without it, with no figure
            from app.monitoring.plots import plot_record

            figure = plot_record(
                recorder.monitored_record(),
                config,
                scenario.sent_faults(),
                out_dir / "demo.png",
                start=scenario.start,
                stop=(recorder.last_sample or scenario.start) + 1,
            )
        console.print(
            f"sent {report.sent} readings in {report.elapsed_s:.1f} s "
            f"({report.retries} retries){'; stopped early' if report.stopped else ''}",
            highlight=False,
        )
        console.print(
            f"figure: {figure}"
            if figure
            else f"no figure: matplotlib is not installed ({INSTALL})",
            highlight=False,
        )
        if keep:
            console.print(f"kept the database: {data_dir / 'twinwatch.db'}", highlight=False)
        return DemoResult(report, found, wrong, figure, data_dir if keep else None)
    finally:
        if not keep:
            shutil.rmtree(data_dir, ignore_errors=True)
