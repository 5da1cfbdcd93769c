"""Replication between three real broker processes on a real etcd, with confluent-kafka:
followers fetch from the leader and hold its batches at the same offsets, acks=all completes
with the ISR full and the ISR stays full past replica.lag.time.max.ms; the leader SIGKILLed,
the new leader (elected from the ISR) serves every acknowledged record once and in order, and
the killed broker, restarted, catches up as a follower."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker.cluster.etcd_process import EtcdProcess
from protocol.record_batch import iter_batches
from tests.cluster.test_cluster_brokers import eventually, metadata, partitions_of
from tests.cluster.test_cluster_faults import RETRIABLE, bootstrap, node_id, stop_all
from tests.support.broker import BrokerProcess

SESSION_MS = 2000
LAG_MS = 2000


def overrides(etcd: EtcdProcess, prefix: str, node: int) -> dict[str, str]:
    return {"node.id": str(node), "minibroker.etcd.endpoints": etcd.endpoint,
            "minibroker.etcd.prefix": prefix, "broker.session.timeout.ms": str(SESSION_MS),
            "broker.heartbeat.interval.ms": "500", "replica.lag.time.max.ms": str(LAG_MS),
            "replica.fetch.wait.max.ms": "200", "replica.fetch.backoff.ms": "200",
            "log.segment.bytes": "8192", "log.flush.interval.messages": "1"}


@pytest.fixture
def three(tmp_path: Path, etcd_server: EtcdProcess) -> Iterator[list[BrokerProcess]]:
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    brokers: list[BrokerProcess] = []
    try:
        for node in (1, 2, 3):
            brokers.append(BrokerProcess(tmp_path / f"b{node}",
                                         overrides(etcd_server, prefix, node)).start())
        yield brokers
    finally:
        stop_all(brokers)


def create_replicated(brokers: list[BrokerProcess], name: str, rf: int, min_isr: int) -> Any:
    """CreateTopics with replication factor ``rf`` and min.insync.replicas (retried on the
    retriable errors), then partition 0 once led with its ISR full."""
    admin = AdminClient({"bootstrap.servers": bootstrap(brokers)})
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.create_topics([NewTopic(name, 1, rf, config={
                "min.insync.replicas": str(min_isr)})], operation_timeout=10)[name].result(30)
            break
        except KafkaException as e:
            if e.args[0].code() not in RETRIABLE or time.monotonic() > deadline:
                raise
        time.sleep(0.5)
    return eventually(lambda: _full(brokers[0], name, rf), 20)


def _full(broker: BrokerProcess, topic: str, rf: int) -> Any:
    meta = metadata(broker)
    if topic not in {t.name for t in meta.topics}:
        return None
    p = partitions_of(meta, topic).get(0)
    if p is None or p.leader_id < 0 or len(p.replica_nodes) != rf or len(p.isr_nodes) != rf:
        return None
    return p


def produce_acked(servers: str, topic: str, values: list[bytes]) -> list[tuple[int, bytes]]:
    """acks=all from an idempotent producer; (offset, value) of each acknowledged record."""
    producer = Producer({"bootstrap.servers": servers, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5, "batch.num.messages": 20,
                         "message.timeout.ms": 40000})
    acked: list[tuple[int, bytes]] = []
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is None:
            acked.append((msg.offset(), msg.value()))
        else:
            errors.append(err)

    for v in values:
        producer.produce(topic, v, partition=0, on_delivery=report)
        producer.poll(0)
    assert producer.flush(45) == 0, "records left unanswered"
    assert errors == [], errors
    return acked


def consume_all(servers: str, topic: str, end: int) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    try:
        while (not out or out[-1][0] < end - 1) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            offset, value = msg.offset(), msg.value()
            assert offset is not None and value is not None
            out.append((offset, value))
    finally:
        consumer.close()
    return out


def batches_on_disk(broker: BrokerProcess, topic: str) -> list[tuple[int, int, int, int]]:
    """(base offset, last offset, partition leader epoch, CRC) of every batch in the broker's
    segment files of partition 0, in offset order."""
    return batches_in(broker.data_dir / "logs", topic)


def batches_in(log_dir: Path, topic: str) -> list[tuple[int, int, int, int]]:
    """As batches_on_disk, of the partition's dir in ``log_dir``."""
    out: list[tuple[int, int, int, int]] = []
    for path in sorted((log_dir / f"{topic}-0").glob("*.log")):
        data = path.read_bytes()
        for _pos, h in iter_batches(data):
            if h.base_offset == 0 and h.batch_length == 0:
                break
            out.append((h.base_offset, h.last_offset, h.partition_leader_epoch, h.crc))
    return out


def same_batches(brokers: list[BrokerProcess], topic: str, end: int) -> bool:
    logs = [batches_on_disk(b, topic) for b in brokers]
    return all(log == logs[0] for log in logs) and bool(logs[0]) and logs[0][-1][1] == end - 1


def test_followers_copy_the_leader_and_the_isr_stays_full(three: list[BrokerProcess]) -> None:
    topic = f"rep-{uuid.uuid4().hex[:8]}"
    create_replicated(three, topic, 3, min_isr=3)  # acks=all needs every replica
    servers = bootstrap(three)
    acked = produce_acked(servers, topic, [f"v{i}".encode() * 20 for i in range(300)])
    assert sorted(o for o, _ in acked) == list(range(300))
    eventually(lambda: same_batches(three, topic, 300), 20)
    assert len(batches_on_disk(three[0], topic)) >= 15  # batches of at most 20 records
    for b in three:  # the followers rolled their segments too
        assert len(list((b.data_dir / "logs" / f"{topic}-0").glob("*.log"))) > 1
    time.sleep(2.5 * LAG_MS / 1000)  # past replica.lag.time.max.ms with nothing produced
    part = _full(three[0], topic, 3)
    assert part is not None, "the ISR shrank while the followers were caught up"
    acked = produce_acked(servers, topic, [b"later"] * 50)
    assert sorted(o for o, _ in acked) == list(range(300, 350))
    eventually(lambda: same_batches(three, topic, 350), 20)
    assert len(consume_all(servers, topic, 350)) == 350


def test_leader_killed_new_leader_has_every_acked_record(three: list[BrokerProcess]) -> None:
    topic = f"fail-{uuid.uuid4().hex[:8]}"
    part = create_replicated(three, topic, 3, min_isr=2)
    servers = bootstrap(three)
    acked = produce_acked(servers, topic, [f"a{i}".encode() for i in range(200)])
    old_leader = next(b for b in three if node_id(b) == part.leader_id)
    survivors = [b for b in three if b is not old_leader]
    old_leader.kill()

    def new_leader() -> Any:
        p = partitions_of(metadata(survivors[0]), topic).get(0)
        return p if p is not None and p.leader_id not in (-1, part.leader_id) else None

    moved = eventually(new_leader, 20)
    assert moved.leader_epoch > part.leader_epoch
    alive = bootstrap(survivors)
    acked += produce_acked(alive, topic, [f"b{i}".encode() for i in range(100)])
    offsets = [o for o, _ in acked]
    assert len(set(offsets)) == len(offsets), "one offset acknowledged for two records"
    got = consume_all(alive, topic, max(offsets) + 1)
    assert [o for o, _ in got] == sorted(offsets), "records lost, repeated or out of order"
    assert got == sorted(acked)

    old_leader.start()  # catches up as a follower of the new leader
    end = max(offsets) + 1
    eventually(lambda: same_batches(three, topic, end), 30)
    eventually(lambda: _full(survivors[0], topic, 3), 20)
