"""OffsetDelete (key 47): drop a group's committed offsets for topics it no longer reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import OffsetDeleteResponse

from broker.apis.deferred import answer_later
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

Topic = OffsetDeleteResponse.OffsetDeleteResponseTopic
Partition = Topic.OffsetDeleteResponsePartition
Result = tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    wanted = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
    result = ctx.groups.delete_offsets(req.group_id, wanted)
    if isinstance(result, tuple):
        return _response(result)
    return answer_later(result, _response)


def _response(result: Result) -> OffsetDeleteResponse:
    error, parts = result
    topics: dict[str, list[Partition]] = {}
    for (t, p), e in parts.items():
        topics.setdefault(t, []).append(Partition(partition_index=p, error_code=e))
    return OffsetDeleteResponse(error_code=error, throttle_time_ms=0,
                                topics=[Topic(name=t, partitions=ps) for t, ps in topics.items()])
