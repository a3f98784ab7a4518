"""The bus partitions' fences: the lease revision of each partition's last commit.

Revision ID: e5b7c9d1f3a4
Revises: c3a9d7e5f1b2
Create Date: 2026-12-02 06:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e5b7c9d1f3a4"
down_revision: str | Sequence[str] | None = "c3a9d7e5f1b2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bus_partitions",
        sa.Column("partition", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("lease_revision", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("partition", name=op.f("pk_bus_partitions")),
    )


def downgrade() -> None:
    op.drop_table("bus_partitions")
