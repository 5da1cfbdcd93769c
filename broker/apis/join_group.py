"""JoinGroup (key 11): join or rejoin a group; answered when the rebalance's join phase ends.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED, Kafka's error response, nothing joined).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import JoinGroupResponse

from broker.apis.authorize import allowed
from broker.group.classic_member import JoinResult
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 11  # JoinGroup
VERSIONS = range(0, 10)

Member = JoinGroupResponse.JoinGroupResponseMember


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    version = request.version
    if not allowed(ctx, request, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return _response(JoinResult(ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                    protocol_name="" if version < 7 else None))
    result = ctx.groups.join_group(
        req.group_id, req.member_id, getattr(req, "group_instance_id", None),
        require_known_id=version >= 4, client_id=request.header.client_id or "",
        # Kafka reports InetAddress.toString() of the client: "/127.0.0.1".
        client_host="/" + request.connection.peer.rpartition(":")[0],
        rebalance_timeout_ms=req.rebalance_timeout_ms if version >= 1 else -1,
        session_timeout_ms=req.session_timeout_ms, protocol_type=req.protocol_type,
        protocols=[(p.name, bytes(p.metadata)) for p in req.protocols],
    )
    return result.then(_response)


def _response(r: JoinResult) -> JoinGroupResponse:
    return JoinGroupResponse(
        throttle_time_ms=0, error_code=r.error, generation_id=r.generation_id,
        protocol_type=r.protocol_type, protocol_name=r.protocol_name, leader=r.leader_id,
        skip_assignment=False, member_id=r.member_id,
        members=[Member(member_id=m, group_instance_id=i, metadata=meta) for m, i, meta in
                 r.members],
    )
