"""DescribeGroups (key 15): state, protocol and members; an unknown group is Dead.

A group of the consumer protocol is not a classic group: it is answered Dead too, as Kafka
answers it (ConsumerGroupDescribe describes it).

Each group needs DESCRIBE (GROUP_AUTHORIZATION_FAILED, listed first as Kafka lists them);
its authorized operations (v3+, when asked) are the principal's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeGroupsResponse

from broker.apis.authorize import allowed, authorized_ops
from broker.group.classic_group import GroupState
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 15  # DescribeGroups
VERSIONS = range(0, 6)

Described = DescribeGroupsResponse.DescribedGroup
Member = Described.DescribedGroupMember


def handle(ctx: ApiContext, request: Request) -> DescribeGroupsResponse:
    groups = []
    asked = request.version >= 3 and bool(
        getattr(request.body, "include_authorized_operations", False))
    wanted = list(request.body.groups)
    if ctx.authorizer.enabled:
        described = []
        for gid in wanted:
            if allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.GROUP, gid):
                described.append(gid)
            else:
                groups.append(Described(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                        group_id=gid, group_state="", protocol_type="",
                                        protocol_data="", members=[]))
        wanted = described
    for gid in wanted:
        ops = authorized_ops(ctx, request, ResourceType.GROUP, gid, asked)
        if (moved := ctx.groups.coordinator_error(gid)) is not None:
            groups.append(Described(error_code=moved, group_id=gid, group_state="",
                                    protocol_type="", protocol_data="", members=[],
                                    authorized_operations=ops))
            continue
        g = ctx.groups.groups.get_classic(gid)
        if g is None:
            groups.append(Described(error_code=0, group_id=gid, group_state="Dead",
                                    protocol_type="", protocol_data="", members=[],
                                    authorized_operations=ops))
            continue
        stable = g.state == GroupState.STABLE
        members = [
            Member(member_id=m.member_id, group_instance_id=m.group_instance_id,
                   client_id=m.client_id, client_host=m.client_host,
                   member_metadata=m.metadata_for(g.protocol_name)
                   if stable and g.protocol_name else b"",
                   member_assignment=m.assignment if stable else b"")
            for m in g.members.values()
        ]
        groups.append(Described(error_code=0, group_id=gid, group_state=g.state.value,
                                protocol_type=g.protocol_type or "",
                                protocol_data=(g.protocol_name or "") if stable else "",
                                members=members, authorized_operations=ops))
    return DescribeGroupsResponse(throttle_time_ms=0, groups=groups)
