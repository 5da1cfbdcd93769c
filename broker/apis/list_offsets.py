"""ListOffsets (key 2): earliest (-2), latest (-1), max timestamp (-3), or by timestamp."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import ListOffsetsResponse

from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request
    from broker.partition import Partition

TopicResponse = ListOffsetsResponse.ListOffsetsTopicResponse
PartitionResponse = TopicResponse.ListOffsetsPartitionResponse

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


def handle(ctx: ApiContext, request: Request) -> ListOffsetsResponse:
    topics = []
    for t in request.body.topics:
        parts = []
        for p in t.partitions:
            partition, error = ctx.replica_manager.partition_or_error((t.name, p.partition_index))
            if partition is not None:
                try:
                    offset, ts = _lookup(partition, p.timestamp)
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
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


def _lookup(partition: Partition, timestamp: int) -> tuple[int, int]:
    """Offsets a consumer may read stop at the high watermark."""
    if timestamp == LATEST:
        return partition.high_watermark, -1
    if timestamp == EARLIEST:
        return partition.log_start_offset, -1
    if timestamp == MAX_TIMESTAMP:
        found = partition.log.max_timestamp_offset()
    else:
        found = partition.log.offset_for_timestamp(timestamp)
    if found is None or found[0] >= partition.high_watermark:
        return -1, -1
    return found
