"""Alembic driven from code: `twinwatch db ...`, the app's start-up and the tests use these.

The migrations live in this package (`env.py`, `versions/`), so an installed twinwatch migrates
its database from any directory; no alembic.ini is read. The project's root alembic.ini is for
developers writing a revision (`alembic revision`), and points here too.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from app.errors import AppError
from app.storage.db import create_db_engine

SCRIPT_LOCATION = Path(__file__).resolve().parent


class MigrationError(AppError):
    status = 500
    title = "Migration failed"
    type_slug = "migration-failed"


def alembic_config(database_url: str) -> Config:
    """The migrations of this package, pointed at `database_url`, leaving our logging alone."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.set_main_option("path_separator", "os")
    config.attributes["database_url"] = database_url
    config.attributes["configure_logger"] = False
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    try:
        command.upgrade(alembic_config(database_url), revision)
    except CommandError as exc:
        raise MigrationError(f"cannot upgrade to {revision!r}: {exc}") from None


def downgrade(database_url: str, revision: str) -> None:
    try:
        command.downgrade(alembic_config(database_url), revision)
    except CommandError as exc:
        raise MigrationError(f"cannot downgrade to {revision!r}: {exc}") from None


def current(database_url: str) -> tuple[str, ...]:
    """The revision(s) the database is at; empty when it has never been migrated."""
    engine = create_db_engine(database_url)
    try:
        with engine.connect() as connection:
            return tuple(MigrationContext.configure(connection).get_current_heads())
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision in `versions/`."""
    revision = ScriptDirectory.from_config(alembic_config("")).get_current_head()
    if revision is None:
        raise MigrationError(f"{SCRIPT_LOCATION / 'versions'} holds no revision")
    return revision
