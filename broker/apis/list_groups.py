"""ListGroups (key 16): every group, filtered by state (v4+) and type (v5+)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import ListGroupsResponse

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request


def handle(ctx: ApiContext, request: Request) -> ListGroupsResponse:
    req = request.body
    states = {s.lower() for s in getattr(req, "states_filter", None) or []}
    types = {t.lower() for t in getattr(req, "types_filter", None) or []}
    groups = [
        ListGroupsResponse.ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type or "",
                                       group_state=g.state.value, group_type="classic")
        for g in ctx.groups.list_groups()
        if (not states or g.state.value.lower() in states) and (not types or "classic" in types)
    ]
    return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=groups)
