"""A leader whose broker registration is lost stops serving its partitions at once; when it
registers again it leads again what the cluster's state, read after the new registration,
still names it leader of. No controller may have seen the registration go (there was none at
the time, or it was this broker), and then nothing in the store changes: without this the
partition stayed led, in the store and every client's metadata, by a broker answering
NOT_LEADER_OR_FOLLOWER, its ISR whole, for good. On the in-process store, with the
partition-state watcher and ClusterReplicas as the server wires them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.cluster.broker_node import LEAD_AGAIN_READ_BATCH, ClusterReplicas
from broker.cluster.memory import InMemoryStore
from broker.cluster.partition_watcher import LocalReplicaTransitions, PartitionStateWatcher
from broker.cluster.store import Lease
from broker.cluster.topic_state import (
    PartitionState,
    TopicAssignment,
    new_topic_id,
    state_key,
    topic_key,
)
from broker.replica.replica_manager import ReplicaManager
from protocol.errors import ErrorCode
from tests.support.components import Components, build, settle
from tests.support.requests import record_batch
from tests.unit.test_cluster_isr import NODE, TOPIC, TP, _until

FOLLOWER = 2
EPOCH = 3
LOST = "the store no longer has the lease (expired or revoked)"
LEASE = Lease(id=7, ttl=6, granted_at_ms=0.0)


@dataclass
class Leader:
    c: Components
    store: InMemoryStore
    replicas: ClusterReplicas
    watcher: PartitionStateWatcher

    @property
    def rm(self) -> ReplicaManager:
        return self.c.replica_manager

    def produce(self) -> ErrorCode:
        """One acks=1 produce to TP, answered at once (led here or not)."""
        answer = self.rm.append_records([(TP, record_batch([b"v"]))], 9, 1, 0)
        assert answer.done()
        return answer.result()[TP].error

    async def lose_registration(self) -> None:
        self.replicas.broker_lost(10, LOST)
        await self.replicas.idle()
        assert TP not in self.replicas.led and TP not in self.rm.partitions
        assert self.produce() == ErrorCode.NOT_LEADER_OR_FOLLOWER


@pytest.fixture
async def leader(tmp_path: Path) -> AsyncIterator[Leader]:
    """Broker NODE registered (epoch 10) and leading TP in EPOCH, with FOLLOWER in its ISR."""
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"}, offsets_topic=False)
    store = InMemoryStore()
    c.replica_manager.broker_id = NODE
    replicas = ClusterReplicas(store, c.replica_manager, c.log_manager, c.topics.log_config)
    replicas.start()
    watcher = PartitionStateWatcher(store, listeners=[LocalReplicaTransitions(NODE, replicas)])
    try:
        await store.put(topic_key(TOPIC),
                        TopicAssignment(TOPIC, new_topic_id(), {0: [NODE, FOLLOWER]}).encode())
        await store.put(state_key(*TP), PartitionState(NODE, EPOCH, [NODE, FOLLOWER], 1).encode())
        replicas.broker_registered(10, LEASE)
        await watcher.start()
        await _until(lambda: TP in replicas.led, "became leader")
        yield Leader(c, store, replicas, watcher)
    finally:
        await watcher.stop()
        await replicas.stop()
        await c.close()


async def test_registered_again_it_leads_what_the_store_still_names_it_leader_of(
        leader: Leader) -> None:
    assert leader.produce() == ErrorCode.NONE
    await leader.lose_registration()
    # No controller wrote anything: the store still names NODE leader in EPOCH.
    leader.replicas.broker_registered(12, LEASE)
    await _until(lambda: TP in leader.replicas.led, "led again after the new registration")
    partition = leader.rm.partitions[TP]
    assert (partition.leader_epoch, partition.isr) == (EPOCH, (NODE, FOLLOWER))
    assert leader.produce() == ErrorCode.NONE
    assert partition.log_end_offset == 2
    assert not leader.replicas.unserved_on_loss


async def test_a_partition_led_elsewhere_by_then_is_not_led_again(leader: Leader) -> None:
    await leader.lose_registration()
    # A controller moved it meanwhile; this broker's watcher has not told it yet.
    await leader.watcher.stop()
    await leader.store.put(state_key(*TP), PartitionState(FOLLOWER, EPOCH + 1, [FOLLOWER],
                                                          2).encode())
    leader.replicas.broker_registered(12, LEASE)
    await leader.replicas.idle()
    await settle()
    assert TP not in leader.replicas.led and TP not in leader.rm.partitions
    assert not leader.replicas.unserved_on_loss
    assert leader.produce() == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_the_store_unreachable_at_the_new_registration_is_read_again(
        leader: Leader) -> None:
    await leader.lose_registration()
    leader.store.set_reachable(False)
    leader.replicas.broker_registered(12, LEASE)
    await asyncio.sleep(0.3)  # a read failed, another is due
    assert TP not in leader.replicas.led
    leader.store.set_reachable(True)
    await _until(lambda: TP in leader.replicas.led, "led again once the store answered")
    assert leader.produce() == ErrorCode.NONE


async def test_lost_again_before_the_read_it_leads_nothing(leader: Leader) -> None:
    await leader.lose_registration()
    leader.store.set_reachable(False)
    leader.replicas.broker_registered(12, LEASE)
    await asyncio.sleep(0.1)
    leader.replicas.broker_lost(12, LOST)
    leader.store.set_reachable(True)
    await asyncio.sleep(0.5)  # past the retry that was due
    await leader.replicas.idle()
    assert TP not in leader.replicas.led and TP not in leader.rm.partitions
    leader.replicas.broker_registered(14, LEASE)  # the one after it does
    await _until(lambda: TP in leader.replicas.led, "led again by the next registration")


async def test_more_partitions_than_one_read_takes_are_all_led_again(leader: Leader) -> None:
    """Read in batches (etcd refuses a transaction of more than 128 operations)."""
    many = LEAD_AGAIN_READ_BATCH + 8
    await leader.store.put(topic_key("many"), TopicAssignment(
        "many", new_topic_id(), {p: [NODE, FOLLOWER] for p in range(many)}).encode())
    for p in range(many):
        await leader.store.put(state_key("many", p),
                               PartitionState(NODE, 0, [NODE, FOLLOWER], 1).encode())
    await _until(lambda: len(leader.replicas.led) == many + 1, "led every partition")
    await leader.lose_registration()
    assert not leader.replicas.led
    leader.replicas.broker_registered(12, LEASE)
    await _until(lambda: len(leader.replicas.led) == many + 1, "led every partition again")
    assert not leader.replicas.unserved_on_loss
