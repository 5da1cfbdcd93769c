"""DelayedFetch: a long-poll fetch parked until min_bytes are readable or max_wait_ms passes.

Checking must be cheap because every high-watermark move checks every fetch watching that
partition: instead of reading the log, a partition's byte counter at its high watermark is
compared with the value seen when the fetch parked (Kafka compares log positions the same way).
Built only by the ReplicaManager, which also does the read when it completes.

A read_committed fetch may read only below the last stable offset, which byte counters do not
track: once the LSO passes its fetch offset, what it could read is measured by a read of at
most min_bytes (Kafka compares log positions at the LSO instead). A marker moving the LSO moves
the high watermark too, so these fetches are checked on the same event.

A follower's fetch (``replica_id`` >= 0) reads up to the log end: it measures the bytes
appended since it parked, and appends to a partition with followers check it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.replica.delayed_result import DelayedResult
from protocol.errors import KafkaError

if TYPE_CHECKING:
    from broker.replica.partition import Partition
    from broker.replica.replica_manager import FetchResult, PartitionFetch, ReplicaManager


class DelayedFetch(DelayedResult[list["FetchResult"]]):
    # Slotted, holding only what the check and the read need and no closure: thousands of
    # long polls may be parked at once, each paying for every byte here.
    __slots__ = ("replica_manager", "fetches", "hw_bytes", "accumulated", "min_bytes",
                 "max_bytes", "limit", "read_committed", "replica_id", "replica_epoch")

    def __init__(
        self,
        replica_manager: ReplicaManager,
        delay_ms: int,
        fetches: list[PartitionFetch],
        hw_bytes: tuple[int, ...],
        accumulated: int,
        min_bytes: int,
        max_bytes: int,
        limit: Callable[[], int] | None,
        *,
        read_committed: bool = False,
        replica_id: int = -1,
        replica_epoch: int = -1,
    ) -> None:
        super().__init__(delay_ms)
        self.replica_manager = replica_manager  # its partitions are checked, its logs read
        self.fetches = fetches  # each partition's tp is known: unknown ones never park
        self.hw_bytes = hw_bytes  # each partition's hw_bytes when parked, in fetches' order
        self.accumulated = accumulated
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.limit = limit  # what the connection may take when the read happens
        self.read_committed = read_committed
        self.replica_id = replica_id
        self.replica_epoch = replica_epoch

    def try_complete(self) -> bool:
        committed = self.read_committed
        total = 0 if committed else self.accumulated
        partitions = self.replica_manager.partitions
        follower = self.replica_id >= 0
        for f, hw_bytes in zip(self.fetches, self.hw_bytes, strict=True):
            p = partitions.get(f.tp)  # type: ignore[arg-type]
            offset = f.fetch_offset
            if p is None or p.offline or not p.log_start_offset <= offset <= p.log_end_offset:
                return self.force_complete()  # an error to report: answer now
            if f.current_leader_epoch >= 0 and p.check_leader_epoch(f.current_leader_epoch):
                return self.force_complete()  # a new epoch fences the client: answer now
            if f.last_fetched_epoch >= 0 and _diverged(p, f):
                return self.force_complete()  # the fetcher must truncate: answer now
            if committed:
                try:
                    total += self._stable_bytes(p, offset)
                except KafkaError:  # the dir failed under the read: answer now
                    return self.force_complete()
            elif follower:
                total += p.appended_bytes - hw_bytes
            else:
                total += p.hw_bytes - hw_bytes
        if total >= self.min_bytes:
            return self.force_complete()
        return False

    def _stable_bytes(self, p: Partition, offset: int) -> int:
        """What a read_committed fetch at ``offset`` could read now (about min_bytes at most)."""
        lso = p.last_stable_offset
        if lso <= offset:
            return 0
        return len(p.log.read(offset, self.min_bytes, lso, True))

    def result(self) -> list[FetchResult]:
        limit = self.limit
        max_bytes = self.max_bytes if limit is None else min(self.max_bytes, limit())
        return self.replica_manager.read_from_log(self.fetches, max_bytes, min_one=max_bytes > 0,
                                                  read_committed=self.read_committed,
                                                  replica_id=self.replica_id,
                                                  replica_epoch=self.replica_epoch)


def _diverged(p: Partition, f: PartitionFetch) -> bool:
    """Whether the read would answer a DivergingEpoch or an error instead of records (Kafka's
    DelayedFetch, case H)."""
    try:
        return p.diverging_epoch(f.current_leader_epoch, f.last_fetched_epoch,
                                 f.fetch_offset) is not None
    except KafkaError:
        return True
