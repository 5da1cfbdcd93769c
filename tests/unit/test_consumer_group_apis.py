"""The consumer group protocol's requests through their handlers, as a client's bytes arrive.

ConsumerGroupHeartbeat and ConsumerGroupDescribe on the wire; how the classic group APIs
answer for a consumer group (ListGroups types and states, DescribeGroups Dead, classic members
joining a live consumer group, an empty group switching protocol either way); DeleteGroups and
offset expiry of consumer groups; OffsetFetch v9 member epochs; the authorization of both new
APIs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DeleteGroupsRequest, DescribeGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer import JoinGroupRequest, OffsetCommitRequest, OffsetFetchRequest

from broker.apis import (
    consumer_group_describe,
    consumer_group_heartbeat,
    delete_groups,
    describe_groups,
    join_group,
    list_groups,
    offset_commit,
    offset_fetch,
)
from broker.group.consumer_group import ConsumerGroupState
from broker.group.offset_cache import OffsetAndMetadata
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode
from protocol.messages import ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest
from tests.support.components import Components, build, parse, settle, wire_roundtrip

GROUP = "cg"
OVERRIDES = {"offsets.topic.num.partitions": "3", "group.consumer.heartbeat.interval.ms": "5000"}
TopicPartitions = ConsumerGroupHeartbeatRequest.TopicPartitions


def now(answer: Completion[Any]) -> Any:
    """An answer known at once."""
    assert answer.done(), "waiting"
    return answer.result()


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic("a", 3, {})
    yield c
    await c.close()


async def call(c: Components, handle: Any, request: Any) -> Any:
    req = parse(request)
    out = handle(c.context, req)
    if not hasattr(out, "encode"):
        out = await out
    return wire_roundtrip(req, out)


def join_request(member_id: str = "", epoch: int = 0, version: int = 1, group: str = GROUP,
                 **kw: Any) -> Any:
    fields: dict[str, Any] = dict(
        group_id=group, member_id=member_id, member_epoch=epoch, instance_id=None,
        rack_id=None, rebalance_timeout_ms=30_000 if epoch == 0 else -1,
        subscribed_topic_names=["a"] if epoch == 0 else None, server_assignor=None,
        topic_partitions=[] if epoch == 0 else None)
    if version >= 1:
        fields["subscribed_topic_regex"] = None
    fields.update(kw)
    return ConsumerGroupHeartbeatRequest[version](**fields)


async def test_heartbeat_on_the_wire(parts: Components) -> None:
    v0 = await call(parts, consumer_group_heartbeat.handle, join_request(version=0))
    assert (v0.error_code, v0.member_epoch, v0.heartbeat_interval_ms) == (0, 1, 5000)
    assert v0.member_id  # chosen by the coordinator for a v0 client
    [tp] = v0.assignment.topic_partitions
    assert (tp.topic_id, sorted(tp.partitions)) == (parts.metadata.topics["a"].topic_id,
                                                    [0, 1, 2])
    v1 = await call(parts, consumer_group_heartbeat.handle, join_request("client-chosen-id"))
    assert (v1.error_code, v1.member_id, v1.member_epoch) == (0, "client-chosen-id", 2)
    owned = [TopicPartitions(topic_id=tp.topic_id, partitions=[0, 1, 2])]
    again = await call(parts, consumer_group_heartbeat.handle,
                       join_request(v0.member_id, 1, version=0, topic_partitions=owned))
    assert again.error_code == 0 and again.assignment is not None  # told to revoke
    assert sum(len(t.partitions) for t in again.assignment.topic_partitions) < 3
    bad = await call(parts, consumer_group_heartbeat.handle,
                     join_request("x", subscribed_topic_regex="[unclosed"))
    assert bad.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION and bad.error_message
    member = parts.coordinator.groups.consumer(GROUP).members["client-chosen-id"]
    assert (member.client_id, member.client_host) == ("unit-test", "/127.0.0.1")


async def test_describe(parts: Components) -> None:
    await call(parts, consumer_group_heartbeat.handle, join_request("m1", server_assignor="range"))
    parts.coordinator.join_group("classic", "", None, False, "c", "/h", 10_000, 10_000,
                                 "consumer", [("range", b"")])
    resp = await call(parts, consumer_group_describe.handle, ConsumerGroupDescribeRequest[0](
        group_ids=[GROUP, "classic", "unknown"], include_authorized_operations=True))
    d, classic, unknown = resp.groups
    assert (d.error_code, d.group_state, d.group_epoch, d.assignment_epoch, d.assignor_name) == (
        0, "Stable", 1, 1, "range")
    [m] = d.members
    assert (m.member_id, m.member_epoch, m.client_id, m.subscribed_topic_names) == (
        "m1", 1, "unit-test", ["a"])
    [tp] = m.assignment.topic_partitions
    assert (tp.topic_name, sorted(tp.partitions)) == ("a", [0, 1, 2])
    assert m.target_assignment.topic_partitions[0].topic_name == "a"
    assert d.authorized_operations > 0
    assert classic.error_code == unknown.error_code == ErrorCode.GROUP_ID_NOT_FOUND


async def test_list_and_describe_groups_by_type(parts: Components) -> None:
    await call(parts, consumer_group_heartbeat.handle, join_request("m1"))
    parts.coordinator.join_group("classic", "", None, False, "c", "/h", 10_000, 10_000,
                                 "consumer", [("range", b"")])
    listed = await call(parts, list_groups.handle,
                        ListGroupsRequest[5](states_filter=[], types_filter=[]))
    by_id = {g.group_id: (g.group_type, g.protocol_type, g.group_state) for g in listed.groups}
    assert by_id[GROUP] == ("consumer", "consumer", "Stable")
    assert by_id["classic"][0] == "classic"
    only = await call(parts, list_groups.handle,
                      ListGroupsRequest[5](states_filter=[], types_filter=["Consumer"]))
    assert [g.group_id for g in only.groups] == [GROUP]
    stable = await call(parts, list_groups.handle,
                        ListGroupsRequest[5](states_filter=["stable"], types_filter=["classic"]))
    assert stable.groups == []
    described = await call(parts, describe_groups.handle, DescribeGroupsRequest[5](
        groups=[GROUP], include_authorized_operations=False))
    assert (described.groups[0].group_state, described.groups[0].members) == ("Dead", [])


async def test_protocol_exclusivity(parts: Components) -> None:
    """A live consumer group refuses a classic member of another protocol type; an empty one
    becomes classic, keeping its offsets; a consumer heartbeat to a classic group with members
    is GROUP_ID_NOT_FOUND, to an empty one it takes the group back."""
    await call(parts, consumer_group_heartbeat.handle, join_request("m1"))
    join = JoinGroupRequest[5](group_id=GROUP, session_timeout_ms=10_000,
                               rebalance_timeout_ms=10_000, member_id="", group_instance_id=None,
                               protocol_type="consumer",
                               protocols=[JoinGroupRequest[5].JoinGroupRequestProtocol(
                                   name="range", metadata=b"")])
    join.protocol_type = "connect"
    refused = await call(parts, join_group.handle, join)
    assert refused.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    join.protocol_type = "consumer"
    commit = await call(parts, offset_commit.handle, OffsetCommitRequest[9](
        group_id=GROUP, generation_id_or_member_epoch=1, member_id="m1", group_instance_id=None,
        topics=[OffsetCommitRequest[9].OffsetCommitRequestTopic(name="a", partitions=[
            OffsetCommitRequest[9].OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                partition_index=0, committed_offset=42, committed_leader_epoch=-1,
                committed_metadata="")])]))
    assert commit.topics[0].partitions[0].error_code == 0
    await call(parts, consumer_group_heartbeat.handle, join_request("m1", -1))
    joined = await call(parts, join_group.handle, join)
    assert joined.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert parts.coordinator.groups.get_consumer(GROUP) is None
    classic = parts.coordinator.groups.classic(GROUP)
    assert parts.coordinator.offsets.committed(GROUP)[("a", 0)].offset == 42
    parts.coordinator.join_group(GROUP, "", None, False, "c", "/h", 10_000, 10_000, "consumer",
                                 [("range", b"")])
    busy = await call(parts, consumer_group_heartbeat.handle, join_request("m2"))
    assert busy.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    # The classic member leaves: the empty group goes back to the consumer protocol.
    [member_id] = classic.members
    parts.coordinator.leave_group(GROUP, [(member_id, None)])
    await parts.advance(3000)
    back = await call(parts, consumer_group_heartbeat.handle, join_request("m2"))
    assert back.error_code == 0
    assert parts.coordinator.groups.get_consumer(GROUP) is not None
    assert parts.coordinator.offsets.committed(GROUP)[("a", 0)].offset == 42
    assert parts.coordinator.groups.get_classic(GROUP) is None


async def test_offset_fetch_v9_checks_the_member_epoch(parts: Components) -> None:
    await call(parts, consumer_group_heartbeat.handle, join_request("m1"))
    Group = OffsetFetchRequest[9].OffsetFetchRequestGroup

    async def fetch(member_id: str | None, epoch: int) -> int:
        resp = await call(parts, offset_fetch.handle, OffsetFetchRequest[9](groups=[Group(
            group_id=GROUP, member_id=member_id, member_epoch=epoch, topics=None)],
            require_stable=False))
        return resp.groups[0].error_code

    assert await fetch("m1", 1) == 0
    assert await fetch("m1", 0) == ErrorCode.STALE_MEMBER_EPOCH
    assert await fetch("other", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert await fetch(None, -1) == 0


async def test_delete_and_expire(parts: Components) -> None:
    await call(parts, consumer_group_heartbeat.handle, join_request("m1"))
    busy = await call(parts, delete_groups.handle, DeleteGroupsRequest[2](groups_names=[GROUP]))
    assert busy.results[0].error_code == ErrorCode.NON_EMPTY_GROUP
    await call(parts, consumer_group_heartbeat.handle, join_request("m1", -1))
    group = parts.coordinator.groups.consumer(GROUP)
    assert group.state == ConsumerGroupState.EMPTY
    done = await call(parts, delete_groups.handle, DeleteGroupsRequest[2](groups_names=[GROUP]))
    assert done.results[0].error_code == 0
    assert GROUP not in parts.coordinator.consumer.groups
    # Expiry: an empty consumer group's offsets go by their commit time, then the group.
    await call(parts, consumer_group_heartbeat.handle, join_request("m2"))
    await parts.coordinator.commit_offsets(GROUP, "m2", None, 1, {
        ("a", 1): OffsetAndMetadata(3, -1, "", 0)}, 9)
    assert parts.coordinator.expire_offsets() == 0  # subscribed: kept
    await call(parts, consumer_group_heartbeat.handle, join_request("m2", -1))
    assert parts.coordinator.expire_offsets() == 1
    await settle()
    assert GROUP not in parts.coordinator.consumer.groups


async def test_authorization(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {**OVERRIDES, "authorizer.class.name":
                                  "org.apache.kafka.metadata.authorizer.StandardAuthorizer"})
    try:
        c.topics.create_topic("a", 3, {})
        denied = await call(c, consumer_group_heartbeat.handle, join_request("m1"))
        assert denied.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
        assert GROUP not in c.coordinator.consumer.groups
        described = await call(c, consumer_group_describe.handle, ConsumerGroupDescribeRequest[0](
            group_ids=[GROUP], include_authorized_operations=False))
        assert described.groups[0].error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    finally:
        await c.close()


async def test_classic_member_joins_a_live_consumer_group(parts: Components) -> None:
    """Kafka's mixed groups: a JoinGroup to a consumer group with members makes a classic
    member of it, assigned by the server; SyncGroup hands out its share once released, its
    Heartbeat asks it to join again while it waits, LeaveGroup fences it."""
    from kafka.protocol.consumer.metadata import (
        ConsumerProtocolAssignment,
        ConsumerProtocolSubscription,
    )

    coordinator = parts.coordinator
    await call(parts, consumer_group_heartbeat.handle, join_request("modern"))
    subscription = bytes(ConsumerProtocolSubscription(
        topics=["a"], user_data=None, owned_partitions=[]).encode(version=1))
    first = now(coordinator.join_group(GROUP, "", None, True, "classic", "/h", 10_000, 10_000,
                                       "consumer", [("range", subscription)]))
    assert first.error == ErrorCode.MEMBER_ID_REQUIRED
    joined = now(coordinator.join_group(GROUP, first.member_id, None, True, "classic", "/h",
                                        10_000, 10_000, "consumer", [("range", subscription)]))
    assert (joined.error, joined.generation_id, joined.protocol_name, joined.leader_id) == (
        ErrorCode.NONE, 2, "range", "")
    group = coordinator.groups.consumer(GROUP)
    assert group.members[first.member_id].uses_classic_protocol
    error, raw = now(coordinator.sync_group(GROUP, 2, first.member_id, None, "consumer",
                                            "range", {}))
    assert error == ErrorCode.NONE
    assert ConsumerProtocolAssignment.decode(raw).assigned_partitions == []  # not released yet
    assert coordinator.heartbeat(GROUP, first.member_id, None, 2) == ErrorCode.NONE
    # The consumer member revokes: the classic one is told to join again and gets its share.
    tid = parts.metadata.topics["a"].topic_id
    kept = sorted(group.target_assignment["modern"][tid])
    await call(parts, consumer_group_heartbeat.handle, join_request(
        "modern", 1, topic_partitions=[TopicPartitions(topic_id=tid, partitions=[0, 1, 2])]))
    await call(parts, consumer_group_heartbeat.handle, join_request(
        "modern", 1, topic_partitions=[TopicPartitions(topic_id=tid, partitions=kept)]))
    assert coordinator.heartbeat(GROUP, first.member_id, None, 2) == (
        ErrorCode.REBALANCE_IN_PROGRESS)
    again = now(coordinator.join_group(GROUP, first.member_id, None, True, "classic", "/h",
                                       10_000, 10_000, "consumer", [("range", subscription)]))
    error, raw = now(coordinator.sync_group(GROUP, again.generation_id, first.member_id, None,
                                            "consumer", "range", {}))
    [tp] = ConsumerProtocolAssignment.decode(raw).assigned_partitions
    assert (error, tp.topic, sorted(tp.partitions)) == (
        ErrorCode.NONE, "a", sorted({0, 1, 2} - set(kept)))
    assert now(coordinator.sync_group(GROUP, 1, first.member_id, None, None, None, {}))[0] == (
        ErrorCode.ILLEGAL_GENERATION)
    bad = now(coordinator.join_group(GROUP, "", None, True, "x", "/h", 10_000, 10_000,
                                     "consumer", [("roundrobin", subscription)]))
    assert bad.error == ErrorCode.INCONSISTENT_GROUP_PROTOCOL  # no protocol in common
    assert coordinator.leave_group(GROUP, [(first.member_id, None), ("modern", None)]) == (
        ErrorCode.NONE, [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID])
    assert set(group.members) == {"modern"}
