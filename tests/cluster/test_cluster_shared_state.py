"""One cluster's state, everywhere: three real broker processes on one real etcd, each with a
PLAINTEXT and a SASL_PLAINTEXT listener and the ACL authorizer on, driven by confluent-kafka.

A SCRAM user created through broker 1 logs in to broker 2; an ACL created through broker 1 lets
that user write to the partition broker 2 leads, which refused it before; a topic config
altered through one broker is described by every broker and enforced by the partition's leader
(max.message.bytes); the cluster default broker config altered through one broker is every
broker's; InitProducerId on
different brokers hands out ids from different blocks, and idempotent producers write through
the cluster.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol.admin import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from broker.cluster.etcd_process import EtcdProcess
from tests.cluster.test_cluster_brokers import cluster_overrides, eventually, metadata
from tests.support.broker import BrokerProcess
from tests.support.wire import Wire

pytestmark = pytest.mark.timeout(180)

ADMIN_PW = "admin-secret"
ALICE_PW = "alice-scram-pw"
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_admin="{ADMIN_PW}";')
WAIT_S = 30


def secure_overrides(etcd: EtcdProcess, prefix: str, node_id: int) -> dict[str, str]:
    return {**cluster_overrides(etcd, prefix, node_id),
            "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            # the test's own PLAINTEXT requests (metadata, InitProducerId) are anonymous
            "super.users": "User:admin;User:ANONYMOUS",
            "auto.create.topics.enable": "false"}


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdProcess
          ) -> Iterator[list[BrokerProcess]]:
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    root = tmp_path_factory.mktemp("shared")
    brokers: list[BrokerProcess] = []
    try:
        for node_id in (1, 2, 3):
            brokers.append(BrokerProcess(Path(root) / f"b{node_id}",
                                         secure_overrides(etcd_server, prefix, node_id)).start())
        yield brokers
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()


def sasl(broker: BrokerProcess, mechanism: str, user: str, password: str,
         **extra: object) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
            "broker.address.family": "v4", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
            **extra}


def produce_one(config: dict[str, Any], topic: str, partition: int) -> Any:
    """The delivery error of one record (None: written)."""
    producer = Producer({**config, "message.timeout.ms": 10000, "retries": 0})
    outcome: list[Any] = []
    producer.produce(topic, b"v", b"k", partition=partition,
                     on_delivery=lambda e, m: outcome.append(e))
    producer.flush(20)
    assert len(outcome) == 1
    return outcome[0]


def test_a_user_and_an_acl_made_on_one_broker_count_on_another(
        three: list[BrokerProcess]) -> None:
    one, two = three[0], three[1]
    admin = AdminClient(sasl(one, "PLAIN", "admin", ADMIN_PW))
    upsert = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), ALICE_PW.encode())
    admin.alter_user_scram_credentials([upsert])["alice"].result(WAIT_S)
    topic = f"shared-{uuid.uuid4().hex[:6]}"
    # One partition on each broker by hand: a broker's session lapsing under load while the
    # controller places the topic must not leave broker 2 without one.
    placed = NewTopic(topic, 3, replica_assignment=[[1], [2], [3]])
    admin.create_topics([placed])[topic].result(WAIT_S)

    def led_by_two() -> int | None:
        meta = metadata(one)
        parts = [p for t in meta.topics if t.name == topic for p in t.partitions]
        mine = [p.partition_index for p in parts if p.leader_id == 2]
        return mine[0] if len(parts) == 3 and mine else None

    partition = eventually(led_by_two, 20)
    # alice logs in to broker 2 (her credentials were made through broker 1) but may not write
    alice = sasl(two, "SCRAM-SHA-256", "alice", ALICE_PW)
    refused = produce_one(alice, topic, partition)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    wrong = produce_one(sasl(two, "SCRAM-SHA-256", "alice", "not-her-password"), topic,
                        partition)
    # (librdkafka keeps retrying a failed login until the record times out)
    assert wrong is not None and wrong.code() in (KafkaError._AUTHENTICATION,
                                                  KafkaError.SASL_AUTHENTICATION_FAILED,
                                                  KafkaError._MSG_TIMED_OUT)

    acls = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice",
                       "*", op, AclPermissionType.ALLOW)
            for op in (AclOperation.WRITE, AclOperation.DESCRIBE)]
    for future in admin.create_acls(acls).values():
        future.result(WAIT_S)
    # broker 2 (the partition's leader) follows the ACLs in etcd
    assert eventually(lambda: produce_one(alice, topic, partition) is None, 60)
    # and broker 3 describes them
    admin_three = AdminClient(sasl(three[2], "PLAIN", "admin", ADMIN_PW))
    described = admin_three.describe_acls(
        AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL,
                         None, None,  # type: ignore[arg-type]  # None: any principal, host
                         AclOperation.ANY, AclPermissionType.ANY)).result(WAIT_S)
    assert sorted(str(b.operation) for b in described) == sorted(
        str(op) for op in (AclOperation.WRITE, AclOperation.DESCRIBE))


def outcomes_into(outcomes: list[Any]) -> Any:
    def delivered(error: Any, _message: Any) -> None:
        outcomes.append(error)
    return delivered


def init_producer_id(broker: BrokerProcess) -> int:
    wire = Wire(broker.port)
    try:
        answer = wire.request(
            InitProducerIdRequest[0](transactional_id=None, transaction_timeout_ms=60000),
            InitProducerIdResponse)
    finally:
        wire.close()
    assert answer.error_code == 0
    return int(answer.producer_id)


def test_producer_ids_from_different_brokers_come_from_different_blocks(
        three: list[BrokerProcess]) -> None:
    ids = {int(b.overrides["node.id"]): [init_producer_id(b) for _ in range(3)] for b in three}
    every = [pid for pids in ids.values() for pid in pids]
    assert len(set(every)) == len(every)
    blocks = {node: {pid // 1000 for pid in pids} for node, pids in ids.items()}
    assert all(len(b) == 1 for b in blocks.values()), blocks  # each broker: its own block
    assert len(set.union(*blocks.values())) == 3, blocks  # none shared
    for pids in ids.values():
        assert pids == sorted(pids) and pids[-1] - pids[0] == 2  # consecutive within a block

    admin = AdminClient(sasl(three[0], "PLAIN", "admin", ADMIN_PW))
    topic = f"idem-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(WAIT_S)
    eventually(lambda: all(p.leader_id != -1 for t in metadata(three[0]).topics
                           if t.name == topic for p in t.partitions) and any(
        t.name == topic for t in metadata(three[0]).topics), 20)
    for b in three:
        producer = Producer({**sasl(b, "PLAIN", "admin", ADMIN_PW), "enable.idempotence": True,
                             "message.timeout.ms": 20000})
        outcomes: list[Any] = []
        for i in range(30):
            producer.produce(topic, f"v{i}".encode(), partition=i % 3,
                             on_delivery=outcomes_into(outcomes))
        assert producer.flush(30) == 0
        assert len(outcomes) == 30 and all(e is None for e in outcomes)


def alter_topic_config(broker: BrokerProcess, topic: str, key: str, value: str) -> int:
    return alter_config(broker, 2, topic, key, value)


def describe_topic_config(broker: BrokerProcess, topic: str) -> tuple[int, dict[str, tuple]]:
    return describe_config(broker, 2, topic)


def test_a_topic_config_altered_on_one_broker_counts_on_another(
        three: list[BrokerProcess]) -> None:
    admin = AdminClient(sasl(three[0], "PLAIN", "admin", ADMIN_PW))
    topic = f"conf-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 3, 1, config={"retention.ms": "3600000"})]
                        )[topic].result(WAIT_S)

    def leaders() -> dict[int, int] | None:
        parts = {p.partition_index: p.leader_id for t in metadata(three[0]).topics
                 if t.name == topic for p in t.partitions}
        return parts if len(parts) == 3 and -1 not in parts.values() else None

    led = eventually(leaders, 20)
    # the leader of partition 0 is "B"; the config is altered through another broker, "A"
    leader = next(b for b in three if int(b.overrides["node.id"]) == led[0])
    other = next(b for b in three if b is not leader)
    producer_config = {**sasl(leader, "PLAIN", "admin", ADMIN_PW), "message.timeout.ms": 10000,
                       "retries": 0}
    big = b"x" * 3000
    assert produce_bytes(producer_config, topic, big) is None  # the broker's default allows it
    assert alter_topic_config(other, topic, "max.message.bytes", "1024") == 0

    code, on_leader = describe_topic_config(leader, topic)
    assert code == 0
    assert on_leader["retention.ms"] == ("3600000", 1)  # created with it: DYNAMIC_TOPIC_CONFIG
    assert eventually(lambda: describe_topic_config(leader, topic)[1]["max.message.bytes"]
                      == ("1024", 1), 10)
    for b in three:  # every broker answers the same
        assert describe_topic_config(b, topic)[1]["max.message.bytes"] == ("1024", 1)
    # the leader enforces it: a batch over 1024 bytes is refused
    refused = produce_bytes(producer_config, topic, big)
    assert refused is not None and refused.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert produce_bytes(producer_config, topic, b"small") is None
    assert describe_topic_config(other, f"{topic}-none")[0] == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert alter_topic_config(other, f"{topic}-none", "retention.ms", "1") == 3


def produce_bytes(config: dict[str, Any], topic: str, value: bytes) -> Any:
    """One record to partition 0; its delivery error (None: written)."""
    producer = Producer(config)
    outcome: list[Any] = []
    producer.produce(topic, value, partition=0, on_delivery=lambda e, m: outcome.append(e))
    producer.flush(20)
    assert len(outcome) == 1
    return outcome[0]


def alter_config(broker: BrokerProcess, rtype: int, name: str, key: str, value: str) -> int:
    """IncrementalAlterConfigs SET on ``broker`` itself; the error code."""
    inc = IncrementalAlterConfigsRequest.AlterConfigsResource
    req = IncrementalAlterConfigsRequest(resources=[inc(
        resource_type=rtype, resource_name=name, configs=[
            inc.AlterableConfig(name=key, config_operation=0, value=value)])],
        validate_only=False, version=1)
    wire = Wire(broker.port)
    try:
        [out] = wire.request(req, IncrementalAlterConfigsResponse).responses
    finally:
        wire.close()
    return int(out.error_code)


def describe_config(broker: BrokerProcess, rtype: int, name: str
                    ) -> tuple[int, dict[str, tuple]]:
    """DescribeConfigs on ``broker`` itself: error code, key -> (value, source)."""
    req = DescribeConfigsRequest[2](resources=[DescribeConfigsRequest[2].DescribeConfigsResource(
        resource_type=rtype, resource_name=name, configuration_keys=None)],
        include_synonyms=False)
    wire = Wire(broker.port)
    try:
        [res] = wire.request(req, DescribeConfigsResponse).results
    finally:
        wire.close()
    return int(res.error_code), {c.name: (c.value, c.config_source) for c in res.configs}


def test_the_cluster_default_altered_on_one_broker_counts_on_every_broker(
        three: list[BrokerProcess]) -> None:
    assert alter_config(three[0], 4, "", "log.retention.ms", "7200000") == 0
    def everywhere() -> bool:  # DYNAMIC_DEFAULT_BROKER_CONFIG (3), each broker's own resource
        return all(describe_config(b, 4, b.overrides["node.id"])[1].get("log.retention.ms")
                   == ("7200000", 3) for b in three)

    assert eventually(everywhere, 10)
    # a broker's own resource is altered on that broker only, as Kafka routes it
    assert alter_config(three[1], 4, "1", "log.retention.ms", "1") == 42  # INVALID_REQUEST
