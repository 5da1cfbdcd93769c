"""OffsetCommit (key 8): committed offsets, answered once written to __consumer_offsets.

Needs READ on the group (every partition GROUP_AUTHORIZATION_FAILED, nothing committed), then
READ on each topic (its partitions TOPIC_AUTHORIZATION_FAILED, the others committed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import OffsetCommitResponse

from broker.apis.authorize import allowed, filter_allowed
from broker.group.offset_cache import OffsetAndMetadata
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 8  # OffsetCommit
VERSIONS = range(2, 10)

Topic = OffsetCommitResponse.OffsetCommitResponseTopic
Partition = Topic.OffsetCommitResponsePartition
TopicPartition = tuple[str, int]


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    offsets = requested_offsets(req, ctx.clock.wall_ms())
    denied: dict[TopicPartition, ErrorCode] = {}
    if ctx.authorizer.enabled:
        if not allowed(ctx, request, AclOperation.READ, ResourceType.GROUP, req.group_id):
            return _response({tp: ErrorCode.GROUP_AUTHORIZATION_FAILED for tp in offsets})
        offsets, denied = split_readable(ctx, request, offsets)
        if not offsets:
            return _response(denied)
    result = ctx.groups.commit_offsets(
        req.group_id, req.member_id, getattr(req, "group_instance_id", None),
        req.generation_id_or_member_epoch, offsets, request.version)
    return result.then(lambda r: _response({**r, **denied}))


def split_readable(ctx: ApiContext, request: Request, offsets: dict[TopicPartition, Any]
                   ) -> tuple[dict[TopicPartition, Any], dict[TopicPartition, ErrorCode]]:
    """The offsets whose topic the principal may READ, and TOPIC_AUTHORIZATION_FAILED for the
    rest (Kafka's filterByAuthorized over the request's topics)."""
    readable = filter_allowed(ctx, request, AclOperation.READ, ResourceType.TOPIC,
                              (t for t, _p in offsets))
    denied = {tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED for tp in offsets if tp[0] not in readable}
    if not denied:
        return offsets, denied
    return {tp: o for tp, o in offsets.items() if tp not in denied}, denied


def requested_offsets(req: Any, now: int) -> dict[TopicPartition, OffsetAndMetadata]:
    """The offsets an OffsetCommit or TxnOffsetCommit request commits, stamped ``now``."""
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
