"""A consume-transform-produce step whose group coordinator and transaction coordinator are
different brokers: TxnOffsetCommit reaches the group's coordinator, which must ask the
producer's transaction coordinator (on another broker) whether the offsets partition is in
the transaction (KIP-890's verification), and commit once it answers. The check is of the
group's offsets partition, so it is made whichever brokers lead the committed partitions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from broker.coordinator.records import java_string_hash
from broker.testing import EmbeddedCluster
from broker.txn.state_log import partition_for as txn_partition_for
from protocol.errors import ErrorCode
from tests.support.wire import Wire

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


def source_and_sink(cluster: EmbeddedCluster) -> tuple[str, str]:
    """Two new topics of one partition, with both internal topics made and led."""
    source, sink = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (source, sink)]).values():
        f.result(30)
    make_internal_topics(cluster, source)
    return source, sink


def test_offsets_commit_in_a_transaction_coordinated_on_another_broker(
        cluster: EmbeddedCluster) -> None:
    source, sink = source_and_sink(cluster)
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


# -- the committed partitions led by brokers other than the group coordinator --------------------

def ids_away_from(cluster: EmbeddedCluster, source: str) -> tuple[str, str]:
    """A group id whose coordinator does not lead ``source``-0, and a transactional id
    coordinated on another broker than the group."""
    source_leader = cluster.wait_for_leader(source, 0)
    for _ in range(1000):
        group, txn = f"g-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
        group_leader = cluster.leader("__consumer_offsets", group_partition(group))
        txn_leader = cluster.leader("__transaction_state", txn_partition_for(txn, PARTITIONS))
        if (group_leader not in (None, source_leader)
                and txn_leader not in (None, group_leader)):
            return group, txn
    raise AssertionError("no pair of ids away from the committed partition")


def ask(cluster: EmbeddedCluster, node: int, request: Any, response_cls: Any) -> Any:
    wire = Wire(cluster.broker(node).port)
    try:
        return wire.request(request, response_cls)
    finally:
        wire.close()


def txn_commit(cluster: EmbeddedCluster, node: int, version: int, txn: str, group: str,
               pid: int, epoch: int, tp: tuple[str, int], offset: int) -> int:
    """One TxnOffsetCommit of ``tp`` to ``node``: its error."""
    topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    body: dict[str, Any] = dict(
        transactional_id=txn, group_id=group, producer_id=pid, producer_epoch=epoch,
        topics=[topic(name=tp[0], partitions=[topic.TxnOffsetCommitRequestPartition(
            partition_index=tp[1], committed_offset=offset, committed_leader_epoch=-1,
            committed_metadata="")])])
    if version >= 3:
        body.update(generation_id=-1, member_id="", group_instance_id=None)
    resp = ask(cluster, node, TxnOffsetCommitRequest[version](**body), TxnOffsetCommitResponse)
    [[error]] = [[p.error_code for p in t.partitions] for t in resp.topics]
    return int(error)


def test_offsets_of_partitions_led_elsewhere_are_verified(cluster: EmbeddedCluster) -> None:
    """Every committed partition is led by a broker other than the group coordinator: the
    offsets partition must still be in the transaction (Kafka verifies the group's
    __consumer_offsets partition, not the committed ones), refused as Kafka refuses it until
    AddOffsetsToTxn, then committed with the transaction."""
    source, sink = source_and_sink(cluster)
    group, txn = ids_away_from(cluster, source)
    group_node = cluster.wait_for_leader("__consumer_offsets", group_partition(group))
    txn_node = cluster.wait_for_leader("__transaction_state", txn_partition_for(txn, PARTITIONS))
    cluster.wait_for_leader(sink, 0)

    init = cluster.wait_for(lambda: (r := ask(cluster, txn_node, InitProducerIdRequest[1](
        transactional_id=txn, transaction_timeout_ms=60000), InitProducerIdResponse)
    ).error_code == 0 and r, what="the producer id")
    pid, epoch = init.producer_id, init.producer_epoch
    add_topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
    added = ask(cluster, txn_node, AddPartitionsToTxnRequest[3](
        v3_and_below_transactional_id=txn, v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[add_topic(name=sink, partitions=[0])]), AddPartitionsToTxnResponse)
    assert [p.partition_error_code for t in added.results_by_topic_v3_and_below
            for p in t.results_by_partition] == [0]

    # The transaction is open (sink-0 in it) but the group's offsets partition is not.
    tp = (source, 0)
    assert txn_commit(cluster, group_node, 3, txn, group, pid, epoch, tp, 1) == \
        ErrorCode.INVALID_TXN_STATE
    assert txn_commit(cluster, group_node, 4, txn, group, pid, epoch, tp, 1) == \
        ErrorCode.TRANSACTION_ABORTABLE

    offsets_added = ask(cluster, txn_node, AddOffsetsToTxnRequest[1](
        transactional_id=txn, producer_id=pid, producer_epoch=epoch, group_id=group),
        AddOffsetsToTxnResponse)
    assert offsets_added.error_code == 0
    assert txn_commit(cluster, group_node, 3, txn, group, pid, epoch, tp, 7) == ErrorCode.NONE
    ended = ask(cluster, txn_node, EndTxnRequest[1](
        transactional_id=txn, producer_id=pid, producer_epoch=epoch, committed=True),
        EndTxnResponse)
    assert ended.error_code == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                         "enable.auto.commit": False})
    try:
        committed = cluster.wait_for(lambda: (c := consumer.committed(
            [TopicPartition(source, 0)], timeout=10)[0]).offset == 7 and c,
            what="the offset committed with the transaction")
        assert committed.offset == 7, "only the verified commit is committed"
    finally:
        consumer.close()
