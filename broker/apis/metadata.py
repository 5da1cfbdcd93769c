"""Metadata (key 3): brokers, topics and partition leaders, with topic auto-creation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import MetadataResponse

from broker.acl import ResourceType, authorized_operations
from broker.metadata import TopicInfo
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

Topic = MetadataResponse.MetadataResponseTopic
PartitionMeta = Topic.MetadataResponsePartition


def handle(ctx: ApiContext, request: Request) -> MetadataResponse:
    req = request.body
    store = ctx.topics.metadata
    topics: list[Topic] = []
    if req.topics is None or (request.version == 0 and not req.topics):
        wanted = list(store.topics.values())
        topics = [_describe(ctx, t) for t in wanted]
    else:
        allow_create = req.allow_auto_topic_creation if request.version >= 4 else True
        for t in req.topics:
            topics.append(_lookup(ctx, t.name, getattr(t, "topic_id", None), allow_create))
    topic_ops = authorized_operations(
        ResourceType.TOPIC, getattr(req, "include_topic_authorized_operations", False))
    for topic in topics:
        if topic.error_code == ErrorCode.NONE:
            topic.authorized_operations = topic_ops
    host, port = (ctx.node.host, ctx.node.port)
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponse.MetadataResponseBroker(node_id=ctx.node.node_id, host=host,
                                                         port=port, rack=None)],
        cluster_id=store.cluster_id,
        controller_id=ctx.node.node_id,
        topics=topics,
        authorized_operations=authorized_operations(
            ResourceType.CLUSTER, getattr(req, "include_cluster_authorized_operations", False)),
    )


def _lookup(ctx: ApiContext, name: str | None, topic_id: object, allow_create: bool) -> Topic:
    store = ctx.topics.metadata
    if name is None:
        info = store.by_id.get(topic_id)  # type: ignore[arg-type]
        if info is None:
            return _error(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id)
        return _describe(ctx, info)
    info = store.topics.get(name)
    if info is None:
        if not allow_create:
            return _error(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        try:
            info = ctx.topics.auto_create(name)
        except KafkaError as exc:
            return _error(name, exc.error_code)
        if info is None:
            return _error(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        # Kafka answers LEADER_NOT_AVAILABLE right after creation; our leader exists at once.
    return _describe(ctx, info)


def _describe(ctx: ApiContext, info: TopicInfo) -> Topic:
    node = ctx.node.node_id
    parts = [
        PartitionMeta(error_code=0, partition_index=i, leader_id=node, leader_epoch=0,
                      replica_nodes=[node], isr_nodes=[node], offline_replicas=[])
        for i in range(info.partitions)
    ]
    internal = info.name.startswith("__")  # __consumer_offsets
    return Topic(error_code=0, name=info.name, topic_id=info.topic_id, is_internal=internal,
                 partitions=parts, authorized_operations=None)


def _error(name: str | None, code: ErrorCode, topic_id: object = None) -> Topic:
    return Topic(error_code=code, name=name, topic_id=topic_id, is_internal=False,
                 partitions=[], authorized_operations=None)
