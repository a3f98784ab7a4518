"""Every benchmark of issue 6 in one run, one summary, one JSON report.

In order, one heavy thing at a time (the machine has 2 shared cores):

1. bench/forecasters.py: forecaster readings/s at batches 1, 64, 1,024, with arithmetic limits;
2. bench/ingest.py: one stream, batches of 1, 100 and 1,000 on SQLite and PostgreSQL, and the
   real app's parse-only ceiling (bench/parse_only.py) at the same batches;
3. bench/streams.py: 1,000 streams at 10 Hz through 2 gateways of 500 streams (POST /v1/readings
   ?results=false: a gateway needs the acknowledgement and the alarms), on PostgreSQL (the
   deployment database; --streams-database sqlite for the embedded one);
4. bench/memory.py: resident memory of the service holding 10,000 warm streams.

Each part prints its own table; a part that fails is reported and the others still run. The
summary prints issue 6's acceptance ratios as measured, each marked PASS or MISS against its
target (n/a when not measured). Nothing asserts on timings. `--quick` keeps the whole run under
about 4 minutes (fewer repeats, 10 s of streams, memory measured at 1,000 streams and
extrapolated to 10,000, flagged); the full run takes 10-20 minutes.

    python bench/run.py [--quick] [--json report.json] [--skip memory,streams]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import forecasters
import ingest
import memory
import streams
from harness import DEFAULT_POSTGRES, machine_info
from sqlalchemy import create_engine, text

PARTS = ("forecasters", "ingest", "streams", "memory")
INGEST_WORKLOADS = ("s1-b1", "s1-b100", "s1-b1000")
BATCH_OF = {"s1-b1": 1, "s1-b100": 100, "s1-b1000": 1000}


def postgres_reachable(url: str) -> str | None:
    """None if PostgreSQL answers at `url`, else why not (ingest then runs on SQLite only)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        engine.dispose()


def run_ingest(args: argparse.Namespace) -> dict[str, Any]:
    """bench/ingest.py's machinery on the one-stream workloads, with the ceiling."""
    problem = postgres_reachable(args.postgres_url)
    databases = ["sqlite"] if problem else ["sqlite", "postgresql"]
    if problem:
        print(f"ingest: PostgreSQL not reachable ({problem}); SQLite only")
    options = ingest.Options(
        quick=args.quick,
        repeats=2 if args.quick else 3,
        workloads=[w for w in ingest.WORKLOADS if w.key in INGEST_WORKLOADS],
        databases=databases,
        postgres_url=args.postgres_url,
        log_level="info",
        ceiling=True,
        profile=None,
        json=None,
        model_kind=args.model_kind,
    )
    report = ingest.run(options, {})
    table: dict[str, dict[str, Any]] = {}
    for row in report["summary"]:
        batch = BATCH_OF[row["workload"]]
        rate = row["readings_per_s_median"]
        if row["target"] in ("sqlite", "postgresql"):
            table.setdefault(row["target"], {})[f"batch_{batch}"] = rate
        elif row["target"] in ("sqlite-ack", "postgresql-ack"):
            database = row["target"].removesuffix("-ack")
            table.setdefault(database, {})[f"ack_only_batch_{batch}"] = rate
        elif row["target"] == "parse-only":
            for database in databases:
                table.setdefault(database, {})[f"ceiling_batch_{batch}"] = rate
        elif row["target"] == "parse+answer":
            for database in databases:
                table.setdefault(database, {})[f"ceiling_answer_batch_{batch}"] = rate
    if problem:
        table["postgresql"] = {"error": f"not reachable: {problem}"}
    return {"readings_per_s": table, "details": report}


def run_part(name: str, function: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one part; its failure is recorded, not raised, so the others still run."""
    print(f"\n=== {name} " + "=" * (60 - len(name)), flush=True)
    started = time.perf_counter()
    try:
        result = function()
    except Exception as exc:
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["wall_s"] = time.perf_counter() - started
    return result


# --- acceptance ---------------------------------------------------------------------------------


def check(
    name: str, value: float | None, target: str, ok: Callable[[float], bool], unit: str = ""
) -> dict[str, Any]:
    return {
        "check": name,
        "measured": value,
        "unit": unit,
        "target": target,
        "pass": None if value is None else bool(ok(value)),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def acceptance(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 6's targets, from the figures measured in this run."""
    fc = report.get("forecasters", {}).get("ratios", {})
    sqlite = report.get("ingest_readings_per_s", {}).get("sqlite", {})
    flow = report.get("streams_1000") or {}
    rss = report.get("rss_mb_10000_streams")
    offered = flow.get("offered_readings_per_s")
    extrapolated = report.get("memory", {}).get("extrapolated")
    return [
        check(
            "stateful vs window LSTM, batch 1,024",
            fc.get("stateful_vs_window_lstm_batch_1024"),
            ">= 10x",
            lambda v: v >= 10,
            "x",
        ),
        check(
            "1,000 streams together vs one by one",
            fc.get("together_vs_one_by_one_1000_streams"),
            ">= 5x",
            lambda v: v >= 5,
            "x",
        ),
        check(
            "SQLite batch 1,000 / ceiling, both answering the acknowledgement",
            ratio(sqlite.get("ack_only_batch_1000"), sqlite.get("ceiling_batch_1000")),
            ">= 25%",
            lambda v: v >= 0.25,
            "%",
        ),
        check(
            "SQLite batch 1,000 / ceiling, both answering every reading (extra)",
            ratio(sqlite.get("batch_1000"), sqlite.get("ceiling_answer_batch_1000")),
            ">= 25%",
            lambda v: v >= 0.25,
            "%",
        ),
        check(
            "SQLite batch 1 / ceiling, both answering the acknowledgement",
            ratio(sqlite.get("ack_only_batch_1"), sqlite.get("ceiling_batch_1")),
            ">= 30%",
            lambda v: v >= 0.30,
            "%",
        ),
        check(
            "SQLite batch 1 / ceiling, both answering every reading (extra)",
            ratio(sqlite.get("batch_1"), sqlite.get("ceiling_answer_batch_1")),
            ">= 30%",
            lambda v: v >= 0.30,
            "%",
        ),
        check("streams_1000 p99 latency", flow.get("p99_ms"), "< 100 ms", lambda v: v < 100, "ms"),
        check("streams_1000 errors", flow.get("errors"), "0", lambda v: v == 0),
        check(
            "streams_1000 sustained / offered (extra)",
            ratio(flow.get("readings_per_s"), offered),
            ">= 99%",
            lambda v: v >= 0.99,
            "%",
        ),
        check(
            "RSS at 10,000 streams" + (" (extrapolated)" if extrapolated else ""),
            rss,
            "< 200 MB",
            lambda v: v < 200,
            "MiB",
        ),
        check(
            "  of which the streams, start-up excluded (extra)",
            report.get("memory", {}).get("streams_mb_10000_streams"),
            "< 200 MB",
            lambda v: v < 200,
            "MiB",
        ),
    ]


def print_summary(report: dict[str, Any]) -> None:
    print("\n=== summary " + "=" * 53)
    fc = report.get("forecaster_readings_per_s")
    if fc:
        print("\nforecaster readings/s (median):")
        print("| model | batch 1 | batch 64 | batch 1,024 |\n|---|---:|---:|---:|")
        for model, row in fc.items():
            print(
                f"| {model} | " + " | ".join(f"{row[b]:,.0f}" for b in ("1", "64", "1024")) + " |"
            )
    ingest_table = report.get("ingest_readings_per_s")
    if ingest_table:
        print(f"\ningest readings/s (median; model kind {report.get('ingest_model_kind')}):")
        keys = [
            "batch_1",
            "batch_1000",
            "ack_only_batch_1",
            "ack_only_batch_1000",
            "ceiling_batch_1",
            "ceiling_batch_1000",
            "ceiling_answer_batch_1",
            "ceiling_answer_batch_1000",
        ]
        print("| database | " + " | ".join(keys) + " |\n|---|" + "---:|" * len(keys))
        for database, row in ingest_table.items():
            if "error" in row:
                print(f"| {database} | {row['error']} |")
                continue
            cells = " | ".join(f"{row[k]:,.0f}" if k in row else "n/a" for k in keys)
            print(f"| {database} | {cells} |")
    print("\nissue 6 acceptance, as measured:")
    print("| check | measured | target | |\n|---|---:|---|---|")
    for item in report["acceptance"]:
        value, unit = item["measured"], item["unit"]
        if value is None:
            shown = "n/a"
        elif unit == "%":
            shown = f"{100 * value:.1f}%"
        elif unit == "x":
            shown = f"{value:.1f}x"
        elif unit:
            shown = f"{value:,.1f} {unit}"
        else:
            shown = f"{value:,}"
        mark = {True: "PASS", False: "MISS", None: "n/a"}[item["pass"]]
        print(f"| {item['check']} | {shown} | {item['target']} | {mark} |")


# --- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Under ~4 minutes.")
    parser.add_argument("--json", type=Path, default=None, help="Write the report here.")
    parser.add_argument("--skip", default="", help=f"Comma-separated parts of {PARTS}.")
    parser.add_argument("--gateways", type=int, default=2, help="streams: gateway connections.")
    parser.add_argument(
        "--streams-database", choices=("sqlite", "postgresql"), default="postgresql"
    )
    parser.add_argument(
        "--streams-results", action="store_true", help="streams: ask for per-reading results."
    )
    parser.add_argument(
        "--model-kind",
        choices=ingest.MODEL_KINDS,
        default="lstm-stateful",
        help="ingest: every stream's model (the service default is a stateful LSTM).",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("TWINWATCH_BENCH_DATABASE_URL")
        or os.environ.get("TWINWATCH_TEST_DATABASE_URL")
        or DEFAULT_POSTGRES,
    )
    args = parser.parse_args()
    skip = {name for name in args.skip.split(",") if name}
    if skip - set(PARTS):
        parser.error(f"unknown part(s) {sorted(skip - set(PARTS))}; parts are {PARTS}")
    started = time.perf_counter()
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "quick": args.quick,
        "machine": machine_info(),
    }
    with tempfile.TemporaryDirectory(prefix="twinwatch-run-") as scratch:
        work = Path(scratch)
        if "forecasters" not in skip:
            part = run_part("forecasters", lambda: forecasters.run(quick=args.quick))
            report["forecasters"] = part
            report["forecaster_readings_per_s"] = part.get("readings_per_s")
        if "ingest" not in skip:
            part = run_part("ingest", lambda: run_ingest(args))
            report["ingest"] = part.get("details", part)
            report["ingest_readings_per_s"] = part.get("readings_per_s")
            report["ingest_model_kind"] = args.model_kind
        if "streams" not in skip:
            options = streams.Options(
                gateways=args.gateways,
                seconds=10.0 if args.quick else 60.0,
                database=args.streams_database,
                postgres_url=args.postgres_url or streams.DEFAULT_POSTGRES,
                results=args.streams_results,
            )
            (work / "streams").mkdir()
            part = run_part("streams", lambda: streams.run(options, work / "streams"))
            report["streams_1000"] = part
        if "memory" not in skip:
            (work / "memory").mkdir()
            part = run_part(
                "memory",
                lambda: memory.run(
                    quick=args.quick,
                    streams=None,
                    work=work / "memory",
                    log_level="warning",
                    analysis=True,
                ),
            )
            report["memory"] = part
            report["rss_mb_10000_streams"] = part.get("rss_mb_10000_streams")
    report["acceptance"] = acceptance(report)
    report["wall_s"] = time.perf_counter() - started
    report["machine"]["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    print_summary(report)
    print(f"\nwhole run: {report['wall_s']:.0f} s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
