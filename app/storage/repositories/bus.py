"""The bus partitions' fences (`BusPartition`): a count of takeovers PostgreSQL keeps, so that
only the latest worker to take a partition commits for it, whatever NATS remembers."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import ConflictError
from app.storage.models import BusChange, BusPartition

CHANGES_KEPT = timedelta(days=1)
"""How long a made change's answer is kept for a delivery again: far longer than a message
waits for its acknowledgement before JetStream delivers it again."""


class FencedError(ConflictError):
    """A commit for a partition a worker took since: nothing may be written."""


def prepare(session: Session, partitions: int) -> None:
    """Every partition's fence row (epoch 0 until a first takeover), in its own transaction:
    a worker starting beside another may find some already there."""
    present = set(session.scalars(select(BusPartition.partition)))
    for partition in range(partitions):
        if partition not in present:
            session.add(BusPartition(partition=partition, epoch=0))
    try:
        session.commit()
    except IntegrityError:
        session.rollback()  # added by another worker meanwhile


def take(session: Session, partition: int) -> int:
    """Count a takeover of the partition (by a worker that has just acquired its lease) and
    return its epoch: the token its commits for the partition carry. Waits for a commit of the
    previous owner in progress (5 s at most on PostgreSQL), which then is the last it makes."""
    _wait_briefly(session)
    epoch = session.execute(
        update(BusPartition)
        .where(BusPartition.partition == partition)
        .values(epoch=BusPartition.epoch + 1)
        .returning(BusPartition.epoch)
    ).scalar_one_or_none()
    if epoch is None:
        raise LookupError(f"partition {partition} has no fence row: prepare() first")
    return int(epoch)


def fence(session: Session, epochs: dict[int, int]) -> None:
    """In the transaction of a commit for these partitions, each taken at its epoch:
    FencedError if another worker took one of them since. Their rows stay share-locked until
    the commit (the owner's own transactions do not wait for each other), so a takeover waits
    for a commit in progress and every later commit of the previous owner is refused. On
    PostgreSQL a commit waits for a takeover in progress 5 s at most (then OperationalError:
    the database is as good as away for it, and the batch is tried again)."""
    _wait_briefly(session)
    rows = session.execute(
        select(BusPartition.partition, BusPartition.epoch)
        .where(BusPartition.partition.in_(sorted(epochs)))
        .order_by(BusPartition.partition)
        .with_for_update(read=True)  # (a takeover's UPDATE waits; the owner's own do not)
    ).all()
    current = {partition: epoch for partition, epoch in rows}
    taken = sorted(p for p, epoch in epochs.items() if current.get(p) != epoch)
    if taken:
        raise FencedError(
            f"partition {taken[0]}: taken by another worker since this one took it (epoch "
            f"{epochs[taken[0]]}, now {current.get(taken[0])}); this worker no longer owns it",
            partitions=taken,
        )


def change_made(session: Session, message_id: str) -> BusChange | None:
    """The change of this message, if a worker made it already (in the message's partition,
    whose fence the caller holds)."""
    return session.get(BusChange, message_id)


def record_change(
    session: Session,
    message_id: str,
    *,
    status: int,
    body: bytes,
    media_type: str,
    now: datetime,
) -> None:
    """In the transaction that makes a change: its answer, by its message's id; the answers
    older than `CHANGES_KEPT` go."""
    session.execute(delete(BusChange).where(BusChange.made_at < now - CHANGES_KEPT))
    session.add(
        BusChange(
            message_id=message_id, status=status, body=body, media_type=media_type, made_at=now
        )
    )


def _wait_briefly(session: Session) -> None:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL lock_timeout = '5s'"))
