"""Engine settings and the unit of work."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from app.errors import AppError
from app.storage.db import Database, create_db_engine
from app.storage.repositories import streams as stream_repo
from tests.integration.conftest import make_stream


def test_sqlite_connections_are_durable_and_enforce_foreign_keys(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path}/nested/dir/db.sqlite")
    try:
        with engine.connect() as connection:
            pragma = {
                name: connection.execute(text(f"PRAGMA {name}")).scalar()
                for name in ("foreign_keys", "journal_mode", "synchronous", "busy_timeout")
            }
    finally:
        engine.dispose()
    assert pragma == {
        "foreign_keys": 1,
        "journal_mode": "wal",
        "synchronous": 2,
        "busy_timeout": 30000,
    }
    assert (tmp_path / "nested" / "dir" / "db.sqlite").is_file()


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"]
)
def test_in_memory_sqlite_is_refused(url: str) -> None:
    with pytest.raises(AppError, match="in-memory SQLite is not supported"):
        create_db_engine(url)


def test_a_malformed_url_is_explained() -> None:
    with pytest.raises(AppError, match="is not a SQLAlchemy URL"):
        create_db_engine("not a url")


def test_the_unit_of_work_commits_or_rolls_back_as_a_whole(database: Database) -> None:
    with pytest.raises(RuntimeError), database.session() as session:
        make_stream(session, "half-done")
        raise RuntimeError("the handler failed after writing")
    with database.session() as session:
        assert stream_repo.get(session, "half-done") is None
        make_stream(session, "done")
    with database.session() as session:
        assert stream_repo.get(session, "done") is not None
