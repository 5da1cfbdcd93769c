"""EmbeddedCluster and its fixtures: etcd and three in-process brokers on fixed ports, and the
faults between them (kill, pause, isolate, partition, slow, move_leader, heal), with real
clients (confluent-kafka) and the state read from etcd itself.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest

from broker.interbroker.client import BrokerUnavailable
from broker.testing import EmbeddedCluster
from broker.testing.cluster import ClusterBroker

METADATA_KEY, METADATA_VERSION = 3, 12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    # Inter-broker requests to a cut peer give up after 3 s instead of 30.
    with EmbeddedCluster(3, tmp_path_factory.mktemp("cluster"), request_timeout_ms=3000) as c:
        yield c


@pytest.fixture(autouse=True)
def healed(cluster: EmbeddedCluster) -> Iterator[None]:
    yield
    cluster.heal()


def new_topic(cluster: EmbeddedCluster, partitions: int = 3, rf: int = 1) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, rf)], operation_timeout=10)[name].result(30)
    for p in range(partitions):
        cluster.wait_for_leader(name, p)
    return name


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> list[Any]:
    """acks=all, idempotent; each record's delivery error (None: acknowledged)."""
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "message.timeout.ms": 30000})
    for v in values:
        producer.produce(topic, v, partition=partition,
                         on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(40) == 0
    return errors


def read_partition(bootstrap: str, topic: str, partition: int, n: int,
                   timeout: float = 30.0, start: int = 0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, start)])
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


def ask_peer(source: ClusterBroker, peer: int) -> float:
    """A Metadata request from ``source`` to ``peer`` over the inter-broker client; seconds
    it took."""
    async def send() -> float:
        assert source.broker is not None and source.broker.cluster is not None
        client = source.broker.cluster.client
        assert client is not None
        started = time.perf_counter()
        await client.send(peer, METADATA_KEY, lambda v: MetadataRequest[v](
            topics=None, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False), METADATA_VERSION)
        return time.perf_counter() - started

    return float(source._on_loop(send))


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_three_brokers_registered_with_a_controller(cluster: EmbeddedCluster) -> None:
    assert cluster.registered() == [1, 2, 3]
    assert cluster.controller() in (1, 2, 3)
    ports = [b.port for b in cluster.brokers]
    assert len(set(ports)) == 3
    assert cluster.bootstrap_servers == ",".join(f"127.0.0.1:{p}" for p in ports)
    assert [b.node_id for b in cluster.brokers] == [1, 2, 3]
    dirs = {b.embedded.data_dir for b in cluster.brokers}
    assert len(dirs) == 3
    meta = AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(timeout=10)
    assert sorted(meta.brokers) == [1, 2, 3]
    assert {b.port for b in meta.brokers.values()} == set(ports)


def test_leader_replicas_and_isr_come_from_etcd(cluster: EmbeddedCluster) -> None:
    topic = new_topic(cluster, partitions=3)
    leaders = [cluster.wait_for_leader(topic, p) for p in range(3)]
    assert sorted(leaders) == [1, 2, 3]  # one partition per broker (Kafka's placement)
    for p, leader in enumerate(leaders):
        assert cluster.replicas(topic, p) == [leader]
        assert cluster.isr(topic, p) == [leader]
        assert cluster.wait_for_isr(topic, p, 1, timeout=5) == [leader]
    assert cluster.leader("no-such-topic", 0) is None
    assert cluster.replicas("no-such-topic", 0) == []


def test_kill_is_a_crash_and_restart_keeps_port_and_records(cluster: EmbeddedCluster) -> None:
    topic = new_topic(cluster)
    victim = cluster.leader(topic, 0)
    assert victim is not None
    port = cluster.broker(victim).port
    acked = [f"r{i}".encode() for i in range(20)]
    assert produce(cluster.bootstrap_servers, topic, 0, acked) == [None] * 20
    cluster.kill(victim)
    assert not cluster.broker(victim).running
    assert not listening(port)
    # No deregistration: the lease expires (session 2 s), then the partition goes offline.
    cluster.wait_for(lambda: victim not in cluster.registered(), 15, "the lease to expire")
    cluster.wait_for(lambda: cluster.leader(topic, 0) is None, 15, "the partition offline")
    assert cluster.fault_counts[("kill", "broker")] >= 1
    cluster.heal()
    broker = cluster.broker(victim)
    assert broker.running and broker.recovered and broker.port == port
    assert cluster.wait_for_leader(topic, 0, victim) == victim
    assert read_partition(cluster.bootstrap_servers, topic, 0, 20) == acked


def replica_offsets(cluster: EmbeddedCluster, topic: str, partition: int, offset: str
                    ) -> dict[int, int]:
    """Each broker's ``offset`` (an attribute name) of its replica of the partition, led or
    followed."""
    offsets = {}
    for node in (1, 2, 3):
        broker = cluster.broker(node).broker
        assert broker is not None and broker.replica_manager is not None
        rm = broker.replica_manager
        tp = (topic, partition)
        replica = rm.partitions.get(tp) or rm.follower_partitions.get(tp)
        assert replica is not None, (node, tp)
        offsets[node] = getattr(replica, offset)
    return offsets


def test_delete_records_answers_once_every_replica_dropped_them(cluster: EmbeddedCluster
                                                                ) -> None:
    topic = new_topic(cluster, partitions=1, rf=3)
    values = [f"r{i}".encode() for i in range(10)]
    assert produce(cluster.bootstrap_servers, topic, 0, values) == [None] * 10
    # Every replica knows the high watermark: a leader elected meanwhile can delete up to it.
    cluster.wait_for(lambda: replica_offsets(cluster, topic, 0, "high_watermark")
                     == {1: 10, 2: 10, 3: 10}, 15, "the followers' high watermark")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    [deleted] = admin.delete_records([TopicPartition(topic, 0, 6)]).values()
    assert deleted.result(30).low_watermark == 6
    # Answered only once the followers had moved their log start too (their fetches said so).
    assert replica_offsets(cluster, topic, 0, "log_start_offset") == {1: 6, 2: 6, 3: 6}
    assert read_partition(cluster.bootstrap_servers, topic, 0, 4, start=6) == values[6:]


def test_clean_stop_deregisters_at_once(cluster: EmbeddedCluster) -> None:
    broker = cluster.broker(3)
    broker.stop()
    assert 3 not in cluster.registered()  # revoked, not left to expire
    broker.start()
    assert not broker.recovered
    cluster.wait_for(lambda: 3 in cluster.registered(), 15, "broker 3 back")


def test_pause_stalls_the_controller_and_another_takes_over(cluster: EmbeddedCluster) -> None:
    old = cluster.wait_for_controller()
    started = time.monotonic()
    cluster.pause(old, 30)
    new = cluster.wait_for_controller(exclude=[old], timeout=20)
    assert new != old
    assert time.monotonic() - started < 20
    assert old not in cluster.registered()  # its lease expired while it stalled
    paused = cluster.broker(old)
    assert listening(paused.port)  # its sockets stay open: a hung process, not a dead one
    assert cluster.fault_counts[("pause", "broker")] >= 1
    cluster.heal()  # ends the stall; the broker registers again
    assert sorted(cluster.registered()) == [1, 2, 3]


def test_isolate_loses_the_lease_but_clients_still_reach_it(cluster: EmbeddedCluster) -> None:
    topic = new_topic(cluster)
    node = cluster.leader(topic, 0)
    assert node is not None
    other = next(b for b in cluster.brokers if b.node_id != node)
    cluster.isolate(node)
    cluster.wait_for(lambda: node not in cluster.registered(), 15, "the lease to expire")
    cluster.wait_for(lambda: cluster.leader(topic, 0) is None, 15, "the partition offline")
    assert cluster.fault_counts[("cut", "etcd")] >= 1
    # A client still reaches the isolated broker and gets an answer from it (asked on its own
    # connection: a client library may send its request to any broker it learnt of).
    assert node in cluster.broker(node).listed_brokers()
    # And the other brokers cannot.
    with pytest.raises(BrokerUnavailable):
        ask_peer(other, node)
    with pytest.raises(BrokerUnavailable):
        ask_peer(cluster.broker(node), other.node_id)
    assert cluster.fault_counts[("cut", "inter-broker")] >= 2
    cluster.heal()
    assert cluster.wait_for_leader(topic, 0, node) == node
    ask_peer(other, node)


def test_partition_cuts_only_the_links_between_the_groups(cluster: EmbeddedCluster) -> None:
    cluster.partition([1], [2, 3])
    with pytest.raises(BrokerUnavailable):
        ask_peer(cluster.broker(1), 2)
    with pytest.raises(BrokerUnavailable):
        ask_peer(cluster.broker(3), 1)
    ask_peer(cluster.broker(2), 3)  # same side: answered
    assert cluster.registered() == [1, 2, 3]  # etcd stays reachable to both sides
    cluster.heal()
    ask_peer(cluster.broker(1), 2)
    with pytest.raises(ValueError):
        cluster.partition([1, 2], [2])


def test_a_partition_stops_replication_so_the_isr_shrinks_and_heals(tmp_path: Path) -> None:
    """The followers' fetchers have connections of their own: a cut must reach them, or a
    leader cut off from its followers would keep them in sync."""
    with EmbeddedCluster(3, tmp_path, request_timeout_ms=3000,
                         replica_lag_time_max_ms=2000) as cluster:
        topic = new_topic(cluster, partitions=1, rf=3)
        leader = cluster.wait_for_leader(topic, 0)
        cluster.wait_for_isr(topic, 0, 3)
        cluster.partition([leader], [n for n in (1, 2, 3) if n != leader])
        producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": 1})
        for i in range(5):  # the followers fall behind only when the leader's log grows
            producer.produce(topic, f"alone-{i}".encode(), partition=0)
        assert producer.flush(30) == 0
        assert cluster.wait_for_isr(topic, 0, 1) == [leader]
        cluster.heal()
        assert sorted(cluster.wait_for_isr(topic, 0, 3)) == [1, 2, 3]


def test_slow_delays_every_inter_broker_request(cluster: EmbeddedCluster) -> None:
    ask_peer(cluster.broker(1), 2)  # connected
    cluster.slow(2, 300)
    assert ask_peer(cluster.broker(1), 2) >= 0.3
    assert ask_peer(cluster.broker(2), 3) >= 0.3
    assert cluster.fault_counts[("slow", "inter-broker")] >= 2
    cluster.heal()
    assert ask_peer(cluster.broker(1), 2) < 0.3


def test_move_leader_goes_through_the_controller(cluster: EmbeddedCluster) -> None:
    topic = new_topic(cluster, partitions=1, rf=3)
    leader = cluster.leader(topic, 0)
    assert sorted(cluster.replicas(topic, 0)) == [1, 2, 3]
    target = next(n for n in cluster.isr(topic, 0) if n != leader)
    cluster.move_leader(topic, 0, target)
    assert cluster.leader(topic, 0) == target
    assert cluster.fault_counts[("move_leader", "controller")] >= 1
    with pytest.raises(ValueError):
        cluster.move_leader("no-such-topic", 0, 1)


def test_a_brokers_own_request_faults(cluster: EmbeddedCluster) -> None:
    topic = new_topic(cluster, partitions=1)
    leader = cluster.broker(cluster.wait_for_leader(topic, 0))
    leader.inject_errors("Produce", "NOT_LEADER_OR_FOLLOWER", count=2, topic=topic)
    assert produce(cluster.bootstrap_servers, topic, 0, [b"once"]) == [None]
    assert leader.fault_counts[("error", "Produce")] == 2
    leader.delay("Produce", 5000, count=None)
    cluster.heal()  # clears it: the next produce is not held
    started = time.monotonic()
    assert produce(cluster.bootstrap_servers, topic, 0, [b"twice"]) == [None]
    assert time.monotonic() - started < 5
    assert read_partition(cluster.bootstrap_servers, topic, 0, 2) == [b"once", b"twice"]


def test_factory_and_async_mode(tmp_path: Path) -> None:
    import asyncio

    async def run() -> tuple[int, int]:
        async with EmbeddedCluster(1, tmp_path / "one") as one:
            return len(one.registered()), one.brokers[0].port

    count, port = asyncio.run(run())
    assert count == 1
    assert not listening(port)
    with pytest.raises(ValueError):
        EmbeddedCluster(0)
    bad = EmbeddedCluster(1, tmp_path / "bad", log_retention_ms="soon")
    with pytest.raises(Exception, match="log.retention.ms"):
        bad.start()
    assert bad.etcd is not None and not bad.etcd.running()


USER_TESTS = """
def test_session(mini_broker_cluster):
    assert mini_broker_cluster.registered() == [1, 2, 3]
    mini_broker_cluster.kill(2)

def test_healed_after_the_test_that_killed(mini_broker_cluster):
    assert mini_broker_cluster.broker(2).running

def test_factory(mini_broker_cluster_factory):
    with mini_broker_cluster_factory(nodes=2, num_partitions=2) as c:
        assert c.registered() == [1, 2]
        assert len(c.bootstrap_servers.split(",")) == 2
"""


def run_user_tests(tmp_path: Path, *args: str) -> str:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--rootdir", str(tmp_path),
                          str(tmp_path / "test_user.py"), *args],
                         cwd=tmp_path, capture_output=True, text=True, timeout=240)
    return run.stdout.strip().splitlines()[-1]


def test_the_plugin_fixtures(tmp_path: Path) -> None:
    """The plugin's cluster fixtures in a user's run; with --kafka-bootstrap the tests that
    need an embedded cluster are skipped."""
    summary = run_user_tests(tmp_path)
    assert summary.startswith("3 passed"), summary
    summary = run_user_tests(tmp_path, "--kafka-bootstrap", "127.0.0.1:1")
    assert summary.startswith("3 skipped"), summary
