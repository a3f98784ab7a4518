"""Model artifacts by content: each version's directory under `root/<manifest sha256>/`.

A directory in the store never changes once it is there: it is copied in beside its final name
and renamed into place, so a crash never leaves a half-written artifact under a name, and two
versions with the same content share one directory.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from app.errors import ArtifactError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sha256: str) -> Path:
        if not _SHA256.fullmatch(sha256):
            raise ArtifactError(f"{sha256!r} is not an artifact hash")
        return self.root / sha256

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_dir()

    def remove(self, sha256: str, *, older_than_s: float | None = None) -> None:
        """Remove an artifact no version refers to any more (if `older_than_s` is given, only
        if it was put longer ago: it was not just reused): renamed out of its name first, so
        a crash never leaves a half-removed one under it."""
        target = self.path(sha256)
        if not target.is_dir():
            return
        if older_than_s is not None and target.stat().st_mtime >= time.time() - older_than_s:
            return
        doomed = Path(tempfile.mkdtemp(prefix=".removing-", dir=self.root)) / "artifact"
        try:
            os.rename(target, doomed)
        except FileNotFoundError:
            pass  # (another service sharing the store removed it first)
        finally:
            shutil.rmtree(doomed.parent, ignore_errors=True)

    def reuse(self, sha256: str) -> bool:
        """Whether the store holds the artifact, marked as put now if it does: a version is
        about to name it, and the removal of old artifacts nothing names must leave it."""
        target = self.path(sha256)
        try:
            os.utime(target)
        except FileNotFoundError:
            return False
        return target.is_dir()

    def older_than(self, seconds: float) -> Iterator[str]:
        """The stored artifacts put in the store more than `seconds` ago."""
        if not self.root.is_dir():
            return
        before = time.time() - seconds
        with os.scandir(self.root) as entries:
            for entry in entries:
                if _SHA256.fullmatch(entry.name) and entry.stat().st_mtime < before:
                    yield entry.name

    def put(self, directory: Path, sha256: str) -> Path:
        """The stored copy of `directory` (an artifact whose manifest hashes to `sha256`)."""
        target = self.path(sha256)
        if self.reuse(sha256):
            return target
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self.root))
        try:
            shutil.copytree(directory, scratch / "artifact")
            os.utime(scratch / "artifact")  # (copied with its source's times: put now)
            try:
                os.rename(scratch / "artifact", target)
            except OSError:
                if not target.is_dir():  # (not another process storing the same one)
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return target
