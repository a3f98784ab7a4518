"""Migrations go from nothing to head and back on every database, and match the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from app.storage import migrations
from app.storage.models import Base

TABLES = {"models", "streams", "alarms", "stream_checkpoints", "readings"}


def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_from_empty_to_head_then_back_to_base(empty_database_url: str) -> None:
    assert migrations.current(empty_database_url) == ()

    migrations.upgrade(empty_database_url)
    assert migrations.current(empty_database_url) == (migrations.head(),)
    assert table_names(empty_database_url) >= TABLES

    migrations.downgrade(empty_database_url, "base")
    assert migrations.current(empty_database_url) == ()
    assert table_names(empty_database_url) & TABLES == set()

    # And up again: the downgrade left nothing behind that blocks a re-upgrade.
    migrations.upgrade(empty_database_url)
    assert table_names(empty_database_url) >= TABLES


def test_head_schema_matches_the_models(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url)
    engine = create_engine(empty_database_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert differences == []


def test_every_revision_steps_down_and_up_one_at_a_time(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url)
    revisions = 0
    while migrations.current(empty_database_url):
        migrations.downgrade(empty_database_url, "-1")
        revisions += 1
    assert revisions >= 1
    for _ in range(revisions):
        migrations.upgrade(empty_database_url, "+1")
    assert migrations.current(empty_database_url) == (migrations.head(),)
