"""OffsetCommit (key 8): committed offsets, answered once written to __consumer_offsets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import OffsetCommitResponse

from broker.apis.deferred import answer_later
from broker.group.metadata import OffsetAndMetadata
from broker.wallclock import now_ms
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

Topic = OffsetCommitResponse.OffsetCommitResponseTopic
Partition = Topic.OffsetCommitResponsePartition
TopicPartition = tuple[str, int]


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    offsets = requested_offsets(req)
    result = ctx.groups.commit_offsets(
        req.group_id, req.member_id, getattr(req, "group_instance_id", None),
        req.generation_id_or_member_epoch, offsets)
    if isinstance(result, dict):
        return _response(result)
    return answer_later(result, _response)


def requested_offsets(req: Any) -> dict[TopicPartition, OffsetAndMetadata]:
    """The offsets an OffsetCommit or TxnOffsetCommit request commits, stamped now."""
    now = now_ms()
    return {
        (t.name, p.partition_index): OffsetAndMetadata(
            p.committed_offset, getattr(p, "committed_leader_epoch", -1),
            p.committed_metadata or "", now)
        for t in req.topics for p in t.partitions
    }


def _response(results: dict[TopicPartition, ErrorCode]) -> OffsetCommitResponse:
    topics: dict[str, list[Partition]] = {}
    for (topic, index), error in results.items():
        topics.setdefault(topic, []).append(Partition(partition_index=index, error_code=error))
    return OffsetCommitResponse(
        throttle_time_ms=0, topics=[Topic(name=t, partitions=ps) for t, ps in topics.items()])
