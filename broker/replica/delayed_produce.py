"""DelayedProduce: an acks=all produce parked until every partition's high watermark covers it.

Watched on each partition of the request; a high-watermark move (or the partition going away)
checks it; at timeout_ms the partitions still short answer REQUEST_TIMED_OUT, as in Kafka.
Built only by the ReplicaManager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from broker.replica.delayed_result import DelayedResult
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.replica.partition import Partition
    from broker.replica.replica_manager import ProduceResult, TopicPartition

Results = dict["TopicPartition", "ProduceResult"]


class DelayedProduce(DelayedResult[Results]):
    def __init__(self, delay_ms: int, partitions: Mapping[TopicPartition, Partition],
                 results: Results) -> None:
        super().__init__(delay_ms)
        self.partitions = partitions
        self.results = results
        # Only successfully appended partitions wait; errors are answered as they are.
        self.pending = {tp for tp, r in results.items() if r.error == ErrorCode.NONE}

    def _settle(self) -> None:
        """Move every partition whose high watermark has reached its last offset out of pending."""
        for tp in list(self.pending):
            partition = self.partitions.get(tp)
            result = self.results[tp]
            if partition is None:
                result.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
                self.pending.discard(tp)
            elif partition.offline:  # its log dir failed before the batch was durable
                result.error = ErrorCode.KAFKA_STORAGE_ERROR
                result.message = f"the log dir of {tp[0]}-{tp[1]} went offline"
                self.pending.discard(tp)
            elif partition.high_watermark > result.last_offset:
                self.pending.discard(tp)

    def try_complete(self) -> bool:
        self._settle()
        if not self.pending:
            return self.force_complete()
        return False

    def result(self) -> Results:
        self._settle()
        for tp in self.pending:
            self.results[tp].error = ErrorCode.REQUEST_TIMED_OUT
        return self.results
