"""LeaveGroup (key 13): one member (v0-v2) or a batch of members (v3+) leave at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import LeaveGroupResponse

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request


def handle(ctx: ApiContext, request: Request) -> LeaveGroupResponse:
    req = request.body
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
