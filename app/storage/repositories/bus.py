"""The bus partitions' fences (`BusPartition`)."""

from __future__ import annotations

from sqlalchemy import select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import ConflictError
from app.storage.models import BusPartition


class FencedError(ConflictError):
    """A commit for a partition whose lease a newer owner holds: nothing may be written."""


def prepare(session: Session, partitions: int) -> None:
    """Every partition's fence row (revision 0 until a first commit), in its own transaction:
    a worker starting beside another may find some already there."""
    present = set(session.scalars(select(BusPartition.partition)))
    for partition in range(partitions):
        if partition not in present:
            session.add(BusPartition(partition=partition, lease_revision=0))
    try:
        session.commit()
    except IntegrityError:
        session.rollback()  # added by another worker meanwhile


def fence(session: Session, partition: int, revision: int) -> None:
    """In the transaction of a commit for `partition` under a lease of `revision`: FencedError
    if a later lease committed already. The row stays locked until the commit, so two owners'
    commits for a partition are in lease order. On PostgreSQL a commit waits for that lock
    5 s at most (then OperationalError: the database is as good as away for it, and the batch
    is tried again), so a paused owner mid-transaction cannot hold its successor up for ever."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL lock_timeout = '5s'"))
    moved = session.execute(
        update(BusPartition)
        .where(BusPartition.partition == partition, BusPartition.lease_revision <= revision)
        .values(lease_revision=revision)
    )
    if moved.rowcount != 1:  # type: ignore[attr-defined]
        raise FencedError(
            f"partition {partition}: a later lease than revision {revision} committed; this "
            "worker no longer owns it"
        )
