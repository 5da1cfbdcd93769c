"""The consumer group protocol (KIP-848) in the group coordinator, on a manual clock.

Kafka's rules checked here (GroupMetadataManager.consumerGroupHeartbeat, CurrentAssignmentBuilder,
ConsumerGroup): a join bumps the group epoch and the server computes the target assignment; a
member only moves to a new epoch once it stopped reporting the partitions it must give up, and
a partition is handed to its new owner only once the old one released it; a session or a
revocation that overruns its deadline fences the member; static members are replaced only after
they left; topics created, grown or deleted bump the group epoch; commits and fetches carry the
member epoch. Time moves only through ``advance``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.group.consumer_coordinator import HeartbeatRequest, HeartbeatResult
from broker.group.consumer_group import ConsumerGroupState
from broker.group.consumer_member import MemberState
from broker.group.offset_cache import OffsetAndMetadata
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode
from tests.support.components import Components, build, settle

GROUP = "cg"
SESSION_MS = 6000
INTERVAL_MS = 500
OVERRIDES = {
    "offsets.topic.num.partitions": "3",
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": str(SESSION_MS),
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.heartbeat.interval.ms": str(INTERVAL_MS),
}


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic("a", 4, {})
    c.topics.create_topic("b", 2, {})
    yield c
    await c.close()


def now(answer: Completion[Any]) -> Any:
    """An answer known at once."""
    assert answer.done(), "waiting"
    return answer.result()


def tid(c: Components, topic: str) -> uuid.UUID:
    return c.metadata.topics[topic].topic_id


def hb(c: Components, member_id: str, epoch: int, *, topics: list[str] | None = None,
       owned: dict[str, list[int]] | None = None, instance: str | None = None,
       regex: str | None = None, assignor: str | None = None, rebalance_ms: int = -1,
       group: str = GROUP) -> HeartbeatResult:
    """One heartbeat; a join (epoch 0) sends everything a client's first heartbeat does."""
    if epoch == 0:
        rebalance_ms = 10_000 if rebalance_ms == -1 else rebalance_ms
        owned = owned or {}
        topics = topics if topics is not None or regex else ["a"]
    owned_list = None if owned is None else [(tid(c, t), ps) for t, ps in owned.items()]
    return c.coordinator.consumer_group_heartbeat(HeartbeatRequest(
        group_id=group, member_id=member_id, member_epoch=epoch, instance_id=instance,
        rebalance_timeout_ms=rebalance_ms, subscribed_topic_names=topics,
        subscribed_topic_regex=regex, server_assignor=assignor, owned=owned_list,
        client_id="client", client_host="/127.0.0.1"))


def names(c: Components, assignment) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    by_id = {info.topic_id: name for name, info in c.metadata.topics.items()}
    return {by_id[t]: sorted(ps) for t, ps in assignment.items()}


def group(c: Components, gid: str = GROUP):  # type: ignore[no-untyped-def]
    return c.coordinator.groups.consumer(gid)


async def test_first_member_gets_everything_at_group_epoch_one(parts: Components) -> None:
    r = hb(parts, "m1", 0)
    assert (r.error, r.member_id, r.member_epoch, r.heartbeat_interval_ms) == (
        ErrorCode.NONE, "m1", 1, INTERVAL_MS)
    assert names(parts, r.assignment) == {"a": [0, 1, 2, 3]}
    g = group(parts)
    assert (g.group_epoch, g.assignment_epoch, g.state) == (1, 1, ConsumerGroupState.STABLE)
    # A plain heartbeat (nothing changed) carries no assignment.
    again = hb(parts, "m1", 1)
    assert (again.error, again.member_epoch, again.assignment) == (ErrorCode.NONE, 1, None)


async def test_empty_member_id_is_generated(parts: Components) -> None:
    r = hb(parts, "", 0)
    assert r.error == ErrorCode.NONE and r.member_id and len(r.member_id) == 22
    assert r.member_id in group(parts).members


async def test_revocation_before_reassignment(parts: Components) -> None:
    """m2 joins: m1 must first give up half of "a" (it stays at epoch 1 meanwhile); m2 moves to
    epoch 2 at once but receives those partitions only after m1 released them."""
    hb(parts, "m1", 0)
    r2 = hb(parts, "m2", 0)
    assert (r2.error, r2.member_epoch) == (ErrorCode.NONE, 2)
    assert names(parts, r2.assignment) == {}  # everything still held by m1
    g = group(parts)
    assert g.state == ConsumerGroupState.RECONCILING
    assert g.members["m2"].state == MemberState.UNRELEASED_PARTITIONS
    target_m1 = names(parts, g.target_assignment["m1"])["a"]
    to_move = sorted(set(range(4)) - set(target_m1))
    r1 = hb(parts, "m1", 1, owned={"a": [0, 1, 2, 3]})
    assert (r1.member_epoch, names(parts, r1.assignment)) == (1, {"a": target_m1})
    assert g.members["m1"].state == MemberState.UNREVOKED_PARTITIONS
    # Still reporting the revoked partitions: nothing moves.
    assert hb(parts, "m1", 1, owned={"a": [0, 1, 2, 3]}).assignment is None
    assert hb(parts, "m2", 2, owned={}).assignment is None
    # m1 acknowledges the revocation: it moves to epoch 2, and m2 gets the freed partitions.
    r1 = hb(parts, "m1", 1, owned={"a": target_m1})
    assert (r1.error, r1.member_epoch) == (ErrorCode.NONE, 2)
    r2 = hb(parts, "m2", 2, owned={})
    assert names(parts, r2.assignment) == {"a": to_move}
    assert hb(parts, "m2", 2, owned={"a": to_move}).error == ErrorCode.NONE
    assert g.state == ConsumerGroupState.STABLE


async def test_previous_epoch_with_a_subset_is_accepted_else_fenced(parts: Components) -> None:
    """A lost answer: the member may come back at its previous epoch owning a subset of its
    assignment; anything else off its epoch is FENCED_MEMBER_EPOCH."""
    hb(parts, "m1", 0)
    hb(parts, "m2", 0)
    hb(parts, "m1", 1, owned={"a": [0, 1, 2, 3]})
    kept = names(parts, group(parts).members["m1"].assigned)["a"]
    assert hb(parts, "m1", 1, owned={"a": kept}).member_epoch == 2
    assert hb(parts, "m1", 1, owned={"a": kept}).error == ErrorCode.NONE  # previous epoch
    fenced = hb(parts, "m1", 1, owned={"a": [0, 1, 2, 3]})
    assert fenced.error == ErrorCode.FENCED_MEMBER_EPOCH
    assert hb(parts, "m1", 5, owned={"a": kept}).error == ErrorCode.FENCED_MEMBER_EPOCH
    assert hb(parts, "nobody", 3).error == ErrorCode.UNKNOWN_MEMBER_ID
    assert hb(parts, "m1", 0).error == ErrorCode.NONE  # a rejoin is always accepted


async def test_leave_bumps_the_epoch_and_the_rest_takes_over(parts: Components) -> None:
    hb(parts, "m1", 0)
    hb(parts, "m2", 0)
    r = hb(parts, "m2", -1)
    assert (r.error, r.member_id, r.member_epoch) == (ErrorCode.NONE, "m2", -1)
    g = group(parts)
    assert g.group_epoch == 3 and set(g.members) == {"m1"}
    # m1 never started revoking: it keeps everything and moves straight to epoch 3.
    r1 = hb(parts, "m1", 1, owned={"a": [0, 1, 2, 3]})
    assert (r1.member_epoch, r1.assignment) == (3, None)
    assert names(parts, g.members["m1"].assigned) == {"a": [0, 1, 2, 3]}
    hb(parts, "m1", -1)
    assert g.state == ConsumerGroupState.EMPTY
    assert hb(parts, "m1", 3).error == ErrorCode.UNKNOWN_MEMBER_ID


async def test_session_expiry_fences_the_member(parts: Components) -> None:
    hb(parts, "m1", 0)
    hb(parts, "m2", 0)
    for _ in range(3):
        await parts.advance(SESSION_MS - 1000)
        m1 = group(parts).members["m1"]
        hb(parts, "m1", m1.member_epoch, owned=names(parts, m1.assigned))
    assert set(group(parts).members) == {"m1"}  # m2 never heartbeated after joining
    assert hb(parts, "m2", 2).error == ErrorCode.UNKNOWN_MEMBER_ID


async def test_session_not_expired_one_ms_early(parts: Components) -> None:
    hb(parts, "m1", 0)
    await parts.advance(SESSION_MS - 1)
    assert "m1" in group(parts).members
    await parts.advance(1)
    assert "m1" not in group(parts).members
    assert group(parts).state == ConsumerGroupState.EMPTY


async def test_rebalance_timeout_fences_a_member_that_does_not_revoke(parts: Components) -> None:
    hb(parts, "m1", 0, rebalance_ms=3000)
    hb(parts, "m2", 0)
    hb(parts, "m1", 1, owned={"a": [0, 1, 2, 3]})  # told to revoke
    for _ in range(3):
        await parts.advance(1000)
        hb(parts, "m1", 1, owned={"a": [0, 1, 2, 3]})  # keeps heartbeating, never revokes
        hb(parts, "m2", 2, owned={})
    assert set(group(parts).members) == {"m2"}
    hb(parts, "m2", 2, owned={})
    assert names(parts, group(parts).members["m2"].assigned) == {"a": [0, 1, 2, 3]}


async def test_static_member_replaced_only_after_leaving(parts: Components) -> None:
    hb(parts, "s1", 0, instance="i1")
    other = hb(parts, "s2", 0, instance="i1")
    assert other.error == ErrorCode.UNRELEASED_INSTANCE_ID
    left = hb(parts, "s1", -2, instance="i1")
    assert (left.error, left.member_epoch) == (ErrorCode.NONE, -2)
    epoch = group(parts).group_epoch
    r = hb(parts, "s2", 0, instance="i1")
    assert (r.error, names(parts, r.assignment)) == (ErrorCode.NONE, {"a": [0, 1, 2, 3]})
    g = group(parts)
    assert set(g.members) == {"s2"} and g.static_members == {"i1": "s2"}
    assert g.group_epoch == epoch  # a replacement is no rebalance
    assert hb(parts, "s1", 1, instance="i1").error == ErrorCode.FENCED_INSTANCE_ID
    assert hb(parts, "x", 1, instance="nope").error == ErrorCode.UNKNOWN_MEMBER_ID


async def test_static_member_keeps_its_partitions_while_away(parts: Components) -> None:
    hb(parts, "s1", 0, instance="i1")
    hb(parts, "d1", 0)
    hb(parts, "s1", 1, owned={"a": [0, 1, 2, 3]}, instance="i1")
    kept = names(parts, group(parts).members["s1"].assigned)["a"]
    hb(parts, "s1", 1, owned={"a": kept}, instance="i1")
    hb(parts, "s1", -2, instance="i1")
    r = hb(parts, "d1", 2, owned={})
    assert not set(names(parts, group(parts).members["d1"].assigned).get("a", [])) & set(kept)
    assert r.error == ErrorCode.NONE
    for _ in range(2):  # the static member never comes back
        await parts.advance(SESSION_MS // 2)
        d1 = group(parts).members["d1"]
        hb(parts, "d1", d1.member_epoch, owned=names(parts, d1.assigned))
    assert set(group(parts).members) == {"d1"}


async def test_new_topic_and_partitions_bump_the_group_epoch(parts: Components) -> None:
    r = hb(parts, "m1", 0, topics=["a", "later"])
    assert names(parts, r.assignment) == {"a": [0, 1, 2, 3]}
    parts.topics.create_topic("later", 2, {})
    r = hb(parts, "m1", 1)
    assert (r.member_epoch, names(parts, r.assignment)) == (
        2, {"a": [0, 1, 2, 3], "later": [0, 1]})
    parts.topics.add_partitions("later", 3)
    r = hb(parts, "m1", 2)
    assert (r.member_epoch, names(parts, r.assignment)["later"]) == (3, [0, 1, 2])
    parts.topics.delete_topic("later")
    r = hb(parts, "m1", 3, owned={"a": [0, 1, 2, 3]})  # it no longer reports "later"
    assert r.member_epoch == 4 and set(names(parts, r.assignment)) == {"a"}


async def test_regex_subscription(parts: Components) -> None:
    r = hb(parts, "m1", 0, topics=None, regex="[ab]")
    assert names(parts, r.assignment) == {"a": [0, 1, 2, 3], "b": [0, 1]}
    parts.topics.create_topic("c", 1, {})
    assert hb(parts, "m1", 1).assignment is None  # "c" does not match
    r = hb(parts, "m1", 1, regex="[a-c]")
    assert names(parts, r.assignment) == {"a": [0, 1, 2, 3], "b": [0, 1], "c": [0]}
    bad = hb(parts, "m2", 0, topics=None, regex="(")
    assert bad.error == ErrorCode.INVALID_REGULAR_EXPRESSION
    assert "__consumer_offsets" not in group(parts).resolved_regex.get("m1", set())
    everything = hb(parts, "m3", 0, topics=None, regex=".*")
    assert everything.error == ErrorCode.NONE
    assert "__consumer_offsets" not in group(parts).resolved_regex["m3"]


async def test_request_validation(parts: Components) -> None:
    def join(**kw) -> ErrorCode:  # type: ignore[no-untyped-def]
        base = dict(group_id=GROUP, member_id="m", member_epoch=0, rebalance_timeout_ms=1000,
                    subscribed_topic_names=["a"], owned=[])
        base.update(kw)
        return parts.coordinator.consumer_group_heartbeat(HeartbeatRequest(**base)).error

    assert join(group_id="") == ErrorCode.INVALID_REQUEST
    assert join(instance_id="") == ErrorCode.INVALID_REQUEST
    assert join(rack_id="") == ErrorCode.INVALID_REQUEST
    assert join(rebalance_timeout_ms=-1) == ErrorCode.INVALID_REQUEST
    assert join(owned=None) == ErrorCode.INVALID_REQUEST
    assert join(subscribed_topic_names=[]) == ErrorCode.INVALID_REQUEST
    assert join(member_epoch=-3) == ErrorCode.INVALID_REQUEST
    assert join(member_epoch=1, member_id="") == ErrorCode.INVALID_REQUEST
    assert join(member_epoch=-2, instance_id=None) == ErrorCode.INVALID_REQUEST
    assert join(server_assignor="sticky") == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert join(server_assignor="range") == ErrorCode.NONE
    assert group(parts).preferred_assignor("uniform") == "range"
    assert hb(parts, "m", 1, group="unknown").error == ErrorCode.GROUP_ID_NOT_FOUND
    assert hb(parts, "m", -1, group="unknown").error == ErrorCode.GROUP_ID_NOT_FOUND


async def test_group_max_size(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {**OVERRIDES, "group.consumer.max.size": "2"})
    try:
        c.topics.create_topic("a", 4, {})
        assert hb(c, "m1", 0).error == ErrorCode.NONE
        assert hb(c, "m2", 0).error == ErrorCode.NONE
        assert hb(c, "m3", 0).error == ErrorCode.GROUP_MAX_SIZE_REACHED
        assert hb(c, "m1", 0).error == ErrorCode.NONE  # a member already in is no newcomer
    finally:
        await c.close()


async def test_a_commit_one_epoch_behind_is_taken_for_partitions_held_since(
        parts: Components) -> None:
    """A client commits at epoch N while the heartbeat that moved it to N+1 is in flight: the
    partitions it held at N and still holds are its own (KIP-1251); the others are stale."""
    hb(parts, "m1", 0)
    hb(parts, "m2", 0)
    hb(parts, "m1", 1, owned={"a": [0, 1, 2, 3]})  # told to revoke two
    kept = names(parts, group(parts).members["m1"].assigned)["a"]
    gone = sorted({0, 1, 2, 3} - set(kept))
    moved = hb(parts, "m1", 1, owned={"a": kept})
    assert moved.member_epoch == 2
    coordinator = parts.coordinator

    def commit(epoch: int, partition: int):  # type: ignore[no-untyped-def]
        return coordinator.commit_offsets(
            GROUP, "m1", None, epoch, {("a", partition): OffsetAndMetadata(5, -1, "", 0)}, 9)

    assert await commit(1, kept[0]) == {("a", kept[0]): ErrorCode.NONE}
    assert now(commit(1, gone[0])) == {("a", gone[0]): ErrorCode.STALE_MEMBER_EPOCH}
    assert now(commit(0, kept[0])) == {("a", kept[0]): ErrorCode.STALE_MEMBER_EPOCH}
    assert await commit(2, kept[0]) == {("a", kept[0]): ErrorCode.NONE}


async def test_commits_carry_the_member_epoch(parts: Components) -> None:
    hb(parts, "m1", 0)
    offsets = {("a", 0): OffsetAndMetadata(5, -1, "", 0)}
    coordinator = parts.coordinator
    stale = coordinator.commit_offsets(GROUP, "m1", None, 0, offsets, 9)
    assert now(stale) == {("a", 0): ErrorCode.STALE_MEMBER_EPOCH}
    unknown = coordinator.commit_offsets(GROUP, "ghost", None, 1, offsets, 9)
    assert now(unknown) == {("a", 0): ErrorCode.UNKNOWN_MEMBER_ID}
    old = coordinator.commit_offsets(GROUP, "m1", None, 1, offsets, 8)
    assert now(old) == {("a", 0): ErrorCode.UNSUPPORTED_VERSION}
    admin = coordinator.commit_offsets(GROUP, "", None, -1, offsets, 9)
    assert now(admin) == {("a", 0): ErrorCode.UNKNOWN_MEMBER_ID}  # not while it has members
    ok = await coordinator.commit_offsets(GROUP, "m1", None, 1, offsets, 9)
    assert ok == {("a", 0): ErrorCode.NONE}
    assert coordinator.fetch_offsets(GROUP, [("a", 0)])[("a", 0)].offset == 5
    assert coordinator.validate_offset_fetch(GROUP, "m1", 1) is None
    assert coordinator.validate_offset_fetch(GROUP, "m1", 0) == ErrorCode.STALE_MEMBER_EPOCH
    assert coordinator.validate_offset_fetch(GROUP, "x", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coordinator.validate_offset_fetch(GROUP, None, -1) is None
    txn = await coordinator.commit_transactional_offsets(GROUP, 7, 0, "m1", None, 0, offsets)
    assert txn == {("a", 0): ErrorCode.ILLEGAL_GENERATION}
    hb(parts, "m1", -1)
    # Empty: an admin tool's commit (no member, generation -1) is taken.
    admin = await coordinator.commit_offsets(GROUP, "", None, -1,
                                             {("a", 1): OffsetAndMetadata(9, -1, "", 0)}, 9)
    assert admin == {("a", 1): ErrorCode.NONE}
    assert not coordinator.groups.get_classic(GROUP)  # still a consumer group, not a classic one
    assert isinstance(coordinator.groups.get(GROUP), type(group(parts)))
    missing = coordinator.commit_offsets("nobody", "m", None, 3, offsets, 9)
    assert now(missing) == {("a", 0): ErrorCode.GROUP_ID_NOT_FOUND}


async def test_group_survives_a_restart_empty(tmp_path: Path) -> None:
    """The group epoch and the offsets come back; members do not, so an old member is told
    UNKNOWN_MEMBER_ID and rejoins."""
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic("a", 4, {})
    hb(c, "m1", 0)
    assert await c.coordinator.commit_offsets(
        GROUP, "m1", None, 1, {("a", 2): OffsetAndMetadata(7, -1, "x", 0)}, 9) == {
        ("a", 2): ErrorCode.NONE}
    await settle()
    await c.close()
    c = build(tmp_path / "logs", OVERRIDES)
    try:
        g = group(c)
        assert (g.group_epoch, g.state, g.members) == (1, ConsumerGroupState.EMPTY, {})
        assert c.coordinator.fetch_offsets(GROUP, [("a", 2)])[("a", 2)].offset == 7
        assert hb(c, "m1", 1).error == ErrorCode.UNKNOWN_MEMBER_ID
        r = hb(c, "m1", 0)
        assert (r.error, r.member_epoch) == (ErrorCode.NONE, 2)
    finally:
        await c.close()
