"""Residual detectors: each turns its input into a statistic, one formula written once.

A detector reads the residual of channel 0, the residual vector of a sensor group, or the gap
between a reading and its reference sensor, and says whether its statistic is on the alarming
side of its threshold. It computes a whole block at once: the inputs of many streams over many
readings, `(N, T)` (`(N, T, C)` for a vector), NaN where a stream has no input at a reading.
What a detector remembers between blocks is a short float vector per stream (`state_size`):
the last inputs of a rolling window, or the running sum of the CUSUM.

Exactness. The live service processes a gateway's tick (many streams, one reading each), a
stream's batch (one stream, many readings), a replay after a crash and an offline record, each
grouped differently. Every statistic is the same bit for bit whatever the grouping: a rolling
statistic is recomputed from its window (gathered into one row, reduced along the row, so the
order of the additions depends on the window length only), never kept as a running sum, and the
CUSUM recursion runs reading by reading.

Missing inputs. A stream without input at a reading (NaN) is skipped: its state holds and the
reading gets no statistic (NaN). A rolling detector gives no statistic until its window holds
`window` inputs, so it cannot alarm before then.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

Direction = Literal["above", "below"]
Source = Literal["residual", "vector", "reference_gap", "missing", "reading"]
FloatArray = NDArray[np.float64]

CUSUM_DESIGN_RATIO = 2.0
"""CUSUM is tuned to detect a doubling of the residual variance (see `cusum_kappa`)."""


def cusum_kappa(variance_ratio: float = CUSUM_DESIGN_RATIO) -> float:
    """Allowance kappa that makes the CUSUM the likelihood-ratio test for var -> ratio * var.

    For Gaussian residuals the log-likelihood ratio of N(0, rho sigma^2) against N(0, sigma^2)
    is proportional to r^2/sigma^2 - ln(rho)/(1 - 1/rho); rho = 2 gives kappa = 1.386: the
    statistic drifts down in normal operation and up once the variance has doubled.
    """
    if variance_ratio <= 1.0:
        raise ValueError("the CUSUM is designed for a variance increase: ratio must exceed 1")
    return math.log(variance_ratio) / (1.0 - 1.0 / variance_ratio)


class Detector(ABC):
    """One statistic with its threshold; the per-stream state is a float vector it is handed."""

    kind: ClassVar[str]
    direction: ClassVar[Direction] = "above"
    source: ClassVar[Source] = "residual"

    def __init__(self, *, threshold: float) -> None:
        if not math.isfinite(threshold):
            raise ValueError(f"{self.kind}: the threshold must be finite, got {threshold}")
        self.threshold = float(threshold)

    @property
    def state_size(self) -> int:
        """Floats each stream carries between blocks."""
        return 0

    def initial_state(self) -> FloatArray:
        """A fresh stream's state."""
        return np.zeros(self.state_size)

    @abstractmethod
    def statistics(self, inputs: FloatArray, state: FloatArray) -> tuple[FloatArray, FloatArray]:
        """The statistics of a block of inputs ((N, T), or (N, T, C) for a vector; NaN: no
        input) from the streams' states ((N, state_size)): ((N, T) statistics, NaN where none;
        the new states). Pure: `state` is left as it was."""

    @property
    def resting(self) -> float | None:
        """Where the statistic sits in normal operation, if that is known whatever the channel's
        units: an open alarm's hysteresis (`AlarmPolicy.clear`) is measured from it. None: no
        hysteresis (the alarm closes on the threshold itself)."""
        return None

    def exceeds(self, statistic: FloatArray) -> NDArray[np.bool_]:
        """On the alarming side of the threshold (False for NaN: no statistic, no alarm)."""
        if self.direction == "above":
            return np.asarray(statistic > self.threshold)
        return np.asarray(statistic < self.threshold)

    def check_state(self, state: FloatArray) -> str | None:
        """What is wrong with a restored state, or None."""
        if state.shape != (self.state_size,):
            return f"{self.kind}: a state of {self.state_size} numbers, got {state.shape}"
        return None


class PointDetector(Detector):
    """|r_t|: spikes and the edges of offsets."""

    kind = "point"

    @property
    def resting(self) -> float | None:
        return 0.0

    def statistics(self, inputs: FloatArray, state: FloatArray) -> tuple[FloatArray, FloatArray]:
        return np.abs(inputs), state


class RollingDetector(Detector):
    """A statistic of the last `window` inputs of each stream, recomputed from the window.

    The state is the last `window - 1` inputs, oldest first, NaN-padded on the left until the
    stream has seen that many."""

    default_window: ClassVar[int]

    def __init__(self, *, threshold: float, window: int | None = None) -> None:
        super().__init__(threshold=threshold)
        self.window = self.default_window if window is None else int(window)
        if self.window < 2:
            raise ValueError(f"{self.kind}: the window must hold at least 2 samples")

    @property
    def state_size(self) -> int:
        return self.window - 1

    def initial_state(self) -> FloatArray:
        return np.full(self.state_size, np.nan)

    @staticmethod
    def prepare(inputs: FloatArray) -> FloatArray:
        """What the windows are cut from: each input on its own (computed once per input, not
        once per window it falls in)."""
        return inputs

    @staticmethod
    @abstractmethod
    def formula(windows: FloatArray) -> FloatArray:
        """(M, window) C-contiguous windows of prepared inputs, oldest first -> (M,)
        statistics; NaN if a window holds a NaN."""

    def statistics(self, inputs: FloatArray, state: FloatArray) -> tuple[FloatArray, FloatArray]:
        count, steps = inputs.shape
        has = ~np.isnan(inputs)
        if not has.any():
            return np.full((count, steps), np.nan), state
        # Each stream's remembered inputs, then its new ones.
        combined = np.concatenate((state, inputs), axis=1)
        if has.all():  # the windows end at each new input (one input: the whole row)
            prepared = self.prepare(combined)
            if steps > 1:
                view = np.lib.stride_tricks.sliding_window_view(prepared, self.window, axis=1)
                prepared = view.reshape(-1, self.window)  # (a copy, in C order)
            statistics = self.formula(prepared).reshape(count, steps)
            return statistics, combined[:, steps:]
        # The NaNs (no input, or a state not yet full) moved to the front, so that each
        # stream's inputs form one run, in order.
        present = ~np.isnan(combined)
        order = np.argsort(present, axis=1, kind="stable")
        combined = np.take_along_axis(combined, order, axis=1)
        rows, columns = np.nonzero(has)
        # Where each new input went: after the row's NaNs, at its rank among the inputs.
        rank = np.cumsum(present, axis=1) - 1
        first = combined.shape[1] - present.sum(axis=1)
        ends = first[rows] + rank[rows, columns + self.state_size]
        gather = ends[:, None] + np.arange(1 - self.window, 1)
        statistics = np.full((count, steps), np.nan)
        statistics[rows, columns] = self.formula(self.prepare(combined)[rows[:, None], gather])
        return statistics, combined[:, steps:]

    def check_state(self, state: FloatArray) -> str | None:
        problem = super().check_state(state)
        if problem is None and np.isinf(state).any():
            return f"{self.kind}: the remembered inputs must be finite"
        if problem is None and np.isnan(state[(~np.isnan(state)).cumsum() > 0]).any():
            return f"{self.kind}: the remembered inputs must be NaN-padded on the left only"
        return problem


def _row_sum(windows: FloatArray) -> FloatArray:
    """Each row's sum, reduced along the row: the order of the additions depends on the row's
    length only, never on how many rows there are."""
    total: FloatArray = np.add.reduce(np.ascontiguousarray(windows), axis=1)
    return total


class RollingRMSDetector(RollingDetector):
    """RMS of the last 50 residuals: a sustained rise of residual energy (a machine running
    rough, an excitation)."""

    kind = "rolling_rms"
    default_window = 50

    def __init__(
        self, *, threshold: float, window: int | None = None, resting: float | None = None
    ) -> None:
        super().__init__(threshold=threshold, window=window)
        if resting is not None and not (math.isfinite(resting) and 0 <= resting < threshold):
            raise ValueError(f"rolling_rms: resting must lie in [0, threshold), got {resting}")
        self._resting = resting

    @property
    def resting(self) -> float | None:
        """Where the RMS rests is the channel's noise, in its own units: known only when its
        configuration says (a learned stream's says at most where, see app/learning)."""
        return self._resting

    @staticmethod
    def prepare(inputs: FloatArray) -> FloatArray:
        squares: FloatArray = inputs * inputs
        return squares

    @staticmethod
    def formula(windows: FloatArray) -> FloatArray:
        rms: FloatArray = np.sqrt(_row_sum(windows) / windows.shape[1])
        return rms


class VarianceFloorDetector(RollingDetector):
    """Std of the last 20 residuals, alarming BELOW a floor: a frozen sensor is too predictable."""

    kind = "variance_floor"
    direction = "below"
    default_window = 20

    @staticmethod
    def formula(windows: FloatArray) -> FloatArray:
        # Two passes (the mean first): accurate near zero, where this detector looks.
        length = windows.shape[1]
        deviations = windows - (_row_sum(windows) / length)[:, None]
        std: FloatArray = np.sqrt(_row_sum(deviations * deviations) / length)
        return std


class FrozenDetector(VarianceFloorDetector):
    """Std of the last 20 readings themselves, alarming below a floor: a sensor that stopped
    moving. Its residuals can look ordinary (a seasonal forecast keeps moving past a frozen
    reading), its readings cannot."""

    kind = "frozen"
    source: ClassVar[Source] = "reading"


class LevelDetector(RollingDetector):
    """|mean(value - reference)| over a short window: a sustained sensor offset stays visible.

    A forecaster that reads its own recent readings re-centres on a new level within a step, so
    the residual shows an offset only at its edges; a reference that does not move with the
    sensor (a redundant sensor, the twin's physics prediction) shows it while it lasts. No
    reference, no statistic.
    """

    kind = "level"
    source: ClassVar[Source] = "reference_gap"
    default_window = 10

    @property
    def resting(self) -> float | None:
        return 0.0

    @staticmethod
    def formula(windows: FloatArray) -> FloatArray:
        level: FloatArray = np.abs(_row_sum(windows) / windows.shape[1])
        return level


class ShiftDetector(LevelDetector):
    """|mean(residual)| over a short window: the forecast keeps missing on one side.

    A model that expects a level (the learned mean of a stationary sensor, an autoregression
    that pulls back towards it) leaves a sustained shift in its residuals for as long as it
    lasts, where the point detector sees only its edge.
    """

    kind = "shift"
    source = "residual"


class MissingDetector(Detector):
    """1 for a reading that came without a number (or with a channel missing), 0 for a complete
    one: with the alarm rule's k-of-n, "k of the last n readings were missing"."""

    kind = "missing"
    source = "missing"

    def statistics(self, inputs: FloatArray, state: FloatArray) -> tuple[FloatArray, FloatArray]:
        return inputs.copy(), state


class CusumDetector(Detector):
    """S_t = max(0, S_{t-1} + min(r_t^2/sigma^2, clip) - kappa): accumulated small evidence of
    more residual energy than normal.

    Restart after a signal: a reading whose S_t is above the limit is reported (and alarms),
    then the recursion continues from 0. Without it, one spike keeps S above the limit for
    hundreds of readings (it drains by only kappa - 1 a reading) and the CUSUM is blind to the
    next fault; with it, a sustained fault signals again every limit/drift readings.

    Bounded evidence (`clip`, None for the unbounded formula): each reading adds at most
    clip - kappa. A single outlier is the point detector's business; unbounded, one outlier of
    4 sigma adds 16 at once, and normal operation's rare outliers make the statistic's tail so
    heavy that a limit for one false alarm a day sits far above what a sustained rise of energy
    accumulates.
    """

    kind = "cusum"

    @property
    def resting(self) -> float | None:
        return 0.0

    def __init__(
        self,
        *,
        threshold: float,
        sigma: float,
        kappa: float | None = None,
        clip: float | None = None,
    ) -> None:
        super().__init__(threshold=threshold)
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"cusum: sigma must be positive, got {sigma}")
        if clip is not None and not (math.isfinite(clip) and clip > 0):
            raise ValueError(f"cusum: clip must be positive, got {clip}")
        self.sigma = float(sigma)
        self.kappa = cusum_kappa() if kappa is None else float(kappa)
        if not (math.isfinite(self.kappa) and self.kappa > 0):
            raise ValueError(f"cusum: kappa must be positive, got {self.kappa}")
        self.clip = None if clip is None else float(clip)

    @property
    def state_size(self) -> int:
        return 1

    def increments(self, inputs: FloatArray) -> FloatArray:
        """min(r^2 / sigma^2, clip) - kappa: positive on average only once the variance grew."""
        z = inputs * inputs / (self.sigma * self.sigma)
        if self.clip is not None:
            z = np.minimum(z, self.clip)
        return z - self.kappa

    def statistics(self, inputs: FloatArray, state: FloatArray) -> tuple[FloatArray, FloatArray]:
        limit = self.threshold
        sums = state[:, 0].tolist()
        out: list[list[float]] = []
        for row, increments in enumerate(self.increments(inputs).tolist()):
            s = sums[row]
            line = []
            for increment in increments:
                if increment != increment:  # NaN: no input, the sum holds
                    line.append(math.nan)
                    continue
                total = s + increment
                statistic = total if total > 0.0 else 0.0
                line.append(statistic)
                s = 0.0 if statistic > limit else statistic
            sums[row] = s
            out.append(line)
        statistics = np.array(out, dtype=np.float64).reshape(inputs.shape)
        return statistics, np.array(sums, dtype=np.float64)[:, None]

    def check_state(self, state: FloatArray) -> str | None:
        problem = super().check_state(state)
        if problem is None and not (math.isfinite(state[0]) and state[0] >= 0):
            return "cusum: the running sum must be a non-negative number"
        return problem


class MahalanobisDetector(Detector):
    """d^2 = r^T Sigma^-1 r on a residual vector: broken correlations between channels.

    Each channel can stay inside its own range while the pair leaves the ellipse that normal
    residuals fill; Sigma is their covariance.
    """

    kind = "mahalanobis"
    source = "vector"

    def __init__(
        self,
        *,
        threshold: float,
        covariance: Sequence[Sequence[float]],
        watched: Sequence[int] | None = None,
    ) -> None:
        super().__init__(threshold=threshold)
        matrix = np.asarray(covariance, dtype=np.float64)
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 2:
            raise ValueError("mahalanobis: the covariance must be a square matrix, 2x2 or larger")
        self.watched = None if watched is None else np.asarray(watched, dtype=np.int64)
        if self.watched is not None and self.watched.shape != (matrix.shape[0],):
            raise ValueError("mahalanobis: one watched channel per row of the covariance")
        if not np.all(np.isfinite(matrix)) or not np.allclose(matrix, matrix.T):
            raise ValueError("mahalanobis: the covariance must be finite and symmetric")
        try:
            factor = np.linalg.cholesky(matrix)
        except np.linalg.LinAlgError:
            raise ValueError("mahalanobis: the covariance is not positive definite") from None
        self.covariance = matrix
        self.whitening: FloatArray = np.linalg.inv(factor)

    @property
    def resting(self) -> float | None:
        """d^2 of normal residuals averages their number of channels."""
        return float(self.covariance.shape[0])

    def statistics(self, inputs: FloatArray, state: FloatArray) -> tuple[FloatArray, FloatArray]:
        """|L^-1 r|^2 = r^T Sigma^-1 r (L: the Cholesky factor), reduced along fixed rows."""
        if self.watched is not None:
            inputs = inputs[:, :, self.watched]
        count, steps, channels = inputs.shape
        vectors = inputs.reshape(-1, channels)
        whitened = np.stack(
            [_row_sum(vectors * row[None, :]) for row in self.whitening], axis=1
        )  # (N*T, C)
        return _row_sum(whitened * whitened).reshape(count, steps), state

    def contributions(self, vectors: FloatArray) -> FloatArray:
        """Each channel's term of d^2 = sum_c r_c (Sigma^-1 r)_c, for (M, C) residual vectors:
        which sensors pulled the vector out of the ellipse (the terms add up to d^2; a term
        can be negative when a channel moved the way its correlations predicted)."""
        precision = self.whitening.T @ self.whitening
        every = vectors
        if self.watched is not None:
            vectors = vectors[:, self.watched]
        # Reduced along fixed rows, as `statistics` is: a matrix product's sums depend on how
        # many vectors it is given, and an alarm's detail must not depend on the grouping.
        pulled = np.stack([_row_sum(vectors * column[None, :]) for column in precision.T], axis=1)
        terms: FloatArray = vectors * pulled
        if self.watched is None:
            return terms
        out: FloatArray = np.zeros_like(every)
        out[:, self.watched] = terms
        return out


DETECTORS: dict[str, type[Detector]] = {
    cls.kind: cls
    for cls in (
        PointDetector,
        RollingRMSDetector,
        VarianceFloorDetector,
        FrozenDetector,
        CusumDetector,
        LevelDetector,
        ShiftDetector,
        MahalanobisDetector,
        MissingDetector,
    )
}
