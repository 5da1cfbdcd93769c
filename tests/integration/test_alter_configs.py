"""Configs changed at run time on a real broker, through confluent-kafka's and kafka-python's
admin clients: a topic's max.message.bytes lowered refuses a larger record at once; a broker
default log.retention.ms changed deletes old data of topics without an override (and not of
one with its own); both survive a restart; DescribeConfigs shows where each value comes
from; bad input is answered with Kafka's error codes."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from kafka.admin import ConfigResource as KpResource
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse

from tests.support.broker import BrokerProcess
from tests.support.clients import Rec, confluent_produce, create_topic, unique_topic, wait_until
from tests.support.clients import watermarks as marks
from tests.support.wire import Wire

SET, DELETE, APPEND = AlterConfigOpType.SET, AlterConfigOpType.DELETE, AlterConfigOpType.APPEND
HOUR_MS = 3_600_000


def topic_res(name: str, *ops: tuple[str, str | None, AlterConfigOpType]) -> ConfigResource:
    return ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops])


def broker_res(name: str, *ops: tuple[str, str | None, AlterConfigOpType]) -> ConfigResource:
    return ConfigResource(ConfigResource.Type.BROKER, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops])


def cluster_default(port: int, key: str, value: str | None, op: int = SET.value,
                    name: str = "") -> int:
    """IncrementalAlterConfigs on the cluster default (BROKER ""), which librdkafka cannot
    name (nor a broker that does not exist: it waits for it); the error code."""
    inc = IncrementalAlterConfigsRequest.AlterConfigsResource
    req = IncrementalAlterConfigsRequest(resources=[inc(
        resource_type=4, resource_name=name, configs=[
            inc.AlterableConfig(name=key, config_operation=op, value=value)])],
        validate_only=False, version=1)
    [out] = Wire(port).request(req, IncrementalAlterConfigsResponse).responses
    return out.error_code


def alter(admin: AdminClient, res: ConfigResource) -> None:
    admin.incremental_alter_configs([res], request_timeout=15)[res].result(20)


def alter_error(admin: AdminClient, res: ConfigResource) -> int:
    """The Kafka error code the broker answered for ``res``."""
    with pytest.raises(KafkaException) as info:
        alter(admin, res)
    return info.value.args[0].code()


def described(admin: AdminClient, rtype: ConfigResource.Type, name: str) -> dict:
    res = ConfigResource(rtype, name)
    return admin.describe_configs([res], request_timeout=15)[res].result(20)


def produce_one(bootstrap: str, topic: str, size: int) -> KafkaError | None:
    """One record of ``size`` bytes; the delivery error, or None when it was written."""
    outcome: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "enable.idempotence": False, "message.timeout.ms": 15000})
    producer.produce(topic, value=b"x" * size, partition=0,
                     on_delivery=lambda err, msg: outcome.append(err))
    assert producer.flush(20) == 0
    return outcome[0]


def old_records(n: int, size: int = 200) -> list[Rec]:
    """Records stamped an hour ago: deleted by a retention.ms under an hour, kept by 7 days."""
    ts = int(time.time() * 1000) - HOUR_MS
    return [Rec(f"k{i}".encode(), b"v" * size, (), ts) for i in range(n)]


def test_altered_configs_take_effect_at_once_and_survive_a_restart(broker_factory) -> None:
    b: BrokerProcess = broker_factory({"log.retention.check.interval.ms": "200"})
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    small, follows, own = unique_topic("small"), unique_topic("follows"), unique_topic("own")
    create_topic(b.bootstrap, small)
    create_topic(b.bootstrap, follows, config={"segment.bytes": "1024"})
    create_topic(b.bootstrap, own, config={"segment.bytes": "1024", "retention.ms": "604800000"})

    # A topic's own config, applied to the next produce.
    assert produce_one(b.bootstrap, small, 4000) is None
    alter(admin, topic_res(small, ("max.message.bytes", "1000", SET),
                           ("cleanup.policy", "compact", APPEND)))
    err = produce_one(b.bootstrap, small, 4000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    err = produce_one(b.bootstrap, small, 100)  # compact now: a record needs a key
    assert err is not None and err.code() == KafkaError.INVALID_RECORD
    cfg = described(admin, ConfigResource.Type.TOPIC, small)
    assert (cfg["max.message.bytes"].value, cfg["max.message.bytes"].source) == (
        "1000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert cfg["cleanup.policy"].value == "delete,compact"

    # A broker default reaches the topics without an override, at the next retention pass.
    for topic in (follows, own):
        confluent_produce(b.bootstrap, topic, old_records(40), one_batch_each=True)
    time.sleep(1)  # several retention passes: nothing is an hour past 7 days
    assert marks(b.bootstrap, follows)[0] == 0 and marks(b.bootstrap, own)[0] == 0
    assert cluster_default(b.port, "log.retention.ms", "60000") == 0
    wait_until(lambda: marks(b.bootstrap, follows)[0] > 0, timeout=15,
               what="the new default retention deletes old segments")
    assert marks(b.bootstrap, own)[0] == 0  # its own retention.ms holds
    cfg = described(admin, ConfigResource.Type.TOPIC, follows)
    assert (cfg["retention.ms"].value, cfg["retention.ms"].source) == (
        "60000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)

    b.restart()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    err = produce_one(b.bootstrap, small, 4000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE
    node = described(admin, ConfigResource.Type.BROKER, "1")
    assert (node["log.retention.ms"].value, node["log.retention.ms"].source,
            node["log.retention.ms"].is_read_only) == (
        "60000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value, False)
    assert node["log.dirs"].is_read_only
    low = marks(b.bootstrap, follows)[0]
    confluent_produce(b.bootstrap, follows, old_records(40), one_batch_each=True)
    wait_until(lambda: marks(b.bootstrap, follows)[0] > low, timeout=15,
               what="the default still applies after the restart")
    # Deleting the default restores the static value.
    assert cluster_default(b.port, "log.retention.ms", None, DELETE.value) == 0
    assert described(admin, ConfigResource.Type.TOPIC, follows)["retention.ms"].value \
        == "604800000"


def test_bad_input_gets_kafkas_error_codes(broker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique_topic("bad")
    create_topic(broker.bootstrap, topic)
    E = KafkaError
    assert alter_error(admin, topic_res("no-such-topic", ("retention.ms", "1", SET))) \
        == E.UNKNOWN_TOPIC_OR_PART
    assert alter_error(admin, topic_res(topic, ("retention.ms", "soon", SET))) \
        == E.INVALID_CONFIG
    assert alter_error(admin, topic_res(topic, ("no.such.config", "1", SET))) \
        == E.INVALID_CONFIG
    assert alter_error(admin, topic_res(topic, ("retention.ms", "1", APPEND))) \
        == E.INVALID_CONFIG
    assert alter_error(admin, topic_res(topic, ("min.compaction.lag.ms", "9", SET),
                                        ("max.compaction.lag.ms", "5", SET))) \
        == E.INVALID_CONFIG
    assert cluster_default(broker.port, "log.dirs", "/elsewhere") == E.INVALID_REQUEST
    assert alter_error(admin, broker_res("1", ("log.retention.ms", "-7", SET))) \
        == E.INVALID_REQUEST
    assert cluster_default(broker.port, "log.retention.ms", "1", name="2") == E.INVALID_REQUEST
    # validate_only: checked, not applied.
    res = topic_res(topic, ("retention.ms", "5000", SET))
    admin.incremental_alter_configs([res], validate_only=True)[res].result(20)
    assert described(admin, ConfigResource.Type.TOPIC, topic)["retention.ms"].is_default


def test_kafka_python_admin_legacy_and_incremental(broker) -> None:
    topic = unique_topic("kp")
    create_topic(broker.bootstrap, topic, config={"retention.ms": "1000"})
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        # AlterConfigs (the legacy API): the set sent replaces the topic's overrides.
        out = admin.alter_configs([KpResource("TOPIC", topic, configs={
            "min.cleanable.dirty.ratio": "0.25"})], incremental=False)
        assert out == {"topic": {topic: "OK"}}
        got = admin.describe_configs([KpResource("TOPIC", topic)], include_synonyms=True,
                                     config_filter="all")["topic"][topic]
        ratio = got["min.cleanable.dirty.ratio"]
        assert (ratio["value"], ratio["config_source"], ratio["config_type"]) == (
            "0.25", "DYNAMIC_TOPIC_CONFIG", "DOUBLE")
        assert [(s["name"], s["source"]) for s in ratio["synonyms"]] == [
            ("min.cleanable.dirty.ratio", "DYNAMIC_TOPIC_CONFIG"),
            ("log.cleaner.min.cleanable.ratio", "DEFAULT_CONFIG")]
        # kafka-python sends the other overrides along, or the legacy API would delete them.
        assert got["retention.ms"]["value"] == "1000"
        out = admin.alter_configs([KpResource("BROKER", "1", configs={
            "log.cleanup.policy": ("APPEND", "compact")})], incremental=True)
        assert out == {"broker": {"1": "OK"}}
        got = admin.describe_configs([KpResource("TOPIC", topic)],
                                     config_filter="all")["topic"][topic]
        assert got["cleanup.policy"]["value"] == "delete,compact"
        out = admin.alter_configs([KpResource("BROKER", "1", configs={
            "num.partitions": "3"})], incremental=True, raise_on_unknown=False)
        assert "InvalidRequest" in str(out["broker"]["1"])
    finally:
        admin.close()
