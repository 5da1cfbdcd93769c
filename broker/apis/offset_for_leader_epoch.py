"""OffsetForLeaderEpoch (key 23): clients check for log truncation after a leader change.

One broker has had one leader epoch (0) for every partition, so epoch 0 ends at the log end;
an unknown later epoch gets UNKNOWN_LEADER_EPOCH / -1, as Kafka answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import OffsetForLeaderEpochResponse

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

TopicResult = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
EpochEndOffset = TopicResult.EpochEndOffset


def handle(ctx: ApiContext, request: Request) -> OffsetForLeaderEpochResponse:
    topics = []
    for t in request.body.topics:
        parts = []
        for p in t.partitions:
            partition, error = ctx.replica_manager.partition_or_error((t.topic, p.partition))
            if partition is None:
                parts.append(EpochEndOffset(error_code=error, partition=p.partition,
                                            leader_epoch=-1, end_offset=-1))
            elif p.current_leader_epoch > partition.leader_epoch:
                parts.append(EpochEndOffset(error_code=ErrorCode.UNKNOWN_LEADER_EPOCH,
                                            partition=p.partition, leader_epoch=-1,
                                            end_offset=-1))
            elif p.leader_epoch > partition.leader_epoch:
                parts.append(EpochEndOffset(error_code=0, partition=p.partition,
                                            leader_epoch=-1, end_offset=-1))
            else:
                parts.append(EpochEndOffset(error_code=0, partition=p.partition,
                                            leader_epoch=partition.leader_epoch,
                                            end_offset=partition.log_end_offset))
        topics.append(TopicResult(topic=t.topic, partitions=parts))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)
