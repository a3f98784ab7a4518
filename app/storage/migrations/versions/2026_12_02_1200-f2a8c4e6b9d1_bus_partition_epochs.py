"""The bus partitions' fences count takeovers (an epoch PostgreSQL issues), not JetStream's
lease revisions, which start again at 1 if the leases bucket is made again.

Revision ID: f2a8c4e6b9d1
Revises: e5b7c9d1f3a4
Create Date: 2026-12-02 12:00:00+00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "f2a8c4e6b9d1"
down_revision: str | Sequence[str] | None = "e5b7c9d1f3a4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A worker takes its partitions again when it starts: the epochs start from 0.
    op.execute("UPDATE bus_partitions SET lease_revision = 0")
    with op.batch_alter_table("bus_partitions") as table:
        table.alter_column("lease_revision", new_column_name="epoch")


def downgrade() -> None:
    op.execute("UPDATE bus_partitions SET epoch = 0")
    with op.batch_alter_table("bus_partitions") as table:
        table.alter_column("epoch", new_column_name="lease_revision")
