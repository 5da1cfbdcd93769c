"""DeleteRecords (key 21): move partitions' log start offsets forward (AdminClient.deleteRecords).

Offset -1 means the high watermark. Each partition answers its new low watermark once every
live replica dropped the records (at most timeout_ms, then REQUEST_TIMED_OUT), or
UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, INVALID_TOPIC_EXCEPTION (the internal
topics are never trimmed by a client), POLICY_VIOLATION (a log without the delete cleanup
policy), OFFSET_OUT_OF_RANGE (below 0 or past the high watermark) or KAFKA_STORAGE_ERROR; -1
as the low watermark with an error, as Kafka's INVALID_LOW_WATERMARK. Each topic needs
DELETE, checked first (TOPIC_AUTHORIZATION_FAILED, nothing moved).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DeleteRecordsResponse

from broker.apis.add_partitions_to_txn import INTERNAL_TOPICS
from broker.apis.authorize import filter_allowed
from broker.replica.replica_manager import DeleteRecordsResult, TopicPartition
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request
    from broker.replica.delayed_result import Completion

API_KEY = 21  # DeleteRecords
VERSIONS = range(0, 3)

TopicResult = DeleteRecordsResponse.DeleteRecordsTopicResult
PartitionResult = TopicResult.DeleteRecordsPartitionResult


def handle(ctx: ApiContext, request: Request) -> Completion[DeleteRecordsResponse]:
    req = request.body
    # A partition named twice is deleted once, to its last offset (Kafka keys them in a map).
    offsets: dict[TopicPartition, int] = {}
    for t in req.topics:
        for p in t.partitions:
            offsets[(t.name, p.partition_index)] = p.offset
    refused: dict[TopicPartition, DeleteRecordsResult] = {}
    if ctx.authorizer.enabled:
        deletable = filter_allowed(ctx, request, AclOperation.DELETE, ResourceType.TOPIC,
                                   (t.name for t in req.topics))
        refused = {tp: DeleteRecordsResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                   for tp in offsets if tp[0] not in deletable}
    refused.update({tp: DeleteRecordsResult(ErrorCode.INVALID_TOPIC_EXCEPTION)
                    for tp in offsets if tp not in refused
                    and tp[0] in INTERNAL_TOPICS and tp in ctx.replica_manager.partitions})
    deleted = ctx.replica_manager.delete_records(
        {tp: o for tp, o in offsets.items() if tp not in refused}, req.timeout_ms)
    return deleted.then(lambda results: _response(offsets, {**results, **refused}))


def _response(offsets: dict[TopicPartition, int],
              results: dict[TopicPartition, DeleteRecordsResult]) -> DeleteRecordsResponse:
    by_topic: dict[str, list[PartitionResult]] = {}
    for tp in offsets:
        r = results[tp]
        by_topic.setdefault(tp[0], []).append(PartitionResult(
            partition_index=tp[1], low_watermark=r.low_watermark, error_code=r.error))
    return DeleteRecordsResponse(
        throttle_time_ms=0,
        topics=[TopicResult(name=name, partitions=parts) for name, parts in by_topic.items()])
