"""DescribeGroups (key 15): state, protocol and members; an unknown group is Dead."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeGroupsResponse

from broker.acl import ResourceType, authorized_operations
from broker.group.metadata import GroupState

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

Described = DescribeGroupsResponse.DescribedGroup
Member = Described.DescribedGroupMember


def handle(ctx: ApiContext, request: Request) -> DescribeGroupsResponse:
    groups = []
    ops = authorized_operations(ResourceType.GROUP,
                                getattr(request.body, "include_authorized_operations", False))
    for gid in request.body.groups:
        g = ctx.groups.groups.get(gid)
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
