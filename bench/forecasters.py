"""Forecaster throughput, readings/s: window LSTM, stateful LSTM and linear AR side by side.

One process, one BLAS thread (`single_threaded`) and the models' single-threaded ONNX Runtime
sessions, as the service forecasts; the cases
interleaved round-robin `--repeats` times so drift on this shared machine hits all alike; the
table shows the median and the best. A "batch" is what one call forecasts:

- `lstm`, `linear-ar`: that many windows (W = 64) in one `predict`;
- `lstm-stateful`: that many streams advanced together by one reading in one `advance`;
- extras: the stateful model's `advance` over one stream's 1,024 consecutive readings, 1,000
  streams stepped one by one against together (issue 6 wants together >= 5x faster), and the
  stateful model's own `predict` (a 256-reading window from a zero state per forecast: what
  the service pays while the engine still forecasts windows).

Beside each figure, the arithmetic limit: floating-point operations per reading counted from the
architecture, against the single-thread float32 GEMM rate this machine achieves (a 1024^3
`torch.mm`). The limit is what a perfect implementation of the same arithmetic could reach;
the gap is per-call overhead (Python, ONNX Runtime dispatch, numpy conversions) and memory
traffic. torch is used for the GEMM reference only (the train extra).

    python bench/forecasters.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import SHIPPED_STATEFUL, TRAIN_DATA, TRAIN_END, fit_stateful, machine_info

from app.forecasting.artifacts import load_model
from app.forecasting.base import Forecaster
from app.forecasting.linear_ar import LinearAR
from app.forecasting.lstm import LSTMForecaster
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import single_threaded
from app.forecasting.windows import sliding_windows
from app.registry import SHIPPED_MODELS_DIR
from app.series import read_csv

BATCHES = (1, 64, 1024)
WINDOW_MODEL = "lstm-day-seed3"  # the service's default model (a window LSTM, W = 64)
ONE_BY_ONE_STREAMS = 1000
RUN_READINGS = 1024
GEMM_N = 1024
GATE_FLOPS_PER_UNIT = 17
"""Per hidden unit and layer step besides the two matrix products: 8 bias adds (b_ih, b_hh
on 4 gates), 4 activations (counted as one flop each, though a sigmoid costs more), 3 for
c = f*c + i*g, 2 for h = o*tanh(c)."""


# --- arithmetic ---------------------------------------------------------------------------------


def lstm_step_flops(inputs: int, hidden: int, layers: int) -> int:
    """One time step of a stacked LSTM: per layer the gate products 4H x (I + H)
    multiply-adds (2 flops each) plus the element-wise gate work."""
    total, width = 0, inputs
    for _ in range(layers):
        total += 2 * 4 * hidden * (width + hidden) + GATE_FLOPS_PER_UNIT * hidden
        width = hidden
    return total


def head_flops(hidden: int, horizon: int) -> int:
    return 2 * hidden * horizon + horizon


def window_lstm_flops(model: LSTMForecaster) -> int:
    """A window LSTM re-reads its whole window: W steps per forecast."""
    step = lstm_step_flops(model.n_channels, model.hidden, model.layers)
    return model.window * step + head_flops(model.hidden, model.horizon)


def stateful_step_flops(model: StatefulLSTMForecaster) -> int:
    """The stateful model steps once per reading."""
    step = lstm_step_flops(model.n_channels, model.hidden, model.layers)
    return step + head_flops(model.hidden, model.horizon)


def stateful_window_flops(model: StatefulLSTMForecaster) -> int:
    """Its offline `predict`: W - 1 differences from a zero state per forecast."""
    step = lstm_step_flops(model.n_channels, model.hidden, model.layers)
    return (model.window - 1) * step + head_flops(model.hidden, model.horizon)


def linear_ar_flops(model: LinearAR) -> int:
    """2 * W * C per horizon step (one multiply-add per coefficient)."""
    return 2 * model.window * model.n_channels * model.horizon


def gemm_flops_per_s(repeats: int, n: int = GEMM_N) -> dict[str, float]:
    """Single-thread float32 GEMM rate (flop/s) of this machine: best and median of `repeats`."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator)
    b = torch.randn(n, n, generator=generator)
    out = torch.empty(n, n)
    rates = []
    with single_threaded():
        torch.mm(a, b, out=out)  # warm-up
        for _ in range(repeats):
            started = time.perf_counter()
            torch.mm(a, b, out=out)
            rates.append(2 * n**3 / (time.perf_counter() - started))
    return {"best": max(rates), "median": statistics.median(rates), "n": n}


# --- cases --------------------------------------------------------------------------------------


@dataclass
class Case:
    """One thing to time: `call()` forecasts `readings` readings."""

    model: str
    label: str
    batch: int
    readings: int
    flops_per_reading: int
    call: Callable[[], object]
    rates: list[float] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.label}/{self.batch}"


@dataclass
class Models:
    window: LSTMForecaster
    stateful: StatefulLSTMForecaster
    linear: LinearAR
    provenance: dict[str, str]


def load_models(epochs: int) -> Models:
    """The service's default window LSTM, the shipped stateful model if there is one (else one
    fitted here for `epochs` epochs) and a linear AR fitted on the same samples."""
    window = load_model(SHIPPED_MODELS_DIR / WINDOW_MODEL).forecaster
    assert isinstance(window, LSTMForecaster)
    shipped = SHIPPED_MODELS_DIR / SHIPPED_STATEFUL
    provenance = {"lstm": f"app/shipped_models/{WINDOW_MODEL}"}
    if (shipped / "manifest.json").is_file():
        stateful = load_model(shipped).forecaster
        provenance["lstm-stateful"] = f"app/shipped_models/{SHIPPED_STATEFUL}"
    else:
        stateful = fit_stateful(epochs)
        provenance["lstm-stateful"] = f"fitted here, {epochs} epochs on {TRAIN_DATA.name}"
    assert isinstance(stateful, StatefulLSTMForecaster)
    matrix = read_csv(TRAIN_DATA).matrix(["value"])
    linear = LinearAR(window=window.window).fit(matrix, train_end=TRAIN_END)
    provenance["linear-ar"] = f"fitted here on {TRAIN_DATA.name}[:{TRAIN_END}], W={window.window}"
    return Models(window, stateful, linear, provenance)


def stream_values(streams: int, length: int) -> np.ndarray:
    """(streams, length) readings: the twin's record, each stream from its own offset."""
    series = read_csv(TRAIN_DATA).value
    offsets = (np.arange(streams) * 7) % (series.shape[0] - length)
    return np.stack([series[o : o + length] for o in offsets])


def predict_case(label: str, model: Forecaster, batch: int, flops_per_reading: int) -> Case:
    """`batch` windows of the twin's record in one `predict` call."""
    series = read_csv(TRAIN_DATA).matrix(["value"])
    targets = model.window + (np.arange(batch) * 3) % (series.shape[0] - model.window)
    windows = sliding_windows(series, targets, model.window)
    return Case(model.kind, label, batch, batch, flops_per_reading, lambda: model.predict(windows))


def step_case(model: StatefulLSTMForecaster, batch: int, label: str = "lstm-stateful") -> Case:
    """`batch` streams advanced together by one reading, the carry kept from call to call."""
    values = stream_values(batch, 512)[:, :, None]
    holder: list[Any] = [model.initial_carry(batch), 1]

    def call() -> None:
        carry, index = holder
        _, holder[0] = model.advance(
            values[:, index - 1 : index], values[:, index : index + 1], carry
        )
        holder[1] = index + 1 if index + 1 < values.shape[1] else 1

    return Case("lstm-stateful", label, batch, batch, stateful_step_flops(model), call)


def one_by_one_case(model: StatefulLSTMForecaster, streams: int) -> Case:
    """The same streams, each stepped in its own call (what no cross-stream batching costs)."""
    values = stream_values(streams, 512)[:, :, None]
    carries = [model.initial_carry(1) for _ in range(streams)]
    position = [1]

    def call() -> None:
        index = position[0]
        for row in range(streams):
            _, carries[row] = model.advance(
                values[row : row + 1, index - 1 : index],
                values[row : row + 1, index : index + 1],
                carries[row],
            )
        position[0] = index + 1 if index + 1 < values.shape[1] else 1

    return Case(
        "lstm-stateful", "stateful one-by-one", streams, streams, stateful_step_flops(model), call
    )


def run_case(model: StatefulLSTMForecaster, readings: int) -> Case:
    """One stream's `readings` consecutive readings in one `advance` (sequential in time)."""
    series = stream_values(1, readings + 1)[:, :, None]
    carry = model.initial_carry(1)
    return Case(
        "lstm-stateful",
        "stateful run",
        1,
        readings,
        stateful_step_flops(model),
        lambda: model.advance(series[:, :1], series[:, 1:], carry),
    )


def build_cases(models: Models) -> list[Case]:
    cases: list[Case] = []
    for batch in BATCHES:
        window, stateful, linear = models.window, models.stateful, models.linear
        cases.append(predict_case("lstm", window, batch, window_lstm_flops(window)))
        cases.append(step_case(stateful, batch))
        cases.append(predict_case("linear-ar", linear, batch, linear_ar_flops(linear)))
        flops = stateful_window_flops(stateful)
        cases.append(predict_case("stateful predict", stateful, batch, flops))
    cases.append(run_case(models.stateful, RUN_READINGS))
    cases.append(one_by_one_case(models.stateful, ONE_BY_ONE_STREAMS))
    cases.append(step_case(models.stateful, ONE_BY_ONE_STREAMS, "stateful together"))
    return cases


def measure(cases: list[Case], repeats: int, seconds: float) -> None:
    """Round-robin: each repeat times every case for about `seconds` (at least one call)."""
    with single_threaded():
        for case in cases:
            case.call()  # warm-up: first-call allocations, lazy init
        for repeat in range(repeats):
            for case in cases:
                calls = 0
                started = time.perf_counter()
                while True:
                    case.call()
                    calls += 1
                    elapsed = time.perf_counter() - started
                    if elapsed >= seconds:
                        break
                case.rates.append(case.readings * calls / elapsed)
            print(f"  repeat {repeat + 1}/{repeats} done", flush=True)


# --- report -------------------------------------------------------------------------------------


def summarise(cases: list[Case], gemm: dict[str, float]) -> dict[str, Any]:
    rows = []
    for case in cases:
        limit = gemm["best"] / case.flops_per_reading
        median = statistics.median(case.rates)
        rows.append(
            {
                "case": case.label,
                "model": case.model,
                "batch": case.batch,
                "readings_per_call": case.readings,
                "readings_per_s_median": median,
                "readings_per_s_best": max(case.rates),
                "us_per_call_median": 1e6 * case.readings / median,
                "flops_per_reading": case.flops_per_reading,
                "limit_readings_per_s": limit,
                "fraction_of_limit": median / limit,
            }
        )
    by = {(r["case"], r["batch"]): r for r in rows}
    headline = {
        name: {str(b): by[(label, b)]["readings_per_s_median"] for b in BATCHES}
        for name, label in (
            ("lstm", "lstm"),
            ("lstm-stateful", "lstm-stateful"),
            ("linear-ar", "linear-ar"),
        )
    }
    together = by[("stateful together", ONE_BY_ONE_STREAMS)]["readings_per_s_median"]
    alone = by[("stateful one-by-one", ONE_BY_ONE_STREAMS)]["readings_per_s_median"]
    ratios = {
        "stateful_vs_window_lstm_batch_1024": headline["lstm-stateful"]["1024"]
        / headline["lstm"]["1024"],
        "together_vs_one_by_one_1000_streams": together / alone,
        "stateful_run_1024_vs_step_batch_1": by[("stateful run", 1)]["readings_per_s_median"]
        / headline["lstm-stateful"]["1"],
    }
    return {"readings_per_s": headline, "ratios": ratios, "rows": rows}


def print_table(summary: dict[str, Any], gemm: dict[str, float]) -> None:
    print(
        f"\nsingle-thread float32 GEMM ({gemm['n']}^3 torch.mm): best {gemm['best'] / 1e9:.1f}, "
        f"median {gemm['median'] / 1e9:.1f} Gflop/s (the limits below use the best)\n"
    )
    print(
        "| case | batch | readings/s median | best | us/call | flops/reading "
        "| limit readings/s | % of limit |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in summary["rows"]:
        print(
            f"| {r['case']} | {r['batch']:,} | {r['readings_per_s_median']:,.0f} "
            f"| {r['readings_per_s_best']:,.0f} | {r['us_per_call_median']:,.0f} "
            f"| {r['flops_per_reading']:,} | {r['limit_readings_per_s']:,.0f} "
            f"| {100 * r['fraction_of_limit']:.2f} |"
        )
    ratios = summary["ratios"]
    print(
        f"\nstateful step vs window LSTM predict at batch 1,024: "
        f"{ratios['stateful_vs_window_lstm_batch_1024']:.1f}x (issue 6 wants >= 10x)"
    )
    print(
        f"1,000 streams stepped together vs one by one: "
        f"{ratios['together_vs_one_by_one_1000_streams']:.1f}x (issue 6 wants >= 5x)"
    )
    print(
        "stateful run of one stream's 1,024 readings vs one-stream step: "
        f"{ratios['stateful_run_1024_vs_step_batch_1']:.1f}x"
    )


def run(*, quick: bool, repeats: int | None = None, epochs: int = 2) -> dict[str, Any]:
    """Everything: load/fit the models, time the cases, print the table; returns the report."""
    repeats = repeats or (3 if quick else 7)
    seconds = 0.1 if quick else 0.3
    torch.manual_seed(0)
    print(f"forecasters: loading models, {repeats} repeats of ~{seconds} s per case", flush=True)
    models = load_models(epochs)
    cases = build_cases(models)
    gemm = gemm_flops_per_s(repeats=max(3, repeats))
    measure(cases, repeats, seconds)
    summary = summarise(cases, gemm)
    print_table(summary, gemm)
    return {
        "repeats": repeats,
        "seconds_per_sample": seconds,
        "models": models.provenance,
        "gemm_flops_per_s": gemm,
        **summary,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 short repeats (~20 s).")
    parser.add_argument("--repeats", type=int, default=None, help="Default 7 (3 with --quick).")
    parser.add_argument("--epochs", type=int, default=2, help="Epochs of the stateful fit.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    report = {"command": " ".join(sys.argv), "machine": machine_info()}
    report |= run(quick=args.quick, repeats=args.repeats, epochs=args.epochs)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
