"""A monitor's configuration, as a model's manifest stores it: each detector's kind,
threshold, window and alarm policy (`MonitorConfig`), and the detector each one builds. The
monitor that runs them is app/monitoring/monitor.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from app.errors import ArtifactError
from app.monitoring.alarms import AlarmPolicy
from app.monitoring.detectors import (
    CusumDetector,
    Detector,
    FrozenDetector,
    LevelDetector,
    MahalanobisDetector,
    MissingDetector,
    PointDetector,
    RollingRMSDetector,
    ShiftDetector,
    VarianceFloorDetector,
)

DETECTOR_ORDER = (
    "point",
    "rolling_rms",
    "variance_floor",
    "cusum",
    "level",
    "mahalanobis",
    "shift",
    "missing",
    "frozen",
)
"""The order detectors run, report and keep their state in (new kinds go last: a saved state
lists its detectors' floats in this order)."""
PER_CHANNEL = ("point", "rolling_rms", "variance_floor", "cusum", "shift", "frozen")
"""Detectors that read residuals (the frozen detector: the readings) and run on each monitored
channel on its own."""


class _DetectorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(gt=0, allow_inf_nan=False)  # every statistic is a size
    alarm: AlarmPolicy | None = None  # overrides the monitor's default policy
    gains: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = Field(
        default=None,
        description="Per monitored channel, what its statistic is multiplied by before the "
        "threshold (0: the channel is not watched by this detector); none: 1 each.",
    )


class PointConfig(_DetectorConfig):
    kind: Literal["point"] = "point"


class RollingRMSConfig(_DetectorConfig):
    kind: Literal["rolling_rms"] = "rolling_rms"
    window: int = Field(default=50, ge=2)
    resting: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Where the RMS (times its gain) stays in normal operation, or above it: an "
        "open alarm's hysteresis (the alarm policy's `clear`) is measured from there. None: the "
        "alarm closes on the threshold itself.",
    )

    @model_validator(mode="after")
    def _rests_below_threshold(self) -> RollingRMSConfig:
        if self.resting is not None and self.resting >= self.threshold:
            raise ValueError(
                f"resting ({self.resting}) must be below the threshold ({self.threshold})"
            )
        return self

    @model_serializer(mode="wrap")
    def _rest_when_known(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Written only when known: a configuration without it reads as it did in releases
        that had no such field (they refuse a field they do not know, even a null one)."""
        data: dict[str, Any] = handler(self)
        if self.resting is None:
            data.pop("resting", None)
        return data


class VarianceFloorConfig(_DetectorConfig):
    kind: Literal["variance_floor"] = "variance_floor"
    window: int = Field(default=20, ge=2)


class FrozenConfig(_DetectorConfig):
    kind: Literal["frozen"] = "frozen"
    window: int = Field(default=20, ge=2)


class CusumConfig(_DetectorConfig):
    kind: Literal["cusum"] = "cusum"
    sigma: float = Field(gt=0, allow_inf_nan=False)
    kappa: float = Field(gt=0, allow_inf_nan=False)
    clip: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class LevelConfig(_DetectorConfig):
    kind: Literal["level"] = "level"
    window: int = Field(default=10, ge=2)


class ShiftConfig(_DetectorConfig):
    kind: Literal["shift"] = "shift"
    window: int = Field(default=10, ge=2)


class MissingConfig(_DetectorConfig):
    kind: Literal["missing"] = "missing"
    threshold: float = Field(default=0.5, gt=0, lt=1, allow_inf_nan=False)


MISSING_READINGS = MissingConfig(alarm=AlarmPolicy(k=3, n=10, m=10))
"""Readings that came without a number, on a stream whose model learned no rule of its own for
them (a trained model; a stream still learning): 3 of the last 10 open an alarm, 10 complete
readings in a row close it. It needs no calibration: every stream watches for them."""


class MahalanobisConfig(_DetectorConfig):
    kind: Literal["mahalanobis"] = "mahalanobis"
    covariance: list[list[float]]
    watched: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description="The channels the distance reads, in order (the covariance is theirs); "
        "none: every channel.",
    )


DetectorConfig = Annotated[
    PointConfig
    | RollingRMSConfig
    | VarianceFloorConfig
    | FrozenConfig
    | CusumConfig
    | LevelConfig
    | MahalanobisConfig
    | ShiftConfig
    | MissingConfig,
    Field(discriminator="kind"),
]


class MonitorConfig(BaseModel):
    """Detectors and alarm rules of a stream; stored as the `thresholds` field of a manifest.

    `calibration` records how the thresholds were obtained (margins or target rate, hold-out,
    what rate the hold-out supports); the monitor itself does not read it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    channels: int = Field(default=1, ge=1)
    alarm: AlarmPolicy = AlarmPolicy()
    detectors: list[DetectorConfig]
    calibration: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> MonitorConfig:
        kinds = [d.kind for d in self.detectors]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"each detector kind at most once, got {kinds}")
        for d in self.detectors:
            if isinstance(d, MahalanobisConfig):
                watched = list(range(self.channels)) if d.watched is None else d.watched
                if len(set(watched)) != len(watched) or max(watched, default=0) >= self.channels:
                    raise ValueError(f"mahalanobis watches channels {watched} of {self.channels}")
                if len(d.covariance) != len(watched):
                    raise ValueError(
                        f"mahalanobis covariance is {len(d.covariance)}x.. for "
                        f"{len(watched)} channels"
                    )
            if d.gains is not None and d.kind not in PER_CHANNEL:
                raise ValueError(f"{d.kind} reads no residual channel: it takes no gains")
            if d.gains is not None and len(d.gains) != self.channels:
                raise ValueError(f"{d.kind}: {len(d.gains)} gains for {self.channels} channels")
            if d.gains is not None and not any(d.gains):
                raise ValueError(f"{d.kind}: every gain is 0, the detector would watch nothing")
        return self

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> MonitorConfig:
        """The thresholds `twinwatch calibrate` stored in a model manifest."""
        raw = manifest.get("thresholds")
        if raw is None:
            raise ArtifactError(
                "the model has no detector thresholds: run `twinwatch calibrate` on it first"
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise ArtifactError(f"the model's thresholds are invalid: {_summary(exc)}") from None

    def thresholds(self) -> dict[str, float]:
        return {d.kind: d.threshold for d in self.detectors}

    def detector(self, kind: str) -> DetectorConfig | None:
        return next((d for d in self.detectors if d.kind == kind), None)


def _summary(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'thresholds'}: {e['msg']}" for e in exc.errors()
    )


def build_detector(config: DetectorConfig) -> Detector:
    """A detector from its configuration."""
    threshold = config.threshold
    if isinstance(config, PointConfig):
        return PointDetector(threshold=threshold)
    if isinstance(config, RollingRMSConfig):
        return RollingRMSDetector(threshold=threshold, window=config.window, resting=config.resting)
    if isinstance(config, VarianceFloorConfig):
        return VarianceFloorDetector(threshold=threshold, window=config.window)
    if isinstance(config, FrozenConfig):
        return FrozenDetector(threshold=threshold, window=config.window)
    if isinstance(config, CusumConfig):
        return CusumDetector(
            threshold=threshold, sigma=config.sigma, kappa=config.kappa, clip=config.clip
        )
    if isinstance(config, LevelConfig):
        return LevelDetector(threshold=threshold, window=config.window)
    if isinstance(config, ShiftConfig):
        return ShiftDetector(threshold=threshold, window=config.window)
    if isinstance(config, MissingConfig):
        return MissingDetector(threshold=threshold)
    return MahalanobisDetector(
        threshold=threshold, covariance=config.covariance, watched=config.watched
    )
