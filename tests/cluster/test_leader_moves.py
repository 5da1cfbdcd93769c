"""The controller moving leadership on purpose: controlled shutdown, ElectLeaders (preferred
and unclean) and the auto leader rebalance, as Kafka's ZooKeeper-era controller decides them.
The strategies are pure functions; the TopicController's writes run against a real etcd and
the in-process store with three brokers (registration, election, liveness view, watcher)."""

from __future__ import annotations

import pytest

from broker.cluster.store import MetadataStore
from broker.cluster.topic_controller import (
    ElectionType,
    controlled_shutdown_leader,
    elect_leader,
    imbalanced_partitions,
    preferred_leader,
    without_replica,
)
from broker.cluster.topic_state import PartitionState, state_key
from protocol.errors import ErrorCode
from tests.cluster.conftest import Backend
from tests.cluster.test_topics import cluster, controller_of, leaders, stop_all

pytestmark = pytest.mark.timeout(60)


def test_controlled_shutdown_moves_leadership_to_the_first_live_isr_replica() -> None:
    s = PartitionState(1, 3, [1, 2, 3], 7, 4)
    # The first replica in assignment order that is live, in the ISR and not shutting down.
    assert controlled_shutdown_leader([1, 3, 2], s, {1, 2, 3}, {1}, 8) == PartitionState(
        3, 4, [2, 3], 8, 5)
    assert controlled_shutdown_leader([1, 2, 3], s, {1, 3}, {1}, 8) == PartitionState(
        3, 4, [2, 3], 8, 5)
    # Nobody else can lead: no change (the broker keeps it; the answer names it).
    assert controlled_shutdown_leader([1, 2, 3], PartitionState(1, 3, [1], 7), {1, 2, 3},
                                      {1}, 8) is None
    assert controlled_shutdown_leader([1, 2], s, {1, 2}, {1, 2}, 8) is None


def test_a_follower_in_controlled_shutdown_leaves_the_isr_never_emptying_it() -> None:
    s = PartitionState(2, 3, [1, 2], 7, 4)
    assert without_replica(s, 1, 8) == PartitionState(2, 4, [2], 8, 5)
    assert without_replica(s, 3, 8) is None  # not in it
    assert without_replica(PartitionState(2, 3, [1], 7, 4), 1, 8) is None


def test_preferred_election_needs_the_first_replica_live_and_in_sync() -> None:
    s = PartitionState(2, 3, [1, 2], 7, 4)
    assert preferred_leader([1, 2], s, {1, 2}, 8) == PartitionState(1, 4, [1, 2], 8, 5)
    assert preferred_leader([1, 2], s, {2}, 8) is None  # not live
    assert preferred_leader([1, 2], PartitionState(2, 3, [2], 7), {1, 2}, 8) is None
    assert preferred_leader([2, 1], s, {1, 2}, 8) is None  # already the leader


def test_a_broker_shutting_down_keeps_what_it_leads_but_is_never_elected() -> None:
    s = PartitionState(1, 3, [1, 2], 7, 4)
    assert elect_leader([1, 2], s, {1, 2}, False, 8, shutting_down={1}) is None
    gone = PartitionState(3, 3, [1, 2, 3], 7, 4)
    assert elect_leader([3, 1, 2], gone, {1, 2}, False, 8, shutting_down={1}) == PartitionState(
        2, 4, [1, 2], 8, 5)
    assert elect_leader([3, 1], PartitionState(3, 3, [3], 7), {1}, True, 8,
                        shutting_down={1}) == PartitionState(-1, 4, [3], 8, 0)


def test_the_rebalance_check_is_kafkas_per_broker_ratio() -> None:
    def st(leader: int, isr: list[int]) -> PartitionState:
        return PartitionState(leader, 1, isr, 1)

    snapshot = {("t", 0): ([1, 2], st(2, [1, 2])), ("t", 1): ([1, 2], st(1, [1, 2])),
                ("t", 2): ([1, 2], st(2, [2])), ("t", 3): ([2, 1], st(2, [1, 2]))}
    # Broker 1 prefers three partitions and leads one: 2/3 > 10 %; t-2's ISR lacks it.
    assert imbalanced_partitions(snapshot, {1, 2}, 10) == [("t", 0)]
    assert imbalanced_partitions(snapshot, {1, 2}, 67) == []  # 2/3 is not above 67 %
    assert imbalanced_partitions(snapshot, {2}, 10) == []  # broker 1 is not live


async def _put(store: MetadataStore, topic: str, p: int, state: PartitionState) -> None:
    await store.put(state_key(topic, p), state.encode())


async def test_controlled_shutdown_through_the_controllers_fenced_writes(
        backend: Backend) -> None:
    nodes = await cluster(backend, 3)
    try:
        controller = controller_of(nodes)
        a, b, c = (x.node_id for x in nodes)
        assert (await controller.create_topic("cs", assignment={0: [a, b, c], 1: [b, a, c]})).ok
        assert (await controller.create_topic("one", assignment={0: [a]})).ok
        epoch_a = controller.liveness.live[a].epoch

        stale = await controller.controlled_shutdown(a, epoch_a - 1)
        assert stale.error_code is ErrorCode.STALE_BROKER_EPOCH
        assert "old broker epoch" in (stale.message or "")
        unknown = await controller.controlled_shutdown(99, -1)
        assert (unknown.error_code, unknown.message) == (
            ErrorCode.BROKER_NOT_AVAILABLE, "Broker id 99 does not exist.")
        assert controller.shutting_down == set()

        result = await controller.controlled_shutdown(a, epoch_a)
        assert (result.error_code, result.remaining) == (ErrorCode.NONE, ())
        assert controller.shutting_down == {a}
        # Led: moved to b, a out of the ISR; followed: a out of the ISR; one replica: kept.
        want = {0: (b, 1, [b, c]), 1: (b, 1, [b, c])}
        assert await backend.eventually(
            lambda: all(leaders(x, "cs") == want and leaders(x, "one") == {0: (a, 0, [a])}
                        for x in nodes), within_s=5)
        # Asked again: nothing left to do, nothing written.
        again = await controller.controlled_shutdown(a, epoch_a)
        assert (again.error_code, again.remaining) == (ErrorCode.NONE, ())
        skv = await backend.store.get(state_key("cs", 0))
        assert skv is not None and skv.version == 2
        # A broker change meanwhile elects nobody onto the broker shutting down.
        assert await controller.elect_leaders() == []
        # b shutting down too: c takes p0 and p1; a partition only a and b replicate stays.
        assert (await controller.create_topic("ab", assignment={0: [b, a]})).ok
        result = await controller.controlled_shutdown(b, -1)
        assert (result.error_code, result.remaining) == (ErrorCode.NONE, (("ab", 0),))
        assert await backend.eventually(
            lambda: leaders(nodes[2], "cs")[0] == (c, 2, [c]), within_s=5)
    finally:
        await stop_all(nodes)


async def test_elect_leaders_preferred_and_unclean_with_kafkas_errors(backend: Backend) -> None:
    nodes = await cluster(backend, 3)
    try:
        controller = controller_of(nodes)
        a, b, c = (x.node_id for x in nodes)
        assert (await controller.create_topic(
            "el", assignment={0: [a, b], 1: [a, b], 2: [b, c], 3: [c, a]})).ok
        # As leaders would have left them: p0 led by b with a in sync, p1 led by b without a.
        await _put(backend.store, "el", 0, PartitionState(b, 1, [a, b], 1))
        await _put(backend.store, "el", 1, PartitionState(b, 1, [b], 1))
        await _put(backend.store, "el", 3, PartitionState(-1, 1, [c], 1))
        asked = [("el", 0), ("el", 1), ("el", 2), ("el", 9), ("nope", 0)]
        results = await controller.elect(asked, ElectionType.PREFERRED)
        assert {tp: r.error_code for tp, r in results.items()} == {
            ("el", 0): ErrorCode.NONE, ("el", 1): ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
            ("el", 2): ErrorCode.ELECTION_NOT_NEEDED,
            ("el", 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert results[("el", 0)].state == PartitionState(a, 2, [a, b], controller.context.epoch,
                                                           2)
        assert results[("el", 1)].message == (
            "Failed to elect leader for partition el-1 under strategy "
            "PreferredReplicaPartitionLeaderElectionStrategy")
        assert results[("nope", 0)].message == "The partition does not exist."
        again = await controller.elect([("el", 0)], ElectionType.PREFERRED)
        assert again[("el", 0)].error_code is ErrorCode.ELECTION_NOT_NEEDED

        # Unclean: only a partition without a live leader; its first live replica leads.
        unclean = await controller.elect([("el", 2), ("el", 3)], ElectionType.UNCLEAN)
        assert unclean[("el", 2)].error_code is ErrorCode.ELECTION_NOT_NEEDED
        assert unclean[("el", 3)].state is not None
        assert (unclean[("el", 3)].state.leader, unclean[("el", 3)].state.isr) == (c, [c])
        await _put(backend.store, "el", 3, PartitionState(-1, 5, [c], 1))
        for broker in (a, c):
            assert (await controller.controlled_shutdown(broker, -1)).error_code \
                is ErrorCode.NONE
        none_left = await controller.elect([("el", 3)], ElectionType.UNCLEAN)
        assert none_left[("el", 3)].error_code is ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE
        # Every partition (None): each decided, the unknown ones cannot be among them.
        every = await controller.elect(None, ElectionType.PREFERRED)
        assert set(every) == {("el", 0), ("el", 1), ("el", 2), ("el", 3)}
    finally:
        await stop_all(nodes)


async def test_the_rebalance_moves_leaders_back_to_preferred_replicas(backend: Backend) -> None:
    nodes = await cluster(backend, 3)
    try:
        controller = controller_of(nodes)
        a, b, c = (x.node_id for x in nodes)
        assert (await controller.create_topic(
            "rb", assignment={0: [a, b], 1: [a, c], 2: [a, b], 3: [b, a]})).ok
        for p, (leader, isr) in {0: (b, [a, b]), 1: (c, [c]), 2: (b, [a, b])}.items():
            await _put(backend.store, "rb", p, PartitionState(leader, 1, isr, 1))
        assert await controller.rebalance_leaders(100) == []  # 3/3 is not above 100 %
        assert await controller.rebalance_leaders(10) == [("rb", 0), ("rb", 2)]
        want = {0: (a, 2, [a, b]), 1: (c, 1, [c]), 2: (a, 2, [a, b]), 3: (b, 0, [b, a])}
        assert await backend.eventually(
            lambda: all(leaders(x, "rb") == want for x in nodes), within_s=5)
        assert await controller.rebalance_leaders(10) == []  # 1/3 led elsewhere, not electable
    finally:
        await stop_all(nodes)
