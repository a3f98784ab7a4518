"""`twinwatch twin` (the built-in twin posting to a service) and `twinwatch demo`."""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.simulate import FAULTS_HELP, resolve_faults
from app.settings import load_settings
from app.twin.client import (
    DEFAULT_MAX_BATCH,
    DEFAULT_URL,
    Batch,
    Retry,
    ServiceClient,
    run_twin,
    stop_on_signals,
)
from app.twin.schedule import Timeline, build_scenario


def _alarm_line(alarm: dict[str, Any], sample_of: dict[datetime, int], opened: bool) -> str:
    key = "opened_at" if opened else "closed_at"
    sample = sample_of.get(datetime.fromisoformat(alarm[key])) if alarm.get(key) else None
    where = f"sample {sample}" if sample is not None else alarm[key]
    verb = "opened" if opened else "closed"
    return (
        f"alarm {verb}: {alarm['detector']} on {alarm['stream']} at {where} "
        f"(peak {alarm['peak']:.4g}, threshold {alarm['threshold']:.4g})"
    )


def twin_command(
    url: Annotated[str, typer.Option(help="Base URL of the twinwatch service.")] = DEFAULT_URL,
    stream: Annotated[
        str, typer.Option(help="Stream id to create, or to continue after its last reading.")
    ] = "twin",
    rate: Annotated[float, typer.Option(help="Readings per second of machine time (Hz).")] = 10.0,
    speed: Annotated[
        float, typer.Option(help="Machine seconds per wall-clock second (1: real time).")
    ] = 1.0,
    faults: Annotated[str | None, typer.Option(help=FAULTS_HELP)] = None,
    seed: Annotated[int, typer.Option(help="Random seed of the machine's noise.")] = 0,
    start: Annotated[int, typer.Option(help="First sample of the run to send.")] = 0,
    samples: Annotated[
        int, typer.Option(help="Samples to send; the run simulated is START + SAMPLES long.")
    ] = 8000,
    token: Annotated[
        str | None,
        typer.Option(envvar="TWINWATCH_API_TOKEN", help="Bearer token for the service's writes."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Model of the stream if the twin creates it (default: the service's)."),
    ] = None,
    max_batch: Annotated[
        int, typer.Option(help="Most readings in one request when the twin catches up.")
    ] = DEFAULT_MAX_BATCH,
    attempts: Annotated[
        int,
        typer.Option(
            help="Tries per request, the first included, on network errors, timeouts, 429 and "
            f"5xx answers, {Retry.first_s:g} s apart doubling to {Retry.max_delay_s:g} s."
        ),
    ] = Retry.attempts,
    loop: Annotated[
        bool, typer.Option(help="Start the run over after its last sample, until stopped.")
    ] = False,
    mqtt: Annotated[
        str | None,
        typer.Option(
            help="Publish the readings to this MQTT broker (mqtt://host:1883) instead of posting "
            "them, on TOPIC-PREFIX/STREAM, for a service subscribed to it; the stream is still "
            "registered over HTTP at --url."
        ),
    ] = None,
    topic_prefix: Annotated[
        str, typer.Option(help="With --mqtt: the topic's prefix.")
    ] = "twinwatch",
) -> None:
    """Run the built-in digital twin and post its readings to a twinwatch service.

    Each reading carries the twin's healthy reference sensor; readings go out when they are due,
    in real time or accelerated (--speed). Ctrl-C or SIGTERM stops it cleanly.
    """
    scenario = build_scenario(seed, start, samples, resolve_faults(faults))
    timeline = Timeline(samples=scenario.samples, rate_hz=rate, speed=speed, loop=loop)
    stop, abort = threading.Event(), threading.Event()
    sample_of: dict[datetime, int] = {}

    def on_batch(batch: Batch) -> None:
        sample_of.update(zip(batch.times, batch.samples, strict=True))
        for alarm in batch.answer.get("opened", []):
            typer.echo(_alarm_line(alarm, sample_of, opened=True))
        for alarm in batch.answer.get("closed", []):
            typer.echo(_alarm_line(alarm, sample_of, opened=False))
        if len(sample_of) > 100_000:  # a looping twin: keep only recent times
            for t in list(sample_of)[:50_000]:
                del sample_of[t]

    def on_retry(attempt: int, delay: float, reason: str) -> None:
        typer.echo(f"attempt {attempt} failed ({reason}); retrying in {delay:g} s", err=True)

    typer.echo(
        f"twin seed {seed}: samples {scenario.start}..{scenario.stop - 1} to "
        f"{url if mqtt is None else f'{mqtt} ({topic_prefix}/{stream})'} stream "
        f"{stream} at {rate:g} Hz x {speed:g}"
        + (f", faults: {', '.join(f.type.value for f in scenario.sent_faults())}" if faults else "")
    )
    if mqtt is None:
        client = ServiceClient(url, token=token)
    else:
        from app.twin.mqtt import MqttPublisher

        client = MqttPublisher(url, mqtt, prefix=topic_prefix, token=token)
    with client, stop_on_signals(stop, abort):
        report = run_twin(
            client,
            stream,
            scenario,
            timeline,
            stop=stop,
            abort=abort,
            retry=Retry(attempts=max(1, attempts)),
            max_batch=max_batch,
            model=model,
            on_batch=on_batch,
            on_retry=on_retry,
        )
    alarms = (
        f"alarms opened {len(report.opened)}, closed {len(report.closed)}"
        if mqtt is None
        else f"alarms: twinwatch alarms list --stream {stream} (MQTT answers none)"
    )
    typer.echo(
        f"{'stopped' if report.stopped else 'done'}: sent {report.sent} readings in "
        f"{report.batches} {'requests' if mqtt is None else 'messages'} over "
        f"{report.elapsed_s:.1f} s (accepted {report.accepted}, duplicates {report.duplicates}, "
        f"retries {report.retries}, max lag {report.max_lag_s:.2f} s); {alarms}"
    )


def demo_command(
    speed: Annotated[
        float, typer.Option(help="Machine seconds per wall-clock second (1: real time).")
    ] = 3.0,
    port: Annotated[int, typer.Option(help="Loopback port of the service (0: any free port).")] = 0,
    keep_database: Annotated[
        bool, typer.Option(help="Keep the temporary SQLite database and print its path.")
    ] = False,
    out: Annotated[Path, typer.Option(help="Directory for the PNG of the run.")] = Path("out/demo"),
    start: Annotated[
        int, typer.Option(help="First sample to send of the twin's 8,000-sample run.")
    ] = 6800,
    samples: Annotated[int, typer.Option(help="Samples to send, 0.1 s apart.")] = 1200,
) -> None:
    """Run the service and the built-in twin together, with a live view of the alarms.

    The service runs on a temporary SQLite database; the twin sends part of a run holding the
    four built-in faults (spike, sensor offset, excitation, stuck sensor; see twinwatch simulate
    --help), faster than real time. At the end: which detectors caught each fault, how fast, and
    a PNG of the run.
    """
    from rich.console import Console

    from app.twin.demo import run_demo

    settings = load_settings().model_copy(update={"host": "127.0.0.1", "port": port})
    run_demo(
        settings=settings,
        out_dir=out,
        console=Console(),
        speed=speed,
        start=start,
        samples=samples,
        keep=keep_database,
    )
