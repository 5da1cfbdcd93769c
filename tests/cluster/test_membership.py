"""Cluster id, broker registration, controller election and the liveness view, each against
a real etcd and the in-process store (``backend``: the etcd is the session's, each test under
its own key root)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from broker.cluster.cluster_id import get_or_create_cluster_id
from broker.cluster.controller import ControllerContext, ControllerElection, ControllerMoved
from broker.cluster.liveness import BrokerChange, BrokerLivenessView
from broker.cluster.paths import CLUSTER_ID, CONTROLLER, CONTROLLER_EPOCH, broker_key
from broker.cluster.placement import BrokerRack
from broker.cluster.registration import BrokerInfo, BrokerRegistration, NodeIdInUse
from broker.cluster.store import Compare, Lease, MetadataStore, Put
from tests.cluster.conftest import Backend

pytestmark = pytest.mark.timeout(60)

TTL = 1


def info(node_id: int, rack: str | None = None) -> BrokerInfo:
    return BrokerInfo(
        node_id,
        {"PLAINTEXT": ("127.0.0.1", 9000 + node_id), "SSL": ("::1", 9100 + node_id)},
        {"PLAINTEXT": "PLAINTEXT", "SSL": "SSL"},
        rack,
    )


class Events:
    """A RegistrationListener that records what it was told, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def broker_registered(self, epoch: int, lease: Lease) -> None:
        self.seen.append(("registered", epoch))

    def broker_lost(self, epoch: int, reason: str) -> None:
        self.seen.append(("lost", epoch))


async def registered(store: MetadataStore, node_id: int) -> BrokerRegistration:
    reg = BrokerRegistration(store, info(node_id), ttl_s=TTL)
    await reg.start()
    return reg


async def test_the_cluster_id_is_created_once(backend: Backend) -> None:
    other = await backend.new_client()
    ids = await asyncio.gather(get_or_create_cluster_id(backend.store, "AAAAAAAAAAAAAAAAAAAAAA"),
                               get_or_create_cluster_id(other, "BBBBBBBBBBBBBBBBBBBBBB"))
    assert ids[0] == ids[1] and ids[0] in ("AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB")
    assert await get_or_create_cluster_id(backend.store) == ids[0]  # a later broker: the same
    kv = await backend.store.get(CLUSTER_ID)
    assert kv is not None and json.loads(kv.value) == {"version": "1", "id": ids[0]}
    assert kv.version == 1


async def test_a_registration_is_kafkas_broker_znode_on_a_lease_with_its_epoch(
    backend: Backend,
) -> None:
    s = backend.store
    reg = BrokerRegistration(s, info(1, "r1"), ttl_s=TTL)
    epoch = await reg.start()
    kv = await s.get(broker_key(1))
    assert kv is not None and reg.lease is not None
    assert epoch == reg.epoch == kv.create_revision and kv.lease == reg.lease.id
    doc = json.loads(kv.value)
    assert doc["version"] == 5 and doc["rack"] == "r1"
    assert doc["endpoints"] == ["PLAINTEXT://127.0.0.1:9001", "SSL://[::1]:9101"]
    assert doc["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT", "SSL": "SSL"}
    assert (doc["host"], doc["port"]) == ("127.0.0.1", 9001)
    assert BrokerInfo.decode(1, kv.value) == info(1, "r1")
    # It stays past its TTL while kept alive; stop deregisters at once.
    await backend.sleep(TTL * 2)
    assert await s.get(broker_key(1)) == kv
    await reg.stop()
    assert await s.get(broker_key(1)) is None


async def test_a_second_broker_with_a_live_node_id_fails_and_changes_nothing(
    backend: Backend,
) -> None:
    first = await registered(backend.store, 1)
    before = await backend.store.get(broker_key(1))
    other = await backend.new_client()
    second = BrokerRegistration(other, info(1), ttl_s=TTL, where="etcd at /test")
    with pytest.raises(NodeIdInUse) as caught:
        await second.start()
    assert str(caught.value) == (
        "node.id 1 is registered by another live broker at PLAINTEXT://127.0.0.1:9001, "
        "SSL://[::1]:9101 in etcd at /test (key /brokers/ids/1): give this broker another "
        "node.id, or stop the "
        "other one (its registration goes within broker.session.timeout.ms)")
    assert await backend.store.get(broker_key(1)) == before
    assert second.epoch is None and second.keeper is None
    await first.stop()
    # Once the first is gone, the id is free.
    assert await second.start() > before.create_revision  # type: ignore[union-attr]
    await second.stop()


async def test_lease_loss_is_reported_at_once_then_the_broker_registers_with_a_new_epoch(
    backend: Backend,
) -> None:
    s = backend.store
    reg = BrokerRegistration(s, info(2), ttl_s=TTL)
    events = Events()
    reg.add_listener(events)
    first = await reg.start()
    assert events.seen == [("registered", first)]
    assert reg.lease is not None
    other = await backend.new_client()
    await other.revoke_lease(reg.lease.id)  # the lease is gone, as after a long pause

    assert await backend.eventually(lambda: len(events.seen) >= 3, within_s=TTL + 3)
    second = reg.epoch
    assert second is not None and second > first
    assert events.seen == [("registered", first), ("lost", first), ("registered", second)]
    kv = await s.get(broker_key(2))
    assert kv is not None and kv.create_revision == second and kv.lease == reg.lease.id
    assert reg.registrations == 2 and not reg.taken.is_set()
    await reg.stop()


async def test_a_node_id_taken_while_re_registering_is_reported(backend: Backend) -> None:
    s = backend.store
    reg = BrokerRegistration(s, info(3), ttl_s=TTL)
    await reg.start()
    assert reg.lease is not None
    other = await backend.new_client()
    # Another broker with node id 3 wins the key between the loss and the re-registration.
    lease = await other.grant_lease(30)
    await other.txn([], [Put(broker_key(3), info(3).encode(0), lease.id)])
    # (putting it moved the key to the other lease; now this broker's lease goes)
    await other.revoke_lease(reg.lease.id)
    assert await backend.eventually(reg.taken.is_set, within_s=TTL + 3)
    assert reg.failed is not None and "node.id 3 is registered by another" in str(reg.failed)
    assert reg.epoch is None
    kv = await s.get(broker_key(3))
    assert kv is not None and kv.lease == lease.id
    await reg.stop()
    await other.revoke_lease(lease.id)


async def elect(backend: Backend, node_id: int, won: list[ControllerContext],
                resigned: list[str]) -> tuple[BrokerRegistration, ControllerElection]:
    store = await backend.new_client()
    reg = BrokerRegistration(store, info(node_id), ttl_s=TTL)
    election = ControllerElection(store, node_id, on_elected=won.append,
                                  on_resigned=lambda ctx, why: resigned.append(why))
    reg.add_listener(election)
    await reg.start()
    return reg, election


async def test_one_controller_is_elected_and_a_deposed_ones_writes_are_refused(
    backend: Backend,
) -> None:
    s = backend.store
    won: list[ControllerContext] = []
    resigned: list[str] = []
    reg1, el1 = await elect(backend, 1, won, resigned)
    reg2, el2 = await elect(backend, 2, won, resigned)

    async def settled() -> bool:
        return len(won) == 1 and el1.active_controller_id == el2.active_controller_id == (
            won[0].broker_id)

    assert await backend.eventually(settled, within_s=5)
    first = won[0]
    assert first.epoch == 1 and first.epoch_version == 1
    epoch_kv, controller_kv = await s.get(CONTROLLER_EPOCH), await s.get(CONTROLLER)
    assert epoch_kv is not None and epoch_kv.value == b"1"
    assert controller_kv is not None
    assert json.loads(controller_kv.value)["brokerid"] == first.broker_id
    winner, loser = (reg1, reg2) if first.broker_id == 1 else (reg2, reg1)
    assert winner.lease is not None and controller_kv.lease == winner.lease.id

    # Controller writes pass the fence; a failed compare of the caller's is no ControllerMoved.
    await first.put("/brokers/topics/t", b"v1")
    missed = await first.txn([Compare.version("/brokers/topics/t", "==", 7)],
                             [Put("/brokers/topics/t", b"v2")])
    assert not missed.succeeded and missed.responses == []

    # A zombie: the same context as if it had not noticed anything yet.
    zombie = dataclasses.replace(first)
    await (await backend.new_client()).revoke_lease(winner.lease.id)  # the winner's lease goes

    async def re_elected() -> bool:
        return len(won) == 2

    assert await backend.eventually(re_elected, within_s=TTL + 5)
    second = won[1]
    assert second.broker_id == loser.info.node_id and second.epoch == 2
    # Whichever it heard of first: its key deleted with the lease, or the lease lost.
    assert not first.active and len(resigned) == 1
    assert resigned[0] == "/controller was deleted" or "registration lost" in resigned[0]
    with pytest.raises(ControllerMoved, match="resigned"):
        await first.put("/brokers/topics/t", b"from the resigned one")
    with pytest.raises(ControllerMoved, match="is stale"):
        await zombie.txn([], [Put("/brokers/topics/t", b"zombie"), Put("/brokers/topics/u", b"z")])
    assert not zombie.active
    topic = await s.get("/brokers/topics/t")
    assert topic is not None and topic.value == b"v1"
    assert await s.get("/brokers/topics/u") is None
    await second.put("/brokers/topics/t", b"v3")  # the new controller's write passes
    epoch_kv = await s.get(CONTROLLER_EPOCH)
    assert epoch_kv is not None and epoch_kv.value == b"2" and epoch_kv.version == 2

    # The old winner registers again and follows the new controller.
    async def follows() -> bool:
        return (winner.epoch is not None and not el_of(winner).is_active
                and el_of(winner).active_controller_id == second.broker_id)

    def el_of(reg: BrokerRegistration) -> ControllerElection:
        return el1 if reg is reg1 else el2

    assert await backend.eventually(follows, within_s=TTL + 5)
    for el, reg in ((el1, reg1), (el2, reg2)):
        await el.stop()
        await reg.stop()
    assert await s.get(CONTROLLER) is None


async def test_a_broker_that_lost_its_registration_names_no_controller(
    backend: Backend,
) -> None:
    """Until it is registered again and has read ``/controller``, a broker cannot know the
    controller (it may have lost its registration too): Metadata must not name it."""
    won: list[ControllerContext] = []
    resigned: list[str] = []
    reg1, el1 = await elect(backend, 1, won, resigned)
    reg2, el2 = await elect(backend, 2, won, resigned)
    try:
        assert await backend.eventually(
            lambda: len(won) == 1 and el1.active_controller_id == el2.active_controller_id
            == won[0].broker_id, within_s=5)
        follower, follower_reg = (el2, reg2) if won[0].broker_id == 1 else (el1, reg1)
        assert follower_reg.epoch is not None
        follower.broker_lost(follower_reg.epoch, "no refresh answered for the lease's TTL")
        assert follower.active_controller_id is None and resigned == []
    finally:
        for el, reg in ((el1, reg1), (el2, reg2)):
            await el.stop()
            await reg.stop()


async def test_a_deleted_controller_key_makes_the_controller_resign_and_run_again(
    backend: Backend,
) -> None:
    won: list[ControllerContext] = []
    resigned: list[str] = []
    reg, election = await elect(backend, 5, won, resigned)
    assert await backend.eventually(lambda: len(won) == 1, within_s=5)
    await backend.store.delete(CONTROLLER)  # an operator forcing a new election
    assert await backend.eventually(lambda: len(won) == 2, within_s=5)
    assert resigned == ["/controller was deleted"]
    assert not won[0].active and won[1].active and won[1].epoch == 2
    await election.stop()
    await reg.stop()


async def test_the_liveness_view_reports_brokers_that_come_go_and_come_back(
    backend: Backend,
) -> None:
    changes: list[BrokerChange] = []
    one = await registered(backend.store, 1)
    view = await BrokerLivenessView(backend.store, on_change=changes.append).start()
    assert list(view.live) == [1] and view.epoch_of(1) == one.epoch
    assert [b.info.node_id for b in changes[0].added] == [1]

    two = BrokerRegistration(await backend.new_client(), info(2, "r2"), ttl_s=TTL)
    await two.start()
    assert await backend.eventually(lambda: 2 in view.live, within_s=5)
    assert view.live[2].epoch == two.epoch and view.live[2].info == info(2, "r2")
    assert view.placement_brokers() == [BrokerRack(1), BrokerRack(2, "r2")]
    assert changes[-1].added[0].epoch == two.epoch

    assert two.lease is not None
    old = two.epoch
    await backend.store.revoke_lease(two.lease.id)  # broker 2's lease goes; it comes back
    assert await backend.eventually(
        lambda: view.epoch_of(2) not in (None, old) and two.epoch == view.epoch_of(2),
        within_s=TTL + 5)
    removed = [c for c in changes if c.removed]
    assert [(b.info.node_id, b.epoch) for b in removed[0].removed] == [(2, old)]
    assert changes[-1].added[0].epoch == two.epoch
    assert view.relists == 1

    await two.stop()
    await one.stop()
    assert await backend.eventually(lambda: not view.live, within_s=5)
    await view.stop()


async def test_a_resumed_view_re_lists_when_its_history_was_compacted(backend: Backend) -> None:
    s = backend.store
    changes: list[BrokerChange] = []
    one = await registered(s, 1)
    three = await registered(s, 3)
    view = await BrokerLivenessView(s, on_change=changes.append).start()
    await view.stop()
    old_one = one.epoch
    # While the view is stopped: 1 bounces, 2 comes, 3 goes; the history is compacted.
    await one.stop()
    await one.start()
    two = await registered(s, 2)
    await three.stop()
    await s.compact((await s.get_prefix("/")).revision)

    await view.start()
    assert await backend.eventually(lambda: view.relists == 2, within_s=5)
    last = changes[-1]
    assert [b.info.node_id for b in last.added] == [2]
    assert [b.info.node_id for b in last.removed] == [3]
    assert [(o.epoch, n.epoch) for o, n in last.bounced] == [(old_one, one.epoch)]
    assert {n: b.epoch for n, b in view.live.items()} == {1: one.epoch, 2: two.epoch}

    # Following resumes: a new broker shows up without another re-list.
    four = await registered(s, 4)
    assert await backend.eventually(lambda: 4 in view.live, within_s=5)
    assert view.relists == 2
    for reg in (one, two, four):
        await reg.stop()
    await view.stop()


async def test_a_resumed_view_catches_up_from_the_watch(backend: Backend) -> None:
    s = backend.store
    changes: list[BrokerChange] = []
    view = await BrokerLivenessView(s, on_change=changes.append).start()
    await view.stop()
    one = await registered(s, 1)
    await view.start()
    assert await backend.eventually(lambda: 1 in view.live, within_s=5)
    assert view.relists == 1 and changes[-1].added[0].epoch == one.epoch
    await one.stop()
    await view.stop()


async def test_a_store_outage_past_the_ttl_resigns_the_controller_then_it_rejoins(
    own_backend: Backend,
) -> None:
    """etcd unreachable for longer than the lease: the broker hears of the loss while etcd is
    still down (and stops acting as controller), then registers again with a new epoch and
    wins the next election once etcd is back."""
    b = own_backend
    won: list[ControllerContext] = []
    resigned: list[str] = []
    reg, election = await elect(b, 1, won, resigned)
    events = Events()
    reg.add_listener(events)
    first = reg.epoch
    assert first is not None
    assert await b.eventually(lambda: len(won) == 1, within_s=5)
    await b.take_down()
    assert await b.eventually(lambda: bool(resigned), within_s=TTL + 2)
    assert ("lost", first) in events.seen and reg.epoch is None
    assert not won[0].active and "registration lost" in resigned[0]
    await b.sleep(0.5)
    await b.bring_back()

    async def rejoined() -> bool:
        return reg.epoch is not None and len(won) == 2

    assert await b.eventually(rejoined, within_s=10)
    assert reg.epoch is not None and reg.epoch > first and won[1].epoch == 2
    assert events.seen[-1] == ("registered", reg.epoch)
    kv = await b.store.get(broker_key(1))
    assert kv is not None and kv.create_revision == reg.epoch
    await election.stop()
    await reg.stop()


async def test_the_heartbeat_interval_refreshes_sooner_than_a_third_of_the_ttl(
    backend: Backend,
) -> None:
    reg = BrokerRegistration(backend.store, info(1), ttl_s=3, heartbeat_interval_ms=100)
    await reg.start()
    assert reg.keeper is not None
    await backend.sleep(1.0)
    # ttl/3 would be one refresh a second; the heartbeat interval makes it about ten.
    assert reg.keeper.refreshes >= 5
    await reg.stop()


async def test_a_controller_key_of_ours_nobody_acts_on_is_given_up(backend: Backend) -> None:
    """An election txn that landed but whose answer was lost leaves /controller on our lease
    with no controller acting on it: the broker deletes it and runs again."""
    s = backend.store
    reg = await registered(s, 4)
    assert reg.lease is not None
    await s.put(CONTROLLER, b'{"version":2,"brokerid":4,"timestamp":"0"}', lease=reg.lease.id)
    won: list[ControllerContext] = []
    election = ControllerElection(s, 4, on_elected=won.append)
    reg.add_listener(election)
    assert await backend.eventually(lambda: len(won) == 1, within_s=5)
    kv = await s.get(CONTROLLER)
    assert kv is not None and kv.create_revision == won[0].revision and won[0].epoch == 1
    await election.stop()
    await reg.stop()


async def test_brokers_racing_for_one_node_id_or_the_controller_have_one_winner(
    backend: Backend,
) -> None:
    clients = [await backend.new_client() for _ in range(3)]
    racers = [BrokerRegistration(c, info(9), ttl_s=TTL) for c in clients]
    outcomes = await asyncio.gather(*(r.start() for r in racers), return_exceptions=True)
    winners = [o for o in outcomes if isinstance(o, int)]
    assert len(winners) == 1
    assert sum(isinstance(o, NodeIdInUse) for o in outcomes) == 2
    for r in racers:
        await r.stop()

    won: list[ControllerContext] = []
    brokers = []
    for n, client in zip((1, 2, 3), clients, strict=True):
        reg = BrokerRegistration(client, info(n), ttl_s=TTL)
        election = ControllerElection(client, n, on_elected=won.append)
        reg.add_listener(election)
        brokers.append((reg, election))
    await asyncio.gather(*(reg.start() for reg, _ in brokers))  # all run at once

    async def agreed() -> bool:
        ids = {el.active_controller_id for _, el in brokers}
        return len(won) == 1 and ids == {won[0].broker_id}

    assert await backend.eventually(agreed, within_s=5)
    await backend.sleep(0.3)
    assert len(won) == 1 and won[0].epoch == 1
    epoch = await backend.store.get(CONTROLLER_EPOCH)
    assert epoch is not None and epoch.value == b"1"
    for reg, el in brokers:
        await el.stop()
        await reg.stop()


async def test_the_fence_holds_when_the_epoch_key_is_made_again(backend: Backend) -> None:
    """An operator wipes /controller_epoch: the next controller's epoch is 1 again, with
    version 1 again, yet the old controller's writes are still refused (the fence compares
    the revision, never reused)."""
    s = backend.store
    won: list[ControllerContext] = []
    reg, election = await elect(backend, 1, won, [])
    assert await backend.eventually(lambda: len(won) == 1, within_s=5)
    zombie = dataclasses.replace(won[0])
    await s.delete(CONTROLLER_EPOCH)
    await s.delete(CONTROLLER)
    assert await backend.eventually(lambda: len(won) == 2, within_s=5)
    assert (won[1].epoch, won[1].epoch_version) == (zombie.epoch, zombie.epoch_version) == (1, 1)
    with pytest.raises(ControllerMoved):
        await zombie.put("/brokers/topics/t", b"zombie")
    assert await s.get("/brokers/topics/t") is None
    await won[1].put("/brokers/topics/t", b"ok")
    await election.stop()
    await reg.stop()
