"""The detectors a stream of a trained model gets: its model's calibrated ones, the
missing-readings rule, and the stream's overrides (switched off, another threshold or alarm
policy); and the overrides a PUT refuses."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from app.errors import ArtifactError, DataError
from app.monitoring.config import MISSING_READINGS, MonitorConfig
from app.registry import RegisteredModel


def monitor_config(model: RegisteredModel, overrides: dict[str, Any]) -> MonitorConfig:
    """The model's detectors (`model_detectors`) with a stream's overrides applied. Overrides of
    detectors it does not have change nothing here: a PUT refuses them (`refuse_absent_detectors`),
    and a stream stored before it did keeps running."""
    return with_overrides(model_detectors(model), overrides)


def model_detectors(model: RegisteredModel) -> MonitorConfig:
    """The model's calibrated detectors, and the missing-readings rule if its calibration made
    none (it needs no calibration: every stream watches for missing readings)."""
    if not model.thresholds:
        raise ArtifactError(
            f"model {model.name!r} has no detector thresholds: run `twinwatch calibrate` on it"
        )
    base = MonitorConfig.from_manifest(model.manifest)
    if MISSING_READINGS.kind in {detector.kind for detector in base.detectors}:
        return base
    return base.model_copy(update={"detectors": [*base.detectors, MISSING_READINGS]})


def refuse_absent_detectors(model: RegisteredModel, overrides: dict[str, Any]) -> None:
    """A DataError if `overrides` asks something of a detector the model does not have (it
    would be accepted and never raise; switching one off is what it is already)."""
    if not overrides:  # (the common case, a fleet's onboarding: no manifest read)
        return
    kinds = [detector.kind for detector in model_detectors(model).detectors]
    absent = sorted(
        kind
        for kind, override in overrides.items()
        if kind not in kinds and override != {"enabled": False}
    )
    if absent:
        raise DataError(
            f"model {model.name!r} has no detector {', '.join(absent)}: its detectors are "
            f"{', '.join(kinds)}",
            model=model.name,
        )


def with_overrides(base: MonitorConfig, overrides: dict[str, Any]) -> MonitorConfig:
    """Detectors with a stream's overrides applied (switched off, another threshold or alarm
    policy)."""
    detectors = []
    for detector in base.detectors:
        override = overrides.get(detector.kind, {})
        if not override.get("enabled", True):
            continue
        update: dict[str, Any] = {}
        if override.get("threshold") is not None:
            update["threshold"] = float(override["threshold"])
            resting = getattr(detector, "resting", None)
            if resting is not None and resting >= update["threshold"]:
                update["resting"] = None  # (a threshold below the rest closes on itself)
        if override.get("policy") is not None:
            update["alarm"] = override["policy"]
        if not update:
            detectors.append(detector)
            continue
        try:  # (validated as a whole: a copy with an update is not)
            detectors.append(type(detector).model_validate(detector.model_dump() | update))
        except ValidationError as exc:
            raise DataError(f"detector {detector.kind}: {exc.errors()[0]['msg']}") from None
    if not detectors:
        raise DataError("every detector is disabled: the stream would never alarm")
    return base.model_copy(update={"detectors": detectors})
