"""The consumer group protocol (KIP-848) on three brokers in cluster mode (real etcd, real
broker processes): librdkafka members with ``group.protocol=consumer`` are assigned the
partitions of a topic the cluster created (the coordinator's assignor reads the cluster's
topics, not the coordinating broker's own), read every record from the three leaders, and
commit; a partition added on the controller reaches the group's assignment.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from broker.cluster.etcd_process import EtcdProcess
from tests.cluster.test_cluster_brokers import cluster_overrides, eventually, metadata
from tests.cluster.test_cluster_faults import all_led
from tests.support.broker import BrokerProcess

TOPIC = "kip848-spread"
PARTITIONS = 6
PER_PARTITION = 10
GROUP_OVERRIDES = {
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.heartbeat.interval.ms": "500",
    "offsets.topic.num.partitions": "3",
}


@pytest.fixture
def three(tmp_path: Path, etcd_server: EtcdProcess) -> Iterator[list[BrokerProcess]]:
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    brokers: list[BrokerProcess] = []
    try:
        for node_id in (1, 2, 3):
            brokers.append(BrokerProcess(
                tmp_path / f"b{node_id}",
                {**cluster_overrides(etcd_server, prefix, node_id), **GROUP_OVERRIDES}).start())
        yield brokers
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()


def member(bootstrap: str, group: str, name: str) -> Consumer:
    """A KIP-848 member as its users configure it: the broker owns session and assignment."""
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                     "group.protocol": "consumer", "group.remote.assignor": "uniform",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "fetch.wait.max.ms": 100, "broker.address.family": "v4"})


def consume(members: list[Consumer], until: Any, within_s: float = 60
            ) -> dict[str, list[tuple[int, bytes]]]:
    """Poll every member in turn until ``until(read)``; what each read, by client id."""
    read: dict[str, list[tuple[int, bytes]]] = {str(i): [] for i in range(len(members))}
    deadline = time.monotonic() + within_s
    while not until(read):
        assert time.monotonic() < deadline, {k: len(v) for k, v in read.items()}
        for i, c in enumerate(members):
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            partition, value = m.partition(), m.value()
            assert partition is not None and value is not None
            read[str(i)].append((partition, value))
    return read


def test_consumer_protocol_members_share_a_cluster_topic(three: list[BrokerProcess]) -> None:
    bootstrap = ",".join(b.bootstrap for b in three)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(60)
    parts = eventually(lambda: all_led(three[0], TOPIC, PARTITIONS), 30)
    assert {p.leader_id for p in parts.values()} == {1, 2, 3}  # led by all three

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    sent = {f"{p}-{i}".encode() for p in range(PARTITIONS) for i in range(PER_PARTITION)}
    for value in sorted(sent):
        producer.produce(TOPIC, value, partition=int(value.split(b"-")[0]))
    assert producer.flush(30) == 0

    group = f"kip848-{uuid.uuid4().hex[:8]}"
    members = [member(bootstrap, group, f"m{i}") for i in range(2)]
    try:
        for c in members:
            c.subscribe([TOPIC])

        def all_read(read: dict[str, list[tuple[int, bytes]]]) -> bool:
            return {v for got in read.values() for _, v in got} >= sent

        read = consume(members, all_read)
        # Every record, each from its own partition; both members were given partitions.
        assert {v for got in read.values() for _, v in got} == sent
        assert all(int(v.split(b"-")[0]) == p for got in read.values() for p, v in got)
        assigned = [{tp.partition for tp in c.assignment()} for c in members]
        assert all(assigned) and not (assigned[0] & assigned[1]), assigned
        assert assigned[0] | assigned[1] == set(range(PARTITIONS))
        for c in members:
            c.commit(asynchronous=False)
        committed = members[0].committed(
            [TopicPartition(TOPIC, p) for p in sorted(assigned[0])], timeout=10)
        assert all(tp.offset == PER_PARTITION for tp in committed), committed

        # A partition added through the controller reaches the group's assignment.
        admin.create_partitions([NewPartitions(TOPIC, PARTITIONS + 1)])[TOPIC].result(60)
        eventually(lambda: all_led(three[0], TOPIC, PARTITIONS + 1), 30)
        # A new producer: the first one's metadata does not have the partition yet.
        late = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        late.produce(TOPIC, b"new", partition=PARTITIONS)
        assert late.flush(30) == 0
        read = consume(members, lambda r: any(v == b"new" for got in r.values() for _, v in got))
        now = [{tp.partition for tp in c.assignment()} for c in members]
        assert now[0] | now[1] == set(range(PARTITIONS + 1)), now
        assert metadata(three[0]).controller_id in (1, 2, 3)
    finally:
        for c in members:
            c.close()
