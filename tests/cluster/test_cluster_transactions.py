"""A transaction over partitions led by three different brokers (three broker processes on a
real etcd, confluent-kafka's transactional producer): committed and aborted, a read_committed
consumer sees exactly the committed records, and a read_uncommitted one the aborted ones too.

The transaction coordinator writes the markers of partitions led elsewhere through the
inter-broker client (WriteTxnMarkers to each leader). Which broker coordinates does not
matter to this test: today every broker answers FindCoordinator for itself, so it is the one
the producer asked; once coordinators follow `__transaction_state` leadership it is that
partition's leader. Either way a coordinator leads at most one of the three partitions, so
it must reach the two other leaders, which the test checks in its log. While each broker
answers FindCoordinator for itself, a producer that asks again (librdkafka does when its
coordinator connection drops) lands on a coordinator that does not know its id: the brokers
run with Kafka's default session (9 s) so that a loaded machine does not bounce them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import WriteTxnMarkersRequest, WriteTxnMarkersResponse

from broker.cluster.etcd_process import EtcdProcess
from tests.cluster.test_cluster_brokers import (
    cluster_overrides,
    eventually,
    metadata,
    partitions_of,
    prefix,
)
from tests.support.broker import BrokerProcess
from tests.support.wire import Wire

__all__ = ["prefix"]  # the fixture, shared with the other three-broker test

TOPIC = "txn-spread"
PARTITIONS = 3
PER_PARTITION = 5


@pytest.fixture
def three(tmp_path: Path, etcd_server: EtcdProcess, prefix: str) -> Iterator[list[BrokerProcess]]:
    """Three brokers with Kafka's default session (9 s): nothing here kills a broker, and a
    2 s session lapses on a loaded machine, moving every leader mid-transaction."""
    brokers: list[BrokerProcess] = []
    try:
        for node_id in (1, 2, 3):
            overrides = {**cluster_overrides(etcd_server, prefix, node_id),
                         "broker.session.timeout.ms": "9000",
                         "broker.heartbeat.interval.ms": "1000"}
            brokers.append(BrokerProcess(tmp_path / f"b{node_id}", overrides).start())
        yield brokers
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()


def read_all(bootstrap: str, topic: str, isolation: str, count: int, settle_s: float = 2.0
             ) -> list[str]:
    """Every value of the topic from offset 0 with ``isolation``, once ``count`` were read and
    nothing more came for ``settle_s``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "assign-only",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got: list[str] = []
        deadline = time.monotonic() + 60
        quiet_until = None
        while time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is None:
                if len(got) >= count:
                    quiet_until = quiet_until or time.monotonic() + settle_s
                    if time.monotonic() >= quiet_until:
                        break
                continue
            if m.error():
                raise KafkaException(m.error())
            value = m.value()
            assert value is not None
            got.append(value.decode())
            quiet_until = None
        return got
    finally:
        consumer.close()


def transaction(producer: Producer, topic: str, tag: str, commit: bool) -> list[str]:
    """One transaction over every partition. One producer runs them all: producer ids are
    still given per broker, so producers of two coordinators could share an id."""
    values = [f"{tag}-{p}-{i}" for p in range(PARTITIONS) for i in range(PER_PARTITION)]
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value.encode(), partition=int(value.split("-")[1]))
    left = producer.flush(30)  # every record appended on its leader, else:
    if left:  # a produce or AddPartitionsToTxn failed; ending the transaction raises why
        producer.commit_transaction(10)
        raise AssertionError(f"{left} records not delivered")
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)
    return values


def peers_reached(broker: BrokerProcess) -> set[int]:
    """The node ids this broker's inter-broker client connected to, from its log."""
    reached = set()
    for line in broker.log_text().splitlines():
        try:
            event: dict[str, Any] = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "connected to broker":
            reached.add(int(event["node_id"]))
    return reached


# What only today's per-broker coordinators cause: the producer asked another broker for its
# coordinator mid-run (librdkafka asks again now and then), which does not know its id.
COORDINATOR_MOVED = {KafkaError.INVALID_PRODUCER_ID_MAPPING, KafkaError._FENCED,
                     KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
ATTEMPTS = 3


def test_a_transaction_over_three_leaders_commits_and_aborts(three: list[BrokerProcess]
                                                             ) -> None:
    """Run on a fresh topic and transactional id; run again (at most ATTEMPTS times) only
    when the producer's coordinator moved, which cannot happen once coordinators follow
    `__transaction_state` leadership. Every run that completes asserts everything."""
    for attempt in range(ATTEMPTS):
        try:
            return commit_abort_commit(three, f"{TOPIC}-{attempt}", f"spread-txn-{attempt}")
        except KafkaException as e:
            if e.args[0].code() not in COORDINATOR_MOVED or attempt == ATTEMPTS - 1:
                raise


def commit_abort_commit(three: list[BrokerProcess], topic: str, transactional_id: str) -> None:
    bootstrap = ",".join(b.bootstrap for b in three)
    admin = AdminClient({"bootstrap.servers": three[0].bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=30)[topic].result(30)

    def led() -> dict[int, Any] | None:
        meta = metadata(three[0])
        if topic not in {t.name for t in meta.topics}:
            return None
        parts = partitions_of(meta, topic)
        return parts if len(parts) == PARTITIONS and all(
            p.leader_id != -1 for p in parts.values()) else None

    leaders = {i: p.leader_id for i, p in eventually(led, 20).items()}
    assert sorted(leaders.values()) == [1, 2, 3], leaders  # one partition per broker

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                         "transaction.timeout.ms": 60000, "message.timeout.ms": 30000})
    producer.init_transactions(30)
    first = transaction(producer, topic, "c1", commit=True)
    aborted = transaction(producer, topic, "ab", commit=False)
    last = transaction(producer, topic, "c2", commit=True)

    committed = read_all(bootstrap, topic, "read_committed", len(first) + len(last))
    assert sorted(committed) == sorted(first + last)
    # Each partition's records in the order produced, the aborted ones skipped.
    for p in range(PARTITIONS):
        mine = [v for v in committed if v.split("-")[1] == str(p)]
        assert mine == [v for v in first + last if v.split("-")[1] == str(p)]
    everything = read_all(bootstrap, topic, "read_uncommitted",
                          len(first) + len(aborted) + len(last))
    assert sorted(everything) == sorted(first + aborted + last)

    # A coordinator reached the two leaders that are not itself.
    reached = {int(b.overrides["node.id"]): peers_reached(b) for b in three}
    assert any(peers == {1, 2, 3} - {node} for node, peers in reached.items()), reached

    # Markers sent to a broker that does not lead the partition: Kafka's NOT_LEADER_OR_FOLLOWER
    # (the coordinator looks the leader up again); a partition the cluster lacks: unknown.
    asked = three[0]
    asked_id = int(asked.overrides["node.id"])
    elsewhere = next(p for p, leader in leaders.items() if leader != asked_id)
    assert write_markers(asked, topic, [elsewhere, PARTITIONS + 5]) == {
        elsewhere: NOT_LEADER_OR_FOLLOWER, PARTITIONS + 5: UNKNOWN_TOPIC_OR_PARTITION}


NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION = 6, 3


def write_markers(broker: BrokerProcess, topic: str, partitions: list[int]) -> dict[int, int]:
    """A WriteTxnMarkers v1 commit marker for ``partitions``: each partition's error code."""
    marker = WriteTxnMarkersRequest.WritableTxnMarker
    wire = Wire(broker.port)
    try:
        resp = wire.request(WriteTxnMarkersRequest[1](markers=[marker(
            producer_id=999_999, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
            topics=[marker.WritableTxnMarkerTopic(name=topic, partition_indexes=partitions)])]),
            WriteTxnMarkersResponse)
    finally:
        wire.close()
    [m] = resp.markers
    return {p.partition_index: p.error_code for t in m.topics for p in t.partitions}
