"""Heartbeat (key 12): keeps a member's session; tells it when a rebalance has begun.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED; the session is not kept).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import HeartbeatResponse

from broker.apis.authorize import allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 12  # Heartbeat
VERSIONS = range(0, 5)


def handle(ctx: ApiContext, request: Request) -> HeartbeatResponse:
    req = request.body
    if not allowed(ctx, request, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return HeartbeatResponse(throttle_time_ms=0,
                                 error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    error = ctx.groups.heartbeat(
        req.group_id, req.member_id, getattr(req, "group_instance_id", None), req.generation_id)
    return HeartbeatResponse(throttle_time_ms=0, error_code=error)
