"""The high-watermark checkpoint (Kafka's replication-offset-checkpoint): written in Kafka's
text format per log dir, read at start so that a partition led with followers starts from its
checkpointed high watermark (capped to its log), while a partition without followers (a single
broker) takes its log end at once, as always. A corrupt file is logged once and read as empty.
Followers are played by calls to the replica manager's fetch path with a replica id."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from structlog.testing import capture_logs

from broker.cluster.broker_node import ClusterReplicas
from broker.cluster.memory import InMemoryStore
from broker.cluster.partition_watcher import LocalReplicaTransitions, PartitionStateWatcher
from broker.cluster.topic_state import (
    PartitionState,
    TopicAssignment,
    new_topic_id,
    state_key,
    topic_key,
)
from broker.replica.hw_checkpoint import REPLICATION_OFFSET_CHECKPOINT_FILE
from broker.replica.replica_manager import PartitionFetch, ReplicaManager
from broker.testing import EmbeddedBroker
from protocol.errors import ErrorCode
from tests.support.clients import create_topic
from tests.support.components import build
from tests.support.requests import record_batch

TOPIC = "hw"
TP = (TOPIC, 0)
LEADER, FOLLOWER = 0, 1
OVERRIDES = {"offsets.topic.num.partitions": "1"}


def _produce(rm: ReplicaManager, values: list[bytes]) -> None:
    answer = rm.append_records([(TP, record_batch(values))], 9, 1, 0)
    assert answer.result()[TP].error == ErrorCode.NONE


def _lead_with_a_follower(rm: ReplicaManager, epoch: int = 1, *, restarted: bool = False
                          ) -> None:
    """``restarted``: the partition was opened at start, as ClusterReplicas opens one."""
    if restarted:
        rm.restore_high_watermark(rm.partitions[TP])
    rm.broker_id = LEADER
    rm.make_leader(TP, epoch, replicas=[LEADER, FOLLOWER], isr=[LEADER, FOLLOWER],
                   partition_epoch=0)


def _follower_fetch(rm: ReplicaManager, offset: int) -> None:
    answer = rm.fetch_messages([PartitionFetch(TP, offset, 1 << 20, -1, 0)], 1 << 20, 0, 0,
                               replica_id=FOLLOWER)
    assert answer.result()[0].error == ErrorCode.NONE


def _file(log_dir: Path) -> Path:
    return log_dir / REPLICATION_OFFSET_CHECKPOINT_FILE


async def _led_at_hw_2_of_5(log_dir: Path) -> None:
    """A run that leaves the partition's checkpointed high watermark at 2, its log end at 5."""
    c = build(log_dir, OVERRIDES)
    c.topics.create_topic(TOPIC, 1, {})
    rm = c.replica_manager
    _lead_with_a_follower(rm)
    _produce(rm, [b"a", b"b", b"c", b"d", b"e"])
    _follower_fetch(rm, 2)
    assert rm.partitions[TP].high_watermark == 2
    await rm.checkpoint_high_watermarks()
    await c.close()


async def test_the_file_is_kafkas_text_format(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    await _led_at_hw_2_of_5(log_dir)
    lines = _file(log_dir).read_text().splitlines()
    assert lines[:2] == ["0", str(len(lines) - 2)], "version 0, then the entry count"
    assert "hw 0 2" in lines[2:]
    assert "__consumer_offsets 0 0" in lines[2:], "every hosted partition is written"
    assert not _file(log_dir).with_name(REPLICATION_OFFSET_CHECKPOINT_FILE + ".tmp").exists()


async def test_a_leader_with_followers_starts_from_the_checkpoint(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    await _led_at_hw_2_of_5(log_dir)
    c = build(log_dir, OVERRIDES, offsets_topic=False)
    try:
        rm = c.replica_manager
        partition = rm.partitions[TP]
        assert partition.log_end_offset == 5
        _lead_with_a_follower(rm, epoch=2, restarted=True)
        assert partition.high_watermark == 2, "started at its log end, not the checkpoint"
        parked = rm.fetch_messages([PartitionFetch(TP, 2, 1 << 20)], 1 << 20, 1, 10_000)
        assert not parked.done(), "a consumer read above the restored high watermark"
        _follower_fetch(rm, 5)
        assert partition.high_watermark == 5
        assert parked.done(), "the high watermark passing the data from before the restart " \
                              "did not wake the parked consumer fetch"
        assert len(parked.result()[0].records) > 0
    finally:
        await c.close()


async def test_a_partition_without_followers_takes_its_log_end(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    await _led_at_hw_2_of_5(log_dir)
    c = build(log_dir, OVERRIDES, offsets_topic=False)
    try:
        rm = c.replica_manager
        assert rm.partitions[TP].high_watermark == 5, "a single broker serves its log end"
        rm.restore_high_watermark(rm.partitions[TP])
        rm.broker_id = LEADER
        rm.make_leader(TP, 2, replicas=[LEADER], isr=[LEADER], partition_epoch=0)
        assert rm.partitions[TP].high_watermark == 5
        _lead_with_a_follower(rm, epoch=3)  # followers added later: nothing to restore
        assert rm.partitions[TP].high_watermark == 5
    finally:
        await c.close()


async def test_the_checkpoint_is_capped_to_the_log(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    c = build(log_dir, OVERRIDES)
    c.topics.create_topic(TOPIC, 1, {})
    _produce(c.replica_manager, [b"a", b"b", b"c"])
    await c.close()
    _file(log_dir).write_text("0\n1\nhw 0 99\n")
    c = build(log_dir, OVERRIDES, offsets_topic=False)
    try:
        _lead_with_a_follower(c.replica_manager, restarted=True)
        assert c.replica_manager.partitions[TP].high_watermark == 3
    finally:
        await c.close()


@pytest.mark.parametrize("text", ["1\n1\nhw 0 1\n", "0\n2\nhw 0 1\n", "0\n1\nhw 0\n",
                                  "0\n1\nhw zero 1\n", "garbage"])
async def test_a_corrupt_checkpoint_is_logged_once_and_read_as_empty(
        tmp_path: Path, text: str) -> None:
    log_dir = tmp_path / "logs"
    await _led_at_hw_2_of_5(log_dir)
    _file(log_dir).write_text(text)
    c = build(log_dir, OVERRIDES, offsets_topic=False)
    try:
        rm = c.replica_manager
        assert rm.partitions[TP].high_watermark == 5, "the single broker's start changed"
        with capture_logs() as logs:
            _lead_with_a_follower(rm, epoch=2, restarted=True)
            rm.restore_high_watermark(rm.partitions[TP])  # read once: not logged again
        assert not rm.partitions[TP].offline, "a corrupt checkpoint took the log dir offline"
        assert rm.partitions[TP].high_watermark == 0, "read as absent: Kafka's 0 (log start)"
        warnings = [e for e in logs if "checkpoint unreadable" in e["event"]]
        assert len(warnings) == 1, logs
        await rm.checkpoint_high_watermarks()
        assert "hw 0 0" in _file(log_dir).read_text().splitlines(), "not rewritten"
    finally:
        await c.close()


async def test_a_partition_led_elsewhere_keeps_its_entry(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    c = build(log_dir, OVERRIDES)
    try:
        c.topics.create_topic(TOPIC, 1, {})
        rm = c.replica_manager
        _lead_with_a_follower(rm)
        _produce(rm, [b"a", b"b", b"c"])
        _follower_fetch(rm, 1)
        rm.remove_partition(TP, not_leader=True)
        await rm.checkpoint_high_watermarks()
        assert "hw 0 1" in _file(log_dir).read_text().splitlines()
    finally:
        await c.close()


def test_the_broker_writes_it_on_its_timer_and_at_shutdown(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, clock="manual",
                            replica_high_watermark_checkpoint_interval_ms=60_000)
    with broker:
        create_topic(broker.bootstrap_servers, TOPIC, 1)
        checkpoint = _file(tmp_path / "logs")
        broker.advance(60_000)
        assert _within(10, checkpoint.exists), "not written when its interval passed"
        assert checkpoint.read_text().splitlines()[2:] == ["hw 0 0"]
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        producer.produce(TOPIC, b"x")
        assert producer.flush(30) == 0
        assert checkpoint.read_text().splitlines()[2:] == ["hw 0 0"], "written off its timer"
    assert "hw 0 1" in checkpoint.read_text().splitlines(), "not written at shutdown"


def _within(seconds: float, check: Callable[[], bool]) -> bool:
    """Real time, bounded: the write runs off the broker's loop."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


async def _cluster_lead(log_dir: Path, then: Callable[[ReplicaManager], None]) -> int:
    """One run of a broker in cluster mode (the in-process store) leading ``TP`` with a
    follower through ClusterReplicas; ``then`` acts on it; the high watermark it started
    with."""
    c = build(log_dir, OVERRIDES, offsets_topic=False)
    store = InMemoryStore()
    rm = c.replica_manager
    rm.broker_id = LEADER
    replicas = ClusterReplicas(store, rm, c.log_manager, c.topics.log_config)
    replicas.start()
    watcher = PartitionStateWatcher(store, listeners=[LocalReplicaTransitions(LEADER, replicas)])
    try:
        await store.put(topic_key(TOPIC), TopicAssignment(TOPIC, new_topic_id(),
                                                          {0: [LEADER, FOLLOWER]}).encode())
        await store.put(state_key(*TP), PartitionState(LEADER, 1, [LEADER, FOLLOWER], 1).encode())
        await watcher.start()
        await _led(replicas)
        started = rm.partitions[TP].high_watermark
        then(rm)
        return started
    finally:
        await watcher.stop()
        await replicas.stop()
        await rm.checkpoint_high_watermarks()
        await c.close()


async def _led(replicas: ClusterReplicas) -> bool:
    for _ in range(1000):  # bounded: 10 s of loop turns
        if TP in replicas.led:
            return True
        await asyncio.sleep(0.01)
    raise AssertionError("did not become leader")


async def test_cluster_replicas_restore_the_checkpoint_on_restart(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"

    def write_five_replicate_two(rm: ReplicaManager) -> None:
        _produce(rm, [b"a", b"b", b"c", b"d", b"e"])
        _follower_fetch(rm, 2)

    assert await _cluster_lead(log_dir, write_five_replicate_two) == 0
    assert "hw 0 2" in _file(log_dir).read_text().splitlines()
    assert await _cluster_lead(log_dir, lambda rm: None) == 2, (
        "the restarted leader did not start from its checkpointed high watermark")
