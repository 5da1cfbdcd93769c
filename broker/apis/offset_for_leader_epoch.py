"""OffsetForLeaderEpoch (key 23): clients check for log truncation after a leader change.

Kafka's ReplicaManager.lastOffsetForLeaderEpoch: the request's current leader epoch (v2+; -1
is not checked) older than the partition's is FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH;
otherwise the answer is the log's epoch cache's: the largest epoch at or below the one asked
and where it ended (the log end offset for the latest epoch), or -1 / -1 with no error when
the cache has none (an epoch above every known one, or -1). Followers and consumers (v3+
ReplicaId) get the same answer, from the leader, as Kafka gives them. CLUSTER_ACTION on the
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
            epoch = end_offset = -1
            if partition is not None:
                error, epoch, end_offset = partition.last_offset_for_leader_epoch(
                    p.current_leader_epoch, p.leader_epoch)
            parts.append(EpochEndOffset(error_code=error, partition=p.partition,
                                        leader_epoch=epoch, end_offset=end_offset))
        topics.append(TopicResult(topic=t.topic, partitions=parts))
    for t in denied:
        topics.append(TopicResult(topic=t.topic, partitions=[
            EpochEndOffset(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, partition=p.partition,
                           leader_epoch=-1, end_offset=-1) for p in t.partitions]))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)
