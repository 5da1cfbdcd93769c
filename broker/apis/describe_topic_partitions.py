"""DescribeTopicPartitions (key 75): topics and their partitions a page at a time (KIP-966).

The Java Admin's describeTopics asks this instead of Metadata, so a topic of many partitions
never needs one huge answer. As Kafka's handler: the named topics (or, with none named, every
topic), sorted, from the cursor's topic and partition on, until ``response_partition_limit``
partitions (at most Kafka's max.request.partition.size.limit default, at least 1) are
answered; ``next_cursor`` then says where the next page starts, possibly at a topic that does
not exist. A named unknown topic answers UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION
for an illegal name); a cursor whose topic is not among the named ones, or whose partition is
negative, makes the whole request INVALID_REQUEST. Partitions read as Metadata reads them
(this broker leads each, alone in its ISR); every topic carries the principal's authorized
operations, which this version always answers. With ACLs on, only topics the principal may
DESCRIBE are paged; a named one it may not answers TOPIC_AUTHORIZATION_FAILED after the page,
without its id or operations, as Kafka's handler does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from kafka.protocol.admin import DescribeTopicPartitionsResponse

from broker.apis.add_partitions_to_txn import INTERNAL_TOPICS
from broker.apis.authorize import allowed, authorized_ops, bitfield
from broker.metadata.file_store import TopicInfo, validate_topic_name
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 75  # DescribeTopicPartitions
VERSIONS = range(0, 1)

logger = structlog.get_logger("broker.apis")

Topic = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic
PartitionMeta = Topic.DescribeTopicPartitionsResponsePartition
Cursor = DescribeTopicPartitionsResponse.Cursor

#: Kafka's max.request.partition.size.limit default: the most partitions one answer holds.
MAX_REQUEST_PARTITION_SIZE_LIMIT = 2000


def handle(ctx: ApiContext, request: Request) -> DescribeTopicPartitionsResponse:
    req = request.body
    store = ctx.topics.metadata
    cursor = req.cursor
    after = cursor.topic_name if cursor is not None else ""
    fetch_all = not req.topics
    if fetch_all:
        names = {name for name in store.topics if name >= after}
    else:
        names = {t.name for t in req.topics if t.name >= after}
        if cursor is not None and cursor.topic_name not in names:
            return _refused(req, "the topic list should contain the cursor topic")
    if cursor is not None and cursor.partition_index < 0:
        return _refused(req, "the cursor partition must not be negative")
    limit = max(min(MAX_REQUEST_PARTITION_SIZE_LIMIT, req.response_partition_limit), 1)
    refused: list[Topic] = []
    if ctx.authorizer.enabled:
        described = {n for n in names
                     if allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC, n)}
        if not fetch_all:
            refused = [Topic(error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=n,
                             topic_id=None, is_internal=False, partitions=[])
                       for n in sorted(names - described)]
        names = described

    def ops(name: str) -> int:
        return bitfield(authorized_ops(ctx, request, ResourceType.TOPIC, name, True))

    topics: list[Topic] = []
    next_cursor: Cursor | None = None
    remaining = limit
    for name in sorted(names):
        if remaining == 0:
            # The page ended with a whole topic: the next one starts the next page.
            next_cursor = Cursor(topic_name=name, partition_index=0)
            break
        info = store.topics.get(name)
        if info is None:
            if not fetch_all:
                topics.append(_unknown(name, ops(name)))
            continue
        start = cursor.partition_index if cursor is not None and name == after else 0
        end = min(info.partitions, start + remaining)
        topics.append(_describe(ctx, info, range(start, end), ops(name)))
        if end < info.partitions:
            next_cursor = Cursor(topic_name=name, partition_index=end)
            break
        remaining -= max(end - start, 0)
    return DescribeTopicPartitionsResponse(throttle_time_ms=0, topics=topics + refused,
                                           next_cursor=next_cursor)


def _describe(ctx: ApiContext, info: TopicInfo, indexes: range, ops: int) -> Topic:
    node = ctx.node.node_id
    partitions = ctx.replica_manager.partitions
    parts = []
    for i in indexes:
        p = partitions.get((info.name, i))
        parts.append(PartitionMeta(
            error_code=ErrorCode.NONE, partition_index=i, leader_id=node,
            leader_epoch=p.leader_epoch if p is not None else 0, replica_nodes=[node],
            isr_nodes=[node], eligible_leader_replicas=[], last_known_elr=[],
            offline_replicas=[]))
    return Topic(error_code=ErrorCode.NONE, name=info.name, topic_id=info.topic_id,
                 is_internal=info.name in INTERNAL_TOPICS, partitions=parts,
                 topic_authorized_operations=ops)


def _unknown(name: str, ops: int) -> Topic:
    try:
        validate_topic_name(name)
        error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    except KafkaError as exc:
        error = ErrorCode(exc.error_code)
    return Topic(error_code=error, name=name, topic_id=None, is_internal=name in INTERNAL_TOPICS,
                 partitions=[], topic_authorized_operations=ops)


def _refused(req: Any, reason: str) -> DescribeTopicPartitionsResponse:
    """Kafka's error response for a request refused whole: each named topic, no partitions
    (the reason reaches only the broker's log, as the answer has no message field)."""
    logger.info("describe topic partitions refused", reason=reason,
             cursor=(req.cursor.topic_name, req.cursor.partition_index))
    topics = [Topic(error_code=ErrorCode.INVALID_REQUEST, name=t.name, topic_id=None,
                    is_internal=False, partitions=[]) for t in req.topics]
    return DescribeTopicPartitionsResponse(throttle_time_ms=0, topics=topics, next_cursor=None)
