"""`twinwatch serve` with experimental tweaks applied from outside the app.

For measuring what a change to the service would gain before making it, never for deployment:
each tweak patches the process the way the corresponding change to `app/` would behave.

    BENCH_TWEAKS=gc-freeze,one-thread python bench/serve_tweaked.py --port 8002

- `gc-freeze`: `gc.freeze()` once everything is imported, so the collector stops re-scanning the
  ~10^6 objects of torch, SQLAlchemy and FastAPI at every full collection (a full collection of
  this process takes hundreds of milliseconds).
- `one-thread`: `torch.set_num_threads(1)` at start-up, so `single_threaded()` around every
  forecast no longer switches torch between one and two threads.
- `relaxed-commit`: SQLite `synchronous=NORMAL` (WAL: a commit survives a crash of the process,
  not of the machine) and PostgreSQL `synchronous_commit=off` (the same trade on the server).
"""

from __future__ import annotations

import gc
import os
from typing import Any

TWEAKS = frozenset({"gc-freeze", "one-thread", "relaxed-commit"})


def relax_commits() -> None:
    from sqlalchemy import Engine, event

    from app.storage import db

    original = db.create_db_engine

    def create(url: str, *, sqlite_foreign_keys: bool = True) -> Engine:
        engine: Engine = original(url, sqlite_foreign_keys=sqlite_foreign_keys)
        backend = engine.dialect.name

        @event.listens_for(engine, "connect")
        def _relax(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if backend == "sqlite":
                cursor.execute("PRAGMA synchronous=NORMAL")
            else:
                cursor.execute("SET synchronous_commit TO off")
                dbapi_connection.commit()
            cursor.close()

        return engine

    db.create_db_engine = create


def main() -> None:
    tweaks = {name for name in os.environ.get("BENCH_TWEAKS", "").split(",") if name}
    unknown = tweaks - TWEAKS
    if unknown:
        raise SystemExit(f"unknown tweak(s) {sorted(unknown)}; known: {sorted(TWEAKS)}")
    if "relaxed-commit" in tweaks:
        relax_commits()
    if "one-thread" in tweaks:
        import torch

        torch.set_num_threads(1)
    from app.cli import main as twinwatch
    from app.main import create_app  # noqa: F401  (import the whole service before freezing)

    if "gc-freeze" in tweaks:
        gc.collect()
        gc.freeze()
    twinwatch()


if __name__ == "__main__":
    main()
