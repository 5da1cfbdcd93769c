"""LeaveGroup (key 13): one member (v0-v2) or a batch of members (v3+) leave at once.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED, no member removed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import LeaveGroupResponse

from broker.apis.authorize import allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 13  # LeaveGroup
VERSIONS = range(0, 6)


def handle(ctx: ApiContext, request: Request) -> LeaveGroupResponse:
    req = request.body
    if not allowed(ctx, request, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return LeaveGroupResponse(throttle_time_ms=0,
                                  error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, members=[])
    if request.version >= 3:
        members = [(m.member_id, m.group_instance_id) for m in req.members]
    else:
        members = [(req.member_id, None)]
    error, results = ctx.groups.leave_group(req.group_id, members)
    if request.version < 3:
        return LeaveGroupResponse(throttle_time_ms=0, error_code=results[0])
    return LeaveGroupResponse(
        throttle_time_ms=0, error_code=error,
        members=[LeaveGroupResponse.MemberResponse(member_id=m, group_instance_id=i, error_code=e)
                 for (m, i), e in zip(members, results, strict=True)],
    )
