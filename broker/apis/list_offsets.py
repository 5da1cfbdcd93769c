"""ListOffsets (key 2): earliest (-2), latest (-1), max timestamp (-3), or by timestamp.

What a consumer may read ends at the high watermark, or for read_committed (isolation_level 1,
v2+) at the last stable offset: "latest" answers that bound and no lookup answers beyond it.
With ACLs on each topic needs DESCRIBE; a denied topic's partitions answer
TOPIC_AUTHORIZATION_FAILED after the others, as Kafka lists them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import ListOffsetsResponse

from broker.apis.authorize import filter_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request
    from broker.replica.partition import Partition

API_KEY = 2  # ListOffsets
VERSIONS = range(1, 9)

TopicResponse = ListOffsetsResponse.ListOffsetsTopicResponse
PartitionResponse = TopicResponse.ListOffsetsPartitionResponse

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


def handle(ctx: ApiContext, request: Request) -> ListOffsetsResponse:
    read_committed = getattr(request.body, "isolation_level", 0) == 1
    topics = []
    requested = request.body.topics
    denied = []
    if ctx.authorizer.enabled:
        described = filter_allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC,
                                   (t.name for t in requested))
        denied = [t for t in requested if t.name not in described]
        requested = [t for t in requested if t.name in described]
    for t in requested:
        parts = []
        for p in t.partitions:
            partition, error = ctx.replica_manager.partition_or_error((t.name, p.partition_index))
            if partition is not None:
                try:
                    offset, ts = _lookup(partition, p.timestamp, read_committed)
                except KafkaError as exc:  # the log dir failed under the lookup
                    error = ErrorCode(exc.error_code)
            if error != ErrorCode.NONE or partition is None:
                parts.append(PartitionResponse(partition_index=p.partition_index,
                                               error_code=error, timestamp=-1, offset=-1,
                                               leader_epoch=-1))
                continue
            parts.append(PartitionResponse(partition_index=p.partition_index, error_code=0,
                                           timestamp=ts, offset=offset, leader_epoch=0))
        topics.append(TopicResponse(name=t.name, partitions=parts))
    for t in denied:
        topics.append(TopicResponse(name=t.name, partitions=[
            PartitionResponse(partition_index=p.partition_index,
                              error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, timestamp=-1,
                              offset=-1, leader_epoch=-1) for p in t.partitions]))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


def _lookup(partition: Partition, timestamp: int, read_committed: bool) -> tuple[int, int]:
    end = partition.last_stable_offset if read_committed else partition.high_watermark
    if timestamp == LATEST:
        return end, -1
    if timestamp == EARLIEST:
        return partition.log_start_offset, -1
    if timestamp == MAX_TIMESTAMP:
        found = partition.log.max_timestamp_offset()
    else:
        found = partition.log.offset_for_timestamp(timestamp)
    if found is None or found[0] >= end:
        return -1, -1
    return found
