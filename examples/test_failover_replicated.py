"""Failover with replication, written as a user of mini-broker's pytest plugin writes it: a
replicated topic (replication factor 3, min.insync.replicas=2) on a cluster of three brokers,
real clients, and faults from the cluster fixtures.

- a leader crashes while confluent-kafka produces with acks=all: a follower in the ISR takes
  over and no acknowledged record is lost;
- a follower cut from the others drops out of the ISR, and comes back into it after heal;
- a leader moved to another replica: a consumer follows it and reads every record once.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

if TYPE_CHECKING:
    from collections.abc import Callable

    from broker.testing import EmbeddedCluster

REPLICAS = 3
SAFE = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}


def create_replicated_topic(cluster: EmbeddedCluster, partitions: int = 1) -> str:
    name = f"replicated-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, REPLICAS, config=SAFE)])[name].result(30)
    for p in range(partitions):
        cluster.wait_for_leader(name, p)
        cluster.wait_for_isr(name, p, REPLICAS)
    return name


def read(bootstrap: str, topic: str, n: int, timeout: float = 60.0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
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


class BackgroundProducer:
    """acks=all, idempotent, producing one record every few ms on its own thread and keeping
    what the cluster acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acked: list[bytes] = []
        self.failed: list[object] = []
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 5,
                                   "message.timeout.ms": 60000})
        self._topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        (self.failed.append(err) if err is not None else self.acked.append(msg.value() or b""))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self._producer.produce(self._topic, f"v{i}".encode(), partition=0,
                                   on_delivery=self._delivered)
            self._producer.poll(0.005)
            i += 1

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(60)

    def wait_for_acks(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < n:
            assert time.monotonic() < deadline, f"only {len(self.acked)} records acknowledged"
            time.sleep(0.05)


def test_no_acknowledged_record_is_lost_when_the_leader_crashes(
        mini_broker_cluster: EmbeddedCluster) -> None:
    cluster = mini_broker_cluster
    topic = create_replicated_topic(cluster)
    old_leader = cluster.wait_for_leader(topic, 0)
    with BackgroundProducer(cluster.bootstrap_servers, topic) as producer:
        producer.wait_for_acks(200)
        cluster.kill(old_leader)
        new_leader = cluster.wait_for(
            lambda: (leader := cluster.leader(topic, 0)) not in (None, old_leader) and leader,
            timeout=20)
        assert new_leader in cluster.replicas(topic, 0)
        before = len(producer.acked)
        producer.wait_for_acks(before + 200)  # the producer carries on with the new leader
    assert producer.failed == []
    cluster.heal()
    stored = read(cluster.bootstrap_servers, topic, len(producer.acked))
    missing = set(producer.acked) - set(stored)
    assert not missing, f"{len(missing)} acknowledged records lost"
    assert len(stored) == len(set(stored))  # idempotence: nothing written twice


def test_an_isolated_follower_leaves_the_isr_and_comes_back(
        mini_broker_cluster_factory: Callable[..., EmbeddedCluster]) -> None:
    # A follower that has not fetched for 2 s is out of the ISR (Kafka's default is 30 s).
    with mini_broker_cluster_factory(nodes=3, replica_lag_time_max_ms=2000) as cluster:
        topic = create_replicated_topic(cluster)
        leader = cluster.leader(topic, 0)
        follower = next(n for n in cluster.isr(topic, 0) if n != leader)
        cluster.isolate(follower)
        isr = cluster.wait_for_isr(topic, 0, REPLICAS - 1, timeout=30)
        assert follower not in isr and leader in isr
        # Two in sync is min.insync.replicas: acks=all writes still succeed.
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
        errors: list = []
        for i in range(10):
            producer.produce(topic, f"during-{i}".encode(), partition=0,
                             on_delivery=lambda err, msg: errors.append(err))
        producer.flush(30)
        assert errors == [None] * 10
        cluster.heal()
        assert sorted(cluster.wait_for_isr(topic, 0, REPLICAS, timeout=60)) == [1, 2, 3]


def test_a_consumer_follows_a_moved_leader(mini_broker_cluster: EmbeddedCluster) -> None:
    cluster = mini_broker_cluster
    topic = create_replicated_topic(cluster)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                         "group.id": f"g-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []

    def poll_until(n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(values) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value() or b"")

    try:
        for i in range(10):
            producer.produce(topic, f"before-{i}".encode(), partition=0)
        assert producer.flush(30) == 0
        poll_until(10)
        cluster.wait_for_isr(topic, 0, REPLICAS)
        old = cluster.leader(topic, 0)
        target = next(n for n in cluster.isr(topic, 0) if n != old)
        cluster.move_leader(topic, 0, target)
        assert cluster.leader(topic, 0) == target
        for i in range(10):
            producer.produce(topic, f"after-{i}".encode(), partition=0)
        assert producer.flush(30) == 0
        poll_until(20)
    finally:
        consumer.close()
    assert values == ([f"before-{i}".encode() for i in range(10)]
                      + [f"after-{i}".encode() for i in range(10)])
