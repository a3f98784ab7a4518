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

    def put(self, directory: Path, sha256: str) -> Path:
        """The stored copy of `directory` (an artifact whose manifest hashes to `sha256`)."""
        target = self.path(sha256)
        if target.is_dir():
            return target
        self.root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self.root))
        try:
            shutil.copytree(directory, scratch / "artifact")
            try:
                os.rename(scratch / "artifact", target)
            except OSError:
                if not target.is_dir():  # (not another process storing the same one)
                    raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return target
