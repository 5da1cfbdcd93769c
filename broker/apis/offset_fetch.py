"""OffsetFetch (key 9): committed offsets of one group (v0-v7) or several (v8+).

A partition with no committed offset answers -1; topics=None asks for everything committed.
From v7 a consumer may require stable offsets (KIP-447): a partition whose commit is still
pending, such as a transactional one awaiting its marker, answers UNSTABLE_OFFSET_COMMIT (a
retriable error: the consumer asks again) instead of an offset about to change.

Each group needs DESCRIBE (GROUP_AUTHORIZATION_FAILED for the group: its error code from v2,
on each requested partition before); offsets are shown only for topics the principal may
DESCRIBE: left out of an all-partitions answer, TOPIC_AUTHORIZATION_FAILED when named.

From v9 a member of a consumer group names itself and its epoch (KIP-848): an unknown member
answers UNKNOWN_MEMBER_ID and an epoch other than its current one STALE_MEMBER_EPOCH, for the
whole group. Without them (member id null, epoch -1) the fetch is not checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import OffsetFetchResponse

from broker.apis.authorize import allowed, filter_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.group.offset_cache import OffsetAndMetadata
    from broker.network.request import Request

API_KEY = 9  # OffsetFetch
VERSIONS = range(1, 10)

OldTopic = OffsetFetchResponse.OffsetFetchResponseTopic
OldPartition = OldTopic.OffsetFetchResponsePartition
Group = OffsetFetchResponse.OffsetFetchResponseGroup
NewTopic = Group.OffsetFetchResponseTopics
NewPartition = NewTopic.OffsetFetchResponsePartitions


def handle(ctx: ApiContext, request: Request) -> OffsetFetchResponse:
    req = request.body
    require_stable = bool(getattr(req, "require_stable", False)) if request.version >= 7 else False
    if request.version >= 8:
        groups = []
        for g in req.groups:
            error, found = _fetch(ctx, request, g.group_id, _wanted(g.topics), require_stable)
            if error == ErrorCode.NONE and request.version >= 9:
                refused = ctx.groups.validate_offset_fetch(g.group_id, g.member_id,
                                                           g.member_epoch)
                if refused is not None:
                    error, found = refused, {}
            groups.append(Group(group_id=g.group_id, topics=_topics(found, NewTopic, NewPartition),
                                error_code=error))
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    wanted = _wanted(req.topics)
    error, found = _fetch(ctx, request, req.group_id, wanted, require_stable)
    if error != ErrorCode.NONE and request.version < 2:
        # No group-level error before v2: the error goes on each requested partition.
        found = {tp: error for tp in wanted or []}
    return OffsetFetchResponse(throttle_time_ms=0, error_code=error,
                               topics=_topics(found, OldTopic, OldPartition))


def _fetch(ctx: ApiContext, request: Request, group_id: str,
           wanted: list[tuple[str, int]] | None, require_stable: bool
           ) -> tuple[ErrorCode, dict[tuple[str, int], OffsetAndMetadata | ErrorCode | None]]:
    """One group's error and offsets, as this principal may see them."""
    if ctx.authorizer.enabled and not allowed(ctx, request, AclOperation.DESCRIBE,
                                              ResourceType.GROUP, group_id):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, {}
    if (moved := ctx.groups.coordinator_error(group_id)) is not None:
        return moved, {}
    if not ctx.authorizer.enabled:
        return ErrorCode.NONE, ctx.groups.fetch_offsets(group_id, wanted, require_stable)
    if wanted is None:
        found = ctx.groups.fetch_offsets(group_id, None, require_stable)
        described = filter_allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC,
                                   (t for t, _p in found))
        return ErrorCode.NONE, {tp: o for tp, o in found.items() if tp[0] in described}
    described = filter_allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC,
                               (t for t, _p in wanted))
    found = ctx.groups.fetch_offsets(group_id, [tp for tp in wanted if tp[0] in described],
                                     require_stable)
    for tp in wanted:
        if tp[0] not in described:
            found[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    return ErrorCode.NONE, found


def _wanted(topics: Any) -> list[tuple[str, int]] | None:
    if topics is None:
        return None
    return [(t.name, p) for t in topics for p in t.partition_indexes]


def _topics(found: dict[tuple[str, int], OffsetAndMetadata | ErrorCode | None], topic_cls: Any,
            part_cls: Any) -> list[Any]:
    by_topic: dict[str, list[Any]] = {}
    for (topic, index), om in found.items():
        if isinstance(om, ErrorCode):
            part = part_cls(partition_index=index, committed_offset=-1,
                            committed_leader_epoch=-1, metadata="", error_code=om)
        else:
            part = part_cls(
                partition_index=index, committed_offset=om.offset if om else -1,
                committed_leader_epoch=om.leader_epoch if om else -1,
                metadata=om.metadata if om else "", error_code=0)
        by_topic.setdefault(topic, []).append(part)
    return [topic_cls(name=t, partitions=ps) for t, ps in by_topic.items()]
