"""DelayedFetch: a long-poll fetch parked until min_bytes are readable or max_wait_ms passes.

Checking must be cheap because every high-watermark move checks every fetch watching that
partition: instead of reading the log, a partition's byte counter at its high watermark is
compared with the value seen when the fetch parked (Kafka compares log positions the same way).
Built only by the ReplicaManager, which also does the read when it completes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from broker.delayed_result import DelayedResult

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
    ) -> None:
        super().__init__(delay_ms)
        self.partitions = partitions
        self.watched = watched  # (partition, fetch offset, partition.hw_bytes when parked)
        self.accumulated = accumulated
        self.min_bytes = min_bytes
        self._read = read

    def try_complete(self) -> bool:
        total = self.accumulated
        partitions = self.partitions
        for tp, offset, hw_bytes in self.watched:
            p = partitions.get(tp)
            if p is None or p.offline or not p.log_start_offset <= offset <= p.log_end_offset:
                return self.force_complete()  # an error to report: answer now
            total += p.hw_bytes - hw_bytes
        if total >= self.min_bytes:
            return self.force_complete()
        return False

    def result(self) -> list[FetchResult]:
        return self._read()
