"""Which worker owns which partition: leases in a JetStream key-value bucket whose entries
expire `lease_s` after they were last written.

A worker announces itself (`w.<id>`) and holds each of its partitions by a key (`p.<n>`), both
written again at every heartbeat; a partition's key is only ever created where none is, and
written again only at the revision its holder last saw, so two workers never both hold it. A
worker that stops beating loses its leases when they expire, and the others take the partitions
(each aims at its fair share: the partitions over the live workers, rounded up; one holding more
gives the surplus back, so a worker that joins gets its share).

A lease says who may consume a partition; who may commit for it, PostgreSQL says: a worker
that acquires a lease counts a takeover of the partition there and commits only while the
count is still its own (`storage/repositories/bus.py`). A worker that was paused past its lease
(a stop, a partition of the network) and wakes to commit is refused there, before it learns it
lost the lease, whatever the bucket remembers."""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass, field

from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

log = logging.getLogger(__name__)

WORKER_PREFIX = "w."
PARTITION_PREFIX = "p."


@dataclass
class Changes:
    gained: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)


def fair_share(partitions: int, workers: int) -> int:
    return math.ceil(partitions / max(1, workers))


class Leases:
    """This worker's leases: `held` maps each partition it holds to its key's revision now,
    `acquired` to the revision it took the partition at (a new one each time it takes it
    again: what a consumer of the partition belongs to)."""

    def __init__(self, bucket: KeyValue, worker_id: str, partitions: int) -> None:
        self.bucket = bucket
        self.worker_id = worker_id
        self.partitions = partitions
        self.held: dict[int, int] = {}
        self.acquired: dict[int, int] = {}

    async def beat(self) -> Changes:
        """Announce this worker, renew its leases, give back a surplus or take free partitions
        up to its fair share. What it gained and lost (a lease it could not renew)."""
        changes = Changes()
        await self.bucket.put(WORKER_PREFIX + self.worker_id, b"")
        for partition, revision in sorted(self.held.items()):
            try:
                self.held[partition] = await self.bucket.update(
                    _key(partition), self.worker_id.encode(), last=revision
                )
            except (KeyWrongLastSequenceError, KeyNotFoundError, APIError):
                del self.held[partition]  # expired, and perhaps taken since
                del self.acquired[partition]
                changes.lost.append(partition)
        keys = await self._keys()
        workers = sum(1 for key in keys if key.startswith(WORKER_PREFIX))
        share = fair_share(self.partitions, workers)
        for partition in sorted(self.held, reverse=True)[: max(0, len(self.held) - share)]:
            await self.release(partition)
            changes.lost.append(partition)
        taken = {
            int(key[len(PARTITION_PREFIX) :]) for key in keys if key.startswith(PARTITION_PREFIX)
        }
        for partition in range(self.partitions):
            if len(self.held) >= share:
                break
            if partition in taken or partition in self.held:
                continue
            try:
                revision = await self.bucket.create(_key(partition), self.worker_id.encode())
            except (KeyWrongLastSequenceError, APIError):
                continue  # another worker was quicker
            self.held[partition] = self.acquired[partition] = revision
            changes.gained.append(partition)
        if changes.gained or changes.lost:
            log.info(
                "worker %s: gained partitions %s, lost %s; holds %d",
                self.worker_id,
                changes.gained,
                changes.lost,
                len(self.held),
            )
        return changes

    async def release(self, partition: int) -> None:
        """Give a partition back at once (a surplus, or at a clean stop)."""
        revision = self.held.pop(partition)
        self.acquired.pop(partition, None)
        # (expired already, or another's since: nats-py passes the server's refusal on as is)
        with contextlib.suppress(KeyWrongLastSequenceError, KeyNotFoundError, APIError):
            await self.bucket.delete(_key(partition), last=revision)

    async def release_all(self) -> None:
        for partition in list(self.held):
            await self.release(partition)
        with contextlib.suppress(KeyNotFoundError, APIError):
            await self.bucket.delete(WORKER_PREFIX + self.worker_id)

    async def _keys(self) -> list[str]:
        try:
            return list(await self.bucket.keys())
        except NoKeysError:
            return []


def _key(partition: int) -> str:
    return f"{PARTITION_PREFIX}{partition}"
