"""ListGroups (key 16): every group, filtered by state (v4+) and type (v5+).

A group of the consumer protocol is listed with type "consumer", protocol type "consumer" and
its own states (Empty, Assigning, Reconciling, Stable); a classic group with type "classic".

With DESCRIBE on the cluster every group is listed; without it only the groups the principal
may DESCRIBE (no error either way), as Kafka does. In cluster mode the groups are those of
the partitions this broker coordinates, with COORDINATOR_LOAD_IN_PROGRESS while one of them is
being loaded (Kafka's handleListGroups).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import ListGroupsResponse

from broker.apis.authorize import allowed, cluster_allowed
from broker.group.consumer_group import ConsumerGroup
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 16  # ListGroups
VERSIONS = range(0, 6)


def handle(ctx: ApiContext, request: Request) -> ListGroupsResponse:
    req = request.body
    states = {s.lower() for s in getattr(req, "states_filter", None) or []}
    types = {t.lower() for t in getattr(req, "types_filter", None) or []}
    groups = []
    for g in ctx.groups.list_groups():
        if isinstance(g, ConsumerGroup):
            protocol_type, group_type = "consumer", "consumer"
        else:
            protocol_type, group_type = g.protocol_type or "", "classic"
        if (states and g.state.value.lower() not in states) or (types and group_type not in types):
            continue
        groups.append(ListGroupsResponse.ListedGroup(
            group_id=g.group_id, protocol_type=protocol_type, group_state=g.state.value,
            group_type=group_type))
    if ctx.authorizer.enabled and not cluster_allowed(ctx, request, AclOperation.DESCRIBE,
                                                      log_if_denied=False):
        groups = [g for g in groups if allowed(ctx, request, AclOperation.DESCRIBE,
                                               ResourceType.GROUP, g.group_id,
                                               log_if_denied=False)]
    ownership = ctx.groups.ownership
    loading = ownership is not None and bool(ownership.loading)
    error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if loading else ErrorCode.NONE
    return ListGroupsResponse(throttle_time_ms=0, error_code=error, groups=groups)
