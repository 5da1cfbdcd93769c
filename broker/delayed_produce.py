"""DelayedProduce: an acks=all produce parked until every partition's high watermark covers it.

Watched on each partition of the request; a high-watermark move (or the partition going away)
checks it; at timeout_ms the partitions still short answer REQUEST_TIMED_OUT, as in Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from protocol.errors import ErrorCode
from purgatory import DelayedOperation

if TYPE_CHECKING:
    from broker.replica_manager import ProduceResult, ReplicaManager, TopicPartition


class DelayedProduce(DelayedOperation):
    def __init__(
        self,
        delay_ms: int,
        rm: ReplicaManager,
        results: dict[TopicPartition, ProduceResult],
        respond: Callable[[dict[TopicPartition, ProduceResult]], object],
    ) -> None:
        super().__init__(delay_ms)
        self.rm = rm
        self.results = results
        # Only successfully appended partitions wait; errors are answered as they are.
        self.pending = {tp for tp, r in results.items() if r.error == ErrorCode.NONE}
        self.future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._respond = respond

    def _settle(self) -> None:
        """Move every partition whose high watermark has reached its last offset out of pending."""
        for tp in list(self.pending):
            partition = self.rm.partitions.get(tp)
            result = self.results[tp]
            if partition is None:
                result.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
                self.pending.discard(tp)
            elif partition.high_watermark > result.last_offset:
                self.pending.discard(tp)

    def try_complete(self) -> bool:
        self._settle()
        if not self.pending:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self._settle()
        for tp in self.pending:
            self.results[tp].error = ErrorCode.REQUEST_TIMED_OUT
        if not self.future.done():
            self.future.set_result(self._respond(self.results))

    def on_expiration(self) -> None:
        pass
