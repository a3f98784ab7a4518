"""Alembic environment: the URL comes from the settings, the target schema from the models.

`app.storage.migrations` passes `database_url` (and optionally an open `connection`) through
`config.attributes`; the plain `alembic` command falls back to `Settings()`, i.e. the
`TWINWATCH_*` environment.
"""

from __future__ import annotations

from logging.config import fileConfig
from typing import Any, Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.settings import Settings
from app.storage.db import create_db_engine
from app.storage.models import Base
from app.storage.types import UTCDateTime

MIGRATION_LOCK = 0x7477_6D69  # the advisory lock migrations take on PostgreSQL ("twmi")

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def database_url() -> str:
    url = config.attributes.get("database_url")
    return str(url) if url else Settings().database_url


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | Literal[False]:
    """Write our column types as plain SQLAlchemy ones, so revisions never import app code."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def configure(connection: Connection | None = None, url: str | None = None) -> None:
    sqlite = (connection.dialect.name if connection is not None else str(url)).startswith("sqlite")
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        render_as_batch=sqlite,
        compare_type=True,
        render_item=render_item,
        literal_binds=connection is None,
    )


def run_migrations_offline() -> None:
    configure(url=database_url())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    # Foreign keys off on SQLite: a batch migration drops and re-creates tables, which with
    # foreign keys on would cascade into the rows that reference them.
    engine = create_db_engine(database_url(), sqlite_foreign_keys=False)
    try:
        with engine.connect() as connection:
            configure(connection=connection)
            with context.begin_transaction():
                if connection.dialect.name == "postgresql":
                    # Processes starting together on a fresh database (a service and its
                    # workers) migrate it one after the other, not into each other.
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK}
                    )
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
