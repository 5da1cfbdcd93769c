"""OffsetDelete (key 47): drop a group's committed offsets for topics it no longer reads.

Needs DELETE on the group (GROUP_AUTHORIZATION_FAILED, nothing deleted), then READ on each
topic (its partitions TOPIC_AUTHORIZATION_FAILED, the others deleted), as Kafka checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import OffsetDeleteResponse

from broker.apis.authorize import allowed, filter_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 47  # OffsetDelete
VERSIONS = range(0, 1)

Topic = OffsetDeleteResponse.OffsetDeleteResponseTopic
Partition = Topic.OffsetDeleteResponsePartition
Result = tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    wanted = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
    denied: dict[tuple[str, int], ErrorCode] = {}
    if ctx.authorizer.enabled:
        if not allowed(ctx, request, AclOperation.DELETE, ResourceType.GROUP, req.group_id):
            return _response((ErrorCode.GROUP_AUTHORIZATION_FAILED, {}))
        readable = filter_allowed(ctx, request, AclOperation.READ, ResourceType.TOPIC,
                                  (t.name for t in req.topics))
        denied = {tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED for tp in wanted
                  if tp[0] not in readable}
        wanted = [tp for tp in wanted if tp not in denied]
        if not wanted:
            return _response((ErrorCode.NONE, denied))
    result = ctx.groups.delete_offsets(req.group_id, wanted)
    return result.then(lambda r: _response(_merged(r, denied)))


def _merged(result: Result, denied: dict[tuple[str, int], ErrorCode]) -> Result:
    error, parts = result
    return (error, {**parts, **denied}) if denied else result


def _response(result: Result) -> OffsetDeleteResponse:
    error, parts = result
    topics: dict[str, list[Partition]] = {}
    for (t, p), e in parts.items():
        topics.setdefault(t, []).append(Partition(partition_index=p, error_code=e))
    return OffsetDeleteResponse(error_code=error, throttle_time_ms=0,
                                topics=[Topic(name=t, partitions=ps) for t, ps in topics.items()])
