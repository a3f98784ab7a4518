"""Model versions: every artifact a model name has had (model_versions), the name's active
version, the version a stream runs when it names one, and each stream's switches between
versions (model_switches). The models already registered become
version 1 of their names at the next start (the service imports its models directory).

Revision ID: 4d8e1f7a2b93
Revises: 7a2e9c4d1b08
Create Date: 2026-12-01 23:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.storage.types import BigIntegerPK, UTCDateTime

revision: str = "4d8e1f7a2b93"
down_revision: str | Sequence[str] | None = "7a2e9c4d1b08"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("artifact_sha256", sa.String(length=64), nullable=False),
        sa.Column("source", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("calibration", sa.JSON(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.CheckConstraint(
            "status IN ('candidate', 'active', 'retired')",
            name=op.f("ck_model_versions_status_valid"),
        ),
        sa.CheckConstraint("version >= 1", name=op.f("ck_model_versions_version_positive")),
        sa.ForeignKeyConstraint(
            ["name"],
            ["models.name"],
            name=op.f("fk_model_versions_name_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("name", "version", name=op.f("pk_model_versions")),
    )
    op.create_table(
        "model_switches",
        sa.Column("id", BigIntegerPK, autoincrement=True, nullable=False),
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("at_sample", sa.BigInteger(), nullable=False),
        sa.Column("from_model", sa.String(length=128), nullable=False),
        sa.Column("from_version", sa.String(length=64), nullable=False),
        sa.Column("to_model", sa.String(length=128), nullable=False),
        sa.Column("to_version", sa.Integer(), nullable=False),
        sa.Column("switched_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_model_switches_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_switches")),
    )
    op.create_index(
        op.f("ix_model_switches_stream_id"), "model_switches", ["stream_id"], unique=False
    )
    with op.batch_alter_table("models") as batch_op:
        batch_op.add_column(sa.Column("active_version", sa.Integer(), nullable=True))
    with op.batch_alter_table("streams") as batch_op:
        batch_op.add_column(sa.Column("model_version", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("streams") as batch_op:
        batch_op.drop_column("model_version")
    with op.batch_alter_table("models") as batch_op:
        batch_op.drop_column("active_version")
    op.drop_index(op.f("ix_model_switches_stream_id"), table_name="model_switches")
    op.drop_table("model_switches")
    op.drop_table("model_versions")
