"""Learned models in the catalogue: a model's name may be "auto." and a stream's id (133
characters), wherever a model's name is kept; a learning stream's fits and revisions are jobs.

Revision ID: c3a9d7e5f1b2
Revises: 8b1c5e9f3a27
Create Date: 2026-12-02 02:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c3a9d7e5f1b2"
down_revision: str | Sequence[str] | None = "8b1c5e9f3a27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = {
    "models": ("name",),
    "model_versions": ("name",),
    "model_switches": ("from_model", "to_model"),
    "shadows": ("model_name",),
    "alarms": ("model_name",),
}


def _resize(old: int, new: int) -> None:
    for table, columns in COLUMNS.items():
        with op.batch_alter_table(table) as batch_op:
            for column in columns:
                batch_op.alter_column(
                    column, existing_type=sa.String(length=old), type_=sa.String(length=new)
                )


def _kinds(kinds: tuple[str, ...]) -> None:
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_constraint(op.f("ck_jobs_kind_valid"), type_="check")
        batch_op.create_check_constraint(op.f("ck_jobs_kind_valid"), f"kind IN {kinds!r}")


def upgrade() -> None:
    _resize(128, 133)
    _kinds(("retrain", "recalibrate", "learn", "revise"))


def downgrade() -> None:
    # What the earlier schema cannot hold: learned versions (the streams keep what they run,
    # in learned_models), and their names where alarms, switches and shadows kept them.
    op.execute("UPDATE streams SET model_version = NULL WHERE model_name = 'auto'")
    op.execute("DELETE FROM shadows WHERE model_name LIKE 'auto.%'")
    op.execute(
        "DELETE FROM model_switches WHERE from_model LIKE 'auto.%' OR to_model LIKE 'auto.%'"
    )
    op.execute("DELETE FROM model_versions WHERE name LIKE 'auto.%'")
    op.execute("DELETE FROM models WHERE name LIKE 'auto.%'")
    op.execute("UPDATE alarms SET model_name = 'auto' WHERE model_name LIKE 'auto.%'")
    op.execute("DELETE FROM jobs WHERE kind IN ('learn', 'revise')")
    _kinds(("retrain", "recalibrate"))
    _resize(133, 128)
