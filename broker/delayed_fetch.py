"""DelayedFetch: a long-poll fetch parked until min_bytes are readable or max_wait_ms passes.

Checking must be cheap because every high-watermark move checks every fetch watching that
partition: instead of reading the log, a partition's byte counter at its high watermark is
compared with the value seen when the fetch parked (Kafka compares log positions the same way).
Built only by the ReplicaManager, which also does the read when it completes.

A read_committed fetch may read only below the last stable offset, which byte counters do not
track: once the LSO passes its fetch offset, what it could read is measured by a read of at
most min_bytes (Kafka compares log positions at the LSO instead). A marker moving the LSO moves
the high watermark too, so these fetches are checked on the same event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from broker.delayed_result import DelayedResult
from protocol.errors import KafkaError

if TYPE_CHECKING:
    from broker.partition import Partition
    from broker.replica_manager import FetchResult, TopicPartition


class DelayedFetch(DelayedResult[list["FetchResult"]]):
    def __init__(
        self,
        delay_ms: int,
        partitions: Mapping[TopicPartition, Partition],
        watched: list[tuple[TopicPartition, int, int]],
        accumulated: int,
        min_bytes: int,
        read: Callable[[], list[FetchResult]],
        *,
        read_committed: bool = False,
    ) -> None:
        super().__init__(delay_ms)
        self.partitions = partitions
        self.watched = watched  # (partition, fetch offset, partition.hw_bytes when parked)
        self.accumulated = accumulated
        self.min_bytes = min_bytes
        self._read = read
        self.read_committed = read_committed

    def try_complete(self) -> bool:
        committed = self.read_committed
        total = 0 if committed else self.accumulated
        partitions = self.partitions
        for tp, offset, hw_bytes in self.watched:
            p = partitions.get(tp)
            if p is None or p.offline or not p.log_start_offset <= offset <= p.log_end_offset:
                return self.force_complete()  # an error to report: answer now
            if committed:
                try:
                    total += self._stable_bytes(p, offset)
                except KafkaError:  # the dir failed under the read: answer now
                    return self.force_complete()
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
        return self._read()
