"""Which databases the integration tests ran on."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.storage.db import Database
from tests.integration.conftest import TEST_DATABASE_ENV, postgres_url


def test_postgresql_is_configured() -> None:
    if postgres_url() is None:
        pytest.skip(f"{TEST_DATABASE_ENV} is not set: database tests ran on SQLite only")
    assert postgres_url().startswith("postgresql")  # type: ignore[union-attr]


def test_each_backend_is_the_database_it_claims(backend: str, database: Database) -> None:
    assert database.dialect == backend
    with database.engine.connect() as connection:
        one = connection.execute(text("SELECT 1")).scalar()
    assert one == 1
