"""Alarms and incidents listed newest first, keyset-paginated: one way for both.

The cursor names the last row returned (its opening time and id), so pages stay consistent
while new rows arrive; pass the same filters with it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session

from app.errors import DataError
from app.storage.models import Alarm, AlarmState, Incident

Row = TypeVar("Row", Alarm, Incident)


@dataclass(frozen=True)
class Page(Generic[Row]):
    items: list[Row]
    next_cursor: str | None


def opened_filters(
    model: type[Alarm] | type[Incident],
    *,
    stream_id: str | None = None,
    state: AlarmState | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[ColumnElement[bool]]:
    """Rows of a stream, in a state, opened in `since <= opened_at < until`."""
    conditions: list[ColumnElement[bool]] = []
    if stream_id is not None:
        conditions.append(model.stream_id == stream_id)
    if state is not None:
        conditions.append(model.state == state)
    if since is not None:
        conditions.append(model.opened_at >= since)
    if until is not None:
        conditions.append(model.opened_at < until)
    return conditions


def newest_first(
    session: Session,
    model: type[Row],
    conditions: list[ColumnElement[bool]],
    *,
    limit: int,
    cursor: str | None,
) -> Page[Row]:
    """Rows matching `conditions`, newest first (by opening time, then id), a page at a time."""
    if limit < 1:
        raise DataError("limit must be at least 1")
    statement: Any = select(model).where(*conditions)
    if cursor is not None:
        after_at, after_id = decode_cursor(cursor)
        statement = statement.where(
            or_(
                model.opened_at < after_at,
                and_(model.opened_at == after_at, model.id < after_id),
            )
        )
    statement = statement.order_by(model.opened_at.desc(), model.id.desc()).limit(limit + 1)
    rows = list(session.scalars(statement))
    items = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = items[-1]
        next_cursor = encode_cursor(last.opened_at, last.id)
    return Page(items=items, next_cursor=next_cursor)


def encode_cursor(opened_at: datetime, row_id: int) -> str:
    raw = f"{opened_at.isoformat()}|{row_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at_text, id_text = raw.split("|")
        opened_at = datetime.fromisoformat(at_text)
        row_id = int(id_text)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise DataError("invalid cursor: pass back the next_cursor of a previous page") from None
    if opened_at.tzinfo is None or not 0 <= row_id < 2**63:  # (a row id is a BIGINT)
        raise DataError("invalid cursor: pass back the next_cursor of a previous page")
    return opened_at, row_id
