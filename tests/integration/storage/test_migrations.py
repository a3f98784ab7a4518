"""Migrations go from nothing to head and back on every database, and match the models."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlalchemy.orm import Session

from app.storage import migrations
from app.storage.models import Base
from app.storage.repositories import readings as reading_repo
from app.storage.types import UTCDateTime
from tests.integration.conftest import empty_database

TABLES = {"models", "streams", "alarms", "stream_checkpoints", "reading_batches"}


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


READINGS_BEFORE_PACKING = "5c0a7e2f9d41"
_T0 = datetime(2025, 1, 1, tzinfo=UTC)
_streams = sa.table(
    "streams",
    *(sa.column(name) for name in ("id", "model_name", "sample_period_s", "sample_count")),
    sa.column("channels", sa.JSON()),
    sa.column("detector_overrides", sa.JSON()),
    sa.column("has_reference", sa.Boolean()),
    sa.column("created_at", UTCDateTime()),
    sa.column("updated_at", UTCDateTime()),
)
_readings = sa.table(
    "readings",
    *(sa.column(name) for name in ("stream_id", "sample", "batch", "value", "reference")),
    sa.column("t", UTCDateTime()),
    sa.column("values", sa.JSON(none_as_null=True)),
)


def _old_readings() -> list[dict[str, Any]]:
    """Two streams' readings as the per-reading table held them: three requests on "one"
    (a null value and reference among them), one on "two" with two channels."""
    rows: list[dict[str, Any]] = []
    for sample, batch in enumerate([0, 0, 0, 3, 4, 4]):
        rows.append(
            {
                "stream_id": "one",
                "sample": sample,
                "batch": batch,
                "t": _T0 + timedelta(seconds=sample, microseconds=7),
                "value": None if sample == 4 else sample * 1.5,
                "values": None,
                "reference": None if sample == 1 else -float(sample),
            }
        )
    for sample in range(2):
        rows.append(
            {
                "stream_id": "two",
                "sample": sample,
                "batch": 0,
                "t": _T0 + timedelta(seconds=sample),
                "value": None,
                "values": {"a": float(sample), "b": None if sample else 9.0},
                "reference": None,
            }
        )
    return rows


def test_readings_are_packed_per_batch_and_unpacked_again(empty_database_url: str) -> None:
    """The data survives the move to one row per batch, and back: same times, numbers, nulls
    and batch boundaries."""
    migrations.upgrade(empty_database_url, READINGS_BEFORE_PACKING)
    engine = create_engine(empty_database_url)
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO models (name, version, kind, manifest_sha256, config, metrics, "
                    "thresholds, loaded_at) VALUES ('m', '1', 'naive', '0', '{}', '{}', '{}', "
                    "'2025-01-01 00:00:00')"
                )
            )
            for stream_id, channels, has_reference in (
                ("one", ["x"], True),
                ("two", ["a", "b"], False),
            ):
                connection.execute(
                    sa.insert(_streams).values(
                        id=stream_id,
                        model_name="m",
                        channels=channels,
                        sample_period_s=1.0,
                        has_reference=has_reference,
                        detector_overrides={},
                        created_at=_T0,
                        updated_at=_T0,
                        sample_count=0,
                    )
                )
            connection.execute(sa.insert(_readings), _old_readings())

        migrations.upgrade(empty_database_url)
        with Session(engine) as session:
            one = reading_repo.batches_from(session, stream_id="one")
            assert [(b.first_sample, b.stop) for b in one] == [(0, 3), (3, 4), (4, 6)]
            assert one[2].last_t == _T0 + timedelta(seconds=5, microseconds=7)
            values = np.concatenate([b.values for b in one])[:, 0]
            np.testing.assert_array_equal(values, [0.0, 1.5, 3.0, 4.5, np.nan, 7.5])
            references = np.concatenate([b.references for b in one if b.references is not None])
            np.testing.assert_array_equal(references, [0.0, np.nan, -2.0, -3.0, -4.0, -5.0])
            (two,) = reading_repo.batches_from(session, stream_id="two")
            np.testing.assert_array_equal(two.values, [[0.0, 9.0], [1.0, np.nan]])
            assert two.references is None

        migrations.downgrade(empty_database_url, READINGS_BEFORE_PACKING)
        with engine.connect() as connection:
            back = connection.execute(
                sa.select(_readings).order_by(_readings.c.stream_id, _readings.c.sample)
            )
            restored = [row._asdict() for row in back]
        assert restored == _old_readings()
    finally:
        engine.dispose()


def test_processes_starting_together_on_a_fresh_database_migrate_it_in_turn(
    tmp_path: Path,
) -> None:
    """A service and its workers started at once each migrate at start-up: on PostgreSQL (the
    database processes share) they wait for each other, an advisory lock, and all succeed."""
    with empty_database("postgresql", tmp_path) as url:
        command = [
            sys.executable,
            "-c",
            "import sys; from app.storage import migrations; migrations.upgrade(sys.argv[1])",
            url,
        ]
        processes = [
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for _ in range(3)
        ]
        for process in processes:
            output, _ = process.communicate(timeout=120)
            assert process.returncode == 0, output.decode()[-2000:]
        assert migrations.current(url) == (migrations.head(),)
