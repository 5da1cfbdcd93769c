"""StoreIsrWriter on the in-process store: the leader's ISR change is a compare-and-swap on the
partition state, committed with the partition epoch moved on, and fenced by a newer leader
epoch or partition epoch; through the replica manager a fence leaves the committed ISR as
it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cluster.isr_writer import StoreIsrWriter
from broker.cluster.memory import InMemoryStore
from broker.cluster.topic_state import PartitionState, state_key
from broker.replica.replica_manager import PartitionFetch
from broker.replica.replica_state import IsrFenced, LeaderAndIsrState
from protocol.errors import ErrorCode, KafkaError
from purgatory import ManualClock
from tests.support.components import build, settle

TP = ("t", 0)
KEY = state_key(*TP)


async def _store_with(state: PartitionState) -> InMemoryStore:
    store = InMemoryStore(ManualClock(run_due_soon=True))
    await store.put(KEY, state.encode())
    return store


async def _state(store: InMemoryStore) -> PartitionState:
    kv = await store.get(KEY)
    assert kv is not None
    return PartitionState.from_kv(kv)


async def test_a_proposal_is_committed_with_the_next_partition_epoch() -> None:
    store = await _store_with(PartitionState(1, 4, [1, 2, 3], 7))
    writer = StoreIsrWriter(store, 1)
    committed = await writer.alter_isr(TP, LeaderAndIsrState(4, (1, 2), 0))
    assert committed == LeaderAndIsrState(4, (1, 2), 1)
    now = await _state(store)
    assert (now.leader, now.leader_epoch, now.isr, now.controller_epoch,
            now.partition_epoch) == (1, 4, [1, 2], 7, 1)


async def test_a_newer_partition_epoch_fences_the_proposal() -> None:
    store = await _store_with(PartitionState(1, 4, [1, 2, 3], 7))
    await store.put(KEY, PartitionState(1, 4, [1, 3], 7).encode())  # partition epoch 1
    writer = StoreIsrWriter(store, 1)
    with pytest.raises(IsrFenced) as fenced:
        await writer.write(TP, LeaderAndIsrState(4, (1, 2), 0))
    assert fenced.value.error == ErrorCode.INVALID_UPDATE_VERSION
    assert (await _state(store)).isr == [1, 3], "a fenced proposal was written"


async def test_another_leader_fences_the_proposal() -> None:
    store = await _store_with(PartitionState(2, 5, [2, 3], 8))
    writer = StoreIsrWriter(store, 1)
    with pytest.raises(IsrFenced) as fenced:
        await writer.write(TP, LeaderAndIsrState(4, (1, 2), 0))
    assert fenced.value.error == ErrorCode.FENCED_LEADER_EPOCH
    assert (await _state(store)).isr == [2, 3]


async def test_a_deleted_partition_refuses_the_proposal() -> None:
    store = InMemoryStore(ManualClock(run_due_soon=True))
    writer = StoreIsrWriter(store, 1)
    with pytest.raises(KafkaError) as refused:
        await writer.write(TP, LeaderAndIsrState(4, (1,), 0))
    assert refused.value.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_replica_manager_applies_only_what_the_store_committed(tmp_path: Path) -> None:
    """A follower catching up: the expansion goes through the store; then a second leader
    epoch written by the controller fences the next proposal, and the ISR stays."""
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"}, offsets_topic=False)
    try:
        c.topics.create_topic(TP[0], 1, {})
        store = await _store_with(PartitionState(1, 1, [1], 3))
        rm = c.replica_manager
        rm.broker_id = 1
        rm.isr_writer = StoreIsrWriter(store, 1)
        rm.make_leader(TP, 1, replicas=[1, 2, 3], isr=[1], partition_epoch=0)
        partition = rm.partitions[TP]
        rm.fetch_messages([PartitionFetch(TP, 0, 1 << 20)], 1 << 20, 0, 0, replica_id=2)
        await settle()
        assert (partition.isr, partition.partition_epoch) == ((1, 2), 1)
        assert (await _state(store)).isr == [1, 2]
        await store.put(KEY, PartitionState(1, 2, [1, 2], 4).encode())  # a new leader epoch
        rm.fetch_messages([PartitionFetch(TP, 0, 1 << 20)], 1 << 20, 0, 0, replica_id=3)
        await settle()
        assert partition.isr == (1, 2), "applied an ISR the store never committed"
        assert (await _state(store)).isr == [1, 2]
        assert rm.isr_changes_failed == 1
    finally:
        await c.close()
