"""Handlers (broker/apis/<api>.py) called as the request channel calls them, without sockets.

Each request is a kafka-python request object, encoded as a client sends it and parsed by a
Connection's own parser into the broker's Request; each response is encoded for the request's
version and decoded again, so a response its version cannot carry fails here too. The ApiContext
is the one tests/support/components.py builds as the server does, on a manual clock.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest, DeleteTopicsRequest
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest

from broker.apis import (
    api_versions,
    create_topics,
    delete_topics,
    fetch,
    find_coordinator,
    heartbeat,
    join_group,
    list_offsets,
    metadata,
    offset_commit,
    offset_fetch,
    produce,
    sync_group,
)
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode
from tests.support.clients import BASE_TS
from tests.support.components import (
    CLIENT_ID,
    CLIENT_PEER,
    Components,
    build,
    parse,
    settle,
    wire_roundtrip,
)
from tests.support.requests import (
    EARLIEST,
    LATEST,
    fetch_request,
    fetched_values,
    list_offsets_request,
    produce_request,
    record_batch,
)

TOPIC = "events"
INITIAL_DELAY_MS = 3000


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "3"})
    yield c
    await c.close()


async def call(c: Components, handle: Callable[..., Any], request: Any, *,
               parked_ms: int | None = None) -> Any:
    """The decoded response. ``parked_ms``: the answer must wait exactly that long on the
    clock (0: parked, answered once the loop runs its callbacks, like a commit)."""
    req = parse(request)
    out = handle(c.context, req)
    if parked_ms is None:
        if isinstance(out, Completion):  # completed already: the channel answers at once
            assert out.done(), f"{req.spec.name} should answer at once"
            out = out.result()
        assert not inspect.isawaitable(out), f"{req.spec.name} should answer at once"
    else:
        assert inspect.isawaitable(out), f"{req.spec.name} should answer later"
        task = asyncio.ensure_future(out)
        await settle()
        if parked_ms:
            await c.advance(parked_ms - 1)
            assert not task.done(), f"{req.spec.name} answered {parked_ms} ms early"
            await c.advance(1)
        assert task.done(), f"{req.spec.name} not answered after {parked_ms} ms"
        out = task.result()
    assert out is not None
    return wire_roundtrip(req, out)


def metadata_request(names: list[str] | None, allow_create: bool = True):
    topics = None if names is None else [
        MetadataRequest.MetadataRequestTopic(topic_id=None, name=n) for n in names]
    return MetadataRequest[12](topics=topics, allow_auto_topic_creation=allow_create,
                               include_topic_authorized_operations=False)


# -- produce and fetch -----------------------------------------------------------------------

async def test_produce_then_fetch_round_trip(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    resp = await call(parts, produce.handle, produce_request(TOPIC, record_batch([b"a", b"b"])))
    [p] = resp.responses[0].partition_responses
    assert (p.index, p.error_code, p.base_offset, p.log_start_offset) == (0, 0, 0, 0)
    # acks=-1 answers through the awaitable even when the high watermark is already there.
    resp = await call(parts, produce.handle, produce_request(TOPIC, record_batch([b"c"]), acks=-1),
                      parked_ms=0)
    [p] = resp.responses[0].partition_responses
    assert (p.error_code, p.base_offset) == (0, 2)

    resp = await call(parts, fetch.handle, fetch_request([(TOPIC, 0, 0)], max_wait_ms=500))
    [t] = resp.responses
    [p] = t.partitions
    assert (resp.error_code, t.topic, p.error_code, p.high_watermark) == (0, TOPIC, 0, 3)
    assert fetched_values(p.records) == [(0, b"a"), (1, b"b"), (2, b"c")]
    # At the end of the log the fetch long-polls, and answers empty at max_wait_ms.
    resp = await call(parts, fetch.handle, fetch_request([(TOPIC, 0, 3)], max_wait_ms=500),
                      parked_ms=500)
    [p] = resp.responses[0].partitions
    assert (p.error_code, p.high_watermark, fetched_values(p.records)) == (0, 3, [])


async def test_fetch_below_v10_of_a_zstd_topic_is_refused(parts: Components) -> None:
    """Clients older than Fetch v10 cannot read zstd: Kafka refuses the partitions of a topic
    whose compression.type is zstd, and serves the other partitions of the same request."""
    parts.topics.create_topic("zstd-topic", 1, {"compression.type": "zstd"})
    parts.topics.create_topic(TOPIC, 1, {})
    for topic in ("zstd-topic", TOPIC):
        await call(parts, produce.handle, produce_request(topic, record_batch([b"a"])))
    old = fetch_request([("zstd-topic", 0, 0), (TOPIC, 0, 0)], max_wait_ms=0)
    old = FetchRequest[9](**{k: getattr(old, k) for k in (
        "replica_id", "max_wait_ms", "min_bytes", "max_bytes", "isolation_level", "session_id",
        "session_epoch", "topics", "forgotten_topics_data")}, rack_id="")
    resp = await call(parts, fetch.handle, old)
    got = {(t.topic, p.partition_index): (p.error_code, fetched_values(p.records))
           for t in resp.responses for p in t.partitions}
    assert got == {("zstd-topic", 0): (ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, []),
                   (TOPIC, 0): (0, [(0, b"a")])}
    resp = await call(parts, fetch.handle, fetch_request([("zstd-topic", 0, 0)], max_wait_ms=0))
    [p] = resp.responses[0].partitions
    assert (p.error_code, fetched_values(p.records)) == (0, [(0, b"a")])


async def test_produce_to_an_unknown_topic_names_the_error(parts: Components) -> None:
    resp = await call(parts, produce.handle, produce_request("nowhere", record_batch([b"a"])))
    [p] = resp.responses[0].partition_responses
    assert (p.error_code, p.base_offset) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)


# -- api versions ------------------------------------------------------------------------------

@pytest.mark.parametrize("protocols, advertised", [
    ("classic,consumer", {68: (0, 1), 69: (0, 0)}), ("classic", {})])
async def test_api_versions_advertise_consumer_group_apis_only_when_served(
        tmp_path: Path, protocols: str, advertised: dict[int, tuple[int, int]]) -> None:
    c = build(tmp_path / "logs", {"group.coordinator.rebalance.protocols": protocols})
    try:
        resp = await call(c, api_versions.handle, ApiVersionsRequest[4](
            client_software_name="t", client_software_version="1"))
    finally:
        await c.close()
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert resp.error_code == 0 and keys[18] == (0, 4)
    assert {k: v for k, v in keys.items() if k in (68, 69)} == advertised
    assert keys[11] == (0, 9)  # JoinGroup either way


@pytest.mark.parametrize("overrides, advertised", [
    ({}, {}),
    ({"minibroker.client.telemetry.metrics": "org.apache.kafka.producer."}, {71: (0, 0),
                                                                            72: (0, 0)})])
async def test_api_versions_advertise_client_telemetry_only_when_metrics_are_asked_for(
        tmp_path: Path, overrides: dict[str, str],
        advertised: dict[int, tuple[int, int]]) -> None:
    """By default GetTelemetrySubscriptions (71) and PushTelemetry (72) are not listed, as Kafka
    leaves them out without a telemetry receiver, so clients never ask."""
    c = build(tmp_path / "logs", overrides)
    try:
        resp = await call(c, api_versions.handle, ApiVersionsRequest[4](
            client_software_name="t", client_software_version="1"))
    finally:
        await c.close()
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert resp.error_code == 0 and keys[0] == (0, 11)
    assert {k: v for k, v in keys.items() if k in (71, 72)} == advertised


# -- metadata and topic administration ---------------------------------------------------------

async def test_metadata_lists_topics_and_auto_creates_when_allowed(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 2, {})
    resp = await call(parts, metadata.handle, metadata_request(None))
    node = parts.context.node
    assert [(b.node_id, b.host, b.port) for b in resp.brokers] == [(1, "127.0.0.1", 9092)]
    assert (resp.cluster_id, resp.controller_id) == (parts.metadata.cluster_id, node.node_id)
    topics = {t.name: t for t in resp.topics}
    assert set(topics) == {TOPIC, "__consumer_offsets"}
    assert topics["__consumer_offsets"].is_internal and not topics[TOPIC].is_internal
    assert topics[TOPIC].topic_id == parts.metadata.topics[TOPIC].topic_id
    assert [(p.partition_index, p.leader_id, p.replica_nodes, p.isr_nodes)
            for p in topics[TOPIC].partitions] == [(0, 1, [1], [1]), (1, 1, [1], [1])]

    resp = await call(parts, metadata.handle, metadata_request(["refused"], allow_create=False))
    assert [(t.name, t.error_code) for t in resp.topics] == [
        ("refused", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]
    assert "refused" not in parts.metadata.topics
    resp = await call(parts, metadata.handle, metadata_request(["created"]))
    [t] = resp.topics
    assert (t.name, t.error_code, len(t.partitions)) == ("created", 0, 1)  # num.partitions
    assert ("created", 0) in parts.replica_manager.partitions


async def test_offsets_topic_created_by_the_first_find_coordinator_for_a_group(
        tmp_path: Path) -> None:
    """As Kafka: a fresh broker has no internal topic (`kcat -L` lists nothing); a group's
    FindCoordinator creates __consumer_offsets, a transactional id's does not."""
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "3"}, offsets_topic=False)
    try:
        resp = await call(c, metadata.handle, metadata_request(None))
        assert resp.topics == []
        found = await call(c, find_coordinator.handle, FindCoordinatorRequest[3](
            key="a-producer", key_type=1))
        assert (found.error_code, found.node_id) == (0, 1)
        assert "__consumer_offsets" not in c.metadata.topics
        found = await call(c, find_coordinator.handle, FindCoordinatorRequest[3](
            key="a-group", key_type=0))
        assert (found.error_code, found.node_id) == (0, 1)
        resp = await call(c, metadata.handle, metadata_request(None))
        offsets = {t.name: t for t in resp.topics}["__consumer_offsets"]
        assert offsets.is_internal and len(offsets.partitions) == 3
        assert c.topics.topic_overrides("__consumer_offsets")["cleanup.policy"] == "compact"
    finally:
        await c.close()


async def test_create_and_delete_topics(parts: Components) -> None:
    def create(name: str, partitions: int, configs: dict[str, str], validate_only: bool = False):
        topic = CreateTopicsRequest.CreatableTopic
        return CreateTopicsRequest[7](timeout_ms=5000, validate_only=validate_only, topics=[
            topic(name=name, num_partitions=partitions, replication_factor=1, assignments=[],
                  configs=[topic.CreatableTopicConfig(name=k, value=v)
                           for k, v in configs.items()])])

    resp = await call(parts, create_topics.handle, create("orders", 3, {}, validate_only=True))
    assert resp.topics[0].error_code == 0 and "orders" not in parts.metadata.topics
    resp = await call(parts, create_topics.handle, create("orders", 3, {"retention.ms": "1000"}))
    [r] = resp.topics
    assert (r.name, r.error_code, r.num_partitions, r.replication_factor) == ("orders", 0, 3, 1)
    assert {c.name: c.value for c in r.configs}["retention.ms"] == "1000"
    assert r.topic_id == parts.metadata.topics["orders"].topic_id
    assert all(("orders", i) in parts.replica_manager.partitions for i in range(3))
    resp = await call(parts, create_topics.handle, create("orders", 1, {}))
    assert resp.topics[0].error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    resp = await call(parts, create_topics.handle, create("bad", 1, {"no.such.key": "1"}))
    assert resp.topics[0].error_code == ErrorCode.INVALID_CONFIG

    def delete(name: str):
        return DeleteTopicsRequest[6](timeout_ms=5000, topics=[
            DeleteTopicsRequest.DeleteTopicState(name=name, topic_id=None)])

    resp = await call(parts, delete_topics.handle, delete("orders"))
    assert [(r.name, r.error_code) for r in resp.responses] == [("orders", 0)]
    assert "orders" not in parts.metadata.topics
    assert not any(tp[0] == "orders" for tp in parts.replica_manager.partitions)
    resp = await call(parts, delete_topics.handle, delete("orders"))
    assert resp.responses[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_list_offsets_earliest_latest_and_by_timestamp(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    await call(parts, produce.handle, produce_request(TOPIC, record_batch([b"a", b"b", b"c"])))

    async def lookup(timestamp: int, partition: int = 0) -> tuple[int, int, int]:
        resp = await call(parts, list_offsets.handle, list_offsets_request(
            TOPIC, timestamp, partition=partition))
        [p] = resp.topics[0].partitions
        return p.error_code, p.offset, p.timestamp

    assert await lookup(EARLIEST) == (0, 0, -1)
    assert await lookup(LATEST) == (0, 3, -1)  # the high watermark
    assert await lookup(BASE_TS + 1) == (0, 1, BASE_TS + 1)
    assert await lookup(BASE_TS + 10) == (0, -1, -1)
    assert (await lookup(LATEST, partition=5))[0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# -- one member of a group, and its offsets ------------------------------------------------------

def join_request(member_id: str = ""):
    return JoinGroupRequest[9](
        group_id="g", session_timeout_ms=6000, rebalance_timeout_ms=300_000,
        member_id=member_id, group_instance_id=None, protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"sub")],
        reason=None)


async def test_join_sync_heartbeat_for_one_member(parts: Components) -> None:
    first = await call(parts, join_group.handle, join_request())
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED and first.member_id
    me = first.member_id
    assert me.startswith(CLIENT_ID + "-")
    joined = await call(parts, join_group.handle, join_request(me), parked_ms=INITIAL_DELAY_MS)
    assert (joined.error_code, joined.generation_id, joined.leader, joined.member_id) == (
        0, 1, me, me)
    assert (joined.protocol_type, joined.protocol_name) == ("consumer", "range")
    assert [(m.member_id, m.metadata) for m in joined.members] == [(me, b"sub")]
    member = parts.coordinator.groups.classic("g").members[me]
    # The host as Kafka records it (InetAddress.toString), which DescribeGroups shows.
    assert (member.client_id, member.client_host) == (CLIENT_ID, "/" + CLIENT_PEER[0])

    synced = await call(parts, sync_group.handle, SyncGroupRequest[5](
        group_id="g", generation_id=1, member_id=me, group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=me,
                                                                 assignment=b"all")]),
        parked_ms=0)  # answered once the assignment is in __consumer_offsets
    assert (synced.error_code, synced.assignment, synced.protocol_name) == (0, b"all", "range")

    beat = await call(parts, heartbeat.handle, HeartbeatRequest[4](
        group_id="g", generation_id=1, member_id=me, group_instance_id=None))
    assert beat.error_code == 0
    stale = await call(parts, heartbeat.handle, HeartbeatRequest[4](
        group_id="g", generation_id=0, member_id=me, group_instance_id=None))
    assert stale.error_code == ErrorCode.ILLEGAL_GENERATION


async def test_offset_commit_then_fetch(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 2, {})
    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    commit = OffsetCommitRequest[9](
        group_id="standalone", generation_id_or_member_epoch=-1, member_id="",
        group_instance_id=None, topics=[topic(name=TOPIC, partitions=[
            topic.OffsetCommitRequestPartition(
                partition_index=i, committed_offset=10 + i, committed_leader_epoch=0,
                committed_metadata=f"meta{i}") for i in range(2)])])
    resp = await call(parts, offset_commit.handle, commit, parked_ms=0)
    assert [(t.name, p.partition_index, p.error_code)
            for t in resp.topics for p in t.partitions] == [(TOPIC, 0, 0), (TOPIC, 1, 0)]

    group = OffsetFetchRequest.OffsetFetchRequestGroup
    resp = await call(parts, offset_fetch.handle, OffsetFetchRequest[8](groups=[group(
        group_id="standalone", topics=[group.OffsetFetchRequestTopics(
            name=TOPIC, partition_indexes=[0, 1, 2])])], require_stable=False))
    [g] = resp.groups
    assert (g.group_id, g.error_code) == ("standalone", 0)
    assert [(p.partition_index, p.committed_offset, p.metadata, p.committed_leader_epoch)
            for t in g.topics for p in t.partitions] == [
        (0, 10, "meta0", 0), (1, 11, "meta1", 0), (2, -1, "", -1)]

    resp = await call(parts, offset_fetch.handle, OffsetFetchRequest[7](
        group_id="standalone", topics=None, require_stable=False))
    assert resp.error_code == 0
    assert sorted((p.partition_index, p.committed_offset) for t in resp.topics
                  for p in t.partitions) == [(0, 10), (1, 11)]
