"""Streams that keep learning: where a learned stream's history began, when it learns again and
when its candidate's proof is decided (learned_models), why a stream switched (model_switches), and the two jobs
(`relearn`, run in a process of its own, and `prove`, in the service's learner).

Revision ID: b4e6a8c0d2f3
Revises: a7d2e4f6c8b1
Create Date: 2026-12-07 14:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b4e6a8c0d2f3"
down_revision: str | Sequence[str] | None = "a7d2e4f6c8b1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _kinds(kinds: tuple[str, ...]) -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_constraint(op.f("ck_jobs_kind_valid"), type_="check")
        batch_op.create_check_constraint(op.f("ck_jobs_kind_valid"), f"kind IN {kinds!r}")


def upgrade() -> None:
    with op.batch_alter_table("learned_models") as batch_op:
        batch_op.add_column(sa.Column("history_from", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("relearn_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("relearned_s", sa.Double(), nullable=True))
        batch_op.add_column(sa.Column("prove_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("model_switches") as batch_op:
        batch_op.add_column(sa.Column("reason", sa.String(length=500), nullable=True))
    _kinds(("retrain", "recalibrate", "learn", "revise", "relearn", "prove"))


def downgrade() -> None:
    op.execute("DELETE FROM jobs WHERE kind IN ('relearn', 'prove')")
    _kinds(("retrain", "recalibrate", "learn", "revise"))
    with op.batch_alter_table("model_switches") as batch_op:
        batch_op.drop_column("reason")
    with op.batch_alter_table("learned_models") as batch_op:
        batch_op.drop_column("prove_at")
        batch_op.drop_column("relearned_s")
        batch_op.drop_column("relearn_at")
        batch_op.drop_column("history_from")
