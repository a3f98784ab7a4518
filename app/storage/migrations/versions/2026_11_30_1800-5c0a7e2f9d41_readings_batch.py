"""Readings remember the batch they arrived in: restarts replay after the last checkpoint.

Revision ID: 5c0a7e2f9d41
Revises: 1b3851d3c863
Create Date: 2026-11-30 18:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5c0a7e2f9d41"
down_revision: str | Sequence[str] | None = "1b3851d3c863"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("readings") as batch_op:
        batch_op.add_column(sa.Column("batch", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("readings") as batch_op:
        batch_op.drop_column("batch")
