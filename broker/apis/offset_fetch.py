"""OffsetFetch (key 9): committed offsets of one group (v0-v7) or several (v8+).

A partition with no committed offset answers -1; topics=None asks for everything committed.
From v7 a consumer may require stable offsets (KIP-447): a partition whose commit is still
pending, such as a transactional one awaiting its marker, answers UNSTABLE_OFFSET_COMMIT (a
retriable error: the consumer asks again) instead of an offset about to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import OffsetFetchResponse

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.group.metadata import OffsetAndMetadata
    from broker.network.request import Request

OldTopic = OffsetFetchResponse.OffsetFetchResponseTopic
OldPartition = OldTopic.OffsetFetchResponsePartition
Group = OffsetFetchResponse.OffsetFetchResponseGroup
NewTopic = Group.OffsetFetchResponseTopics
NewPartition = NewTopic.OffsetFetchResponsePartitions


def handle(ctx: ApiContext, request: Request) -> OffsetFetchResponse:
    req = request.body
    coordinator = ctx.groups
    require_stable = bool(getattr(req, "require_stable", False)) if request.version >= 7 else False
    if request.version >= 8:
        groups = []
        for g in req.groups:
            found = coordinator.fetch_offsets(g.group_id, _wanted(g.topics), require_stable)
            groups.append(Group(group_id=g.group_id, topics=_topics(found, NewTopic, NewPartition),
                                error_code=0))
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    found = coordinator.fetch_offsets(req.group_id, _wanted(req.topics), require_stable)
    return OffsetFetchResponse(throttle_time_ms=0, error_code=0,
                               topics=_topics(found, OldTopic, OldPartition))


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
