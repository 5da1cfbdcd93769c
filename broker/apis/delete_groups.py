"""DeleteGroups (key 42): only empty groups; their offsets and metadata get tombstones.

Each group needs DELETE (GROUP_AUTHORIZATION_FAILED after the others, nothing deleted); a
group named twice is answered once, as Kafka answers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DeleteGroupsResponse

from broker.apis.authorize import filter_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 42  # DeleteGroups
VERSIONS = range(0, 3)


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    names = list(request.body.groups_names)
    denied: dict[str, ErrorCode] = {}
    if ctx.authorizer.enabled:
        names = list(dict.fromkeys(names))
        deletable = filter_allowed(ctx, request, AclOperation.DELETE, ResourceType.GROUP, names)
        denied = {g: ErrorCode.GROUP_AUTHORIZATION_FAILED for g in names if g not in deletable}
        names = [g for g in names if g in deletable]
        if not names:
            return _response(denied)
    result = ctx.groups.delete_groups(names)
    return result.then(lambda r: _response({**r, **denied}))


def _response(results: dict[str, ErrorCode]) -> DeleteGroupsResponse:
    return DeleteGroupsResponse(
        throttle_time_ms=0,
        results=[DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=e)
                 for g, e in results.items()])
