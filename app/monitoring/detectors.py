"""Residual detectors (SPEC section 5), each one formula with an incremental and a batch form.

A detector turns its input (the residual of channel 0, the residual vector, or the gap between the
reading and its reference) into a statistic and says whether the statistic is on the alarming
side of its threshold.

Exactness. The live engine steps a stream one reading at a time through `update`; the offline
evaluation calls `batch` over a whole record. Both must give the same statistic bit for bit, so
each formula is written once, over a sequence of "columns" that are either Python floats (one
window, incremental) or numpy arrays (all windows at once, batch), and reduced in a fixed
left-to-right order. Every operation involved (+, *, /, sqrt, abs) is a single IEEE-rounded
operation in both numpy and Python, so the two forms cannot drift apart. Rolling statistics are
recomputed from a ring buffer of the last `window` inputs (O(window) per step, O(1) in the length
of the stream) rather than kept as running sums, which would accumulate rounding error.

Missing samples. Callers pass only valid (finite) inputs: a missing reading (NaN) is skipped, the
detector's state holds and the sample gets no statistic. Warm-up: a rolling detector gives no
statistic until its window is full, so it cannot alarm before then.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Literal, TypeGuard, TypeVar, cast

import numpy as np
from numpy.typing import NDArray

from app.errors import DataError

Direction = Literal["above", "below"]
Source = Literal["residual", "vector", "reference_gap"]
FloatArray = NDArray[np.float64]
F = TypeVar("F", float, FloatArray)

CUSUM_DESIGN_RATIO = 2.0
"""CUSUM is tuned to detect a doubling of the residual variance (see `cusum_kappa`)."""


def cusum_kappa(variance_ratio: float = CUSUM_DESIGN_RATIO) -> float:
    """Allowance kappa that makes the CUSUM the likelihood-ratio test for var -> ratio * var.

    For Gaussian residuals the log-likelihood ratio of N(0, rho sigma^2) against N(0, sigma^2)
    is proportional to r^2/sigma^2 - ln(rho)/(1 - 1/rho); rho = 2 gives kappa = 1.386, "slightly
    above 1": the statistic drifts down under normal operation and up when variance doubles.
    """
    if variance_ratio <= 1.0:
        raise ValueError("the CUSUM is designed for a variance increase: ratio must exceed 1")
    return math.log(variance_ratio) / (1.0 - 1.0 / variance_ratio)


# --- the formulas, each written once ------------------------------------------------------------


def _sequential_sum(terms: Iterable[F]) -> F:
    """Left-to-right sum: the same rounding for a float window and for a column of windows."""
    iterator = iter(terms)
    total = next(iterator)
    for term in iterator:
        total = total + term
    return total


def _sqrt(value: F) -> F:
    if isinstance(value, float):
        return math.sqrt(value)
    return np.sqrt(value)


def _abs(value: F) -> F:
    if isinstance(value, float):
        return abs(value)
    return np.abs(value)


def rms(window: Sequence[F]) -> F:
    """sqrt(mean(r^2)) over the window."""
    return _sqrt(_sequential_sum(x * x for x in window) / len(window))


def std(window: Sequence[F]) -> F:
    """Population standard deviation, two-pass (mean first) for accuracy near zero."""
    mean = _sequential_sum(window) / len(window)
    return _sqrt(_sequential_sum((x - mean) * (x - mean) for x in window) / len(window))


def abs_mean(window: Sequence[F]) -> F:
    """|mean| of the window: a sustained gap survives averaging, white noise does not."""
    return _abs(_sequential_sum(window) / len(window))


def cusum_increment(residual: F, sigma: float, kappa: float, clip: float | None) -> F:
    """min(r^2 / sigma^2, clip) - kappa: positive on average only once the variance has grown."""
    z = residual * residual / (sigma * sigma)
    if clip is not None:
        z = min(z, clip) if isinstance(z, float) else np.minimum(z, clip)
    return z - kappa


def cusum_steps(
    previous: float, increments: Iterable[float], limit: float
) -> tuple[list[float], float]:
    """(S_t for each increment, the state carried forward): S_t = max(0, S_{t-1} + increment),
    restarted at 0 once it has signalled (S_t > limit), so that each alarm is fresh evidence.
    Both forms iterate it (one loop here: a call per sample would cost four times the step)."""
    statistics = []
    s = previous
    for increment in increments:
        total = s + increment
        statistic = total if total > 0.0 else 0.0
        statistics.append(statistic)
        s = 0.0 if statistic > limit else statistic
    return statistics, s


def whitened_square(whitening: FloatArray, residual: Sequence[F]) -> F:
    """d^2 = |L^-1 r|^2 = r^T Sigma^-1 r, with L the Cholesky factor of Sigma (fixed order)."""
    rows: list[list[float]] = whitening.tolist()
    terms: list[F] = []
    for i, row in enumerate(rows):
        terms.append(_sequential_sum(row[j] * residual[j] for j in range(i + 1)))
    return _sequential_sum(y * y for y in terms)


def _columns(view: FloatArray) -> list[FloatArray]:
    return [view[:, j] for j in range(view.shape[1])]


# --- detectors ----------------------------------------------------------------------------------


class Detector(ABC):
    """One statistic with its threshold and its running state.

    `update` takes one valid input and returns the statistic (None during warm-up); `batch` takes
    the valid inputs of a whole record and returns their statistics (NaN during warm-up); both
    advance the same state, so a stream can switch between them at any sample.
    """

    kind: ClassVar[str]
    direction: ClassVar[Direction] = "above"
    source: ClassVar[Source] = "residual"

    def __init__(self, *, threshold: float) -> None:
        if not math.isfinite(threshold):
            raise ValueError(f"{self.kind}: the threshold must be finite, got {threshold}")
        self.threshold = float(threshold)

    @abstractmethod
    def update(self, value: Any) -> float | None:
        """Advance by one valid input; the statistic, or None while warming up."""

    @abstractmethod
    def batch(self, values: FloatArray) -> FloatArray:
        """Advance by many valid inputs at once; their statistics, NaN while warming up."""

    @classmethod
    def update_many(
        cls, detectors: Sequence[Detector], values: Any, *, alike: bool = False
    ) -> FloatArray:
        """`update` on many detectors of this kind and configuration (one per stream), one
        valid input each (row i of `values` for detector i); NaN while one warms up.

        The forms below compute the same formula for all the streams at once, over numpy
        columns across the streams, so each statistic is the one `update` gives bit for bit
        (see the module's note on exactness). `alike`: the caller vouches that the detectors
        share their kind and configuration (those of one monitor configuration do), which
        spares checking it detector by detector."""
        out = [detector.update(value) for detector, value in zip(detectors, values, strict=True)]
        return np.array([math.nan if x is None else x for x in out], dtype=np.float64)

    def exceeds(self, statistic: F) -> Any:
        """On the alarming side of the threshold (False for NaN: no statistic, no alarm)."""
        if self.direction == "above":
            return statistic > self.threshold
        return statistic < self.threshold

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise DataError(f"{self.kind}: unexpected state keys {sorted(state)}")


class PointDetector(Detector):
    """|r_t|: spikes and the edges of offsets."""

    kind = "point"

    def update(self, value: float) -> float:
        return _abs(value)

    def batch(self, values: FloatArray) -> FloatArray:
        return _abs(values)

    @classmethod
    def update_many(
        cls, detectors: Sequence[Detector], values: Any, *, alike: bool = False
    ) -> FloatArray:
        return _abs(np.asarray(values, dtype=np.float64))


class _RollingDetector(Detector):
    """A statistic of the last `window` valid inputs, recomputed from a ring buffer."""

    default_window: ClassVar[int]

    def __init__(self, *, threshold: float, window: int | None = None) -> None:
        super().__init__(threshold=threshold)
        self.window = self.default_window if window is None else int(window)
        if self.window < 2:
            raise ValueError(f"{self.kind}: the window must hold at least 2 samples")
        # The last `window` inputs, oldest first, as C doubles: 8 bytes each where a deque of
        # Python floats costs 32 (and a live service holds one per detector and stream).
        self._buffer = array("d")

    @staticmethod
    @abstractmethod
    def formula(window: Sequence[F]) -> F: ...

    def update(self, value: float) -> float | None:
        self._buffer.append(value)
        if len(self._buffer) > self.window:
            del self._buffer[0]
        if len(self._buffer) < self.window:
            return None
        return self.formula(list(self._buffer))

    def batch(self, values: FloatArray) -> FloatArray:
        history = len(self._buffer)
        extended = np.concatenate([np.frombuffer(self._buffer, dtype=np.float64), values])
        out = np.full(values.shape[0], np.nan)
        # Row i of the view is the window ending at extended[first + i + W - 1], i.e. at
        # values[first + i + W - 1 - history]; windows ending inside the old buffer were
        # reported already, so the view starts with the first window ending on a new value.
        first = max(0, history - self.window + 1)
        if values.shape[0] and extended.shape[0] - first >= self.window:
            view = np.lib.stride_tricks.sliding_window_view(extended[first:], self.window)
            out[first + self.window - 1 - history :] = self.formula(_columns(view))
        self._buffer = array("d", extended[-self.window :].tolist())
        return out

    @classmethod
    def update_many(
        cls, detectors: Sequence[Detector], values: Any, *, alike: bool = False
    ) -> FloatArray:
        rolling = (
            cast("Sequence[_RollingDetector]", detectors)
            if alike
            else [d for d in detectors if isinstance(d, _RollingDetector)]
        )
        window = rolling[0].window if rolling else 0
        if not alike and (
            len(rolling) != len(detectors) or any(d.window != window for d in rolling)
        ):
            return super().update_many(detectors, values)
        out = np.full(len(rolling), np.nan)
        full_rows: list[int] = []
        full_buffers: list[array[float]] = []
        for row, (detector, value) in enumerate(zip(rolling, values.tolist(), strict=True)):
            buffer = detector._buffer
            buffer.append(value)
            if len(buffer) > window:
                del buffer[0]
            if len(buffer) == window:
                full_rows.append(row)
                full_buffers.append(buffer)
        if full_buffers:
            # Row i: stream i's window, oldest first, as `update` reads it.
            windows = np.frombuffer(b"".join(full_buffers), dtype=np.float64)
            out[full_rows] = cls.formula(_columns(windows.reshape(-1, window)))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": list(self._buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        buffer = state.get("buffer")
        if set(state) != {"buffer"} or not isinstance(buffer, list):
            raise DataError(f"{self.kind}: state must be {{'buffer': [...]}}")
        if len(buffer) > self.window or not all(_is_finite_number(x) for x in buffer):
            raise DataError(f"{self.kind}: the buffer must hold at most {self.window} numbers")
        self._buffer = array("d", (float(x) for x in buffer))


class RollingRMSDetector(_RollingDetector):
    """RMS of the last 50 residuals: a sustained rise of residual energy (excitation)."""

    kind = "rolling_rms"
    default_window = 50

    @staticmethod
    def formula(window: Sequence[F]) -> F:
        return rms(window)


class VarianceFloorDetector(_RollingDetector):
    """Std of the last 20 residuals, alarming BELOW a floor: a frozen sensor is too predictable."""

    kind = "variance_floor"
    direction = "below"
    default_window = 20

    @staticmethod
    def formula(window: Sequence[F]) -> F:
        return std(window)


class LevelDetector(_RollingDetector):
    """|mean(value - reference)| over a short window: a sustained sensor offset stays visible.

    The per-window forecaster re-centres on a new level within a step, so the residual shows an
    offset only at its edges; a reference that does not move with the sensor (a redundant sensor,
    the twin's physics prediction) shows it for its whole duration. No reference, no statistic.
    """

    kind = "level"
    source = "reference_gap"
    default_window = 10

    @staticmethod
    def formula(window: Sequence[F]) -> F:
        return abs_mean(window)


class CusumDetector(Detector):
    """S_t = max(0, S_{t-1} + r_t^2/sigma^2 - kappa): accumulated small evidence of more energy.

    Restart after a signal: a sample with S_t above the limit is reported (and alarms), then the
    recursion continues from 0. Without it, one spike (r = 1.5 is r^2/sigma^2 ~ 130 at sigma
    0.13) keeps S above the limit for hundreds of samples, at a drain of only kappa - 1 per
    sample, and the CUSUM is blind to the next fault; with it, a sustained fault re-signals every
    limit/drift samples.

    Bounded evidence (`clip`, None for the literal formula): each sample adds at most
    clip - kappa. A single outlier is the point detector's business; unbounded, one r = 1.8 adds
    ~180 at once and such samples make the statistic's normal tail so heavy (GPD shape 0.5 on
    3 simulated days) that a limit for one false alarm a day is far above what a sustained rise
    accumulates. With clip = 9 (3 sigma), the lab's excitation fault stands out at ~0.3 normal
    events a day instead of ~3.
    """

    kind = "cusum"

    def __init__(
        self,
        *,
        threshold: float,
        sigma: float,
        kappa: float | None = None,
        clip: float | None = None,
    ) -> None:
        super().__init__(threshold=threshold)
        if clip is not None and not (math.isfinite(clip) and clip > 0):
            raise ValueError(f"cusum: clip must be positive, got {clip}")
        self.clip = None if clip is None else float(clip)
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"cusum: sigma must be positive, got {sigma}")
        self.sigma = float(sigma)
        self.kappa = cusum_kappa() if kappa is None else float(kappa)
        if not (math.isfinite(self.kappa) and self.kappa > 0):
            raise ValueError(f"cusum: kappa must be positive, got {self.kappa}")
        self._s = 0.0

    def update(self, value: float) -> float:
        increment = cusum_increment(value, self.sigma, self.kappa, self.clip)
        (statistic,), self._s = cusum_steps(self._s, (increment,), self.threshold)
        return statistic

    def batch(self, values: FloatArray) -> FloatArray:
        increments = cusum_increment(values, self.sigma, self.kappa, self.clip).tolist()
        out, self._s = cusum_steps(self._s, increments, self.threshold)
        return np.asarray(out, dtype=np.float64)

    @classmethod
    def update_many(
        cls, detectors: Sequence[Detector], values: Any, *, alike: bool = False
    ) -> FloatArray:
        cusums = (
            cast("Sequence[CusumDetector]", detectors)
            if alike
            else [d for d in detectors if isinstance(d, CusumDetector)]
        )
        first = cusums[0] if cusums else None
        if first is None or (
            not alike
            and (
                len(cusums) != len(detectors)
                or any(d._settings() != first._settings() for d in cusums)
            )
        ):
            return super().update_many(detectors, values)
        increments = cusum_increment(
            np.asarray(values, dtype=np.float64), first.sigma, first.kappa, first.clip
        )
        # cusum_steps' step on arrays: the same comparisons and one addition per stream.
        total = np.array([d._s for d in cusums]) + increments
        statistics = np.where(total > 0.0, total, 0.0)
        carried = np.where(statistics > first.threshold, 0.0, statistics)
        for detector, s in zip(cusums, carried.tolist(), strict=True):
            detector._s = s
        return statistics

    def _settings(self) -> tuple[float, float, float, float | None]:
        return self.threshold, self.sigma, self.kappa, self.clip

    def state_dict(self) -> dict[str, Any]:
        return {"s": self._s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        s = state.get("s")
        if set(state) != {"s"} or not _is_finite_number(s) or s < 0:
            raise DataError("cusum: state must be {'s': <non-negative number>}")
        self._s = float(s)


class MahalanobisDetector(Detector):
    """d^2 = r^T Sigma^-1 r on a residual vector: broken correlations between channels.

    Each channel can stay inside its own marginal range while the pair leaves the ellipse the
    hold-out residuals fill; Sigma comes from those hold-out residuals.
    """

    kind = "mahalanobis"
    source = "vector"

    def __init__(self, *, threshold: float, covariance: Sequence[Sequence[float]]) -> None:
        super().__init__(threshold=threshold)
        matrix = np.asarray(covariance, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 2:
            raise ValueError("mahalanobis: the covariance must be a square matrix, 2x2 or larger")
        if not np.all(np.isfinite(matrix)) or not np.allclose(matrix, matrix.T):
            raise ValueError("mahalanobis: the covariance must be finite and symmetric")
        try:
            factor = np.linalg.cholesky(matrix)
        except np.linalg.LinAlgError:
            raise ValueError("mahalanobis: the covariance is not positive definite") from None
        self.covariance = matrix
        self.whitening: FloatArray = np.linalg.inv(factor)

    def update(self, value: Sequence[float]) -> float:
        return whitened_square(self.whitening, value)

    def batch(self, values: FloatArray) -> FloatArray:
        return whitened_square(self.whitening, _columns(values))

    @classmethod
    def update_many(
        cls, detectors: Sequence[Detector], values: Any, *, alike: bool = False
    ) -> FloatArray:
        first = detectors[0] if detectors else None
        if not isinstance(first, MahalanobisDetector) or (
            not alike
            and any(
                not isinstance(d, MahalanobisDetector)
                or not np.array_equal(d.whitening, first.whitening)
                for d in detectors
            )
        ):
            return super().update_many(detectors, values)
        return first.batch(np.asarray(values, dtype=np.float64))


DETECTORS: dict[str, type[Detector]] = {
    cls.kind: cls
    for cls in (
        PointDetector,
        RollingRMSDetector,
        VarianceFloorDetector,
        CusumDetector,
        LevelDetector,
        MahalanobisDetector,
    )
}


def _is_finite_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
