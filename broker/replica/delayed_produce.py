"""DelayedProduce: an acks=all produce parked until every partition's high watermark covers it.

Watched on each partition of the request; a high-watermark move, an ISR change (or the
partition going away: NOT_LEADER_OR_FOLLOWER) checks it; at timeout_ms the partitions still
short answer REQUEST_TIMED_OUT, as in Kafka. A partition whose high watermark reached the
batch while its ISR had shrunk below min.insync.replicas answers
NOT_ENOUGH_REPLICAS_AFTER_APPEND (Kafka's checkEnoughReplicasReachOffset). An acks=1 produce
parks only where the flush gates durability, and waits for this replica's own durable end.
Built only by the ReplicaManager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from broker.replica.delayed_result import DelayedPartitions
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.replica.partition import Partition
    from broker.replica.replica_manager import ProduceResult, TopicPartition

Results = dict["TopicPartition", "ProduceResult"]


class DelayedProduce(DelayedPartitions["ProduceResult"]):
    def __init__(self, delay_ms: int, partitions: Mapping[TopicPartition, Partition],
                 results: Results, acks: int = -1) -> None:
        super().__init__(delay_ms, results)
        self.partitions = partitions
        self.acks = acks
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
            elif self.acks != -1:
                if partition.local_end_offset > result.last_offset:
                    self.pending.discard(tp)
            else:
                done, error = partition.check_enough_replicas_reach_offset(result.last_offset + 1)
                if done:
                    if error != ErrorCode.NONE:
                        result.error = error
                        result.message = (f"the ISR of {tp[0]}-{tp[1]} shrank below "
                                          f"min.insync.replicas={partition.effective_min_isr}")
                    self.pending.discard(tp)
