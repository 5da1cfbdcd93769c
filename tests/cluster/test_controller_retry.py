"""Controller work the store fails is run again while the broker stays the controller: a
broker that dies while etcd cannot be reached still has its partitions' leadership moved,
without waiting for another broker to change. On the in-process store (manual time), cut
off at the moment the controller hears of the broker change, so the first election pass
fails."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from broker.cluster.liveness import BrokerChange
from broker.cluster.topic_state import PartitionState, state_key
from tests.cluster.conftest import MemoryBackend
from tests.cluster.test_topics import TTL, Node, cluster, leaders, stop_all

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def backend() -> AsyncIterator[MemoryBackend]:
    b = MemoryBackend()
    yield b
    await b.close()


@dataclass
class Outage:
    """A three-broker cluster whose controller is about to hear that ``victim`` went, with
    the store cut off at that moment; ``changes`` the broker changes it heard, ``attempts``
    the times (store clock, ms) its broker-change work started."""

    nodes: list[Node]
    controller: Node
    victim: Node
    survivor: Node
    changes: list[BrokerChange]
    attempts: list[float]


async def lose_a_broker_while_the_store_is_cut_off(backend: MemoryBackend,
                                                   monkeypatch: pytest.MonkeyPatch) -> Outage:
    nodes = await cluster(backend, 3)
    controller = next(x for x in nodes if x.controller is not None)
    victim, survivor = (x for x in nodes if x is not controller)
    topic_controller = controller.controller
    assert topic_controller is not None
    v, s = victim.node_id, survivor.node_id
    assert (await topic_controller.create_topic("t", assignment={0: [v, s]})).ok
    assert await backend.eventually(lambda: leaders(survivor, "t") == {0: (v, 0, [v, s])},
                                    within_s=5)

    changes: list[BrokerChange] = []
    handle = controller.duties.brokers_changed

    def cut_off_then_handle(change: BrokerChange) -> None:
        if not changes:
            backend.memory.set_reachable(False)
        changes.append(change)
        handle(change)

    controller.liveness.on_change = cut_off_then_handle
    attempts: list[float] = []
    on_broker_change = topic_controller.on_broker_change

    async def counted(change: BrokerChange) -> None:
        attempts.append(backend.clock.time())
        await on_broker_change(change)

    monkeypatch.setattr(topic_controller, "on_broker_change", counted)
    await victim.crash()  # its lease expires after the TTL
    assert await backend.eventually(lambda: bool(attempts), within_s=TTL + 5)
    assert [b.info.node_id for b in changes[0].removed] == [v]
    return Outage(nodes, controller, victim, survivor, changes, attempts)


async def partition_state(backend: MemoryBackend) -> PartitionState:
    kv = await backend.store.get(state_key("t", 0))
    assert kv is not None
    return PartitionState.from_kv(kv)


async def test_an_election_pass_the_store_failed_is_run_again_until_it_is_done(
        backend: MemoryBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    o = await lose_a_broker_while_the_store_is_cut_off(backend, monkeypatch)
    try:
        # Failing: tried again after a growing backoff (100 ms, then 200 ms).
        assert await backend.eventually(lambda: len(o.attempts) >= 3, within_s=2)
        first, second, third = o.attempts[:3]
        assert second - first >= 100 and third - second >= 200
        backend.memory.set_reachable(True)

        s = o.survivor.node_id
        topic_controller = o.controller.controller
        assert topic_controller is not None
        expected = PartitionState(s, 1, [s], topic_controller.context.epoch, 1)

        async def elected() -> bool:
            return await partition_state(backend) == expected

        assert await backend.eventually(elected, within_s=5)
        assert await backend.eventually(
            lambda: leaders(o.survivor, "t") == {0: (s, 1, [s])}, within_s=5)
        assert len(o.changes) == 1, "another broker change did it, not the retry"
        tries = len(o.attempts)
        await backend.sleep(5)
        assert len(o.attempts) == tries, "retried after it was done"
    finally:
        backend.memory.set_reachable(True)
        await stop_all(o.nodes)


@pytest.mark.parametrize("ending", ["stop", "resignation"])
async def test_stop_or_resignation_during_the_backoff_ends_the_retries(
        backend: MemoryBackend, monkeypatch: pytest.MonkeyPatch, ending: str) -> None:
    o = await lose_a_broker_while_the_store_is_cut_off(backend, monkeypatch)
    try:
        assert await backend.eventually(lambda: len(o.attempts) >= 2, within_s=2)
        if ending == "stop":
            await o.controller.duties.stop()
        else:
            await o.controller.election.stop()  # resigns; the key stays on its lease
        assert o.controller.duties.controller is None
        tries = len(o.attempts)
        backend.memory.set_reachable(True)
        await backend.sleep(5)
        assert len(o.attempts) == tries
        v, s = o.victim.node_id, o.survivor.node_id
        assert (await partition_state(backend)).leader == v  # nobody elected since
        assert leaders(o.survivor, "t") == {0: (v, 0, [v, s])}
    finally:
        backend.memory.set_reachable(True)
        await stop_all(o.nodes)
