"""ConsumerGroupHeartbeat (key 68, v0-1): the consumer group protocol's one request (KIP-848).

Join (epoch 0), heartbeat, leave (-1, or -2 for a static member coming back); the answer
carries the member's epoch and, when it changed, its assignment (broker/group/
consumer_coordinator.py). From v1 the client chooses its member id (KIP-1082); an empty one is
still given a new id, as v0 members are.

As Kafka's handler: UNSUPPORTED_VERSION unless group.coordinator.rebalance.protocols lists
"consumer"; READ on the group (GROUP_AUTHORIZATION_FAILED); DESCRIBE on every subscribed topic
named (TOPIC_AUTHORIZATION_FAILED if any is refused); a regex resolves only to topics the
principal may DESCRIBE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.apis.authorize import allowed, filter_allowed
from broker.group.consumer_coordinator import HeartbeatRequest, HeartbeatResult
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode
from protocol.messages import ConsumerGroupHeartbeatResponse

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.group.consumer_member import Partitions
    from broker.network.request import Request

API_KEY = 68  # ConsumerGroupHeartbeat
VERSIONS = range(0, 2)

Response = ConsumerGroupHeartbeatResponse
Assignment = Response.Assignment


def handle(ctx: ApiContext, request: Request) -> ConsumerGroupHeartbeatResponse:
    req = request.body
    if not ctx.groups.consumer.config.enabled:
        return _response(HeartbeatResult(ErrorCode.UNSUPPORTED_VERSION,
                                         "The consumer group protocol is not enabled."))
    if not allowed(ctx, request, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return _response(HeartbeatResult(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    names = req.subscribed_topic_names
    if ctx.authorizer.enabled and names:
        wanted = set(names)
        if len(filter_allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC,
                              wanted)) < len(wanted):
            return _response(HeartbeatResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED))
    owned = None
    if req.topic_partitions is not None:
        owned = [(t.topic_id, list(t.partitions)) for t in req.topic_partitions]
    result = ctx.groups.consumer_group_heartbeat(HeartbeatRequest(
        group_id=req.group_id, member_id=req.member_id or "", member_epoch=req.member_epoch,
        instance_id=req.instance_id, rack_id=req.rack_id,
        rebalance_timeout_ms=req.rebalance_timeout_ms, subscribed_topic_names=names,
        subscribed_topic_regex=getattr(req, "subscribed_topic_regex", None),
        server_assignor=req.server_assignor, owned=owned,
        client_id=request.header.client_id or "",
        # Kafka reports InetAddress.toString() of the client: "/127.0.0.1".
        client_host="/" + request.connection.peer.rpartition(":")[0],
        topic_allowed=lambda name: allowed(ctx, request, AclOperation.DESCRIBE,
                                           ResourceType.TOPIC, name, log_if_denied=False)))
    return _response(result)


def _response(r: HeartbeatResult) -> ConsumerGroupHeartbeatResponse:
    return Response(throttle_time_ms=0, error_code=r.error, error_message=r.message,
                    member_id=r.member_id, member_epoch=r.member_epoch,
                    heartbeat_interval_ms=r.heartbeat_interval_ms,
                    assignment=None if r.assignment is None else _assignment(r.assignment))


def _assignment(partitions: Partitions) -> Assignment:
    return Assignment(topic_partitions=[
        Assignment.TopicPartitions(topic_id=topic_id, partitions=sorted(parts))
        for topic_id, parts in sorted(partitions.items(), key=lambda kv: str(kv[0]))])
