"""Engine and sessions: the only place that knows how to connect to each database."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from sqlalchemy.orm import Session, sessionmaker

from app.errors import AppError

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000


class DatabaseError(AppError):
    status = 503
    title = "Database unavailable"
    type_slug = "database-unavailable"


def parse_url(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError as exc:
        raise AppError(f"database URL {url!r} is not a SQLAlchemy URL: {exc}") from None


def create_db_engine(url: str, *, sqlite_foreign_keys: bool = True) -> Engine:
    """An engine with the per-dialect settings the service relies on.

    SQLite: foreign keys on (cascading deletes depend on it; migrations turn them off because
    batch mode copies and drops tables), WAL so readers never block the writer,
    `synchronous=FULL` so a committed batch survives a crash, and a busy timeout so concurrent
    writers wait instead of failing. The file's directory is created if missing.
    """
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)

    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        # Each connection (and the migration run) would see its own empty database.
        raise AppError(f"{url!r}: in-memory SQLite is not supported; give a file path")
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        parsed,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    )

    @event.listens_for(engine, "connect")
    def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA foreign_keys={'ON' if sqlite_foreign_keys else 'OFF'}")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.close()

    return engine


UNAVAILABLE = (OperationalError, InterfaceError, SQLAlchemyTimeoutError)
"""What the database raises when it cannot be reached or gives up: an outage, not a bug."""


class Outage:
    """The database's outages as the log tells them: one line when one starts, one when it ends
    (how long, how many requests failed), nothing in between: a client retrying through an
    outage must not flood the log."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    def failed(self, where: str, exc: BaseException) -> None:
        with self._guard:
            first = self._since is None
            if first:
                self._since = time.monotonic()
            self._failures += 1
        if first:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            log.warning(
                "database unavailable (first on %s): %s: %s; failures are counted until it "
                "answers again",
                where,
                type(exc).__name__,
                reason,
            )

    @contextmanager
    def background(self, where: str) -> Iterator[None]:
        """A background loop's work on the database: an outage it meets is the outage's one
        line (`failed`), not a traceback each time it tries again; its success ends it."""
        try:
            yield
        except UNAVAILABLE as exc:
            self.failed(where, exc)
        else:
            self.answered()

    def answered(self) -> None:
        if self._since is None:  # the usual case, without the lock
            return
        with self._guard:
            if self._since is None:
                return
            seconds, failures = time.monotonic() - self._since, self._failures
            self._since, self._failures = None, 0
        log.warning(
            "database available again after %.1f s and %d failed request(s)", seconds, failures
        )


class Database:
    """An engine plus its session factory; `session()` is one unit of work."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_db_engine(url)
        # Objects stay readable after commit: responses are built from them after the commit.
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.outage = Outage()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """Commit when the block succeeds, roll back when it raises. Callees never commit."""
        with self.sessions.begin() as session:
            yield session

    def ping(self) -> None:
        """Raise `DatabaseError` unless a trivial query succeeds."""
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except (SQLAlchemyError, OSError) as exc:
            self.outage.failed("the readiness check", exc)
            raise DatabaseError(f"database unreachable: {type(exc).__name__}") from exc
        self.outage.answered()

    def dispose(self) -> None:
        self.engine.dispose()
