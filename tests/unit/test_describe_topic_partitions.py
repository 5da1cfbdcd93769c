"""DescribeTopicPartitions through its handler: pages of at most response_partition_limit
partitions, sorted by topic, with Kafka's cursor; unknown and illegal names; a request refused
whole for a bad cursor; partitions and topic ids as Metadata answers them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DescribeTopicPartitionsRequest
from kafka.protocol.metadata import MetadataRequest

from broker.apis import describe_topic_partitions, metadata
from broker.security.acl import SUPPORTED_OPERATIONS, ResourceType
from protocol import registry
from protocol.errors import ErrorCode
from tests.support.components import Components, build, parse, wire_roundtrip

E = ErrorCode
OFFSETS = "__consumer_offsets"


def test_the_registry_serves_these_versions() -> None:
    spec = registry.APIS[DescribeTopicPartitionsRequest.API_KEY]
    assert (spec.min_version, spec.max_version) == (0, 0)


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "2"})
    for name, count in (("alpha", 3), ("beta", 2), ("gamma", 1)):
        c.topics.create_topic(name, count, {})
    yield c
    await c.close()


def describe(c: Components, names: list[str], limit: int = 2000,
             cursor: tuple[str, int] | None = None) -> Any:
    req = DescribeTopicPartitionsRequest[0](
        topics=[DescribeTopicPartitionsRequest.TopicRequest(name=n) for n in names],
        response_partition_limit=limit,
        cursor=None if cursor is None else DescribeTopicPartitionsRequest.Cursor(
            topic_name=cursor[0], partition_index=cursor[1]))
    parsed = parse(req)
    return wire_roundtrip(parsed, describe_topic_partitions.handle(c.context, parsed))


def page(resp: Any) -> tuple[list[tuple[str, int, list[int]]], tuple[str, int] | None]:
    """([(topic, error, partition indexes)], next cursor) of a response."""
    topics = [(t.name, t.error_code, [p.partition_index for p in t.partitions])
              for t in resp.topics]
    cursor = resp.next_cursor
    return topics, None if cursor is None else (cursor.topic_name, cursor.partition_index)


async def test_every_topic_in_one_page(parts: Components) -> None:
    assert page(describe(parts, [])) == ([
        (OFFSETS, 0, [0, 1]), ("alpha", 0, [0, 1, 2]), ("beta", 0, [0, 1]), ("gamma", 0, [0]),
    ], None)


async def test_pages_follow_the_cursor(parts: Components) -> None:
    names = ["gamma", "alpha", "beta"]  # answered sorted
    assert page(describe(parts, names, limit=2)) == ([("alpha", 0, [0, 1])], ("alpha", 2))
    assert page(describe(parts, names, limit=2, cursor=("alpha", 2))) == (
        [("alpha", 0, [2]), ("beta", 0, [0])], ("beta", 1))
    assert page(describe(parts, names, limit=2, cursor=("beta", 1))) == (
        [("beta", 0, [1]), ("gamma", 0, [0])], None)


async def test_a_full_page_points_at_the_next_topic(parts: Components) -> None:
    assert page(describe(parts, ["alpha", "beta"], limit=3)) == (
        [("alpha", 0, [0, 1, 2])], ("beta", 0))
    # Every topic: the cursor's topic and those after it only.
    assert page(describe(parts, [], limit=3, cursor=("alpha", 1))) == (
        [("alpha", 0, [1, 2]), ("beta", 0, [0])], ("beta", 1))
    # Even a next topic that does not exist.
    assert page(describe(parts, ["gamma", "nowhere"], limit=1)) == (
        [("gamma", 0, [0])], ("nowhere", 0))


async def test_limits_below_one_answer_one_partition(parts: Components) -> None:
    assert page(describe(parts, ["alpha"], limit=0)) == ([("alpha", 0, [0])], ("alpha", 1))
    assert page(describe(parts, ["alpha"], limit=-5)) == ([("alpha", 0, [0])], ("alpha", 1))


async def test_unknown_and_illegal_names(parts: Components) -> None:
    topics, cursor = page(describe(parts, ["nowhere", "beta", "bad/name"]))
    assert (topics, cursor) == ([
        ("bad/name", E.INVALID_TOPIC_EXCEPTION, []), ("beta", 0, [0, 1]),
        ("nowhere", E.UNKNOWN_TOPIC_OR_PARTITION, []),
    ], None)
    unknown = describe(parts, ["nowhere"]).topics[0]
    assert (unknown.topic_id, unknown.is_internal) == (None, False)


async def test_a_bad_cursor_refuses_the_whole_request(parts: Components) -> None:
    assert page(describe(parts, ["alpha", "beta"], cursor=("gamma", 0))) == (
        [("alpha", E.INVALID_REQUEST, []), ("beta", E.INVALID_REQUEST, [])], None)
    assert page(describe(parts, ["alpha"], cursor=("alpha", -1))) == (
        [("alpha", E.INVALID_REQUEST, [])], None)
    assert page(describe(parts, [], cursor=("alpha", -1))) == ([], None)


async def test_partitions_and_ids_as_metadata_answers(parts: Components) -> None:
    node = parts.context.node.node_id
    ops = sum(1 << op for op in SUPPORTED_OPERATIONS[ResourceType.TOPIC])
    resp = describe(parts, ["alpha", OFFSETS])
    parsed = parse(MetadataRequest[12](
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=n)
                for n in ("alpha", OFFSETS)],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    answer = wire_roundtrip(parsed, metadata.handle(parts.context, parsed))
    meta = {t.name: t for t in answer.topics}
    for t in resp.topics:
        m = meta[t.name]
        assert (t.topic_id, t.is_internal, t.topic_authorized_operations) == (
            m.topic_id, t.name == OFFSETS, ops)
        for p, mp in zip(t.partitions, m.partitions, strict=True):
            assert (p.error_code, p.partition_index, p.leader_id, p.leader_epoch,
                    p.replica_nodes, p.isr_nodes, p.offline_replicas) == (
                0, mp.partition_index, node, mp.leader_epoch, [node], [node], [])
            # Kafka always sends both lists (the Java client streams them without a null check)
            assert (p.eligible_leader_replicas, p.last_known_elr) == ([], [])
