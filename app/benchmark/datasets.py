"""Labelled data sets for `twinwatch evaluate benchmark`: CSV files with a time column, sensor
columns and a 0/1 `anomaly` column (and optionally `changepoint`), such as SKAB's.

A path is one CSV file or a directory searched for them (in natural order: 2.csv before 10.csv).
The separator (`,` or `;`) is detected; the time column is the first one, as a date and time
(ISO 8601, no zone: UTC) or as seconds since the epoch; every other column but the labels is a
sensor channel, empty or NaN for a missing number. A file is loaded whatever its number of
channels: whether a stream takes them is the run's question, answered per file.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from app.errors import DataError
from app.schemas import RESERVED_CHANNELS

LABELS = ("anomaly", "changepoint")


class UnlabelledError(DataError):
    """A CSV without an `anomaly` column: not part of the scored set."""


@dataclass(frozen=True)
class LabelledFile:
    name: str  # its path relative to the data set's root
    times: np.ndarray  # (R,) int64 microseconds since the epoch
    values: np.ndarray  # (R, C) float64, NaN for a missing number
    channels: list[str]  # the sensor columns' names, as channel names (`channel_name`)
    anomaly: np.ndarray  # (R,) bool
    changepoint: np.ndarray | None  # (R,) bool, if the file has them

    @property
    def rows(self) -> int:
        return int(self.times.shape[0])


def channel_name(column: str, taken: set[str]) -> str:
    """A column's name as a stream channel may be called (letters, digits, '_', '.', '-', not a
    name the readings' fields take; "Volume Flow RateRMS" becomes "Volume_Flow_RateRMS")."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", column.strip())[:64] or "channel"
    if not re.match(r"[A-Za-z_]", name) or name in RESERVED_CHANNELS:
        name = f"_{name}"[:64]
    unique, number = name, 2
    while unique in taken:
        unique, number = f"{name[:60]}_{number}", number + 1
    taken.add(unique)
    return unique


def _natural(path: Path) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def find_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise DataError(f"{root} is neither a CSV file nor a directory")
    files = sorted(root.rglob("*.csv"), key=_natural)
    if not files:
        raise DataError(f"{root} holds no CSV file")
    return files


def _time(text: str) -> int:
    text = text.strip()
    try:
        return round(float(text) * 1e6)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise DataError(f"time {text!r} is neither seconds nor an ISO 8601 date") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1e6)


def _number(text: str) -> float:
    text = text.strip()
    if not text:
        return math.nan
    return float(text)


def load_file(path: Path, root: Path) -> LabelledFile:
    name = str(path.relative_to(root)) if root.is_dir() else path.name
    with path.open(newline="") as handle:
        sample = handle.read(4096)
        handle.seek(0)
        delimiter = ";" if sample.count(";") > sample.count(",") else ","
        rows = list(csv.reader(handle, delimiter=delimiter))
    if len(rows) < 2:
        raise DataError(f"{name}: no rows")
    header = [column.strip() for column in rows[0]]
    if "anomaly" not in header:
        raise UnlabelledError(f"{name}: no 'anomaly' column (0/1 labels) among {header}")
    channels = [c for c in header[1:] if c not in LABELS]
    if not channels:
        raise DataError(f"{name}: no sensor column")
    index = {column: position for position, column in enumerate(header)}
    taken: set[str] = set()
    names = [channel_name(column, taken) for column in channels]
    try:
        times = np.array([_time(row[0]) for row in rows[1:]], dtype=np.int64)
        values = np.array(
            [[_number(row[index[c]]) for c in channels] for row in rows[1:]], dtype=np.float64
        )
        anomaly = np.array([_number(row[index["anomaly"]]) == 1 for row in rows[1:]])
        changepoint = (
            np.array([_number(row[index["changepoint"]]) == 1 for row in rows[1:]])
            if "changepoint" in index
            else None
        )
    except (ValueError, IndexError) as exc:
        raise DataError(f"{name}: a row does not parse ({exc})") from None
    except DataError as exc:
        raise DataError(f"{name}: {exc.detail}") from None
    if np.isinf(values).any():
        raise DataError(f"{name}: infinite numbers")
    if (np.diff(times) <= 0).any():
        raise DataError(f"{name}: times must increase")
    return LabelledFile(name, times, values, names, anomaly, changepoint)


def load(root: Path) -> list[LabelledFile]:
    return [load_file(path, root) for path in find_files(root)]


@dataclass
class LoadedSet:
    """A data set's files as loaded: one file that does not parse is that file's failure."""

    files: list[LabelledFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why each unlabelled CSV is not scored
    failed: list[tuple[str, Exception]] = field(default_factory=list)  # (file, what went wrong)


def load_set(
    root: Path, *, paths: list[Path] | None = None, on_file: Callable[[str], None] | None = None
) -> LoadedSet:
    """Every CSV under `root` (or `paths`, as `find_files(root)` gave them)."""
    loaded = LoadedSet()
    for path in find_files(root) if paths is None else paths:
        name = str(path.relative_to(root)) if root.is_dir() else path.name
        try:
            loaded.files.append(load_file(path, root))
        except UnlabelledError as exc:
            loaded.skipped.append(exc.detail)
        except Exception as exc:  # one bad file is that file's failure, not the run's
            loaded.failed.append((name, exc))
        if on_file is not None:
            on_file(name)
    return loaded


def learning_rows(spec: str, rows: int) -> int:
    """`--learn`: a number of rows ("400") or a share of each file ("15%")."""
    text = spec.strip()
    try:
        if text.endswith("%"):
            share = float(text[:-1]) / 100
            if not 0 < share < 1:
                raise ValueError
            return max(1, math.floor(rows * share))
        count = int(text)
    except ValueError:
        raise DataError(f"--learn takes a number of rows or a percentage, got {spec!r}") from None
    if count < 1:
        raise DataError("--learn must be at least one row")
    return count
