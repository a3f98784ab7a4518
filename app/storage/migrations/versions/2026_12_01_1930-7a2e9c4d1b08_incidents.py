"""Incidents: the alarms of a stream that overlap or follow each other closely, acknowledged as
one; an alarm names its incident, for a stream of several channels what each channel made of its
peak, and, re-opened, the spells it was closed. Alarms from before this revision belong to no incident.

Revision ID: 7a2e9c4d1b08
Revises: 3f6d2b8a1c57
Create Date: 2026-12-01 19:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.storage.types import BigIntegerPK, UTCDateTime

revision: str = "7a2e9c4d1b08"
down_revision: str | Sequence[str] | None = "3f6d2b8a1c57"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", BigIntegerPK, autoincrement=True, nullable=False),
        sa.Column("stream_id", sa.String(length=128), nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("opened_at", UTCDateTime(), nullable=False),
        sa.Column("opened_sample", sa.BigInteger(), nullable=False),
        sa.Column("closed_at", UTCDateTime(), nullable=True),
        sa.Column("closed_sample", sa.BigInteger(), nullable=True),
        sa.Column("acknowledged_at", UTCDateTime(), nullable=True),
        sa.Column("acknowledged_by", sa.String(length=128), nullable=True),
        sa.CheckConstraint("state IN ('open', 'closed')", name=op.f("ck_incidents_state_valid")),
        sa.ForeignKeyConstraint(
            ["stream_id"],
            ["streams.id"],
            name=op.f("fk_incidents_stream_id_streams"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_incidents")),
    )
    op.create_index("ix_incidents_opened_at_id", "incidents", ["opened_at", "id"])
    op.create_index(
        "ix_incidents_stream_id_opened_sample", "incidents", ["stream_id", "opened_sample"]
    )
    with op.batch_alter_table("alarms") as batch_op:
        batch_op.add_column(sa.Column("incident_id", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("detail", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("gaps", sa.JSON(none_as_null=True), nullable=True))
        batch_op.create_index(batch_op.f("ix_alarms_incident_id"), ["incident_id"])
        batch_op.create_foreign_key(
            batch_op.f("fk_alarms_incident_id_incidents"),
            "incidents",
            ["incident_id"],
            ["id"],
            ondelete="SET NULL",
        )


def downgrade() -> None:
    with op.batch_alter_table("alarms") as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_alarms_incident_id_incidents"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_alarms_incident_id"))
        batch_op.drop_column("gaps")
        batch_op.drop_column("detail")
        batch_op.drop_column("incident_id")
    op.drop_index("ix_incidents_stream_id_opened_sample", table_name="incidents")
    op.drop_index("ix_incidents_opened_at_id", table_name="incidents")
    op.drop_table("incidents")
