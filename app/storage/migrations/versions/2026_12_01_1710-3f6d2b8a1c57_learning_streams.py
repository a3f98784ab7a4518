"""Streams that learn: their learning period and false-alarm budget, an inferred sample period,
and what each learned (learned_models).

Revision ID: 3f6d2b8a1c57
Revises: 9e4b7c1d2a60
Create Date: 2026-12-01 17:10:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.storage.types import UTCDateTime

revision: str = "3f6d2b8a1c57"
down_revision: str | Sequence[str] | None = "9e4b7c1d2a60"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "learned_models",
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("learned_from", sa.BigInteger(), nullable=False),
        sa.Column("fitted_at", UTCDateTime(), nullable=False),
        sa.Column("model", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("error", sa.String(length=1000), nullable=True),
        sa.Column("revisions", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_learned_models_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("stream_id", name=op.f("pk_learned_models")),
    )
    with op.batch_alter_table("streams") as batch_op:
        batch_op.add_column(sa.Column("learning", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(
            sa.Column(
                "false_alarms_per_day", sa.Double(), nullable=False, server_default=sa.text("1.0")
            )
        )
        batch_op.alter_column("sample_period_s", existing_type=sa.Double(), nullable=True)
        batch_op.create_check_constraint(
            "false_alarms_per_day_positive", "false_alarms_per_day > 0"
        )
    with op.batch_alter_table("streams") as batch_op:
        batch_op.alter_column("false_alarms_per_day", server_default=None)


def downgrade() -> None:
    # A stream still learning had no period yet: it gets 1 s (it cannot learn under 0.1 anyway).
    op.execute("UPDATE streams SET sample_period_s = 1.0 WHERE sample_period_s IS NULL")
    with op.batch_alter_table("streams") as batch_op:
        batch_op.drop_constraint("false_alarms_per_day_positive", type_="check")
        batch_op.alter_column("sample_period_s", existing_type=sa.Double(), nullable=False)
        batch_op.drop_column("false_alarms_per_day")
        batch_op.drop_column("learning")
    op.drop_table("learned_models")
