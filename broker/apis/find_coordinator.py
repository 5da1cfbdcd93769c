"""FindCoordinator (key 10): the broker coordinating a group or a transactional id (v0-v3 one
key, v4+ a batch).

A single broker coordinates every key. A group key creates `__consumer_offsets` and a
transactional key `__transaction_state` on first use, as Kafka's auto topic creation does for
them; the topic is local here, so the answer names this node at once instead of a
COORDINATOR_NOT_AVAILABLE to retry.

In cluster mode the coordinator is the leader of the key's partition of the topic (the group
id's or transactional id's hash, as each coordinator computes it), with its endpoint on the
listener the request came in on. A topic the cluster does not have yet is created through the
controller (Kafka's createInternalTopic, its partitions from offsets.topic.num.partitions /
transaction.state.log.num.partitions, its replicas from offsets.topic.replication.factor /
transaction.state.log.replication.factor, not before that many brokers are alive); until the
key's partition has a live leader the answer is COORDINATOR_NOT_AVAILABLE, which clients retry.

Key types other than group (0) and transaction (1) are an INVALID_REQUEST (no share coordinator
is served). With ACLs on, each key needs DESCRIBE on its group (GROUP_AUTHORIZATION_FAILED) or
transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), checked first, as Kafka's
getCoordinator does. Before v4 an error carries Kafka's message for it; v4+ none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import FindCoordinatorResponse

from broker.apis.authorize import MESSAGES, allowed
from broker.group.offsets_store import TOPIC as OFFSETS_TOPIC
from broker.security.acl import AclOperation, ResourceType
from broker.txn.state_log import TOPIC as TRANSACTION_TOPIC
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 10  # FindCoordinator
VERSIONS = range(0, 6)

GROUP = 0
TRANSACTION = 1
NOT_AVAILABLE_MESSAGE = "The coordinator is not available."  # Kafka's Errors message

#: The coordinator found: (node id, host, port).
Endpoint = tuple[int, str, int]
NO_NODE: Endpoint = (-1, "", -1)


def handle(ctx: ApiContext, request: Request) -> FindCoordinatorResponse:
    req = request.body
    key_type = getattr(req, "key_type", GROUP)
    if request.version >= 4:
        coordinators = []
        for key in req.coordinator_keys:
            error, message, (node, host, port) = _coordinator(ctx, request, key_type, key)
            coordinators.append(FindCoordinatorResponse.Coordinator(
                key=key, node_id=node, host=host, port=port, error_code=error,
                error_message=message))
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    error, message, (node, host, port) = _coordinator(ctx, request, key_type, req.key)
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=error, error_message=message,
                                   node_id=node, host=host, port=port)


def _denied(ctx: ApiContext, request: Request, key_type: int, key: str) -> ErrorCode | None:
    if key_type == GROUP and not allowed(ctx, request, AclOperation.DESCRIBE,
                                         ResourceType.GROUP, key):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    if key_type == TRANSACTION and not allowed(ctx, request, AclOperation.DESCRIBE,
                                               ResourceType.TRANSACTIONAL_ID, key):
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return None


def _coordinator(ctx: ApiContext, request: Request, key_type: int, key: str
                 ) -> tuple[ErrorCode, str | None, Endpoint]:
    if ctx.authorizer.enabled and (denied := _denied(ctx, request, key_type, key)) is not None:
        # Before v4 Kafka's error response carries the error's own message; v4+ none.
        return denied, MESSAGES[denied] if request.version < 4 else None, NO_NODE
    if key_type not in (GROUP, TRANSACTION):
        return ErrorCode.INVALID_REQUEST, f"unknown coordinator type {key_type}", NO_NODE
    listener = request.connection.session.listener
    if ctx.cluster is not None:
        found = _cluster_coordinator(ctx, key_type, key, listener)
        if found is None:
            message = NOT_AVAILABLE_MESSAGE if request.version < 4 else None
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, message, NO_NODE
        return ErrorCode.NONE, None, found
    if key_type == GROUP:
        ctx.groups.store.ensure_topic()
    else:
        ctx.transactions.ensure_topic()
    return ErrorCode.NONE, None, (ctx.node.node_id, *ctx.node.address(listener))


def _cluster_coordinator(ctx: ApiContext, key_type: int, key: str, listener: str
                         ) -> Endpoint | None:
    """The live leader of the key's partition, on ``listener``; None when there is none yet
    (the topic is then created if the cluster lacks it)."""
    cluster = ctx.cluster
    assert cluster is not None
    cfg = ctx.config
    if key_type == GROUP:
        name, partitions = OFFSETS_TOPIC, cfg["offsets.topic.num.partitions"]
        replication_factor = cfg["offsets.topic.replication.factor"]
        configs = {"cleanup.policy": "compact",
                   "segment.bytes": str(cfg["offsets.topic.segment.bytes"])}
    else:
        name, partitions = TRANSACTION_TOPIC, cfg["transaction.state.log.num.partitions"]
        replication_factor = cfg["transaction.state.log.replication.factor"]
        configs = {"cleanup.policy": "compact", "compression.type": "uncompressed",
                   "min.insync.replicas": str(cfg["transaction.state.log.min.isr"]),
                   "segment.bytes": str(cfg["transaction.state.log.segment.bytes"])}
    topic = cluster.cache.topic(name)
    if topic is None:
        cluster.ensure_internal_topic(name, partitions, replication_factor, configs)
        return None
    if not topic.partitions:
        return None
    # Keys hash over the cluster topic's partitions, whatever this broker's config says.
    count = max(topic.partitions) + 1
    if key_type == GROUP:
        ctx.groups.store.num_partitions = count
        partition = ctx.groups.partition_for(key)
    else:
        ctx.transactions.state_log.num_partitions = count
        partition = ctx.transactions.partition_for(key)
    state = topic.partitions.get(partition)
    if state is None or not state.leader_available:
        return None
    leader = cluster.cache.broker(state.leader)
    endpoint = leader.endpoints.get(listener) if leader is not None else None
    if endpoint is None:
        return None
    return state.leader, endpoint[0], endpoint[1]
