"""ListOffsets (key 2): earliest (-2), latest (-1), max timestamp (-3), or by timestamp.

What a consumer may read ends at the high watermark, or for read_committed (isolation_level 1,
v2+) at the last stable offset: "latest" answers that bound and no lookup answers beyond it.
With ACLs on each topic needs DESCRIBE; a denied topic's partitions answer
TOPIC_AUTHORIZATION_FAILED after the others, as Kafka lists them.

Leader epochs as Kafka's Partition.fetchOffsetForTimestamp: the request's current leader epoch
(v4+; -1 is not checked) older than the partition's is FENCED_LEADER_EPOCH, newer
UNKNOWN_LEADER_EPOCH. The answer carries (v4+) the epoch of the offset found: "latest" the
partition's epoch, "earliest" the first cached epoch when it starts at the log start, a
lookup the epoch that wrote the batch (from the log's epoch cache, which holds exactly the
batches' epochs). A consumer asking while the high watermark lags the start of the leader's
epoch (a leader just elected) gets OFFSET_NOT_AVAILABLE (LEADER_NOT_AVAILABLE before v5) for
"latest" and for a lookup with nothing readable to answer. In cluster mode a partition of the
cluster that this broker does not lead answers NOT_LEADER_OR_FOLLOWER, as Produce and Fetch do.
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
CONSUMER_REPLICA_ID = -1
OFFSET_NOT_AVAILABLE_VERSION = 5  # older clients get LEADER_NOT_AVAILABLE instead


def handle(ctx: ApiContext, request: Request) -> ListOffsetsResponse:
    read_committed = getattr(request.body, "isolation_level", 0) == 1
    consumer = getattr(request.body, "replica_id", CONSUMER_REPLICA_ID) == CONSUMER_REPLICA_ID
    not_available = (ErrorCode.OFFSET_NOT_AVAILABLE
                     if request.version >= OFFSET_NOT_AVAILABLE_VERSION
                     else ErrorCode.LEADER_NOT_AVAILABLE)
    topics = []
    requested = request.body.topics
    denied = []
    if ctx.authorizer.enabled:
        described = filter_allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC,
                                   (t.name for t in requested))
        denied = [t for t in requested if t.name not in described]
        requested = [t for t in requested if t.name in described]
    cluster = ctx.cluster
    for t in requested:
        parts = []
        not_led = (cluster.not_led(((t.name, p.partition_index) for p in t.partitions),
                                   ctx.replica_manager.partitions)
                   if cluster is not None else ())
        for p in t.partitions:
            partition, error = ctx.replica_manager.partition_or_error((t.name, p.partition_index))
            if (t.name, p.partition_index) in not_led:
                # A partition of the cluster another broker leads (or none, for now): the
                # client asks the leader, as Kafka's answer tells it.
                error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            found: tuple[int, int, int] | None = None
            if partition is not None:
                error = partition.check_leader_epoch(p.current_leader_epoch)
            if partition is not None and error == ErrorCode.NONE:
                try:
                    found = _lookup(partition, p.timestamp, read_committed, consumer)
                except KafkaError as exc:  # the log dir failed under the lookup
                    error = ErrorCode(exc.error_code)
                else:
                    if found is None:
                        error = not_available
            if error != ErrorCode.NONE or found is None:
                parts.append(PartitionResponse(partition_index=p.partition_index,
                                               error_code=error, timestamp=-1, offset=-1,
                                               leader_epoch=-1))
                continue
            offset, ts, epoch = found
            parts.append(PartitionResponse(partition_index=p.partition_index, error_code=0,
                                           timestamp=ts, offset=offset, leader_epoch=epoch))
        topics.append(TopicResponse(name=t.name, partitions=parts))
    for t in denied:
        topics.append(TopicResponse(name=t.name, partitions=[
            PartitionResponse(partition_index=p.partition_index,
                              error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, timestamp=-1,
                              offset=-1, leader_epoch=-1) for p in t.partitions]))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


_NOT_FOUND = (-1, -1, -1)


def _lookup(partition: Partition, timestamp: int, read_committed: bool, consumer: bool
            ) -> tuple[int, int, int] | None:
    """``(offset, timestamp, leader epoch)``; None when, for a consumer, the high watermark
    lags the start of the leader's epoch and there is nothing to answer. A replica (replica
    id >= 0) is not bound by the high watermark: its LATEST is the log end, as Kafka's."""
    if not consumer:
        end = partition.log_end_offset
    else:
        end = partition.last_stable_offset if read_committed else partition.high_watermark
    lagging = consumer and partition.leader_epoch_start_offset > partition.high_watermark
    log = partition.log
    if timestamp == LATEST:
        return None if lagging else (end, -1, partition.leader_epoch)
    if timestamp == EARLIEST:
        start = partition.log_start_offset
        first = log.earliest_epoch_entry()
        epoch = first.epoch if first is not None and first.start_offset <= start else -1
        return start, -1, epoch
    found = (log.max_timestamp_offset() if timestamp == MAX_TIMESTAMP
             else log.offset_for_timestamp(timestamp))
    if found is None or found[0] < 0 or found[0] >= end:
        return None if lagging else _NOT_FOUND
    batch_epoch = log.epoch_for_offset(found[0])
    return found[0], found[1], -1 if batch_epoch is None else batch_epoch
