"""MQTT ingest beside HTTP: 1,000 streams at 10 Hz into one `twinwatch serve` (a stateful LSTM
each, as bench/streams.py), the same readings through the two transports in alternating
phases of one run (HTTP, MQTT, HTTP, MQTT, ...), so both meet the same machine.

- HTTP: G gateways, each posting one `POST /v1/readings` a tick with its streams' next
  reading (bench/streams.py's driver, `?results=false`).
- MQTT: the same gateways publish the same body as one QoS 1 message a tick on
  `twinwatch/gateway-<g>` to a Mosquitto of the run's own (Debian's `mosquitto`); the service
  subscribes (TWINWATCH_MQTT_URL) and acknowledges each message after its commit.

Per phase: readings accepted against readings offered, the server's CPU per 1,000 readings,
and for MQTT how long after its last message the service had committed everything (`drain`:
near zero when it keeps up; growing when it falls behind).

    python bench/mqtt.py [--seconds 20] [--rounds 2] [--gateways 2] [--database postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as mqtt
from harness import (
    DEFAULT_POSTGRES,
    free_port,
    machine_info,
    postgres_schema,
    stateful_model,
    twinwatch_server,
)
from paho.mqtt.enums import CallbackAPIVersion
from prometheus_client.parser import text_string_to_metric_families
from streams import PERIOD_S, Load, Options, Sender, drive, prepare

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
DRAIN_LIMIT_S = 120.0


def accepted(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == "twinwatch_readings_accepted":
            return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))
    return 0.0


def broker(work: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    config = work / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\nuser root\n"
        "max_queued_messages 0\nmax_inflight_messages 200\n"
    )
    log = (work / "mosquitto.log").open("wb")
    process = subprocess.Popen([MOSQUITTO, "-c", str(config)], stdout=log, stderr=log)
    time.sleep(0.5)
    return process, port


def publish_phase(
    load: Load, gateways: list[list[int]], client: mqtt.Client, server_port: int, cpu: Any
) -> dict[str, Any]:
    before, cpu_before = accepted(server_port), cpu()
    start = time.perf_counter() + 0.2
    sent: list[mqtt.MQTTMessageInfo] = []
    late = 0
    for tick in range(load.ticks):
        due = start + tick * load.period_s
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        elif -delay > load.period_s / 2:
            late += 1
        for index, rows in enumerate(gateways):
            sent.append(client.publish(f"twinwatch/gateway-{index}", load.body(rows, tick), qos=1))
    published = time.perf_counter()
    offered = load.ticks * len(load.names)
    deadline = published + DRAIN_LIMIT_S
    while accepted(server_port) - before < offered and time.perf_counter() < deadline:
        time.sleep(0.05)
    done = time.perf_counter()
    taken = accepted(server_port) - before
    server_cpu = cpu() - cpu_before
    return {
        "transport": "mqtt",
        "offered": offered,
        "accepted": taken,
        "elapsed_s": done - start,
        "drain_s": done - published,
        "ticks_late": late,
        "broker_acknowledged": sum(info.is_published() for info in sent),
        "messages": len(sent),
        "server_cpu_s": server_cpu,
        "cpu_ms_per_1000_readings": 1e6 * server_cpu / max(taken, 1),
    }


def http_phase(load: Load, gateways: list[list[int]], server: Any) -> dict[str, Any]:
    senders = [Sender(rows) for rows in gateways]
    report = asyncio.run(drive(load, senders, server))
    return {
        "transport": "http",
        "offered": load.ticks * len(load.names),
        "accepted": report["accepted"],
        "elapsed_s": report["elapsed_s"],
        "p99_ms": report["p99_ms"],
        "ticks_missed": report["ticks_missed"],
        "errors": report["errors"],
        "server_cpu_s": report["server_cpu_s"],
        "cpu_ms_per_1000_readings": 1e6 * report["server_cpu_s"] / max(report["accepted"], 1),
    }


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model, provenance = stateful_model(work / "models")
    phases = 2 * args.rounds
    options = Options(
        streams=args.streams, gateways=args.gateways, seconds=args.seconds * phases, results=False
    )
    with ExitStack() as stack:
        if args.database == "postgresql":
            database_url = stack.enter_context(postgres_schema(args.postgres_url))
        else:
            database_url = f"sqlite:///{(work / 'mqtt.db').as_posix()}"
        process, broker_port = broker(work)
        stack.callback(process.kill)
        server = twinwatch_server(
            "mqtt",
            database_url=database_url,
            models_dir=work / "models",
            work=work,
            log_level="warning",
            default_model=model,
        )
        server.env |= {
            "TWINWATCH_MQTT_URL": f"mqtt://127.0.0.1:{broker_port}",
            "TWINWATCH_MQTT_TOPICS": '["twinwatch/#"]',
            "TWINWATCH_STALE_PERIODS": "0",
        }
        server.launch()
        stack.callback(server.stop)
        server.wait_ready("/readyz")
        load, _, _, timings = asyncio.run(prepare(options, server.port, model))
        load.ticks = round(args.seconds / PERIOD_S)
        gateways = [list(range(g, args.streams, args.gateways)) for g in range(args.gateways)]
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bench-gateways")
        client.max_inflight_messages_set(200)
        client.connect("127.0.0.1", broker_port)
        client.loop_start()
        stack.callback(client.loop_stop)
        results = []
        for phase in range(phases):
            if phase % 2 == 0:
                result = http_phase(load, gateways, server)
            else:
                result = publish_phase(load, gateways, client, server.port, server.cpu_seconds)
            load.warm += load.ticks  # the next phase goes on from the next sample
            results.append(result)
            print(json.dumps(result), flush=True)
    return {
        "machine": machine_info(),
        "model": model,
        "model_provenance": provenance,
        "database": args.database,
        "streams": args.streams,
        "gateways": args.gateways,
        "seconds_per_phase": args.seconds,
        "setup": timings,
        "phases": results,
    }


def print_table(report: dict[str, Any]) -> None:
    print(
        f"\n{report['streams']:,} streams at 10 Hz, {report['gateways']} gateways, "
        f"{report['seconds_per_phase']:g} s a phase, {report['database']}\n"
    )
    print("| phase | transport | accepted / offered | server CPU ms per 1,000 readings | |")
    print("|---|---|---|---|---|")
    for index, phase in enumerate(report["phases"], start=1):
        extra = (
            f"drain {phase['drain_s']:.2f} s, {phase['ticks_late']} ticks late"
            if phase["transport"] == "mqtt"
            else f"p99 {phase['p99_ms']:.0f} ms, {phase['ticks_missed']} ticks missed"
        )
        print(
            f"| {index} | {phase['transport']} | {phase['accepted']:,.0f} / {phase['offered']:,} "
            f"| {phase['cpu_ms_per_1000_readings']:.0f} | {extra} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--gateways", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="each phase")
    parser.add_argument("--rounds", type=int, default=2, help="HTTP then MQTT, this many times")
    parser.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="twinwatch-mqtt-bench-") as work:
        report = run(args, Path(work))
    print_table(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
