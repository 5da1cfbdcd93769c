"""ListGroups (key 16): every group, filtered by state (v4+) and type (v5+).

With DESCRIBE on the cluster every group is listed; without it only the groups the principal
may DESCRIBE (no error either way), as Kafka does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import ListGroupsResponse

from broker.acl import AclOperation, ResourceType
from broker.apis.authorize import allowed, cluster_allowed

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
    if ctx.authorizer.enabled and not cluster_allowed(ctx, request, AclOperation.DESCRIBE,
                                                      log_if_denied=False):
        groups = [g for g in groups if allowed(ctx, request, AclOperation.DESCRIBE,
                                               ResourceType.GROUP, g.group_id,
                                               log_if_denied=False)]
    return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=groups)
