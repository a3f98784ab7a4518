"""What learning streams learned (`learned_models`), one row per stream."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete as sql_delete
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.registry import AUTO
from app.storage.models import LearnedModel, Stream


def get(session: Session, stream_id: str) -> LearnedModel | None:
    return session.get(LearnedModel, stream_id)


def save(
    session: Session,
    *,
    stream_id: str,
    learned_from: int,
    fitted_at: datetime,
    model: dict[str, Any] | None,
    error: str | None = None,
) -> LearnedModel:
    """Record the stream's learned model (or why there is none), replacing an earlier one."""
    row = session.get(LearnedModel, stream_id)
    if row is None:
        row = LearnedModel(stream_id=stream_id)
        session.add(row)
    row.learned_from = learned_from
    row.fitted_at = fitted_at
    row.model = model
    row.error = None if error is None else error[:1000]
    row.revisions = []
    session.flush()
    return row


def add_revision(session: Session, row: LearnedModel, *, from_sample: int, monitor: Any) -> None:
    """Revised thresholds, from sample `from_sample` on."""
    row.revisions = [*row.revisions, {"from_sample": from_sample, "monitor": monitor}]
    session.flush()


def unscheduled(session: Session) -> list[tuple[Stream, LearnedModel]]:
    """The streams that learned a model and have no relearning scheduled, with it."""
    statement = (
        select(Stream, LearnedModel)
        .join(LearnedModel, LearnedModel.stream_id == Stream.id)
        .where(LearnedModel.model.is_not(None), LearnedModel.relearn_at.is_(None))
    )
    return [(stream, row) for stream, row in session.execute(statement)]


def delete(session: Session, stream_id: str) -> None:
    """Forget what the stream learned: it learns again."""
    session.execute(
        sql_delete(LearnedModel).where(LearnedModel.stream_id == stream_id),
        execution_options={"synchronize_session": "fetch"},
    )


def unversioned(session: Session) -> list[tuple[Stream, LearnedModel]]:
    """The streams that learned a model before the catalogue kept learned versions (they name
    no version), with what they learned."""
    statement = (
        select(Stream, LearnedModel)
        .join(LearnedModel, LearnedModel.stream_id == Stream.id)
        .where(
            Stream.model_name == AUTO,
            Stream.model_version.is_(None),
            LearnedModel.model.is_not(None),
        )
    )
    return [(stream, row) for stream, row in session.execute(statement)]


def get_many(session: Session, stream_ids: Sequence[str]) -> dict[str, LearnedModel]:
    """The rows of those of the streams that have one, by stream."""
    if not stream_ids:
        return {}
    statement = select(LearnedModel).where(LearnedModel.stream_id.in_(stream_ids))
    return {row.stream_id: row for row in session.scalars(statement)}
