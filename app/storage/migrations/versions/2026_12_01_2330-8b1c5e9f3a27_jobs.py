"""Jobs: work on a stream's stored readings (retrain, recalibrate) that makes a candidate
model version; shadows: a candidate version beside what a stream runs.

Revision ID: 8b1c5e9f3a27
Revises: 4d8e1f7a2b93
Create Date: 2026-12-01 23:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.storage.types import BigIntegerPK, UTCDateTime

revision: str = "8b1c5e9f3a27"
down_revision: str | Sequence[str] | None = "4d8e1f7a2b93"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", BigIntegerPK, autoincrement=True, nullable=False),
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("progress", sa.JSON(), nullable=False),
        sa.Column("result", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("error", sa.String(length=2000), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.CheckConstraint(
            "kind IN ('retrain', 'recalibrate')", name=op.f("ck_jobs_kind_valid")
        ),
        sa.CheckConstraint(
            "phase IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_jobs_phase_valid"),
        ),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_jobs_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_stream_id"), "jobs", ["stream_id"], unique=False)
    op.create_table(
        "shadows",
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("model_name", sa.String(length=128), nullable=False),
        sa.Column("model_version", sa.Integer(), nullable=False),
        sa.Column("from_sample", sa.BigInteger(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_shadows_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("stream_id", name=op.f("pk_shadows")),
    )


def downgrade() -> None:
    op.drop_table("shadows")
    op.drop_index(op.f("ix_jobs_stream_id"), table_name="jobs")
    op.drop_table("jobs")
