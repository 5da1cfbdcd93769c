"""Group and transaction coordinators across three real brokers on a real etcd (confluent-kafka).

FindCoordinator creates `__consumer_offsets` / `__transaction_state` through the controller on
first use (COORDINATOR_NOT_AVAILABLE until their partitions have leaders), then answers the
leader of the key's partition, on the listener asked. A consumer group coordinated by a broker
other than the bootstrap one commits, and a second consumer resumes from its offsets; the
coordinator's broker killed (SIGKILL) and restarted on its port and data dir takes its
partition back with the group's offsets loaded from its log.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from broker.cluster.etcd_process import EtcdProcess
from broker.coordinator.records import java_string_hash
from broker.txn.state_log import partition_for as txn_partition_for
from tests.cluster.test_cluster_brokers import (
    cluster_overrides,
    eventually,
    metadata,
    partitions_of,
    poll_records,
)
from tests.support.broker import BrokerProcess
from tests.support.wire import Wire

OFFSETS_PARTITIONS = 6
TXN_PARTITIONS = 6
TOPIC = "orders"
TOPIC_PARTITIONS = 3
GROUP_TYPE, TXN_TYPE = 0, 1
COORDINATOR_NOT_AVAILABLE = 15
RETRIABLE = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
             KafkaError.COORDINATOR_NOT_AVAILABLE}


def coordinator_overrides(etcd: EtcdProcess, prefix: str, node_id: int) -> dict[str, str]:
    return {**cluster_overrides(etcd, prefix, node_id),
            "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
            "transaction.state.log.num.partitions": str(TXN_PARTITIONS),
            "group.initial.rebalance.delay.ms": "0"}


@pytest.fixture
def three(tmp_path: Path, etcd_server: EtcdProcess, prefix: str) -> Iterator[list[BrokerProcess]]:
    brokers: list[BrokerProcess] = []
    try:
        for node_id in (1, 2, 3):
            brokers.append(BrokerProcess(
                tmp_path / f"b{node_id}",
                coordinator_overrides(etcd_server, prefix, node_id)).start())
        yield brokers
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()


@pytest.fixture
def prefix() -> str:
    return f"/test-{uuid.uuid4().hex[:12]}"


def group_partition(group_id: str) -> int:
    """The single-node coordinator's hash (sign bit masked), which cluster mode keeps."""
    return (java_string_hash(group_id) & 0x7FFFFFFF) % OFFSETS_PARTITIONS


def node_of(broker: BrokerProcess) -> int:
    return int(broker.overrides["node.id"])


def find(broker: BrokerProcess, key_type: int, keys: list[str]) -> dict[str, Any]:
    """FindCoordinator v4 (batched): each key's answer."""
    wire = Wire(broker.port)
    try:
        resp = wire.request(FindCoordinatorRequest[4](key_type=key_type, coordinator_keys=keys),
                            FindCoordinatorResponse)
    finally:
        wire.close()
    return {c.key: c for c in resp.coordinators}


def find_v3(broker: BrokerProcess, key_type: int, key: str) -> Any:
    wire = Wire(broker.port)
    try:
        return wire.request(FindCoordinatorRequest[3](key=key, key_type=key_type),
                            FindCoordinatorResponse)
    finally:
        wire.close()


def leaders(broker: BrokerProcess, topic: str, count: int) -> dict[int, int] | None:
    """Partition -> leader of the internal topic, once every partition has one."""
    meta = metadata(broker)
    if topic not in {t.name for t in meta.topics}:
        return None
    parts = partitions_of(meta, topic)
    if len(parts) != count or any(p.leader_id == -1 for p in parts.values()):
        return None
    return {i: p.leader_id for i, p in parts.items()}


def keys_by_partition(partition_of: Any, count: int, prefix: str) -> dict[int, str]:
    """One key per partition of the topic."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < count:
        key = f"{prefix}-{i}"
        found.setdefault(partition_of(key), key)
        i += 1
    return found


def found_by(broker: BrokerProcess, keys: list[str]) -> dict[str, Any] | None:
    """``broker``'s FindCoordinator answers for the group ``keys``, once all are found."""
    answers = find(broker, GROUP_TYPE, keys)
    return answers if all(c.error_code == 0 for c in answers.values()) else None


def test_find_coordinator_answers_the_leader_of_the_keys_partition(
        three: list[BrokerProcess]) -> None:
    asked = three[0]
    group_keys = keys_by_partition(group_partition, OFFSETS_PARTITIONS, "group")
    # The first ask creates the topic: not available until its partitions have leaders.
    first = find(asked, GROUP_TYPE, list(group_keys.values()))
    assert {c.error_code for c in first.values()} <= {0, COORDINATOR_NOT_AVAILABLE}
    led = eventually(lambda: leaders(asked, "__consumer_offsets", OFFSETS_PARTITIONS), 30)
    assert set(led.values()) == {1, 2, 3}, led  # spread over the live brokers
    ports = {node_of(b): b.port for b in three}

    answers = eventually(lambda: found_by(asked, list(group_keys.values())), 30)
    for partition, key in group_keys.items():
        c = answers[key]
        assert (c.node_id, c.host, c.port) == (led[partition], "127.0.0.1",
                                               ports[led[partition]]), (partition, c)
    assert len({answers[k].node_id for k in group_keys.values()}) == 3  # answers differ
    # Every broker answers the same once it has the topic's partition states (each learns
    # them from its own watch, as a Kafka broker from UpdateMetadata); v3 (one key) too.
    for broker in three[1:]:
        again = eventually(functools.partial(found_by, broker, list(group_keys.values())), 30)
        assert {k: c.node_id for k, c in again.items()} == {k: c.node_id
                                                           for k, c in answers.items()}
    one = find_v3(three[2], GROUP_TYPE, group_keys[0])
    assert (one.error_code, one.node_id, one.port) == (0, led[0], ports[led[0]])

    # Transactional ids hash as the transaction coordinator does (Kafka's Utils.abs).
    txn_keys = keys_by_partition(lambda k: txn_partition_for(k, TXN_PARTITIONS),
                                 TXN_PARTITIONS, "txn")
    pending = find_v3(asked, TXN_TYPE, txn_keys[0])
    assert pending.error_code in (0, COORDINATOR_NOT_AVAILABLE)
    if pending.error_code:
        assert pending.error_message == "The coordinator is not available."
        assert (pending.node_id, pending.host, pending.port) == (-1, "", -1)
    txn_led = eventually(lambda: leaders(asked, "__transaction_state", TXN_PARTITIONS), 30)

    def txn_found() -> dict[str, Any] | None:
        got = find(three[1], TXN_TYPE, list(txn_keys.values()))
        return got if all(c.error_code == 0 for c in got.values()) else None

    txn_answers = eventually(txn_found, 30)
    for partition, key in txn_keys.items():
        assert txn_answers[key].node_id == txn_led[partition]


def produce(bootstrap: str, count: int, start: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "message.timeout.ms": 30000})
    for i in range(start, start + count):
        producer.produce(TOPIC, f"v{i}".encode(), f"k{i}".encode(), partition=i % 3)
    assert producer.flush(30) == 0


def consume(bootstrap: str, group: str, count: int, commit: bool = True) -> list[bytes]:
    """Subscribe in ``group``, read ``count`` records (earliest when nothing is committed),
    commit synchronously and leave."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 10000})
    try:
        consumer.subscribe([TOPIC])
        got = [m.value() for m in poll_records(consumer, count)]
        if commit:
            consumer.commit(asynchronous=False)
        return got
    finally:
        consumer.close()


def committed(bootstrap: str, group: str) -> dict[int, int]:
    """The group's committed offsets; a coordinator that moved or is loading (the answer of
    a broker whose own view of the leadership is a moment behind the others') is asked again,
    as a client does, for up to 30 s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                tps = consumer.committed(
                    [TopicPartition(TOPIC, p) for p in range(TOPIC_PARTITIONS)], timeout=30)
                return {tp.partition: tp.offset for tp in tps}
            except KafkaException as e:
                if e.args[0].code() not in RETRIABLE or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()


def test_group_commits_on_a_remote_coordinator_and_survives_its_restart(
        three: list[BrokerProcess]) -> None:
    bootstrap = three[0]
    eventually(lambda: metadata(bootstrap).controller_id != -1, 20)
    admin = AdminClient({"bootstrap.servers": bootstrap.bootstrap})
    admin.create_topics([NewTopic(TOPIC, TOPIC_PARTITIONS, 1)],
                        operation_timeout=30)[TOPIC].result(timeout=30)
    find(bootstrap, GROUP_TYPE, ["warm-up"])  # creates __consumer_offsets
    led = eventually(lambda: leaders(bootstrap, "__consumer_offsets", OFFSETS_PARTITIONS), 30)
    # A group whose coordinator is not the bootstrap broker.
    group = next(g for i in range(1000)
                 if led[group_partition(g := f"remote-{i}")] != node_of(bootstrap))
    coordinator_id = led[group_partition(group)]
    coordinator = next(b for b in three if node_of(b) == coordinator_id)
    eventually(lambda: find(bootstrap, GROUP_TYPE, [group])[group].error_code == 0, 30)
    assert find(bootstrap, GROUP_TYPE, [group])[group].node_id == coordinator_id

    produce(bootstrap.bootstrap, 30, 0)
    first = consume(bootstrap.bootstrap, group, 30)
    assert sorted(first) == sorted(f"v{i}".encode() for i in range(30))
    assert committed(bootstrap.bootstrap, group) == {p: 10 for p in range(TOPIC_PARTITIONS)}

    produce(bootstrap.bootstrap, 9, 30)
    second = consume(bootstrap.bootstrap, group, 9)  # resumes from the committed offsets
    assert sorted(second) == sorted(f"v{i}".encode() for i in range(30, 39))
    assert committed(bootstrap.bootstrap, group) == {p: 13 for p in range(TOPIC_PARTITIONS)}

    # SIGKILL the coordinator's broker; restarted on its port and data dir it takes its
    # partition back and loads the group's offsets from its log.
    coordinator.kill()
    others = [b for b in three if b is not coordinator]
    gone = eventually(lambda: leaders_or_offline(others[0], group_partition(group)) == -1, 15)
    assert gone
    not_available = find(others[0], GROUP_TYPE, [group])[group]
    assert not_available.error_code == COORDINATOR_NOT_AVAILABLE
    coordinator.start()
    eventually(lambda: leaders_or_offline(others[0], group_partition(group)) == coordinator_id,
               30)
    eventually(lambda: find(others[1], GROUP_TYPE, [group])[group].error_code == 0, 30)
    assert find(others[1], GROUP_TYPE, [group])[group].node_id == coordinator_id
    assert committed(others[0].bootstrap, group) == {p: 13 for p in range(TOPIC_PARTITIONS)}
    bootstrap_all = ",".join(b.bootstrap for b in three)
    produce(bootstrap_all, 3, 39)
    third = consume(bootstrap_all, group, 3)
    assert sorted(third) == sorted(f"v{i}".encode() for i in range(39, 42))


def leaders_or_offline(broker: BrokerProcess, partition: int) -> int:
    """The leader of the offsets partition as ``broker`` knows it (-1: offline)."""
    return int(partitions_of(metadata(broker), "__consumer_offsets")[partition].leader_id)
