"""The classic group coordinator on a manual clock: Kafka's timing rules, to the millisecond.

The rules checked are Kafka's (GroupCoordinator, InitialDelayedJoin, DelayedHeartbeat,
MemberMetadata.hasSatisfiedHeartbeat): the first rebalance of an empty group waits
group.initial.rebalance.delay.ms once, and again only for members arriving while it waits, never
past the rebalance timeout; a member whose JoinGroup or SyncGroup is parked cannot heartbeat, so
it is never expired meanwhile; a member that stops heartbeating is removed at its session
timeout. Time moves only through ``clock.advance``; nothing here sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.group.classic_group import GroupState
from broker.group.classic_member import JoinResult
from broker.group.offset_cache import OffsetAndMetadata
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode
from tests.support.components import Components, build, settle

GROUP = "g"
SESSION_MS = 6000
INITIAL_DELAY_MS = 3000  # the broker's default, which these tests rely on
SUBSCRIPTION = b"subscription"
PROTOCOLS = [("range", SUBSCRIPTION)]
OVERRIDES = {"offsets.topic.num.partitions": "3"}


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    assert c.config["group.initial.rebalance.delay.ms"] == INITIAL_DELAY_MS
    yield c
    await c.close()


def join(c: Components, member_id: str = "", *, instance: str | None = None,
         client: str = "client", rebalance_ms: int = 300_000, require_known_id: bool = True,
         group: str = GROUP) -> Completion[JoinResult]:
    return c.coordinator.join_group(group, member_id, instance, require_known_id, client,
                                    "127.0.0.1", rebalance_ms, SESSION_MS, "consumer", PROTOCOLS)


def join_new(c: Components, client: str, *, rebalance_ms: int = 300_000,
             require_known_id: bool = True) -> tuple[str, Completion[JoinResult]]:
    """A new dynamic member, joining as clients do: from JoinGroup v4 the broker first hands
    out a member id (MEMBER_ID_REQUIRED) and the client joins again with it."""
    first = join(c, client=client, rebalance_ms=rebalance_ms, require_known_id=require_known_id)
    if require_known_id:
        assert first.done() and first.result().error == ErrorCode.MEMBER_ID_REQUIRED
        member_id = first.result().member_id
        parked = join(c, member_id, client=client, rebalance_ms=rebalance_ms)
    else:
        parked = first
        [member_id] = [m for m in c.coordinator.groups.classic(GROUP).members
                       if m.startswith(client + "-")]
    assert isinstance(parked, Completion) and not parked.done(), parked
    return member_id, parked


def now(answer: Completion[Any]) -> Any:
    """An answer known at once."""
    assert answer.done(), "waiting"
    return answer.result()


def sync(c: Components, member_id: str, generation: int,
         assignments: dict[str, bytes] | None = None, group: str = GROUP):
    return c.coordinator.sync_group(group, generation, member_id, None, "consumer", "range",
                                    assignments or {})


def heartbeat(c: Components, member_id: str, generation: int, instance: str | None = None
              ) -> ErrorCode:
    return c.coordinator.heartbeat(GROUP, member_id, instance, generation)


def state(c: Components, group: str = GROUP) -> GroupState:
    return c.coordinator.groups.classic(group).state


async def stable_pair(c: Components, rebalance_ms: int = 300_000
                      ) -> tuple[str, str]:
    """Leader A and follower B in a Stable generation 1, at t=6000 (B's arrival during the
    initial delay extended it once)."""
    a, join_a = join_new(c, "a", rebalance_ms=rebalance_ms)
    b, join_b = join_new(c, "b", rebalance_ms=rebalance_ms)
    await c.advance(2 * INITIAL_DELAY_MS)
    assert join_a.done() and join_b.done()
    assert join_a.result().leader_id == a and join_a.result().generation_id == 1
    sync_a = sync(c, a, 1, {a: b"for-a", b: b"for-b"})
    sync_b = sync(c, b, 1)
    await settle()
    assert sync_a.result() == (ErrorCode.NONE, b"for-a")  # type: ignore[union-attr]
    assert sync_b.result() == (ErrorCode.NONE, b"for-b")  # type: ignore[union-attr]
    assert state(c) == GroupState.STABLE
    return a, b


# -- the initial delay -------------------------------------------------------------------------

@pytest.mark.parametrize("require_known_id", [True, False], ids=["join-v4+", "join-v0-3"])
async def test_group_of_one_forms_when_the_initial_delay_passes_once(
        parts: Components, require_known_id: bool) -> None:
    """A lone member is not a member who arrived during the delay: one delay, not two."""
    member, joined = join_new(parts, "solo", require_known_id=require_known_id)
    await parts.advance(INITIAL_DELAY_MS - 1)
    assert not joined.done(), "answered before group.initial.rebalance.delay.ms"
    await parts.advance(1)
    assert joined.done(), "a group of one waited longer than one initial delay"
    result = joined.result()
    assert result.error == ErrorCode.NONE
    assert (result.generation_id, result.leader_id, result.member_id) == (1, member, member)
    assert result.members == [(member, None, SUBSCRIPTION)]
    assert state(parts) == GroupState.COMPLETING_REBALANCE
    assert parts.coordinator.rebalances[GROUP] == 1


async def test_members_arriving_during_the_delay_extend_it_and_share_a_generation(
        parts: Components) -> None:
    """Each arrival during a delay buys one more delay; a delay nobody arrived in ends it."""
    a, join_a = join_new(parts, "a")
    await parts.advance(1000)
    b, join_b = join_new(parts, "b")  # during the first delay: a second one follows
    await parts.advance(3000)  # t=4000, in the second delay
    c, join_c = join_new(parts, "c")  # a third one follows
    await parts.advance(4999)  # t=8999
    assert not any(f.done() for f in (join_a, join_b, join_c))
    await parts.advance(1)  # t=9000: the third delay saw no arrival
    results = [f.result() for f in (join_a, join_b, join_c)]
    assert [r.error for r in results] == [ErrorCode.NONE] * 3
    assert {r.generation_id for r in results} == {1}
    assert {r.leader_id for r in results} == {a}
    assert [r.member_id for r in results] == [a, b, c]
    assert {m for m, _i, _meta in results[0].members} == {a, b, c}
    assert results[1].members == [] and results[2].members == []
    assert parts.coordinator.rebalances[GROUP] == 1


async def test_the_initial_delay_never_outlasts_the_rebalance_timeout(parts: Components) -> None:
    """Arrivals every 2 s would extend it forever; the rebalance timeout (10 s) caps it."""
    rebalance_ms = 10_000
    members, joins = [], []
    for at in (0, 2000, 4000, 6000, 8000, 9500):
        await parts.advance(at - parts.clock.time())
        member, fut = join_new(parts, f"m{at}", rebalance_ms=rebalance_ms)
        members.append(member)
        joins.append(fut)
    await parts.advance(rebalance_ms - 1 - parts.clock.time())
    assert not any(f.done() for f in joins), "the join ended before the rebalance timeout"
    await parts.advance(1)
    assert all(f.done() for f in joins), "the join outlasted the rebalance timeout"
    results = [f.result() for f in joins]
    assert {(r.error, r.generation_id, r.leader_id) for r in results} == {
        (ErrorCode.NONE, 1, members[0])}
    assert set(parts.coordinator.groups.classic(GROUP).members) == set(members)


# -- sessions while waiting on the broker ------------------------------------------------------

async def test_member_with_a_parked_join_outlives_its_session(parts: Components) -> None:
    """A rejoining member waits on the broker, so it cannot heartbeat: it stays a member while
    the rebalance waits (here for B, who heartbeats but never rejoins) up to its timeout."""
    rebalance_ms = 20_000
    a, b = await stable_pair(parts, rebalance_ms)
    started = parts.clock.time()
    rejoin = join(parts, a, client="a", rebalance_ms=rebalance_ms)  # the leader rejoins
    assert isinstance(rejoin, Completion)
    assert state(parts) == GroupState.PREPARING_REBALANCE
    for _ in range(9):  # to t0+18000, three sessions past A's last heartbeat
        await parts.advance(2000)
        assert heartbeat(parts, b, 1) == ErrorCode.REBALANCE_IN_PROGRESS
    await parts.advance(rebalance_ms - 1 - (parts.clock.time() - started))
    group = parts.coordinator.groups.classic(GROUP)
    assert a in group.members, "a member awaiting its JoinGroup was expired by its session"
    assert not rejoin.done()
    await parts.advance(1)  # the rebalance timeout: B never rejoined and is dropped
    result = rejoin.result()
    assert (result.error, result.generation_id, result.leader_id) == (ErrorCode.NONE, 2, a)
    assert list(group.members) == [a]


async def test_member_with_a_parked_sync_outlives_its_session(parts: Components) -> None:
    """A follower whose SyncGroup waits for the leader's assignment cannot heartbeat either."""
    a, join_a = join_new(parts, "a", rebalance_ms=60_000)
    b, join_b = join_new(parts, "b", rebalance_ms=60_000)
    await parts.advance(2 * INITIAL_DELAY_MS)
    assert join_a.result().generation_id == join_b.result().generation_id == 1
    waiting = sync(parts, b, 1)
    assert isinstance(waiting, Completion)
    for _ in range(7):  # 14 s, over two of B's sessions; the leader heartbeats, never syncs
        await parts.advance(2000)
        assert heartbeat(parts, a, 1) == ErrorCode.NONE
    assert b in parts.coordinator.groups.classic(GROUP).members, (
        "a member awaiting its SyncGroup was expired by its session")
    assert not waiting.done()
    assert state(parts) == GroupState.COMPLETING_REBALANCE
    leader = sync(parts, a, 1, {a: b"for-a", b: b"for-b"})
    await settle()
    assert leader.result() == (ErrorCode.NONE, b"for-a")  # type: ignore[union-attr]
    assert waiting.result() == (ErrorCode.NONE, b"for-b")
    assert state(parts) == GroupState.STABLE


async def test_member_that_never_syncs_is_removed_at_the_rebalance_timeout(
        parts: Components) -> None:
    """The other side of the rule above: waiting on the broker is not a licence to never ask.
    Kafka removes the members that sent no SyncGroup within the rebalance timeout of the join
    (GroupCoordinator.onExpirePendingSync), heartbeats or not, and rebalances."""
    rebalance_ms = 20_000
    a, join_a = join_new(parts, "a", rebalance_ms=rebalance_ms)
    b, join_b = join_new(parts, "b", rebalance_ms=rebalance_ms)
    await parts.advance(2 * INITIAL_DELAY_MS)
    joined_at = parts.clock.time()
    assert join_a.result().generation_id == join_b.result().generation_id == 1
    leader = sync(parts, a, 1, {a: b"for-a", b: b"for-b"})
    await settle()
    assert leader.result() == (ErrorCode.NONE, b"for-a")  # type: ignore[union-attr]
    for _ in range(9):  # B heartbeats, yet never sends its SyncGroup
        await parts.advance(2000)
        assert heartbeat(parts, a, 1) == heartbeat(parts, b, 1) == ErrorCode.NONE
    await parts.advance(joined_at + rebalance_ms - 1 - parts.clock.time())
    assert b in parts.coordinator.groups.classic(GROUP).members
    await parts.advance(1)
    assert b not in parts.coordinator.groups.classic(GROUP).members, (
        "a member that never synced outlived the rebalance timeout")
    assert state(parts) == GroupState.PREPARING_REBALANCE


async def test_silent_member_of_a_stable_group_is_removed_at_its_session_timeout(
        parts: Components) -> None:
    a, b = await stable_pair(parts)
    last_heartbeat = parts.clock.time()  # both sessions were renewed when the group went Stable
    await parts.advance(2000)
    assert heartbeat(parts, b, 1) == ErrorCode.NONE
    await parts.advance(2000)
    assert heartbeat(parts, b, 1) == ErrorCode.NONE
    await parts.advance(last_heartbeat + SESSION_MS - 1 - parts.clock.time())
    assert a in parts.coordinator.groups.classic(GROUP).members, (
        "expired before its session timeout")
    assert state(parts) == GroupState.STABLE
    await parts.advance(1)
    group = parts.coordinator.groups.classic(GROUP)
    assert a not in group.members, "not expired at its session timeout"
    assert state(parts) == GroupState.PREPARING_REBALANCE
    assert parts.coordinator.rebalances[GROUP] == 2
    assert heartbeat(parts, b, 1) == ErrorCode.REBALANCE_IN_PROGRESS
    assert heartbeat(parts, a, 1) == ErrorCode.UNKNOWN_MEMBER_ID
    rejoin = join(parts, b, client="b")  # the last member to rejoin completes the join
    assert isinstance(rejoin, Completion) and rejoin.done()
    result = rejoin.result()
    assert (result.error, result.generation_id, result.leader_id) == (ErrorCode.NONE, 2, b)


# -- static membership -------------------------------------------------------------------------

async def test_static_member_restart_keeps_its_assignment_without_a_rebalance(
        parts: Components) -> None:
    """KIP-345: the restarted instance takes over its identity; nobody else is disturbed."""
    first = join(parts, instance="instance-1")
    assert isinstance(first, Completion)
    await parts.advance(INITIAL_DELAY_MS)
    old = first.result()
    assert (old.error, old.generation_id) == (ErrorCode.NONE, 1)
    synced = sync(parts, old.member_id, 1, {old.member_id: b"partitions-of-1"})
    await settle()
    assert synced.result() == (ErrorCode.NONE, b"partitions-of-1")  # type: ignore[union-attr]

    rejoin = join(parts, instance="instance-1")  # a restart: no member id, same instance
    await settle()
    assert isinstance(rejoin, Completion) and rejoin.done()
    new = rejoin.result()
    assert new.error == ErrorCode.NONE
    assert new.member_id != old.member_id
    assert new.generation_id == 1, "a static member's restart started a new generation"
    # The old leader id, so the restarted leader does not run the assignor again (Kafka).
    assert (new.leader_id, new.members) == (old.member_id, [])
    assert state(parts) == GroupState.STABLE
    assert parts.coordinator.rebalances[GROUP] == 1
    assert now(sync(parts, new.member_id, 1)) == (ErrorCode.NONE, b"partitions-of-1")
    assert heartbeat(parts, new.member_id, 1, "instance-1") == ErrorCode.NONE
    assert heartbeat(parts, old.member_id, 1, "instance-1") == ErrorCode.FENCED_INSTANCE_ID


# -- offsets -----------------------------------------------------------------------------------

async def test_offsets_round_trip_and_a_fresh_coordinator_loads_them(tmp_path: Path) -> None:
    """Commits are answered once in __consumer_offsets; a coordinator built over the same logs
    (a restart) rebuilds the offsets and the Stable group from them alone."""
    c = build(tmp_path / "logs", OVERRIDES)
    try:
        c.topics.create_topic("orders", 2, {})
        om = {("orders", 0): OffsetAndMetadata(42, 3, "checkpoint", 1_700_000_000_000),
              ("orders", 1): OffsetAndMetadata(7, -1, "", 1_700_000_000_001)}
        standalone = c.coordinator.commit_offsets(
            "standalone", "", None, -1, {**om, ("no-such-topic", 0): om[("orders", 0)]})
        assert isinstance(standalone, Completion)
        await settle()
        assert standalone.result() == {("orders", 0): ErrorCode.NONE,
                                       ("orders", 1): ErrorCode.NONE,
                                       ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert c.coordinator.fetch_offsets("standalone", [("orders", 0), ("orders", 1),
                                                          ("orders", 2)]) == {
            ("orders", 0): om[("orders", 0)], ("orders", 1): om[("orders", 1)],
            ("orders", 2): None}

        a, b = await stable_pair(c)
        by_member = c.coordinator.commit_offsets(
            GROUP, b, None, 1, {("orders", 1): OffsetAndMetadata(99, 5, "b", 1_700_000_000_002)})
        await settle()
        assert by_member.result() == {("orders", 1): ErrorCode.NONE}  # type: ignore[union-attr]
        stale = c.coordinator.commit_offsets(
            GROUP, b, None, 0, {("orders", 1): OffsetAndMetadata(1, -1, "", 0)})
        assert now(stale) == {("orders", 1): ErrorCode.ILLEGAL_GENERATION}
    finally:
        await c.close()

    fresh = build(tmp_path / "logs", OVERRIDES)
    try:
        assert fresh.coordinator.fetch_offsets("standalone", None) == om
        assert fresh.coordinator.fetch_offsets(GROUP, [("orders", 1)]) == {
            ("orders", 1): OffsetAndMetadata(99, 5, "b", 1_700_000_000_002)}
        group = fresh.coordinator.groups.classic(GROUP)
        assert (group.state, group.generation_id, group.leader_id) == (GroupState.STABLE, 1, a)
        assert {m: x.assignment for m, x in group.members.items()} == {a: b"for-a", b: b"for-b"}
        # The loaded members hold sessions again: they carry on with their generation.
        assert heartbeat(fresh, b, 1) == ErrorCode.NONE
    finally:
        await fresh.close()
