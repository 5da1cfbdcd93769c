"""Topics and partition states in the store: the controller creates, grows and deletes topics
and elects leaders when brokers go and come back; every broker's watcher, replica transitions
and metadata cache follow. Each test runs against a real etcd and the in-process store, with
two or three brokers (registration, election, liveness view, watcher) on one store."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable

import pytest

from broker.cluster.controller import ControllerContext, ControllerElection, ControllerMoved
from broker.cluster.liveness import BrokerLivenessView
from broker.cluster.membership import ClusterMembership
from broker.cluster.metadata_cache import ClusterMetadataCache
from broker.cluster.partition_watcher import (
    LeaderAndIsr,
    LocalReplicaTransitions,
    PartitionStateWatcher,
    PartitionUpdate,
)
from broker.cluster.placement import PlacementError
from broker.cluster.registration import BrokerInfo, BrokerRegistration
from broker.cluster.store import MetadataStore, StoreUnavailable
from broker.cluster.topic_controller import (
    ControllerDuties,
    TopicController,
    plan_topic,
    propose_topic,
)
from broker.cluster.topic_state import (
    PartitionState,
    config_key,
    state_key,
    topic_key,
)
from protocol.errors import ErrorCode
from tests.cluster.conftest import Backend

pytestmark = pytest.mark.timeout(90)

TTL = 1


def info(node_id: int) -> BrokerInfo:
    return BrokerInfo(node_id, {"PLAINTEXT": ("127.0.0.1", 9000 + node_id)},
                      {"PLAINTEXT": "PLAINTEXT"})


class Replicas:
    """A ReplicaListener: what the broker's replica manager was told, partition by
    partition."""

    def __init__(self) -> None:
        self.leading: dict[tuple[str, int], LeaderAndIsr] = {}
        self.following: dict[tuple[str, int], LeaderAndIsr] = {}
        self.deleted: list[tuple[str, str, int]] = []

    def become_leader(self, p: LeaderAndIsr) -> None:
        self.following.pop((p.topic, p.partition), None)
        self.leading[(p.topic, p.partition)] = p

    def become_follower(self, p: LeaderAndIsr) -> None:
        self.leading.pop((p.topic, p.partition), None)
        self.following[(p.topic, p.partition)] = p

    def partition_deleted(self, topic: str, topic_id: str, partition: int) -> None:
        self.leading.pop((topic, partition), None)
        self.following.pop((topic, partition), None)
        self.deleted.append((topic, topic_id, partition))


class Node:
    """One broker's cluster pieces on its own store client."""

    def __init__(self, backend: Backend, node_id: int) -> None:
        self.backend = backend
        self.node_id = node_id
        self.replicas = Replicas()

    async def start(self) -> Node:
        self.store: MetadataStore = await self.backend.new_client()
        self.liveness = BrokerLivenessView(self.store)
        self.duties = ControllerDuties(lambda: self.liveness, rng=random.Random(self.node_id))
        self.liveness.on_change = self.duties.brokers_changed
        self.cache = ClusterMetadataCache(self.liveness)
        self.watcher = PartitionStateWatcher(self.store, listeners=[
            LocalReplicaTransitions(self.node_id, self.replicas), self.cache])
        self.registration = BrokerRegistration(self.store, info(self.node_id), ttl_s=TTL)
        self.election = ControllerElection(self.store, self.node_id,
                                           on_elected=self.duties.elected,
                                           on_resigned=self.duties.resigned)
        self.registration.add_listener(self.election)
        await self.liveness.start()
        await self.watcher.start()
        await self.registration.start()
        return self

    @property
    def controller(self) -> TopicController | None:
        c = self.duties.controller
        return c if c is not None and c.context.active else None

    async def crash(self) -> None:
        """Stop everything without a goodbye: the lease is left to expire."""
        await self.watcher.stop()
        await self.liveness.stop()
        await self.duties.stop()
        task, self.election._task = self.election._task, None
        if task is not None:
            task.cancel()
        keeper = self.registration.keeper
        assert keeper is not None
        await keeper.stop()

    async def stop(self) -> None:
        await self.election.stop()
        await self.duties.stop()
        await self.watcher.stop()
        await self.liveness.stop()
        await self.registration.stop()


async def cluster(backend: Backend, n: int) -> list[Node]:
    nodes = [await Node(backend, i).start() for i in range(1, n + 1)]
    assert await backend.eventually(
        lambda: sum(1 for x in nodes if x.controller) == 1
        and all(len(x.liveness.live) == n for x in nodes), within_s=5)
    return nodes


def controller_of(nodes: list[Node]) -> TopicController:
    found = [x.controller for x in nodes if x.controller is not None]
    assert len(found) == 1
    return found[0]


def leaders(node: Node, topic: str) -> dict[int, tuple[int, int, list[int]]]:
    """(leader, leader epoch, isr) by partition, as the broker's metadata cache has them."""
    meta = node.cache.topic(topic)
    return {} if meta is None else {
        p: (m.leader, m.leader_epoch, m.isr) for p, m in meta.partitions.items()}


async def stop_all(nodes: list[Node]) -> None:
    for x in nodes:
        await x.stop()


async def test_created_topics_reach_every_brokers_watcher_with_the_same_leaders(
    backend: Backend,
) -> None:
    nodes = await cluster(backend, 3)
    try:
        controller = controller_of(nodes)
        one = await controller.create_topic("one", 3, 1, configs={"retention.ms": "1000"})
        two = await controller.create_topic("two", 3, 2)
        assert one.ok and two.ok and one.partitions is not None and two.partitions is not None
        assert all(len(r) == 1 for r in one.partitions.values())
        assert all(len(r) == 2 and len(set(r)) == 2 for r in two.partitions.values())

        # Kafka's documents: the assignment, the configs, each partition's LeaderAndIsr.
        s = backend.store
        kv = await s.get(topic_key("two"))
        assert kv is not None
        doc = json.loads(kv.value)
        assert doc["version"] == 3 and doc["topic_id"] == two.topic_id
        assert doc["partitions"] == {str(p): r for p, r in two.partitions.items()}
        conf = await s.get(config_key("one"))
        assert conf is not None
        assert json.loads(conf.value) == {"version": 1, "config": {"retention.ms": "1000"}}
        for p, replicas in two.partitions.items():
            skv = await s.get(state_key("two", p))
            assert skv is not None and skv.version == 1
            assert json.loads(skv.value) == {
                "version": 1, "leader": replicas[0], "leader_epoch": 0, "isr": replicas,
                "controller_epoch": controller.context.epoch}

        expected = {
            "one": {p: (r[0], 0, r) for p, r in one.partitions.items()},
            "two": {p: (r[0], 0, r) for p, r in two.partitions.items()}}

        def agreed() -> bool:
            return all(leaders(x, t) == expected[t] for x in nodes for t in expected)

        assert await backend.eventually(agreed, within_s=5)
        for x in nodes:
            meta = x.cache.topic("two")
            assert meta is not None and meta.topic_id == two.topic_id
            assert all(not m.offline_replicas for m in meta.partitions.values())
            assert [b.node_id for b in x.cache.live_brokers("PLAINTEXT")] == [1, 2, 3]
            assert x.cache.live_brokers("PLAINTEXT")[0].port == 9001
            # The replica transitions: exactly the partitions this broker holds.
            for t, placed in (("one", one.partitions), ("two", two.partitions)):
                for p, r in placed.items():
                    if r[0] == x.node_id:
                        led = x.replicas.leading[(t, p)]
                        assert (led.leader_epoch, led.isr, led.replicas,
                                led.partition_epoch) == (0, r, r, 0)
                    elif x.node_id in r:
                        assert x.replicas.following[(t, p)].leader == r[0]
                    else:
                        assert (t, p) not in x.replicas.leading
                        assert (t, p) not in x.replicas.following
    finally:
        await stop_all(nodes)


async def test_a_lost_brokers_partitions_get_a_new_leader_or_go_offline_until_it_returns(
    backend: Backend,
) -> None:
    nodes = await cluster(backend, 3)
    try:
        controller = controller_of(nodes)
        victim = next(x for x in nodes if x.controller is None)
        other = next(x for x in nodes if x is not victim and x.controller is None)
        v, o = victim.node_id, other.node_id
        assert (await controller.create_topic("two", assignment={0: [v, o], 1: [o, v]})).ok
        assert (await controller.create_topic("one", assignment={0: [v]})).ok
        # A topic allowing unclean election, whose ISR (as a leader would have shrunk it) has
        # only the victim left.
        assert (await controller.create_topic(
            "dirty", assignment={0: [v, o]},
            configs={"unclean.leader.election.enable": "true"})).ok
        await backend.store.put(state_key("dirty", 0), PartitionState(v, 1, [v], 1).encode())
        assert await backend.eventually(
            lambda: ("one", 0) in victim.replicas.leading
            and ("two", 0) in other.replicas.following
            and leaders(other, "dirty") == {0: (v, 1, [v])}, within_s=5)

        await victim.crash()  # its lease expires after the TTL
        after_loss = {"two": {0: (o, 1, [o]), 1: (o, 1, [o])}, "one": {0: (-1, 1, [v])},
                      "dirty": {0: (o, 2, [o])}}
        survivors = [x for x in nodes if x is not victim]
        assert await backend.eventually(
            lambda: all(leaders(x, t) == after_loss[t] for x in survivors for t in after_loss),
            within_s=TTL + 5)
        two0 = other.replicas.leading[("two", 0)]
        assert (two0.leader_epoch, two0.isr, two0.partition_epoch) == (1, [o], 1)
        assert other.replicas.leading[("two", 1)].leader_epoch == 1  # the ISR shrank
        skv = await backend.store.get(state_key("one", 0))
        assert skv is not None
        assert PartitionState.from_kv(skv) == PartitionState(
            -1, 1, [v], controller.context.epoch, 1)
        meta = other.cache.topic("one")
        assert meta is not None and meta.partitions[0].offline_replicas == [v]
        assert not meta.partitions[0].leader_available

        # It comes back (registers again, with a new epoch): its ISR partition is led again.
        back = await Node(backend, v).start()
        nodes[nodes.index(victim)] = back
        after_return = {"two": {0: (o, 1, [o]), 1: (o, 1, [o])}, "one": {0: (v, 2, [v])},
                        "dirty": {0: (o, 2, [o])}}
        assert await backend.eventually(
            lambda: all(leaders(x, t) == after_return[t] for x in nodes for t in after_return),
            within_s=5)
        assert back.replicas.leading[("one", 0)].leader_epoch == 2
        # Not in the ISR of "two": a follower, until the leader takes it back into the ISR.
        assert back.replicas.following[("two", 0)].leader == o
        assert other.cache.topic("one").partitions[0].offline_replicas == []  # type: ignore[union-attr]
    finally:
        await stop_all(nodes)


async def test_partitions_are_added_as_kafka_places_them_and_deleted_topics_go_everywhere(
    backend: Backend,
) -> None:
    nodes = await cluster(backend, 3)
    try:
        controller = controller_of(nodes)
        made = await controller.create_topic("grow", assignment={0: [2, 3], 1: [3, 1]})
        assert made.ok
        grown = await controller.create_partitions("grow", 5)
        # Kafka's addPartitions: round robin from the broker leading partition 0 (index 1 of
        # 1, 2, 3), partition ids and shift continuing from 2.
        assert grown.ok and grown.partitions == {0: [2, 3], 1: [3, 1], 2: [1, 3], 3: [2, 3],
                                                 4: [3, 1]}
        assert grown.topic_id == made.topic_id
        same = await controller.create_partitions("grow", 5)
        assert same.error_code is ErrorCode.INVALID_PARTITIONS
        assert "5 would not be an increase" in (same.message or "")
        assert (await controller.create_partitions("nope", 3)).error_code is (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        assert await backend.eventually(
            lambda: all(len(leaders(x, "grow")) == 5 for x in nodes), within_s=5)
        assert ("grow", 4) in nodes[2].replicas.leading  # broker 3 leads partition 4

        assert (await controller.delete_topic("grow")).ok
        assert (await controller.delete_topic("grow")).error_code is (
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        assert await backend.eventually(
            lambda: all(x.cache.topic("grow") is None for x in nodes), within_s=5)
        listing = await backend.store.get_prefix("/")
        assert [kv.key for kv in listing.kvs if "grow" in kv.key] == []
        for x in nodes:
            held = sum(1 for r in grown.partitions.values() if x.node_id in r)
            assert sorted(d for d in x.replicas.deleted) == sorted(
                ("grow", made.topic_id, p) for p, r in grown.partitions.items()
                if x.node_id in r)
            assert len(x.replicas.deleted) == held
            assert not x.replicas.leading and not x.replicas.following

        # The name again: a new topic id, reported afresh.
        again = await controller.create_topic("grow", 1, 3)
        assert again.ok and again.topic_id != made.topic_id
        assert await backend.eventually(
            lambda: all(x.cache.topic_name_of(again.topic_id or "") == "grow" for x in nodes),
            within_s=5)
        assert (await controller.create_topic("a/b", 1, 1)).error_code is (
            ErrorCode.INVALID_TOPIC_EXCEPTION)
        assert (await controller.create_topic("big", 1, 4)).error_code is (
            ErrorCode.INVALID_REPLICATION_FACTOR)
    finally:
        await stop_all(nodes)


async def test_a_deposed_controllers_topic_create_is_refused(backend: Backend) -> None:
    nodes = await cluster(backend, 2)
    try:
        first = controller_of(nodes)
        zombie = TopicController(dataclasses.replace(first.context), first.liveness)
        old = next(x for x in nodes if x.controller is first)
        lease = old.registration.lease
        assert lease is not None
        await (await backend.new_client()).revoke_lease(lease.id)  # its registration goes
        assert await backend.eventually(
            lambda: any(x.controller is not None and x.controller.context.epoch == 2
                        for x in nodes), within_s=TTL + 5)
        with pytest.raises(ControllerMoved):
            await zombie.create_topic("zombie", 1, 1)
        with pytest.raises(ControllerMoved):
            await first.create_topic("zombie", 1, 1)  # resigned
        assert await backend.store.get(topic_key("zombie")) is None
        assert await backend.store.get(state_key("zombie", 0)) is None
        assert (await controller_of(nodes).create_topic("zombie", 1, 1)).ok
    finally:
        await stop_all(nodes)


async def test_of_two_concurrent_creates_of_one_name_exactly_one_wins(backend: Backend) -> None:
    nodes = await cluster(backend, 2)
    try:
        controller = controller_of(nodes)
        # Two writers with the same (valid) epoch on two clients: only etcd's compare decides.
        twin_context = ControllerContext(
            await backend.new_client(), controller.context.broker_id, controller.context.epoch,
            controller.context.epoch_version, controller.context.revision)
        twin = TopicController(twin_context, controller.liveness)
        results = await asyncio.gather(controller.create_topic("race", 2, 2),
                                       twin.create_topic("race", 4, 1))
        assert sorted(r.error_code for r in results) == [ErrorCode.NONE,
                                                         ErrorCode.TOPIC_ALREADY_EXISTS]
        winner = next(r for r in results if r.ok)
        loser = next(r for r in results if not r.ok)
        assert loser.message == "Topic 'race' already exists."
        kv = await backend.store.get(topic_key("race"))
        assert kv is not None and json.loads(kv.value)["topic_id"] == winner.topic_id
        listing = await backend.store.get_prefix(topic_key("race") + "/")
        assert len(listing.kvs) == len(winner.partitions or {})
    finally:
        await stop_all(nodes)


class Updates:
    def __init__(self) -> None:
        self.seen: list[PartitionUpdate] = []

    def partition_changed(self, update: PartitionUpdate) -> None:
        self.seen.append(update)


async def test_malformed_and_stale_states_are_skipped_and_the_watcher_goes_on(
    backend: Backend,
) -> None:
    nodes = await cluster(backend, 2)
    updates = Updates()
    watcher = await PartitionStateWatcher(backend.store, listeners=[updates]).start()
    try:
        controller = controller_of(nodes)
        made = await controller.create_topic("t", assignment={0: [1, 2]})
        assert made.ok
        assert await backend.eventually(lambda: len(updates.seen) == 1, within_s=5)
        s = backend.store
        good = PartitionState(1, 5, [1, 2], 1).encode()
        await s.put(state_key("t", 0), good)
        assert await backend.eventually(lambda: len(updates.seen) == 2, within_s=5)
        assert updates.seen[-1].state is not None and updates.seen[-1].state.leader_epoch == 5
        for bad in (b"{not json", b'{"leader": "1", "leader_epoch": 0, "isr": [1]}',
                    b'{"leader": 1, "leader_epoch": 6, "isr": [1, 1], "controller_epoch": 1}',
                    b'{"leader": -2, "leader_epoch": 6, "isr": [], "controller_epoch": 1}'):
            await s.put(state_key("t", 0), bad)
        await s.put(topic_key("u"), b'{"version": 3, "partitions": {"0": "x"}}')
        await s.put(state_key("t", 0), PartitionState(1, 4, [1], 1).encode())  # stale epoch
        marker = await controller.create_topic("after", assignment={0: [2]})
        assert marker.ok
        assert await backend.eventually(
            lambda: any(u.topic == "after" for u in updates.seen), within_s=5)
        assert watcher.malformed.skipped == 5 and len(watcher.malformed.seen) == 5
        assert watcher.stale_ignored == 1
        assert [u.topic for u in updates.seen] == ["t", "t", "after"]
        assert watcher.reported[("t", 0)].state.leader_epoch == 5  # type: ignore[union-attr]
        assert "u" not in watcher.topics
        # Every broker's cache still holds the last good state.
        assert await backend.eventually(
            lambda: all(leaders(x, "t") == {0: (1, 5, [1, 2])} for x in nodes), within_s=5)
        # The controller skips the malformed topic too when electing.
        assert await controller.elect_leaders() == []
    finally:
        await watcher.stop()
        await stop_all(nodes)


async def test_the_watcher_relists_after_compaction_and_reports_the_difference(
    own_backend: Backend,
) -> None:
    b = own_backend
    nodes = await cluster(b, 2)
    updates = Updates()
    watcher = await PartitionStateWatcher(b.store, listeners=[updates]).start()
    try:
        controller = controller_of(nodes)
        assert (await controller.create_topic("gone", assignment={0: [1]})).ok
        assert (await controller.create_topic("kept", assignment={0: [2]})).ok
        assert await b.eventually(lambda: len(updates.seen) == 2, within_s=5)
        await watcher.stop()
        assert (await controller.delete_topic("gone")).ok
        assert (await controller.create_topic("new", assignment={0: [2, 1]})).ok
        assert (await controller.create_topic("newer", assignment={0: [1]})).ok
        await b.store.put(state_key("kept", 0), b"garbage")  # the last good state stays
        listing = await b.store.get_prefix("/")
        await b.store.compact(listing.revision)
        await watcher.start()
        assert await b.eventually(lambda: watcher.relists == 2, within_s=5)
        assert [(u.topic, u.deleted) for u in updates.seen[2:]] == [
            ("gone", True), ("new", False), ("newer", False)]
        assert watcher.reported[("kept", 0)].state == updates.seen[1].state
        assert watcher.malformed.skipped == 1
    finally:
        await watcher.stop()
        await stop_all(nodes)


def test_offline_election_follows_kafkas_strategy() -> None:
    from broker.cluster.topic_controller import elect_leader

    s = PartitionState(1, 3, [1, 2], 7, 4)
    # The leader went: the first live ISR replica in assignment order; ISR without the dead.
    assert elect_leader([1, 3, 2], s, {2, 3}, False, 8) == PartitionState(2, 4, [2], 8, 5)
    # A follower went: the ISR shrinks, the leader stays, the epoch moves.
    assert elect_leader([1, 2], s, {1}, False, 8) == PartitionState(1, 4, [1], 8, 5)
    assert elect_leader([1, 2], s, {1, 2}, False, 8) is None
    # No live ISR member: offline, the last ISR member kept; unclean: any live replica.
    assert elect_leader([1, 2, 3], s, {3}, False, 8) == PartitionState(-1, 4, [2], 8, 5)
    assert elect_leader([1, 2, 3], s, {3}, True, 8) == PartitionState(3, 4, [3], 8, 5)
    offline = PartitionState(-1, 4, [2], 8, 5)
    assert elect_leader([1, 2, 3], offline, {1, 3}, False, 9) is None
    assert elect_leader([1, 2, 3], offline, {2}, False, 9) == PartitionState(2, 5, [2], 9, 6)


async def test_a_state_write_that_lost_its_compare_and_swap_decides_again_on_the_winner(
    backend: Backend,
) -> None:
    nodes = await cluster(backend, 2)
    try:
        controller = controller_of(nodes)
        assert (await controller.create_topic("cas", assignment={0: [1, 2]})).ok
        s = backend.store
        read = await s.get(state_key("cas", 0))
        assert read is not None
        # Another writer moves the state on after the controller read it (version 1 -> 2).
        await s.put(state_key("cas", 0), PartitionState(2, 7, [2, 1], 1).encode())
        decided: list[PartitionState] = []

        def decide(state: PartitionState) -> PartitionState:
            decided.append(state)
            return state.next(state.leader, [state.leader], controller.context.epoch)

        written = await controller._cas(read, decide)
        assert [d.leader_epoch for d in decided] == [0, 7]  # the second on the winner's state
        assert written == PartitionState(2, 8, [2], controller.context.epoch, 2)
        now = await s.get(state_key("cas", 0))
        assert now is not None and now.version == 3 and PartitionState.from_kv(now) == written
    finally:
        await stop_all(nodes)


def liveness_of(m: ClusterMembership) -> Callable[[], BrokerLivenessView | None]:
    return lambda: m.liveness


async def test_the_wiring_the_server_will_use_with_cluster_membership(backend: Backend) -> None:
    """ClusterMembership's callbacks driving ControllerDuties, as docs/cluster.md tells the
    server: the controller creates a topic, a broker leaves, its partition gets a new leader."""
    from tests.cluster.test_cluster_membership import broker_info, membership

    prefix = f"/mb-{random.randrange(1 << 32):08x}"
    members, duties = [], []
    for n in (1, 2):
        m = membership(backend, n, prefix)
        d = ControllerDuties(liveness_of(m))
        await m.register(broker_info(n), on_elected=d.elected, on_brokers=d.brokers_changed,
                         on_resigned=d.resigned)
        members.append(m)
        duties.append(d)
    try:
        def controller() -> TopicController | None:
            active = [d.controller for d in duties
                      if d.controller is not None and d.controller.context.active]
            ok = len(active) == 1 and len(active[0].liveness.live) == 2
            return active[0] if ok else None

        assert await backend.eventually(lambda: controller() is not None, within_s=5)
        c = controller()
        assert c is not None
        leaving = 2 if c.context.broker_id == 1 else 1
        staying = c.context.broker_id
        assert (await c.create_topic("wired", assignment={0: [leaving, staying]})).ok
        gone_duties, gone = duties.pop(leaving - 1), members.pop(leaving - 1)
        await gone_duties.stop()
        await gone.close()
        store = members[0].store

        async def moved() -> bool:
            kv = await store.get(state_key("wired", 0))
            return kv is not None and PartitionState.from_kv(kv).leader == staying

        assert await backend.eventually(moved, within_s=5)
        kv = await store.get(state_key("wired", 0))
        assert kv is not None
        assert PartitionState.from_kv(kv) == PartitionState(staying, 1, [staying], 1, 1)
    finally:
        for d, m in zip(duties, members, strict=True):
            await d.stop()
            await m.close()


async def test_a_broker_that_loses_its_lease_and_registers_again_hears_a_new_epoch(
    backend: Backend,
) -> None:
    nodes = await cluster(backend, 2)
    try:
        controller = controller_of(nodes)
        victim = next(x for x in nodes if x.controller is None)
        v = victim.node_id
        assert (await controller.create_topic("solo", assignment={0: [v]})).ok
        assert await backend.eventually(lambda: ("solo", 0) in victim.replicas.leading,
                                        within_s=5)
        old_epoch = victim.registration.epoch
        lease = victim.registration.lease
        assert lease is not None and old_epoch is not None
        await (await backend.new_client()).revoke_lease(lease.id)
        # It registers again by itself; its partition went offline and came back to it.
        assert await backend.eventually(
            lambda: leaders(victim, "solo") == {0: (v, 2, [v])}
            and (victim.registration.epoch or 0) > old_epoch, within_s=TTL + 5)
        assert victim.replicas.leading[("solo", 0)].leader_epoch == 2
    finally:
        await stop_all(nodes)


async def test_a_topic_another_broker_proposes_is_completed_by_the_controller(
    backend: Backend,
) -> None:
    """Auto-creation on a broker that is not the controller: the broker writes the topic's
    assignment and configs (``propose_topic``, as Kafka's AdminZkClient did); the controller
    gives every partition its first state and every broker leads or follows it. A proposal of
    a name that exists changes nothing."""
    nodes = await cluster(backend, 3)
    try:
        controller = controller_of(nodes)
        other = next(x for x in nodes if x.controller is None)
        placed = plan_topic(other.liveness, "proposed", 3, 1, rng=random.Random(1))
        assert sorted(r for rs in placed.values() for r in rs) == [1, 2, 3]
        assert await propose_topic(other.store, "proposed", placed, {"retention.ms": "1000"})

        def complete() -> bool:
            return all(len(leaders(x, "proposed")) == 3 for x in nodes)

        assert await backend.eventually(complete, within_s=5)
        for p, (leader, epoch, isr) in leaders(nodes[0], "proposed").items():
            assert (leader, epoch, isr) == (placed[p][0], 0, placed[p])
        led = {tp for x in nodes for tp in x.replicas.leading if tp[0] == "proposed"}
        assert led == {("proposed", p) for p in range(3)}
        kv = await other.store.get(state_key("proposed", 0))
        assert kv is not None
        assert PartitionState.from_kv(kv).controller_epoch == controller.context.epoch
        assert not await propose_topic(other.store, "proposed", {0: [1]})
        assert await controller.initialize_partitions("proposed") == []
        with pytest.raises(PlacementError) as refused:
            plan_topic(other.liveness, "too-many", 1, 4)
        assert refused.value.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
        with pytest.raises(PlacementError) as bad:
            plan_topic(other.liveness, "bad/name", 1, 1)
        assert bad.value.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    finally:
        await stop_all(nodes)


async def test_a_new_controller_completes_a_proposal_made_while_there_was_none(
    backend: Backend,
) -> None:
    """A topic proposed and never completed (no controller at the time) is found by the next
    controller's listing at failover."""
    nodes = await cluster(backend, 2)
    try:
        old = next(x for x in nodes if x.controller is not None)
        await old.duties.stop()  # no controller duties anywhere for now
        assert await propose_topic(old.store, "orphan", {0: [1], 1: [2]})
        await backend.sleep(0.3)
        assert leaders(nodes[0], "orphan") == {}  # no states: not a topic yet for the cache
        await old.crash()
        survivor = next(x for x in nodes if x is not old)
        assert await backend.eventually(
            lambda: len(leaders(survivor, "orphan")) == 2, within_s=TTL + 5)
        # The partition of the crashed broker has no live replica: offline.
        states = leaders(survivor, "orphan")
        assert states[survivor.node_id - 1][0] == survivor.node_id
    finally:
        await stop_all(nodes)


async def test_a_controller_places_topics_only_once_its_view_has_listed_the_brokers(
        backend: Backend) -> None:
    """Just elected (etcd just back), the controller's liveness view is still empty: a create
    waits for the listing rather than refusing for want of brokers, and answers a retriable
    StoreUnavailable when the listing does not come."""
    nodes = await cluster(backend, 2)
    try:
        elected = controller_of(nodes)
        fresh_view = BrokerLivenessView(elected.store)  # not started: nothing listed yet
        controller = TopicController(elected.context, fresh_view, brokers_known_timeout_s=0.3)
        with pytest.raises(StoreUnavailable):
            await controller.create_topic("early", 2, 2)
        with pytest.raises(StoreUnavailable):
            await controller.create_partitions("early", 3)
        assert await backend.store.get(topic_key("early")) is None
        controller.brokers_known_timeout_s = 10
        creating = asyncio.create_task(controller.create_topic("early", 2, 2))
        await asyncio.sleep(0.1)
        assert not creating.done()  # waiting for the listing, not refused
        await fresh_view.start()
        try:
            result = await creating
            assert result.ok, result
            assert result.partitions is not None
            assert {len(r) for r in result.partitions.values()} == {2}
        finally:
            await fresh_view.stop()
    finally:
        await stop_all(nodes)
