"""A stream's checkpoint as bytes: fixed-size counters, its arrays as raw little-endian floats,
and its alarm rules' few integers. Decoding is a handful of buffer views, not a parse: a start-up
restores a whole fleet from these. Nothing here knows what the numbers mean; `Recurrence.restore`
checks them against the model and the monitor. Checkpoints written as JSON (before this layout)
are read too (`SavedState.from_json`)."""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.errors import DataError
from app.monitoring.alarms import OpenAlarm, RuleState

MAGIC = b"TWS3"
_HEADER = struct.Struct("<4sqqqqqIIIIIH")
_RULE = struct.Struct("<qHB")  # seen, recent exceedances, whether an alarm is open
_OPEN = struct.Struct("<qdqqH")  # start, peak, last, last_sample, detail's length (or NONE)
_NO_DETAIL = 0xFFFF
_FLOAT, _SINGLE, _INT = np.dtype("<f8"), np.dtype("<f4"), np.dtype("<i8")
_NATIVE = {dtype: dtype.newbyteorder("=") for dtype in (_FLOAT, _SINGLE, _INT)}


@dataclass
class SavedState:
    """What a stream's state is made of, as stored."""

    samples: int
    run: int
    since_imputed: int
    missing_run: int
    held: int
    history: np.ndarray  # float64, flat
    carry: np.ndarray  # float32
    pending: np.ndarray  # float64
    latest: np.ndarray  # float64
    monitor_values: np.ndarray  # float64
    rules: dict[str, RuleState]  # by detector, in the monitor's order

    def to_bytes(self) -> bytes:
        kinds = ",".join(self.rules).encode("ascii")
        parts = [
            _HEADER.pack(
                MAGIC,
                self.samples,
                self.run,
                self.since_imputed,
                self.missing_run,
                self.held,
                self.history.size,
                self.carry.size,
                self.pending.size,
                self.latest.size,
                self.monitor_values.size,
                len(kinds),
            ),
            np.ascontiguousarray(self.history, _FLOAT).tobytes(),
            np.ascontiguousarray(self.carry, _SINGLE).tobytes(),
            np.ascontiguousarray(self.pending, _FLOAT).tobytes(),
            np.ascontiguousarray(self.latest, _FLOAT).tobytes(),
            np.ascontiguousarray(self.monitor_values, _FLOAT).tobytes(),
            kinds,
        ]
        for rule in self.rules.values():
            event = rule.open
            parts.append(_RULE.pack(rule.seen, len(rule.recent), event is not None))
            parts.append(np.asarray(rule.recent, _INT).tobytes())
            if event is not None:
                detail = () if event.detail is None else event.detail
                size = _NO_DETAIL if event.detail is None else len(detail)
                parts.append(
                    _OPEN.pack(event.start, event.peak, event.last, event.last_sample, size)
                )
                parts.append(np.asarray(detail, _FLOAT).tobytes())
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, blob: bytes) -> SavedState:
        """The parts of `to_bytes`'s output; DataError if it is cut short or has more."""
        reader = _Reader(memoryview(blob))
        try:
            header = reader.unpack(_HEADER)
            if header[0] != MAGIC:
                raise DataError("stream state: not a checkpoint of this layout")
            samples, run, since, missing, held = header[1:6]
            n_history, n_carry, n_pending, n_latest, n_values, n_kinds = header[6:]
            history = reader.array(_FLOAT, n_history)
            carry = reader.array(_SINGLE, n_carry)
            pending = reader.array(_FLOAT, n_pending)
            latest = reader.array(_FLOAT, n_latest)
            values = reader.array(_FLOAT, n_values)
            kinds = bytes(reader.take(n_kinds)).decode("ascii").split(",") if n_kinds else []
            rules = {}
            for kind in kinds:
                seen, n_recent, is_open = reader.unpack(_RULE)
                recent = [int(x) for x in reader.array(_INT, n_recent)]
                event = None
                if is_open:
                    start, peak, last, last_sample, n_detail = reader.unpack(_OPEN)
                    detail = None
                    if n_detail != _NO_DETAIL:
                        detail = tuple(float(x) for x in reader.array(_FLOAT, n_detail))
                    event = OpenAlarm(start, peak, last, last_sample, detail)
                rules[kind] = RuleState(seen, recent, event)
        except (struct.error, ValueError, UnicodeDecodeError):
            raise DataError("stream state: the checkpoint is cut short or malformed") from None
        if reader.left:
            raise DataError("stream state: the checkpoint has bytes after its end")
        return cls(
            samples, run, since, missing, held, history, carry, pending, latest, values, rules
        )

    @classmethod
    def from_json(cls, saved: Mapping[str, Any]) -> SavedState:
        """A checkpoint written as JSON by an earlier release (`version` 2, its monitor's
        `version` 2: `Recurrence.restore` upgrades older ones first)."""
        monitor = saved.get("monitor")
        if not isinstance(monitor, Mapping):
            raise DataError("stream state: its monitor is missing")
        raw_rules = monitor.get("rules")
        if not isinstance(raw_rules, Mapping):
            raise DataError("monitor state needs 'values' and 'rules'")
        try:
            samples, run, since, missing = (
                int(saved[key]) for key in ("samples", "run", "since_imputed", "missing_run")
            )
            held = int(saved.get("held", 0))
        except (KeyError, TypeError, ValueError):
            raise DataError("stream state: counters must be integers") from None
        return cls(
            samples=samples,
            run=run,
            since_imputed=since,
            missing_run=missing,
            held=held,
            history=_floats(saved.get("history"), "history"),
            carry=_floats(saved.get("carry"), "carry").astype(np.float32),
            pending=_floats(saved.get("pending"), "pending"),
            latest=_floats(saved.get("latest"), "latest"),
            monitor_values=_floats(monitor.get("values"), "monitor values"),
            rules={str(kind): RuleState.parse(raw, str(kind)) for kind, raw in raw_rules.items()},
        )


def _floats(raw: Any, what: str) -> np.ndarray:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise DataError(f"stream state: {what} must be a list of numbers")
    try:
        return np.array([math.nan if x is None else float(x) for x in raw], dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"stream state: {what} must be numbers or null") from None


class _Reader:
    def __init__(self, view: memoryview) -> None:
        self.view, self.at = view, 0

    @property
    def left(self) -> int:
        return len(self.view) - self.at

    def take(self, size: int) -> memoryview:
        if size > self.left:
            raise ValueError("cut short")
        part = self.view[self.at : self.at + size]
        self.at += size
        return part

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size))

    def array(self, dtype: np.dtype[Any], count: int) -> np.ndarray:
        # An array of its own, in the machine's byte order: a view would keep the whole
        # checkpoint alive, and a dtype made per array (`newbyteorder`) is one more object a
        # stream holds for as long as it lives.
        return np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype).astype(
            _NATIVE[dtype], copy=True
        )
