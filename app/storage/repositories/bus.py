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


def fence(session: Session, revisions: dict[int, int]) -> None:
    """In the transaction of a commit for these partitions, each under a lease of its revision:
    FencedError if a later lease committed already for one of them. Their rows stay locked
    until the commit (taken in partition order, so two commits never wait for each other in a
    cycle), so two owners' commits for a partition are in lease order. On PostgreSQL a commit
    waits for those locks 5 s at most (then OperationalError: the database is as good as away
    for it, and the batch is tried again), so a paused owner mid-transaction cannot hold its
    successor up for ever."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL lock_timeout = '5s'"))
    rows = session.execute(
        select(BusPartition.partition, BusPartition.lease_revision)
        .where(BusPartition.partition.in_(sorted(revisions)))
        .order_by(BusPartition.partition)
        .with_for_update()
    ).all()
    committed = {partition: revision for partition, revision in rows}
    later = sorted(p for p, revision in revisions.items() if committed.get(p, 0) > revision)
    if later:
        raise FencedError(
            f"partition {later[0]}: a later lease than revision {revisions[later[0]]} committed; "
            "this worker no longer owns it",
            partitions=later,
        )
    moved = [
        {"partition": partition, "lease_revision": revision}
        for partition, revision in revisions.items()
        if partition in committed and committed[partition] != revision
    ]
    if moved:
        session.execute(update(BusPartition), moved)
    for partition in revisions.keys() - committed.keys():  # (`prepare` made them all)
        session.add(BusPartition(partition=partition, lease_revision=revisions[partition]))
