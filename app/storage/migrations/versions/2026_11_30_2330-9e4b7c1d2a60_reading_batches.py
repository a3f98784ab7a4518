"""Readings packed one row per batch (reading_batches) instead of one row per reading.

The data moves both ways: each run of readings that arrived in one request (same `batch`)
becomes one packed row, and a downgrade unpacks them again. Layout: `ReadingBatch`'s docstring.

Revision ID: 9e4b7c1d2a60
Revises: 5c0a7e2f9d41
Create Date: 2026-11-30 23:30:00+00:00
"""

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import groupby
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

from app.storage.types import UTCDateTime

revision: str = "9e4b7c1d2a60"
down_revision: str | Sequence[str] | None = "5c0a7e2f9d41"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

streams = sa.table(
    "streams", sa.column("id", sa.String()), sa.column("channels", sa.JSON()), sa.column("has_reference", sa.Boolean())
)
readings = sa.table(
    "readings",
    sa.column("stream_id", sa.String()),
    sa.column("sample", sa.BigInteger()),
    sa.column("batch", sa.BigInteger()),
    sa.column("t", UTCDateTime()),
    sa.column("value", sa.Double()),
    sa.column("values", sa.JSON(none_as_null=True)),
    sa.column("reference", sa.Double()),
)
reading_batches = sa.table(
    "reading_batches",
    sa.column("stream_id", sa.String()),
    sa.column("first_sample", sa.BigInteger()),
    sa.column("count", sa.Integer()),
    sa.column("first_t", UTCDateTime()),
    sa.column("last_t", UTCDateTime()),
    sa.column("times", sa.LargeBinary()),
    sa.column("channel_values", sa.LargeBinary()),
    sa.column("reference_values", sa.LargeBinary()),
)


def _number(value: float | None) -> float:
    return math.nan if value is None else value


def _stored(number: float) -> float | None:
    return None if math.isnan(number) else number


def upgrade() -> None:
    op.create_table(
        "reading_batches",
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("first_sample", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_t", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_t", sa.DateTime(timezone=True), nullable=False),
        sa.Column("times", sa.LargeBinary(), nullable=False),
        sa.Column("channel_values", sa.LargeBinary(), nullable=False),
        sa.Column("reference_values", sa.LargeBinary(), nullable=True),
        sa.CheckConstraint("count > 0", name=op.f("ck_reading_batches_count_positive")),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_reading_batches_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("stream_id", "first_sample", name=op.f("pk_reading_batches")),
    )
    with op.batch_alter_table("reading_batches") as batch_op:
        batch_op.create_index(
            "ix_reading_batches_stream_id_last_t", ["stream_id", "last_t"], unique=False
        )
    connection = op.get_bind()
    for stream in connection.execute(sa.select(streams)).all():
        rows = (
            connection.execute(
                sa.select(readings)
                .where(readings.c.stream_id == stream.id)
                .order_by(readings.c.sample)
            )
            .mappings()
            .all()
        )
        packed: list[dict[str, Any]] = []
        for _, group in groupby(rows, key=lambda row: row["batch"]):
            batch = list(group)
            values = [
                [_number(row["value"])]
                if row["values"] is None
                else [_number(row["values"].get(channel)) for channel in stream.channels]
                for row in batch
            ]
            packed.append(
                {
                    "stream_id": stream.id,
                    "first_sample": batch[0]["sample"],
                    "count": len(batch),
                    "first_t": batch[0]["t"],
                    "last_t": batch[-1]["t"],
                    "times": np.array(
                        [(row["t"] - EPOCH) // timedelta(microseconds=1) for row in batch], "<i8"
                    ).tobytes(),
                    "channel_values": np.array(values, "<f8").tobytes(),
                    "reference_values": np.array(
                        [_number(row["reference"]) for row in batch], "<f8"
                    ).tobytes()
                    if stream.has_reference
                    else None,
                }
            )
        if packed:
            connection.execute(sa.insert(reading_batches), packed)
    op.drop_table("readings")


def downgrade() -> None:
    op.create_table(
        "readings",
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("sample", sa.BigInteger(), nullable=False),
        sa.Column("t", sa.DateTime(timezone=True), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("values", sa.JSON(), nullable=True),
        sa.Column("reference", sa.Double(), nullable=True),
        sa.Column("batch", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_readings_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("stream_id", "sample", name=op.f("pk_readings")),
        sa.UniqueConstraint("stream_id", "t", name=op.f("uq_readings_stream_id_t")),
    )
    connection = op.get_bind()
    channels = {row.id: row.channels for row in connection.execute(sa.select(streams)).all()}
    for batch in connection.execute(
        sa.select(reading_batches).order_by(
            reading_batches.c.stream_id, reading_batches.c.first_sample
        )
    ).all():
        names = channels[batch.stream_id]
        times = np.frombuffer(batch.times, "<i8").tolist()
        values = np.frombuffer(batch.channel_values, "<f8").reshape(len(times), -1).tolist()
        references = (
            [math.nan] * len(times)
            if batch.reference_values is None
            else np.frombuffer(batch.reference_values, "<f8").tolist()
        )
        unpacked = [
            {
                "stream_id": batch.stream_id,
                "sample": batch.first_sample + index,
                "batch": batch.first_sample,
                "t": EPOCH + timedelta(microseconds=micro),
                "value": _stored(row[0]) if len(names) == 1 else None,
                "values": None
                if len(names) == 1
                else {name: _stored(number) for name, number in zip(names, row, strict=True)},
                "reference": _stored(reference),
            }
            for index, (micro, row, reference) in enumerate(
                zip(times, values, references, strict=True)
            )
        ]
        connection.execute(sa.insert(readings), unpacked)
    with op.batch_alter_table("reading_batches") as batch_op:
        batch_op.drop_index("ix_reading_batches_stream_id_last_t")
    op.drop_table("reading_batches")
