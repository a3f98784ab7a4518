"""The calibrate and evaluate workflows: model and data in, manifest and report out.

The thin layer between the CLI and the numeric core: it reads files, checks that the user's
ranges make sense (one-line DataErrors), streams the record through the stream recurrence (as
the live service would process it) and hands what the detectors saw to the core.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import DataError
from app.figures import require_matplotlib
from app.forecasting.artifacts import LoadedModel, load_model, update_manifest
from app.monitoring.alarms import AlarmPolicy
from app.monitoring.calibration import (
    DetectorSettings,
    HoldOut,
    calibrate_margins,
    calibrate_rate,
)
from app.monitoring.config import MonitorConfig, PointConfig
from app.monitoring.evaluation import (
    RECOVERY,
    MonitoredRecord,
    normal_day_false_alarms,
    score_faults,
    stream_record,
)
from app.series import VALUE_COLUMN, Series, read_csv
from app.simulation.faults import Fault, load_schedule

DEFAULT_SAMPLE_PERIOD_S = 0.1
MIN_HOLDOUT = 100  # residuals, beyond the largest detector window


def parse_range(text: str, total: int, *, option: str = "--holdout") -> tuple[int, int]:
    """'6000:7000', '6000:', ':1000' or 'all' -> [start, stop) inside a record of `total`."""
    text = text.strip()
    if text == "all":
        return 0, total
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        start = int(parts[0]) if parts[0].strip() else 0
        stop = int(parts[1]) if parts[1].strip() else total
    except ValueError:
        raise DataError(
            f"{option} must be START:STOP in samples (e.g. 6000:7000) or 'all', got {text!r}"
        ) from None
    if not 0 <= start < stop:
        raise DataError(f"{option} {text}: need 0 <= START < STOP")
    if stop > total:
        raise DataError(f"{option} {text} runs past the end of the data ({total} samples)")
    return start, stop


def sample_period(series: Series, given: float | None) -> float:
    """The --sample-period, else the data's own spacing."""
    if given is not None:
        if not given > 0:
            raise DataError(f"--sample-period must be positive, got {given}")
        return given
    if len(series) < 2:
        return DEFAULT_SAMPLE_PERIOD_S
    return float(np.median(np.diff(series.t)))


def model_channels(loaded: LoadedModel) -> list[str]:
    """The data columns the forecaster reads, target first."""
    channels = loaded.manifest.get("channels")
    if isinstance(channels, list) and channels and all(isinstance(c, str) for c in channels):
        return channels
    return [VALUE_COLUMN]


def _training(loaded: LoadedModel) -> dict[str, Any]:
    training = loaded.manifest.get("training")
    return training if isinstance(training, dict) else {}


def unseen_from(loaded: LoadedModel, series: Series) -> int:
    """The first sample of `series` to score as normal operation the model never saw.

    Its training range when the record may be (a version of) the training record, so in-sample
    residuals never count; 0 when the model trained on samples past the record's end, which
    then cannot be its training record (a model trained on a day, scored on a lab record).
    """
    end = train_end(loaded)
    if end < len(series) or series.sha256() == _training(loaded).get("data_sha256"):
        return min(end, len(series))
    return 0


def train_end(loaded: LoadedModel) -> int:
    """The first sample the model never trained on (0 when the manifest does not say)."""
    value = _training(loaded).get("train_end")
    return value if isinstance(value, int) else 0


def _check_holdout(loaded: LoadedModel, series: Series, text: str) -> tuple[int, int]:
    """The hold-out range, refused when it cannot hold a full detector window (before any
    forecasting, so a typo costs nothing)."""
    start, stop = parse_range(text, len(series))
    window = loaded.forecaster.window
    first = max(start, window)
    settings = DetectorSettings()
    needed = max(settings.rms_window, settings.floor_window, settings.level_window) + MIN_HOLDOUT
    if stop - first < needed:
        raise DataError(
            f"--holdout {text}: only {max(0, stop - first)} residuals (the first {window} samples "
            f"of the data have no full forecast window); need at least {needed}"
        )
    return start, stop


def _holdout(path: Path, series: Series, record: MonitoredRecord, start: int, stop: int) -> HoldOut:
    description = {"data": str(path), "data_sha256": series.sha256(), "start": start, "stop": stop}
    return HoldOut(record.inputs, record.reference_gaps, start, stop, description)


WATCH_ONLY = MonitorConfig(detectors=[PointConfig(threshold=1e300)])
"""A monitor that never alarms: for streaming a record to see what the detectors would see."""


def detector_inputs(loaded: LoadedModel, series: Series, sample_period_s: float) -> MonitoredRecord:
    """The record streamed through the model, from its first sample: the residuals and gaps the
    detectors of a live stream of it would see."""
    return stream_record(
        loaded.forecaster,
        WATCH_ONLY,
        series,
        model_channels(loaded),
        sample_period_s=sample_period_s,
    )


def calibrate(
    model: Path,
    data: Path,
    holdout: str,
    *,
    false_alarms_per_day: float | None = None,
    sample_period_s: float | None = None,
    alarm: AlarmPolicy | None = None,
) -> MonitorConfig:
    """Thresholds from the hold-out, written into the model's manifest as `thresholds`: those
    that the statistics of a live stream of the record give over the hold-out."""
    loaded = load_model(model)
    series = read_csv(data)
    start, stop = _check_holdout(loaded, series, holdout)
    end = train_end(loaded)
    if start < end and series.sha256() == _training(loaded).get("data_sha256"):
        raise DataError(
            f"--holdout {holdout} overlaps the samples before {end} this model trained on; "
            "thresholds must come from data the model never saw"
        )
    settings = DetectorSettings(alarm=alarm or AlarmPolicy())
    period = sample_period(series, sample_period_s)
    # The record up to the hold-out's end: the stream reaches the hold-out warm, as it would.
    record = detector_inputs(loaded, series.head(stop), period)
    held = _holdout(data, series, record, start, stop)
    if false_alarms_per_day is None:
        config = calibrate_margins(held, settings)
    else:
        config = calibrate_rate(
            held, false_alarms_per_day, sample_period_s=period, settings=settings
        )
    update_manifest(model, thresholds=config.model_dump(mode="json"))
    return config


def load_faults(path: Path, total: int) -> list[Fault]:
    faults = load_schedule(path)
    for fault in faults:
        if fault.end > total:
            raise DataError(
                f"{path}: the {fault.type.value} fault ends at {fault.end}, after the "
                f"{total} samples of the data"
            )
    return faults


def evaluate(
    model: Path,
    data: Path,
    faults_path: Path,
    *,
    holdout: str | None = None,
    plots: Path | None = None,
    normal_days: float | None = None,
    seed: int | None = None,
    sample_period_s: float | None = None,
) -> dict[str, Any]:
    """The fault-injection report of the issue's JSON format."""
    if plots is not None:
        require_matplotlib()  # before the stream is run, not after
    started = time.perf_counter()
    if normal_days is not None and (seed is None or not normal_days > 0):
        raise DataError("--normal-days needs a positive number of days and --seed")
    loaded = load_model(model)
    series = read_csv(data)
    faults = load_faults(faults_path, len(series))
    period = sample_period(series, sample_period_s)
    if holdout is not None:
        start, stop = _check_holdout(loaded, series, holdout)
        for fault in faults:
            if fault.start < stop and start < fault.end + RECOVERY:
                raise DataError(
                    f"--holdout {holdout} overlaps the {fault.type.value} fault at "
                    f"{fault.start}..{fault.end}: thresholds must come from normal data"
                )
        score_from, plot_from = stop, start
    else:
        config = MonitorConfig.from_manifest(loaded.manifest)
        if config.channels != 1:
            raise DataError(
                f"the thresholds are for {config.channels} residual channels; "
                "this model forecasts one"
            )
        score_from = plot_from = max(unseen_from(loaded, series), loaded.forecaster.window)
    forecast_started = time.perf_counter()
    if holdout is not None:
        inputs = detector_inputs(loaded, series, period)
        config = calibrate_margins(_holdout(data, series, inputs, start, stop))
    record = stream_record(
        loaded.forecaster, config, series, model_channels(loaded), sample_period_s=period
    )
    forecast_seconds = time.perf_counter() - forecast_started
    report: dict[str, Any] = {
        "model": str(model),
        "data": str(data),
        **score_faults(record, faults, score_from=score_from, sample_period_s=period),
        "thresholds": config.thresholds(),
        "detector_config": config.model_dump(mode="json", exclude={"calibration"}),
        "calibration": config.calibration,
        "sample_period_s": period,
        "stream_seconds": forecast_seconds,
    }
    if plots is not None:
        from app.monitoring.plots import plot_record  # matplotlib, on demand

        path = plot_record(record, config, faults, plots / "monitor.png", start=plot_from)
        report["plots"] = [str(path)]
    if normal_days is not None and seed is not None:
        report["normal_days"] = normal_day_false_alarms(
            loaded.forecaster,
            config,
            model_channels(loaded),
            days=normal_days,
            seed=seed,
            sample_period_s=period,
        )
    report["seconds"] = time.perf_counter() - started
    return report
