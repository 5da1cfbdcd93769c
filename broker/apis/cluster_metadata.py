"""Metadata and DescribeCluster in cluster mode: answered from the cluster's metadata cache
(the partition-state watcher's topics and this broker's liveness view), as Kafka's
ZooKeeper-era brokers answered from the MetadataCache UpdateMetadata filled.

Every live broker is listed with its advertised endpoint of the listener the request came on
(a broker without that listener is left out, as Kafka's getAliveBrokerNodes does). A
partition whose leader is -1, or not live now, answers LEADER_NOT_AVAILABLE with leader -1;
one with a replica on a broker not live answers REPLICA_NOT_AVAILABLE (Kafka's
getPartitionMetadata), with its offline replicas.

An unknown topic is auto-created as Kafka does (``auto.create.topics.enable`` and the
request's allow_auto_topic_creation from v4, CREATE on the cluster or the topic when ACLs are
on): the controller creates it (``ClusterNode.auto_create_topic``) and the topic answers
LEADER_NOT_AVAILABLE until the cache has it, or at once the error Kafka's placement gives
(INVALID_REPLICATION_FACTOR with too few brokers, INVALID_TOPIC_EXCEPTION for a bad name).
The internal topics are left to their coordinators.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.metadata import MetadataResponse

from broker.apis.add_partitions_to_txn import INTERNAL_TOPICS
from broker.apis.authorize import allowed, authorized_ops, cluster_allowed, cluster_ops
from broker.cluster.broker_node import ClusterNode, topic_id_text, topic_uuid
from broker.cluster.metadata_cache import TopicMetadata
from broker.cluster.topic_state import topic_name_problem
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode
from protocol.templates import MetadataTopics, PackedMetadataResponse

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

Topic = MetadataResponse.MetadataResponseTopic
PartitionMeta = Topic.MetadataResponsePartition
Broker = MetadataResponse.MetadataResponseBroker
DESCRIBE, TOPIC = AclOperation.DESCRIBE, ResourceType.TOPIC


def metadata(ctx: ApiContext, request: Request, cluster: ClusterNode) -> PackedMetadataResponse:
    req = request.body
    version = request.version
    cache = cluster.cache
    on = ctx.authorizer.enabled
    ops = version >= 8 and bool(getattr(req, "include_topic_authorized_operations", False))
    topics: list[Any] = []
    if req.topics is None or (version == 0 and not req.topics):
        for t in cache.topics():
            if not on or allowed(ctx, request, DESCRIBE, TOPIC, t.name, log_if_denied=False):
                topics.append(_topic(ctx, request, cluster, t, ops))
    else:
        seen: set[object] = set()
        for wanted in req.topics:
            name, topic_id = wanted.name, getattr(wanted, "topic_id", None)
            key = name if name is not None else topic_id
            if key in seen:
                continue  # Kafka answers a topic named twice once
            seen.add(key)
            topics.append(_requested(ctx, request, cluster, name, topic_id, ops,
                                     _may_auto_create(ctx, request)))
    listener = request.connection.session.listener
    brokers = [Broker(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack)
               for b in cache.live_brokers(listener)]
    cluster_asked = 8 <= version <= 10 and bool(
        getattr(req, "include_cluster_authorized_operations", False))
    return PackedMetadataResponse({
        "throttle_time_ms": 0,
        "brokers": brokers,
        "cluster_id": cluster.cluster_id,
        "controller_id": cluster.controller_id,
        "authorized_operations": cluster_ops(ctx, request, cluster_asked),
    }, [MetadataTopics(topics)])


def _may_auto_create(ctx: ApiContext, request: Request) -> bool:
    """Kafka's allowAutoTopicCreation: the broker's key and the request's flag (v4+)."""
    if not ctx.config["auto.create.topics.enable"]:
        return False
    return request.version < 4 or bool(request.body.allow_auto_topic_creation)


def _requested(ctx: ApiContext, request: Request, cluster: ClusterNode, name: str | None,
               topic_id: Any, ops: bool, auto_create: bool) -> Any:
    cache = cluster.cache
    on = ctx.authorizer.enabled
    if name is None:
        found = cache.topic_name_of(topic_id_text(topic_id)) if topic_id is not None else None
        t = cache.topic(found) if found is not None else None
        if t is None:
            return _error(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id)
        if on and not allowed(ctx, request, DESCRIBE, TOPIC, t.name):
            return _error(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic_id)
        return _topic(ctx, request, cluster, t, ops)
    if on and not allowed(ctx, request, DESCRIBE, TOPIC, name):
        return _error(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    t = cache.topic(name)
    if t is None:
        return _unknown(ctx, request, cluster, name, auto_create)
    return _topic(ctx, request, cluster, t, ops)


def _unknown(ctx: ApiContext, request: Request, cluster: ClusterNode, name: str,
             auto_create: bool) -> Any:
    """A name the cluster has no topic of: created if allowed (Kafka's
    AutoTopicCreationManager), else UNKNOWN_TOPIC_OR_PARTITION (INVALID_TOPIC_EXCEPTION for a
    name no topic can have)."""
    if not auto_create or name in INTERNAL_TOPICS:
        invalid = topic_name_problem(name) is not None
        return _error(name, ErrorCode.INVALID_TOPIC_EXCEPTION if invalid
                      else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    if ctx.authorizer.enabled and not (
            cluster_allowed(ctx, request, AclOperation.CREATE, log_if_denied=False)
            or allowed(ctx, request, AclOperation.CREATE, TOPIC, name)):
        return _error(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    return _error(name, cluster.auto_create_topic(name, ctx.config["num.partitions"],
                                                  ctx.config["default.replication.factor"]))


def _topic(ctx: ApiContext, request: Request, cluster: ClusterNode, t: TopicMetadata,
           ops: bool) -> Any:
    live = cluster.view.live
    partitions = []
    for p in t.partitions.values():
        if not p.leader_available or p.leader not in live:
            error, leader = ErrorCode.LEADER_NOT_AVAILABLE, -1
        elif p.offline_replicas:
            error, leader = ErrorCode.REPLICA_NOT_AVAILABLE, p.leader
        else:
            error, leader = ErrorCode.NONE, p.leader
        partitions.append(PartitionMeta(
            error_code=error, partition_index=p.partition, leader_id=leader,
            leader_epoch=p.leader_epoch, replica_nodes=list(p.replicas),
            isr_nodes=list(p.isr), offline_replicas=list(p.offline_replicas)))
    return Topic(error_code=0, name=t.name, topic_id=topic_uuid(t.topic_id),
                 is_internal=t.name.startswith("__"), partitions=partitions,
                 authorized_operations=(authorized_ops(ctx, request, TOPIC, t.name, True)
                                        if ops else None))


def _error(name: str | None, code: ErrorCode, topic_id: Any = None) -> Any:
    return Topic(error_code=code, name=name, topic_id=topic_id, is_internal=False,
                 partitions=[], authorized_operations=None)
