"""A consume-transform-produce step whose group coordinator and transaction coordinator are
different brokers: TxnOffsetCommit reaches the group's coordinator, which must ask the
producer's transaction coordinator (on another broker) whether the offsets partition is in
the transaction (KIP-890's verification), and commit once it answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker.coordinator.records import java_string_hash
from broker.testing import EmbeddedCluster
from broker.txn.state_log import partition_for as txn_partition_for

PARTITIONS = 3  # of each internal topic


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(3, tmp_path_factory.mktemp("txn-offsets"), **{
            "offsets.topic.num.partitions": str(PARTITIONS),
            "transaction.state.log.num.partitions": str(PARTITIONS),
            "broker.session.timeout.ms": "6000"}) as c:
        yield c


def group_partition(group_id: str) -> int:
    return (java_string_hash(group_id) & 0x7FFFFFFF) % PARTITIONS


def ids_on_different_brokers(cluster: EmbeddedCluster, source: str) -> tuple[str, str]:
    """A group id whose coordinator leads ``source``-0 (the committed partition is its own,
    so the commit is verified) and a transactional id coordinated on another broker."""
    source_leader = cluster.wait_for_leader(source, 0)
    for _ in range(1000):
        group, txn = f"g-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
        group_leader = cluster.leader("__consumer_offsets", group_partition(group))
        txn_leader = cluster.leader("__transaction_state", txn_partition_for(txn, PARTITIONS))
        if group_leader == source_leader and txn_leader not in (None, group_leader):
            return group, txn
    raise AssertionError("no pair of ids on different coordinators")


def make_internal_topics(cluster: EmbeddedCluster, topic: str) -> None:
    """Both internal topics made (a transactional producer and a group commit ask for
    them) and led."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers,
                         "transactional.id": f"warm-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(60)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                         "group.id": f"warm-{uuid.uuid4().hex[:8]}"})
    consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    consumer.close()
    for name in ("__consumer_offsets", "__transaction_state"):
        for p in range(PARTITIONS):
            cluster.wait_for_leader(name, p)


def test_offsets_commit_in_a_transaction_coordinated_on_another_broker(
        cluster: EmbeddedCluster) -> None:
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (source, sink)]).values():
        f.result(30)
    make_internal_topics(cluster, source)
    group, txn = ids_on_different_brokers(cluster, source)
    feeder = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    feeder.produce(source, b"one")
    assert feeder.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers,
                         "transactional.id": txn})
    try:
        consumer.subscribe([source])
        msgs: list = []
        for _ in range(60):
            msgs = [m for m in consumer.consume(1, timeout=1) if m.error() is None]
            if msgs:
                break
        assert [m.value() for m in msgs] == [b"one"]
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.produce(sink, b"ONE")
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        [committed] = consumer.committed([TopicPartition(source, 0)], timeout=30)
        assert committed.offset == 1
    finally:
        consumer.close()
