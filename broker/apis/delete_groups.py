"""DeleteGroups (key 42): only empty groups; their offsets and metadata get tombstones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DeleteGroupsResponse

from broker.apis.deferred import answer_later
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    result = ctx.groups.delete_groups(list(request.body.groups_names))
    if isinstance(result, dict):
        return _response(result)
    return answer_later(result, _response)


def _response(results: dict[str, ErrorCode]) -> DeleteGroupsResponse:
    return DeleteGroupsResponse(
        throttle_time_ms=0,
        results=[DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=e)
                 for g, e in results.items()])
