"""What the recurrence (app/streams/recurrence.py) works on and gives: one stream's state,
carried from one reading to the next; a block of new readings of many streams; and a block's
results, per stream."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.errors import DataError
from app.monitoring.alarms import AlarmEvent
from app.monitoring.monitor import Monitor, MonitorState
from app.streams.saved import SavedState

FloatArray = np.ndarray


@dataclass(slots=True)
class StreamState:
    """Everything one stream carries from one reading to the next; its size never grows."""

    samples: int  # readings seen: the sample index of the next one
    last_time: int | None  # the last reading's time, microseconds since the epoch
    run: int  # readings since the stream (re)started warming up, counted up to the window
    since_imputed: int  # readings since the last imputed one, counted up to the window
    missing_run: int  # null readings in a row just seen
    history: FloatArray  # (context, C) the latest readings (imputed ones included); NaN: none
    carry: FloatArray  # (carry_size,) float32: what the forecaster keeps between readings
    pending: FloatArray  # (outputs,) the forecast made after the last reading; NaN: none
    monitor: MonitorState
    latest: FloatArray  # (2 targets + detectors,) the last forecasts, residuals, statistics
    held: int = 0  # readings in a row kept out of the history (an alarm open): see `advance`

    def copy(self) -> StreamState:
        """An independent copy: `Recurrence.advance` replaces the arrays, never writes into
        them, and changes the monitor's rule states in place (copied)."""
        return StreamState(
            self.samples,
            self.last_time,
            self.run,
            self.since_imputed,
            self.missing_run,
            self.history,
            self.carry,
            self.pending,
            self.monitor.copy(),
            self.latest,
            self.held,
        )

    def become(self, other: StreamState) -> None:
        """Take `other`'s values (a copy made before a block, to redo it)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(other, name))

    def to_bytes(self, monitor: Monitor) -> bytes:
        """The checkpoint (`app/streams/saved.py`: a layout decoded in microseconds). The last
        reading's time is stored beside it (`Recurrence.restore` takes it back)."""
        return SavedState(
            samples=self.samples,
            run=self.run,
            since_imputed=self.since_imputed,
            missing_run=self.missing_run,
            held=self.held,
            history=self.history.ravel(),
            carry=self.carry,
            pending=self.pending,
            latest=self.latest,
            monitor_values=self.monitor.values,
            rules=dict(zip(monitor.kinds, self.monitor.rules, strict=True)),
        ).to_bytes()


def sized(array: FloatArray, shape: tuple[int, ...], what: str) -> FloatArray:
    """A saved array checked for its size and finiteness, as the state keeps it."""
    if array.size != math.prod(shape):
        raise DataError(f"stream state: {what} must be {shape} numbers")
    if np.isinf(array).any():
        raise DataError(f"stream state: {what} must be finite")
    if array.shape == shape and array.dtype == np.float64 and array.base is None:
        return array
    # (a copy: a view would be one more object, and hold its base, for the stream's life)
    return np.array(np.reshape(array, shape), dtype=np.float64)


@dataclass(frozen=True)
class Readings:
    """New readings of N streams, stream after stream: `counts[i]` readings of stream i."""

    counts: np.ndarray  # (N,) int
    times: np.ndarray  # (R,) int64 microseconds since the epoch, increasing within a stream
    values: np.ndarray  # (R, C) float64, NaN for a missing number
    references: np.ndarray | None = None  # (R,) float64, NaN for none; None: no reference

    @classmethod
    def of_one(
        cls,
        times: np.ndarray,
        values: np.ndarray,
        references: np.ndarray | None = None,
    ) -> Readings:
        """One stream's readings."""
        values = np.asarray(values, dtype=np.float64)
        if values.ndim == 1:
            values = values[:, None]
        return cls(
            np.array([len(values)]),
            np.asarray(times, dtype=np.int64),
            values,
            None if references is None else np.asarray(references, dtype=np.float64),
        )

    def part(self, start: int, stop: int) -> Readings:
        """Readings `start:stop` of one stream's."""
        return Readings(
            np.array([stop - start]),
            self.times[start:stop],
            self.values[start:stop],
            None if self.references is None else self.references[start:stop],
        )


class StreamResult:
    """One stream's part of a block: per reading (views of the block's arrays, cut when read:
    a gateway's acknowledgement reads none of them) and its events."""

    __slots__ = ("_block", "_index", "closed", "first_sample", "opened")

    def __init__(self, block: BlockResult, index: int) -> None:
        self._block, self._index = block, index
        self.first_sample = block.first_samples[index]
        self.opened = block.opened.get(index, [])
        self.closed = block.closed.get(index, [])

    def _part(self, values: np.ndarray) -> np.ndarray:
        offsets = self._block.offsets
        return values[int(offsets[self._index]) : int(offsets[self._index + 1])]

    @property
    def forecast(self) -> FloatArray:
        """The first forecast channel's; NaN while warming up."""
        return self._part(self._block.forecast)[:, 0]

    @property
    def residual(self) -> FloatArray:
        """The first forecast channel's; NaN without a forecast, and for an imputed reading."""
        return self._part(self._block.residual)[:, 0]

    @property
    def forecasts(self) -> FloatArray:
        """(readings, targets): every forecast channel's."""
        return self._part(self._block.forecast)

    @property
    def residuals(self) -> FloatArray:
        """(readings, targets)."""
        return self._part(self._block.residual)

    @property
    def imputed(self) -> np.ndarray:
        """The reading was null and was imputed with its forecast."""
        return self._part(self._block.imputed)

    @property
    def monitored(self) -> np.ndarray:
        """The residual reached the detectors."""
        return self._part(self._block.monitored)

    @property
    def reference_gap(self) -> FloatArray:
        """Reading minus reference, as the level detector saw it (NaN: none)."""
        return self._part(self._block.reference_gap)

    @property
    def statistics(self) -> dict[str, FloatArray]:
        """Detector -> statistic, NaN where none."""
        return {kind: self._part(values) for kind, values in self._block.statistics.items()}


@dataclass(frozen=True)
class BlockResult:
    """What a block did, per reading in the order given (stream after stream)."""

    offsets: np.ndarray  # (N + 1,): stream i's readings are [offsets[i], offsets[i + 1])
    first_samples: list[int]
    forecast: FloatArray  # (R, targets)
    residual: FloatArray  # (R, targets)
    imputed: np.ndarray
    monitored: np.ndarray
    reference_gap: FloatArray
    statistics: dict[str, FloatArray]
    opened: dict[int, list[AlarmEvent]]
    closed: dict[int, list[AlarmEvent]]

    def stream(self, index: int) -> StreamResult:
        return StreamResult(self, index)
