"""DelayedFetch: a long-poll fetch parked until min_bytes are readable or max_wait_ms passes.

Checking must be cheap because every high-watermark move checks every fetch watching that
partition: instead of reading the log, a partition's byte counter at its high watermark is
compared with the value seen when the fetch parked (Kafka compares log positions the same way).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from purgatory import DelayedOperation

if TYPE_CHECKING:
    from broker.replica_manager import ReplicaManager, TopicPartition


class DelayedFetch(DelayedOperation):
    def __init__(
        self,
        delay_ms: int,
        rm: ReplicaManager,
        watched: list[tuple[TopicPartition, int, int]],
        accumulated: int,
        min_bytes: int,
        respond: Callable[[], object],
    ) -> None:
        super().__init__(delay_ms)
        self.rm = rm
        self.watched = watched  # (partition, fetch offset, partition.hw_bytes when parked)
        self.accumulated = accumulated
        self.min_bytes = min_bytes
        self.future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._respond = respond

    def try_complete(self) -> bool:
        total = self.accumulated
        partitions = self.rm.partitions
        for tp, offset, hw_bytes in self.watched:
            p = partitions.get(tp)
            if p is None or not p.log_start_offset <= offset <= p.log_end_offset:
                return self.force_complete()  # an error to report: answer now
            total += p.hw_bytes - hw_bytes
        if total >= self.min_bytes:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        if not self.future.done():
            try:
                self.future.set_result(self._respond())
            except Exception as exc:  # surfaces as a closed connection, logged once
                self.future.set_exception(exc)

    def on_expiration(self) -> None:
        pass
