"""OffsetForLeaderEpoch (key 23): clients check for log truncation after a leader change.

One broker has had one leader epoch (0) for every partition, so epoch 0 ends at the log end;
an unknown later epoch gets UNKNOWN_LEADER_EPOCH / -1, as Kafka answers. CLUSTER_ACTION on the
cluster (a follower) allows every topic; otherwise each topic needs DESCRIBE (KIP-320), a
refused one's partitions TOPIC_AUTHORIZATION_FAILED after the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import OffsetForLeaderEpochResponse

from broker.apis.authorize import cluster_allowed, filter_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 23  # OffsetForLeaderEpoch
VERSIONS = range(2, 5)

TopicResult = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
EpochEndOffset = TopicResult.EpochEndOffset


def handle(ctx: ApiContext, request: Request) -> OffsetForLeaderEpochResponse:
    topics = []
    requested = list(request.body.topics)
    denied: list = []
    if ctx.authorizer.enabled and not cluster_allowed(ctx, request, AclOperation.CLUSTER_ACTION,
                                                      log_if_denied=False):
        described = filter_allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC,
                                   (t.topic for t in requested))
        denied = [t for t in requested if t.topic not in described]
        requested = [t for t in requested if t.topic in described]
    for t in requested:
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
    for t in denied:
        topics.append(TopicResult(topic=t.topic, partitions=[
            EpochEndOffset(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, partition=p.partition,
                           leader_epoch=-1, end_offset=-1) for p in t.partitions]))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)
