"""The leader's ISR round trip in cluster mode, on the in-process store: the partition-state
watcher makes this broker leader of a partition with a follower; the follower never fetches,
so after replica.lag.time.max.ms the leader writes the smaller ISR to the store by
compare-and-swap, applies it only once committed, and the parked acks=all produce completes;
the watcher's echo of that state changes nothing further."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from broker.cluster.broker_node import ClusterReplicas
from broker.cluster.isr_writer import StoreIsrWriter
from broker.cluster.memory import InMemoryStore
from broker.cluster.partition_watcher import LocalReplicaTransitions, PartitionStateWatcher
from broker.cluster.topic_state import (
    PartitionState,
    TopicAssignment,
    new_topic_id,
    state_key,
    topic_key,
)
from protocol.errors import ErrorCode
from tests.support.components import build, settle
from tests.support.requests import record_batch

TOPIC = "t"
TP = (TOPIC, 0)
NODE = 1
LAG_MS = 10_000


async def _until(predicate: Callable[[], bool], what: str, seconds: float = 10) -> None:
    """Real time, bounded: the store's tasks run on the loop."""
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what}: not within {seconds}s")


async def test_a_lagging_follower_leaves_the_isr_through_the_store(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"}, offsets_topic=False)
    store = InMemoryStore()
    rm = c.replica_manager
    rm.broker_id = NODE
    rm.isr_writer = writer = StoreIsrWriter(store, NODE)
    rm.replica_lag_time_max_ms = LAG_MS
    replicas = ClusterReplicas(store, rm, c.log_manager, c.topics.log_config)
    replicas.start()
    watcher = PartitionStateWatcher(store, listeners=[LocalReplicaTransitions(NODE, replicas)])
    try:
        await store.put(topic_key(TOPIC),
                        TopicAssignment(TOPIC, new_topic_id(), {0: [NODE, 2]}).encode())
        await store.put(state_key(*TP), PartitionState(NODE, 3, [NODE, 2], 1).encode())
        await watcher.start()
        await _until(lambda: TP in replicas.led, "became leader")
        partition = rm.partitions[TP]
        assert (partition.leader_epoch, partition.isr, partition.partition_epoch) == (
            3, (NODE, 2), 0)
        answer = rm.append_records([(TP, record_batch([b"a"]))], 9, -1, 60_000)
        assert not answer.done()
        await c.advance(LAG_MS)
        await settle()
        kv = await store.get(state_key(*TP))
        assert kv is not None and PartitionState.from_kv(kv).isr == [NODE, 2], (
            "shrunk within replica.lag.time.max.ms")
        await c.advance(LAG_MS // 2)
        await _until(lambda: answer.done(), "acks=all answered once the ISR shrink committed")
        assert answer.result()[TP].error == ErrorCode.NONE
        kv = await store.get(state_key(*TP))
        assert kv is not None
        state = PartitionState.from_kv(kv)
        assert (state.leader, state.leader_epoch, state.isr, state.partition_epoch) == (
            NODE, 3, [NODE], 1)
        assert (partition.isr, partition.partition_epoch, partition.high_watermark) == (
            (NODE,), 1, 1)
        await replicas.idle()
        await settle()
        assert rm.partitions[TP] is partition and partition.isr == (NODE,)
        assert (writer.committed, writer.fenced) == (1, 0)
    finally:
        await watcher.stop()
        await replicas.stop()
        await writer.stop()
        await c.close()
