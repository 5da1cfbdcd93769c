"""Metadata (key 3): brokers, topics and partition leaders, with topic auto-creation.

Authorization as Kafka's KafkaApis: the all-topics form lists only topics the principal may
DESCRIBE; a named topic it may not describe answers TOPIC_AUTHORIZATION_FAILED without
revealing whether it exists (no topic id; by id, the id but no name); a missing topic is
auto-created only with CREATE on the cluster or on the topic, else TOPIC_AUTHORIZATION_FAILED.
Authorized-operations fields (v8+) are the principal's, the cluster's only through v10. The
broker answered is this listener's advertised endpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import MetadataResponse

from broker.apis.add_partitions_to_txn import INTERNAL_TOPICS
from broker.apis.authorize import allowed, authorized_ops, cluster_allowed, cluster_ops
from broker.metadata.file_store import TopicInfo
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 3  # Metadata
VERSIONS = range(0, 13)

Topic = MetadataResponse.MetadataResponseTopic
PartitionMeta = Topic.MetadataResponsePartition
DESCRIBE, TOPIC = AclOperation.DESCRIBE, ResourceType.TOPIC


def handle(ctx: ApiContext, request: Request) -> MetadataResponse:
    req = request.body
    version = request.version
    store = ctx.topics.metadata
    on = ctx.authorizer.enabled
    if req.topics is None or (version == 0 and not req.topics):
        topics = [_describe(ctx, t) for t in list(store.topics.values())
                  if not on or allowed(ctx, request, DESCRIBE, TOPIC, t.name,
                                       log_if_denied=False)]
    else:
        allow_create = req.allow_auto_topic_creation if version >= 4 else True
        topics = _requested(ctx, request, req.topics, allow_create)
    if version >= 8 and getattr(req, "include_topic_authorized_operations", False):
        for topic in topics:
            if topic.name is not None and topic.error_code != ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                topic.authorized_operations = authorized_ops(ctx, request, TOPIC, topic.name,
                                                             True)
    host, port = ctx.node.address(request.connection.session.listener)
    cluster_asked = 8 <= version <= 10 and bool(
        getattr(req, "include_cluster_authorized_operations", False))
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponse.MetadataResponseBroker(node_id=ctx.node.node_id, host=host,
                                                         port=port, rack=None)],
        cluster_id=store.cluster_id,
        controller_id=ctx.node.node_id,
        topics=topics,
        authorized_operations=cluster_ops(ctx, request, cluster_asked),
    )


def _requested(ctx: ApiContext, request: Request, wanted: list, allow_create: bool
               ) -> list[Topic]:
    """The named topics (or ids) in Kafka's answer order: unknown ids, the described topics,
    those refused creation, those refused description."""
    store = ctx.topics.metadata
    on = ctx.authorizer.enabled
    unknown_ids: list[Topic] = []
    described: list[Topic] = []
    refused_create: list[Topic] = []
    refused_describe: list[Topic] = []
    seen: set[object] = set()
    may_create: bool | None = None  # CREATE on the cluster, asked once when first needed
    for t in wanted:
        name, topic_id = t.name, getattr(t, "topic_id", None)
        key = name if name is not None else topic_id
        if key in seen:
            continue  # Kafka answers a topic named twice once
        seen.add(key)
        if name is None:
            info = store.by_id.get(topic_id)  # type: ignore[arg-type]
            if info is None:
                unknown_ids.append(_error(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id))
            elif on and not allowed(ctx, request, DESCRIBE, TOPIC, info.name):
                # Topic ids are not secret: the id comes back, the name does not.
                refused_describe.append(_error(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                               topic_id))
            else:
                described.append(_describe(ctx, info))
            continue
        if on and not allowed(ctx, request, DESCRIBE, TOPIC, name):
            refused_describe.append(_error(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            continue
        info = store.topics.get(name)
        if info is None:
            if on and allow_create and ctx.config["auto.create.topics.enable"]:
                if may_create is None:
                    may_create = cluster_allowed(ctx, request, AclOperation.CREATE,
                                                 log_if_denied=False)
                if not may_create and not allowed(ctx, request, AclOperation.CREATE, TOPIC,
                                                  name):
                    refused_create.append(_error(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                 internal=name in INTERNAL_TOPICS))
                    continue
            described.append(_lookup(ctx, name, allow_create))
            continue
        described.append(_describe(ctx, info))
    return unknown_ids + described + refused_create + refused_describe


def _lookup(ctx: ApiContext, name: str, allow_create: bool) -> Topic:
    """A topic not in the metadata: auto-created when allowed, else UNKNOWN_TOPIC_OR_PARTITION."""
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


def _error(name: str | None, code: ErrorCode, topic_id: object = None,
           internal: bool = False) -> Topic:
    return Topic(error_code=code, name=name, topic_id=topic_id, is_internal=internal,
                 partitions=[], authorized_operations=None)
