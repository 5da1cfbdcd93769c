"""Failover tests written as a user of mini-broker's pytest plugin writes them: only the cluster
fixtures (mini_broker_cluster: three brokers and their etcd for the session) and real clients.

Each fault is undone after the test that armed it (the plugin heals the session cluster).
`pytest examples/ --kafka-bootstrap host:9092` skips these: faults need the embedded cluster.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker.testing import EmbeddedCluster


def create_topic(cluster: EmbeddedCluster, partitions: int = 3, replication_factor: int = 1) -> str:
    name = f"failover-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, replication_factor)])[name].result(30)
    for p in range(partitions):
        cluster.wait_for_leader(name, p)
    return name


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> list:
    """acks=all; each record's delivery error (None: acknowledged)."""
    errors: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value, partition=partition,
                         on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    return errors


def read(bootstrap: str, topic: str, partition: int, n: int, timeout: float = 30.0,
         config: dict[str, object] | None = None) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, **(config or {})})
    consumer.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value() or b"")
    finally:
        consumer.close()
    return values


def test_a_crashed_leader_comes_back_with_every_acknowledged_record(
        mini_broker_cluster: EmbeddedCluster) -> None:
    cluster = mini_broker_cluster
    topic = create_topic(cluster)
    victim = cluster.wait_for_leader(topic, 0)
    acked = [f"order-{i}".encode() for i in range(50)]
    assert produce(cluster.bootstrap_servers, topic, 0, acked) == [None] * 50

    cluster.kill(victim)  # a crash: no flush, no deregistration
    # One replica: once the dead broker's session expires, the partition has no leader.
    cluster.wait_for(lambda: cluster.leader(topic, 0) is None, timeout=15)
    assert all(cluster.leader(topic, p) is not None for p in (1, 2))  # the others still led

    cluster.heal()  # restarted on the same port, its log recovered
    assert cluster.wait_for_leader(topic, 0) == victim
    assert read(cluster.bootstrap_servers, topic, 0, 50) == acked


def test_another_broker_becomes_controller_when_the_controller_stalls(
        mini_broker_cluster: EmbeddedCluster) -> None:
    cluster = mini_broker_cluster
    controller = cluster.wait_for_controller()
    cluster.pause(controller, 30)  # its event loop stalls: no lease refresh, no answers
    successor = cluster.wait_for_controller(exclude=[controller], timeout=20)
    assert successor != controller
    # The cluster still creates topics through the new controller.
    topic = create_topic(cluster, partitions=1)
    assert cluster.leader(topic, 0) != controller


def test_an_isolated_broker_loses_its_lease_but_still_answers_clients(
        mini_broker_cluster: EmbeddedCluster) -> None:
    cluster = mini_broker_cluster
    topic = create_topic(cluster)
    zombie = cluster.wait_for_leader(topic, 0)
    cluster.isolate(zombie)  # cut from etcd and the other brokers, not from clients
    cluster.wait_for(lambda: zombie not in cluster.registered(), timeout=15)
    cluster.wait_for(lambda: cluster.leader(topic, 0) is None, timeout=15)
    # A client still gets answers from the zombie, which still lists itself (asked on a
    # connection to it alone: a client library may route a request to any broker it knows).
    assert zombie in cluster.broker(zombie).listed_brokers()
    cluster.heal()
    assert cluster.wait_for_leader(topic, 0) == zombie


def test_a_transaction_across_a_partition_commits_after_heal(
        mini_broker_cluster: EmbeddedCluster) -> None:
    """The partition leader asks the transaction coordinator to verify each transactional
    write: with the two brokers partitioned nothing is acknowledged and the commit times out;
    after heal, the retried commit succeeds and a read_committed consumer sees the records."""
    cluster = mini_broker_cluster
    topic = create_topic(cluster)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers,
                         "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    coordinator = cluster.wait_for_leader("__transaction_state", 0)
    partition = next(p for p in range(3) if cluster.leader(topic, p) != coordinator)
    others = [b.node_id for b in cluster.brokers if b.node_id != coordinator]
    cluster.partition([coordinator], others)

    producer.begin_transaction()
    values = [f"payment-{i}".encode() for i in range(5)]
    for value in values:
        producer.produce(topic, value, partition=partition)
    try:
        producer.commit_transaction(5)
        raise AssertionError("committed across a network partition")
    except KafkaException as e:
        assert e.args[0].retriable(), e
    assert read(cluster.bootstrap_servers, topic, partition, 5, timeout=3,
                config={"isolation.level": "read_committed"}) == []

    cluster.heal()
    producer.commit_transaction(30)
    assert read(cluster.bootstrap_servers, topic, partition, 5,
                config={"isolation.level": "read_committed"}) == values


def test_a_cluster_of_its_own(mini_broker_cluster_factory: Callable[..., EmbeddedCluster]) -> None:
    with mini_broker_cluster_factory(nodes=2, num_partitions=4) as cluster:
        topic = f"own-{uuid.uuid4().hex[:8]}"
        assert produce(cluster.bootstrap_servers, topic, 3, [b"x"]) == [None]
        assert sorted({cluster.wait_for_leader(topic, p) for p in range(4)}) == [1, 2]


#: What the transform app's producer adds to librdkafka's defaults. librdkafka (2.10 on) drops a
#: broker missing from a Metadata answer (a dead broker is, once its registration expires); if
#: that broker was the cached group coordinator, send_offsets_to_transaction waits, past its own
#: timeout, for some broker connection of the producer to go up or down before it looks the
#: coordinator up again. With no such change the transaction outlives transaction.timeout.ms, the
#: coordinator aborts it with a new epoch, and the late TxnOffsetCommit is fenced (fatal). Idle
#: connections closed after 5 s are such a change; the metadata refreshed every second keeps one
#: connection busy, so the lookup is not sent on a connection closing for idleness at that moment.
TRANSFORM_PRODUCER_CONFIG: dict[str, object] = {"connections.max.idle.ms": 5000,
                                                "topic.metadata.refresh.interval.ms": 1000}


def transform(bootstrap: str, source: str, sink: str, expected: int, stop_after: float,
              progress: list[int]) -> int:
    """A consume-transform-produce app, exactly once: read ``source``, upper-case each value,
    write it to ``sink`` and commit the input offsets in the same transaction. A step that
    fails retriably (a leader or coordinator down) is tried again; a transaction that needs
    an abort is aborted and its input read again from the committed offsets. Returns how
    many records it committed (``progress`` gets the count after each commit)."""
    group = f"transform-{source}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": group,
                         "transaction.timeout.ms": 60000, **TRANSFORM_PRODUCER_CONFIG})
    producer.init_transactions(30)
    consumer.subscribe([source])
    done = 0
    deadline = time.monotonic() + stop_after
    try:
        while done < expected and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(10, timeout=0.5) if m.error() is None]
            if not batch:
                continue
            producer.begin_transaction()
            for msg in batch:
                producer.produce(sink, (msg.value() or b"").upper(), key=msg.key())
            offsets = consumer.position(consumer.assignment())
            if committed_in_transaction(producer, consumer, offsets, deadline):
                done += len(batch)
                progress.append(done)
            else:  # aborted: read the batch again from the last committed offsets
                for tp in consumer.committed(consumer.assignment(), timeout=30):
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
    finally:
        consumer.close()
    return done


def committed_in_transaction(producer: Producer, consumer: Consumer, offsets: list,
                             deadline: float) -> bool:
    """The input offsets sent and the transaction committed: True; False when it had to be
    aborted. Retriable errors are retried until ``deadline``."""
    offsets_sent = False
    while True:
        try:
            if not offsets_sent:
                producer.send_offsets_to_transaction(
                    offsets, consumer.consumer_group_metadata(), 10)
                offsets_sent = True
            producer.commit_transaction(10)
            return True
        except KafkaException as e:
            error = e.args[0]
            if error.txn_requires_abort():
                producer.abort_transaction(30)
                return False
            if not error.retriable() or time.monotonic() > deadline:
                raise


def test_a_transform_app_survives_a_leader_crash(mini_broker_cluster: EmbeddedCluster) -> None:
    cluster = mini_broker_cluster
    source, sink = create_topic(cluster, partitions=1), create_topic(cluster, partitions=1)
    inputs = [f"event-{i}".encode() for i in range(300)]
    assert produce(cluster.bootstrap_servers, source, 0, inputs) == [None] * 300

    result: list[int] = []
    progress: list[int] = []
    app = threading.Thread(target=lambda: result.append(
        transform(cluster.bootstrap_servers, source, sink, 300, 120, progress)))
    app.start()
    cluster.wait_for(lambda: progress, timeout=60)  # the first transaction committed
    cluster.kill(cluster.wait_for_leader(sink, 0))  # the output's leader crashes mid-stream
    assert progress[-1] < 300
    time.sleep(3)
    cluster.heal()
    app.join(150)

    assert result == [300]
    output = read(cluster.bootstrap_servers, sink, 0, 300, config={"isolation.level":
                                                                "read_committed"})
    assert output == [v.upper() for v in inputs]  # each input once, in order


def test_offsets_reach_a_group_coordinator_back_from_a_crash(
        mini_broker_cluster_factory: Callable[..., EmbeddedCluster]) -> None:
    """The transform app's producer keeps committing offsets after the group coordinator's
    broker crashed, dropped out of the cluster's metadata and came back: the producer's
    client forgets that broker while it is gone, and TRANSFORM_PRODUCER_CONFIG lets it look
    the coordinator up again. The transaction coordinator is on another broker, so nothing
    else wakes the client."""
    for _ in range(8):  # fresh clusters until the two coordinators are on different brokers
        with mini_broker_cluster_factory(nodes=3) as cluster:
            if offsets_reach_the_restarted_group_coordinator(cluster):
                return
    raise AssertionError("the group and transaction coordinators always shared a broker")


def offsets_reach_the_restarted_group_coordinator(cluster: EmbeddedCluster) -> bool:
    """False when the coordinators share a broker (nothing to show); else asserts."""
    group = f"app-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers,
                         "transactional.id": group, **TRANSFORM_PRODUCER_CONFIG})
    producer.init_transactions(30)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                         "enable.auto.commit": False})
    source = create_topic(cluster, partitions=1)
    try:
        assert transact_offsets(producer, consumer, source, 1, 30) == []  # coordinator cached
        coordinator = cluster.wait_for_leader("__consumer_offsets", 0)
        if coordinator == cluster.wait_for_leader("__transaction_state", 0):
            return False
        cluster.kill(coordinator)
        # Once the brokers' metadata no longer lists it, the client drops it.
        cluster.wait_for(lambda: coordinator not in producer.list_topics(timeout=10).brokers,
                         timeout=20)
        cluster.heal()
        cluster.wait_for_leader("__consumer_offsets", 0)
        assert transact_offsets(producer, consumer, source, 2, 30) == []
        committed = consumer.committed([TopicPartition(source, 0)], timeout=30)
        assert [tp.offset for tp in committed] == [2]
        return True
    finally:
        consumer.close()


def transact_offsets(producer: Producer, consumer: Consumer, topic: str, offset: int,
                     within: float) -> list[BaseException]:
    """One transaction committing ``offset`` for the consumer's group, retried until
    ``within`` seconds pass; what stopped it (nothing: committed). Run on a thread of its
    own, so that a client call blocked past its timeout fails the caller instead of
    hanging it (a call begun just before the deadline may end 20 s after it)."""
    errors: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        deadline = time.monotonic() + within
        try:
            producer.begin_transaction()
            offsets = [TopicPartition(topic, 0, offset)]
            if not committed_in_transaction(producer, consumer, offsets, deadline):
                errors.append(AssertionError("the transaction was aborted"))
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    if not done.wait(within + 25):
        errors.append(TimeoutError(f"the transaction still open after {within} s"))
    return errors
