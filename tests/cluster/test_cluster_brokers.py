"""Three real broker processes in cluster mode on one real etcd, driven by confluent-kafka.

Replication factor 1: the slice of cluster mode that exists (no replication). A topic created
through any broker is created by the controller and its partitions led by all three brokers;
records produced with acks=all are read back with an assign()-based consumer; a broker killed
has its partitions offline (leader -1) within the session timeout while the others serve; on
restart it leads them again in a newer leader epoch, with their data. A second broker with a
live node id exits 2 with one line.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker.cluster.etcd_process import EtcdProcess
from tests.support.broker import BrokerProcess
from tests.support.requests import produce_request, produce_response, record_batch
from tests.support.wire import Wire
from tools.cluster_run import INTERNAL_TOPICS_ONE_REPLICA

SESSION_MS = 4000  # a 2 s session lapsed on a loaded machine: leaders moved mid-test
TOPIC = "spread"
PARTITIONS = 6
RECORDS = 600


def cluster_overrides(etcd: EtcdProcess, prefix: str, node_id: int) -> dict[str, str]:
    return {"node.id": str(node_id), "minibroker.etcd.endpoints": etcd.endpoint,
            "minibroker.etcd.prefix": prefix, "broker.session.timeout.ms": str(SESSION_MS),
            "broker.heartbeat.interval.ms": "500", **INTERNAL_TOPICS_ONE_REPLICA}


@pytest.fixture
def prefix() -> str:
    return f"/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def three(tmp_path: Path, etcd_server: EtcdProcess, prefix: str) -> Iterator[list[BrokerProcess]]:
    brokers: list[BrokerProcess] = []
    try:
        for node_id in (1, 2, 3):
            brokers.append(BrokerProcess(tmp_path / f"b{node_id}",
                                         cluster_overrides(etcd_server, prefix, node_id)).start())
        yield brokers
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()


def metadata(broker: BrokerProcess) -> Any:
    wire = Wire(broker.port)
    try:
        return wire.request(MetadataRequest[9](topics=None, allow_auto_topic_creation=False,
                                               include_cluster_authorized_operations=False,
                                               include_topic_authorized_operations=False),
                            MetadataResponse)
    finally:
        wire.close()


def partitions_of(meta: Any, topic: str) -> dict[int, Any]:
    (t,) = [t for t in meta.topics if t.name == topic]
    return {p.partition_index: p for p in t.partitions}


def eventually(check: Callable[[], Any], within_s: float, step_s: float = 0.1) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s")
        time.sleep(step_s)


def produce(bootstrap: str, records: list[tuple[bytes, bytes]], partition: int = -1) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "message.timeout.ms": 30000})
    errors: list[Any] = []
    for key, value in records:
        producer.produce(TOPIC, value, key, partition=partition,
                         on_delivery=lambda e, m: errors.append(e) if e else None)
    assert producer.flush(30) == 0
    assert errors == []


def consume_all(bootstrap: str, partitions: list[int], count: int) -> list[tuple[bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-assign-only",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in partitions])
        got: list[tuple[bytes, bytes]] = []
        for m in poll_records(consumer, count):
            key, value = m.key(), m.value()
            assert key is not None and value is not None, m
            got.append((key, value))
        return got
    finally:
        consumer.close()


def poll_records(consumer: Consumer, count: int, within_s: float = 60) -> list[Any]:
    """Up to ``count`` records, polled for at most ``within_s``; an error raises."""
    got: list[Any] = []
    deadline = time.monotonic() + within_s
    while len(got) < count and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        if m.error():
            raise KafkaException(m.error())
        got.append(m)
    return got


def test_three_brokers_spread_serve_and_survive_a_kill(three: list[BrokerProcess]) -> None:
    bootstrap = ",".join(b.bootstrap for b in three)
    admin = AdminClient({"bootstrap.servers": three[2].bootstrap})
    futures = admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)], operation_timeout=30)
    futures[TOPIC].result(timeout=30)

    def all_led() -> dict[int, Any] | None:
        meta = metadata(three[0])
        if TOPIC not in {t.name for t in meta.topics}:
            return None
        parts = partitions_of(meta, TOPIC)
        return parts if len(parts) == PARTITIONS and all(
            p.leader_id != -1 and p.error_code == 0 for p in parts.values()) else None

    before = eventually(all_led, 20)
    meta = metadata(three[1])
    assert sorted(b.node_id for b in meta.brokers) == [1, 2, 3]
    assert {b.port for b in meta.brokers} == {b.port for b in three}
    assert meta.controller_id in (1, 2, 3)
    leaders = [p.leader_id for p in before.values()]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3], leaders  # spread over the three
    for p in before.values():
        assert p.replica_nodes == [p.leader_id] and p.isr_nodes == [p.leader_id]

    check_not_controller_and_not_leader(three, meta.controller_id, before)

    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(RECORDS)]
    produce(bootstrap, records)
    got = consume_all(bootstrap, list(range(PARTITIONS)), RECORDS)
    assert sorted(got) == sorted(records)

    # Kill a broker that is not the controller: its partitions go offline within the
    # session timeout (plus the controller's turn), the others keep their leaders.
    victim = next(b for b in three if int(b.overrides["node.id"]) != meta.controller_id)
    victim_id = int(victim.overrides["node.id"])
    survivor = next(b for b in three if b is not victim)
    victims = {i for i, p in before.items() if p.leader_id == victim_id}
    killed_at = time.monotonic()
    victim.kill()

    def offline() -> dict[int, Any] | None:
        # Offline as the controller wrote it (leader -1 in a new epoch), not only as a cache
        # that already misses the dead broker shows it before the controller's turn.
        parts = partitions_of(metadata(survivor), TOPIC)
        return parts if all(parts[i].leader_id == -1
                            and parts[i].leader_epoch > before[i].leader_epoch
                            for i in victims) else None

    after_kill = eventually(offline, SESSION_MS / 1000 + 5, step_s=0.05)
    assert time.monotonic() - killed_at < SESSION_MS / 1000 + 5
    for i, p in after_kill.items():
        if i in victims:
            assert p.error_code == 5  # LEADER_NOT_AVAILABLE
            assert p.leader_epoch > before[i].leader_epoch
            assert p.offline_replicas == [victim_id]
        else:
            # Same leader; its epoch moves only if that broker's own session lapsed meanwhile
            # (a bounce: possible on a loaded machine even with a 4 s session).
            assert p.leader_id == before[i].leader_id and p.error_code == 0
            assert p.leader_epoch >= before[i].leader_epoch
    assert victim_id not in {b.node_id for b in metadata(survivor).brokers}
    # The others keep serving: a record to a partition a live broker leads.
    live_partition = next(i for i in range(PARTITIONS) if i not in victims)
    live_bootstrap = ",".join(b.bootstrap for b in three if b is not victim)
    produce(live_bootstrap, [(b"after", b"kill")], partition=live_partition)

    victim.start()

    def back() -> dict[int, Any] | None:
        parts = partitions_of(metadata(survivor), TOPIC)
        return parts if all(parts[i].leader_id == victim_id for i in victims) else None

    after_restart = eventually(back, 30)
    for i in victims:  # a newer epoch: +1, unless a session lapsed again meanwhile
        assert after_restart[i].leader_epoch > after_kill[i].leader_epoch
        assert after_restart[i].error_code == 0 and after_restart[i].offline_replicas == []
    got = consume_all(bootstrap, list(range(PARTITIONS)), RECORDS + 1)
    assert sorted(got) == sorted([*records, (b"after", b"kill")])


def check_not_controller_and_not_leader(three: list[BrokerProcess], controller_id: int,
                                        partitions: dict[int, Any]) -> None:
    """A broker that is not the controller refuses CreateTopics with NOT_CONTROLLER; one that
    does not lead a partition refuses a produce to it with NOT_LEADER_OR_FOLLOWER."""
    other = next(b for b in three if int(b.overrides["node.id"]) != controller_id)
    wire = Wire(other.port)
    try:
        topic = CreateTopicsRequest.CreatableTopic
        req = CreateTopicsRequest[7](timeout_ms=5000, validate_only=False, topics=[topic(
            name="elsewhere", num_partitions=1, replication_factor=1, configs=[],
            assignments=[])])
        [result] = wire.request(req, CreateTopicsResponse).topics
        assert result.error_code == 41  # NOT_CONTROLLER
        other_id = int(other.overrides["node.id"])
        index = next(i for i, p in partitions.items() if p.leader_id != other_id)
        wire.send(produce_request(TOPIC, record_batch([b"x"]), partition=index))
        assert produce_response(wire.read_frame())[0] == 6  # NOT_LEADER_OR_FOLLOWER
    finally:
        wire.close()


def test_a_second_broker_with_a_live_node_id_exits_2(tmp_path: Path, etcd_server: EtcdProcess,
                                                     prefix: str) -> None:
    first = BrokerProcess(tmp_path / "a", cluster_overrides(etcd_server, prefix, 7)).start()
    try:
        args = [sys.executable, "-m", "broker"]
        overrides = {**cluster_overrides(etcd_server, prefix, 7),
                     "log.dirs": str(tmp_path / "b" / "logs"),
                     "listeners": "PLAINTEXT://127.0.0.1:0",
                     "metrics.listener": "http://127.0.0.1:0/metrics"}
        for k, v in overrides.items():
            args += ["--override", f"{k}={v}"]
        done = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.startswith("mini-broker:")]
        assert len(lines) == 1, done.stderr
        assert "node.id 7 is registered by another live broker" in lines[0], lines[0]
        assert "(key /brokers/ids/7)" in lines[0] and prefix in lines[0], lines[0]
        assert "Traceback" not in done.stderr
        assert first.proc is not None and first.proc.poll() is None  # the first one serves on
        assert [b.node_id for b in metadata(first).brokers] == [7]
        assert first.stop() == 0  # a clean shutdown: resigned and deregistered
        assert "broker stopped cleanly" in first.log_text()
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.stop()
