"""The changes of streams bus workers made, by message id: a change delivered again is
answered as it was, not made twice.

Revision ID: a7d2e4f6c8b1
Revises: f2a8c4e6b9d1
Create Date: 2026-12-05 08:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7d2e4f6c8b1"
down_revision: str | Sequence[str] | None = "f2a8c4e6b9d1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bus_changes",
        sa.Column("message_id", sa.String(length=200), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("media_type", sa.String(length=100), nullable=False),
        sa.Column("made_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("message_id", name=op.f("pk_bus_changes")),
    )
    op.create_index(op.f("ix_bus_changes_made_at"), "bus_changes", ["made_at"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_bus_changes_made_at"), table_name="bus_changes")
    op.drop_table("bus_changes")
