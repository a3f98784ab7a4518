"""Sensor series on disk: the `t,value,reference[,...]` CSV every command reads and writes.

Missing readings are empty fields on disk and NaN in memory. Extra columns are extra channels
(other sensors, exogenous inputs such as load or set-points).
"""

from __future__ import annotations

import csv
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.errors import DataError

TIME_COLUMN = "t"
VALUE_COLUMN = "value"
REFERENCE_COLUMN = "reference"


@dataclass(frozen=True)
class Series:
    """A uniformly indexed record: `t` in seconds and one float array per column."""

    t: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.t.shape[0])

    @property
    def value(self) -> np.ndarray:
        return self.columns[VALUE_COLUMN]

    @property
    def reference(self) -> np.ndarray | None:
        return self.columns.get(REFERENCE_COLUMN)

    def head(self, stop: int) -> Series:
        """The first `stop` samples."""
        return Series(self.t[:stop], {name: values[:stop] for name, values in self.columns.items()})

    def matrix(self, channels: list[str]) -> np.ndarray:
        """Stack `channels` into a (T, C) float64 array, channel 0 being the forecast target."""
        unknown = [c for c in channels if c not in self.columns]
        if unknown:
            raise DataError(
                f"unknown channel(s) {', '.join(unknown)}; the data has {', '.join(self.columns)}"
            )
        return np.stack([self.columns[c] for c in channels], axis=1).astype(np.float64)

    def sha256(self) -> str:
        """Hash of the numbers (not the text), so a model can name the data it was trained on."""
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(self.t, dtype="<f8").tobytes())
        for name in sorted(self.columns):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(self.columns[name], dtype="<f8").tobytes())
        return digest.hexdigest()


def read_csv(path: str | Path) -> Series:
    """Read a series, refusing anything that is not a numeric `t,value,...` table."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        with path.open(newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read: {exc}") from exc
    if not rows:
        raise DataError(f"{path}: empty file; expected a header 't,value[,reference,...]'")
    header = [name.strip() for name in rows[0]]
    if len(header) < 2 or header[0] != TIME_COLUMN or VALUE_COLUMN not in header:
        raise DataError(
            f"{path}: header is {','.join(header)!r}; expected 't,value' "
            "optionally followed by 'reference' and other channels"
        )
    if len(set(header)) != len(header):
        raise DataError(f"{path}: duplicate column names in header {','.join(header)!r}")
    body = rows[1:]
    if not body:
        raise DataError(f"{path}: header only, no samples")
    data = np.empty((len(body), len(header)), dtype=np.float64)
    for line_number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise DataError(
                f"{path}:{line_number}: {len(row)} fields, the header has {len(header)}"
            )
        for column, text in enumerate(row):
            text = text.strip()
            if text == "":
                if column == 0:
                    raise DataError(f"{path}:{line_number}: missing time")
                data[line_number - 2, column] = math.nan
                continue
            try:
                number = float(text)
            except ValueError:
                raise DataError(
                    f"{path}:{line_number}: {header[column]} is {text!r}, not a number"
                ) from None
            if math.isinf(number):
                raise DataError(f"{path}:{line_number}: {header[column]} is infinite")
            data[line_number - 2, column] = number
    t = data[:, 0]
    if np.isnan(t).any():
        raise DataError(f"{path}: the time column has NaN")
    if t.shape[0] > 1 and not np.all(np.diff(t) > 0):
        bad = int(np.argmin(np.diff(t) > 0)) + 3
        raise DataError(f"{path}:{bad}: time does not increase")
    columns = {name: data[:, i].copy() for i, name in enumerate(header) if i > 0}
    return Series(t=t.copy(), columns=columns)


def write_csv(series: Series, path: str | Path) -> None:
    """Write with full float precision (shortest round-trip repr); NaN becomes an empty field."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(series.columns)
    columns = [series.t.tolist()] + [series.columns[name].tolist() for name in names]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([TIME_COLUMN, *names])
        for row in zip(*columns, strict=True):
            writer.writerow(["" if math.isnan(x) else repr(x) for x in row])
