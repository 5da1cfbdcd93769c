"""DelayedDeleteRecords: a DeleteRecords parked until every live replica dropped the records.

The leader moves its log start offset at once; its followers move theirs when a fetch answer
carries the new one, and say so in their next fetch. The request is answered when each
partition's low watermark (the least log start offset of the leader and its live followers)
reached the offset asked for, as Kafka's DelayedDeleteRecords. Watched on each partition; a
follower's fetch that moved its log start, or the partition leaving this broker's lead,
checks it. At timeout_ms the partitions still short answer REQUEST_TIMED_OUT with the low
watermark they reached. Built only by the ReplicaManager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.replica.delayed_result import DelayedPartitions
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.replica.partition import Partition
    from broker.replica.replica_manager import DeleteRecordsResult, TopicPartition

Results = dict["TopicPartition", "DeleteRecordsResult"]
#: The partition led here, or None and the error to answer (Kafka's getPartitionOrError).
PartitionLookup = Callable[["TopicPartition"], "tuple[Partition | None, ErrorCode]"]


class DelayedDeleteRecords(DelayedPartitions["DeleteRecordsResult"]):
    def __init__(self, delay_ms: int, lookup: PartitionLookup, required: dict[TopicPartition, int],
                 results: Results) -> None:
        """``required``: the offset each deleted partition's low watermark must reach;
        ``results``: the answer so far (the partitions refused are answered as they are)."""
        super().__init__(delay_ms, results)
        self.lookup = lookup
        self.required = required
        self.pending = {tp for tp, r in results.items()
                        if r.error == ErrorCode.NONE and tp in required}

    def _settle(self) -> None:
        """Answer every partition whose low watermark reached its offset, or that erred."""
        for tp in list(self.pending):
            partition, error = self.lookup(tp)
            result = self.results[tp]
            if partition is None:
                result.error, result.low_watermark = error, -1
                self.pending.discard(tp)
                continue
            low = partition.low_watermark
            result.low_watermark = low
            if low >= self.required[tp]:
                self.pending.discard(tp)
