"""A manifest of labelled data sets, so that one command runs a whole corpus, each set with the
learning and the protocol it was published with:

    {"about": "...",
     "sets": [{"name": "skab-valve", "path": "skab/data", "learn": 400, "protocol": "skab"},
              {"name": "tep", "path": "corpus/tep", "learn": 160, "sample_period_s": 180}]}

A set's `path` is relative to the data root: the folder given beside `--manifest`, else the
manifest's own folder (so a manifest kept with its data needs nothing more). `learn` takes what
`--learn` takes (a row count or a share such as "15%"). `"protocol": "skab"` scores the set's
changepoints in SKAB's fixed 60 s windows, every other set in NAB's (app/benchmark/scoring.py).
`sample_period_s` (the pace the set's times declare) and `note` describe the set: they are
reported, and the scoring reads each file's own times.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.benchmark.datasets import learning_rows
from app.benchmark.scoring import WindowRule, window_rule
from app.errors import DataError

MANIFEST_NAME = "benchmarks.json"


class _SetEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")  # a plots subfolder too
    path: str = Field(min_length=1)
    learn: int | str
    protocol: Literal["skab", "nab"] | None = None
    sample_period_s: float | None = Field(default=None, gt=0)
    note: str | None = None


class _Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    about: str | None = None
    sets: list[_SetEntry] = Field(min_length=1)


@dataclass(frozen=True)
class BenchmarkSet:
    """One labelled data set of a manifest, its path resolved."""

    name: str
    path: Path
    learn: str
    window: WindowRule
    sample_period_s: float | None = None
    note: str | None = None


def find_manifest(folder: Path) -> Path | None:
    """The manifest a data folder holds, if it holds one."""
    path = folder / MANIFEST_NAME
    return path if folder.is_dir() and path.is_file() else None


def read_manifest(path: Path, data_root: Path | None = None) -> list[BenchmarkSet]:
    """The sets a manifest lists, their paths under `data_root` (default: its own folder).
    DataError if it is malformed or a set's folder is missing: before any set has run."""
    try:
        manifest = _Manifest.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:  # ValidationError is a ValueError
        detail = exc.errors(include_url=False) if isinstance(exc, ValidationError) else exc
        raise DataError(f"{path}: not a benchmark manifest ({detail})") from None
    root = path.parent if data_root is None else data_root
    names = [entry.name for entry in manifest.sets]
    if len(set(names)) < len(names):
        raise DataError(f"{path}: set names must differ, got {names}")
    sets = []
    for entry in manifest.sets:
        learn = str(entry.learn)
        learning_rows(learn, 1_000_000)  # refused here rather than after the sets before it
        folder = root / entry.path
        if not folder.exists():
            raise DataError(f"{path}: set {entry.name!r}: {folder} does not exist")
        window: WindowRule = window_rule(entry.protocol or "nab")
        sets.append(
            BenchmarkSet(entry.name, folder, learn, window, entry.sample_period_s, entry.note)
        )
    return sets
