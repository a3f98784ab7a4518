"""Initial schema: models registry, streams, alarms, checkpoints, readings.

Revision ID: 1b3851d3c863
Revises:
Create Date: 2026-11-30 14:50:03.926522+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "1b3851d3c863"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("manifest_sha256", sa.String(length=64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("loaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_models")),
    )
    op.create_table(
        "streams",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("model_name", sa.String(length=128), nullable=False),
        sa.Column("channels", sa.JSON(), nullable=False),
        sa.Column("sample_period_s", sa.Double(), nullable=False),
        sa.Column("has_reference", sa.Boolean(), nullable=False),
        sa.Column("detector_overrides", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_t", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sample_count", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("sample_period_s > 0", name=op.f("ck_streams_sample_period_positive")),
        sa.ForeignKeyConstraint(
            ["model_name"],
            ["models.name"],
            name=op.f("fk_streams_model_name_models"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_streams")),
    )
    with op.batch_alter_table("streams", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_streams_model_name"), ["model_name"], unique=False)

    op.create_table(
        "alarms",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("detector", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("opened_sample", sa.BigInteger(), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("closed_sample", sa.BigInteger(), nullable=True),
        sa.Column("peak", sa.Double(), nullable=False),
        sa.Column("threshold", sa.Double(), nullable=False),
        sa.Column("model_name", sa.String(length=128), nullable=False),
        sa.Column("model_version", sa.String(length=64), nullable=False),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acknowledged_by", sa.String(length=128), nullable=True),
        sa.CheckConstraint(
            "(state = 'open' AND closed_at IS NULL AND closed_sample IS NULL) OR (state = 'closed' AND closed_at IS NOT NULL AND closed_sample IS NOT NULL)",
            name=op.f("ck_alarms_closed_consistent"),
        ),
        sa.CheckConstraint("state IN ('open', 'closed')", name=op.f("ck_alarms_state_valid")),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_alarms_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alarms")),
    )
    with op.batch_alter_table("alarms", schema=None) as batch_op:
        batch_op.create_index("ix_alarms_opened_at_id", ["opened_at", "id"], unique=False)
        batch_op.create_index(
            "ix_alarms_stream_id_detector_state", ["stream_id", "detector", "state"], unique=False
        )
        batch_op.create_index(
            "uq_alarms_one_open",
            ["stream_id", "detector"],
            unique=True,
            sqlite_where=sa.text("state = 'open'"),
            postgresql_where=sa.text("state = 'open'"),
        )

    op.create_table(
        "readings",
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("sample", sa.BigInteger(), nullable=False),
        sa.Column("t", sa.DateTime(timezone=True), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.Column("values", sa.JSON(), nullable=True),
        sa.Column("reference", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_readings_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("stream_id", "sample", name=op.f("pk_readings")),
        sa.UniqueConstraint("stream_id", "t", name=op.f("uq_readings_stream_id_t")),
    )
    op.create_table(
        "stream_checkpoints",
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("sample_count", sa.BigInteger(), nullable=False),
        sa.Column("last_t", sa.DateTime(timezone=True), nullable=True),
        sa.Column("state_version", sa.Integer(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_stream_checkpoints_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("stream_id", name=op.f("pk_stream_checkpoints")),
    )


def downgrade() -> None:
    op.drop_table("stream_checkpoints")
    op.drop_table("readings")
    with op.batch_alter_table("alarms", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_alarms_one_open",
            sqlite_where=sa.text("state = 'open'"),
            postgresql_where=sa.text("state = 'open'"),
        )
        batch_op.drop_index("ix_alarms_stream_id_detector_state")
        batch_op.drop_index("ix_alarms_opened_at_id")

    op.drop_table("alarms")
    with op.batch_alter_table("streams", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_streams_model_name"))

    op.drop_table("streams")
    op.drop_table("models")
