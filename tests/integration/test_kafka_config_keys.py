"""Kafka's config keys through real admin clients: every topic key Kafka 4.0 accepts is
accepted at creation and by both alter APIs, stored, and described with Kafka's defaults and
sources (the ones without effect on one broker included); a dynamic broker key Kafka knows but
this broker has no use for is answered NO_ERROR, stored and described, as Kafka answers it; a
group's configs (resource type GROUP) are set, described, kept across a restart and honoured
by the coordinator; bad values still get Kafka's error codes."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kafka.admin import ConfigResource as KpResource
from kafka.admin import KafkaAdminClient

from protocol.messages import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse
from tests.support.clients import create_topic, unique_topic
from tests.support.wire import Wire

SET, APPEND = AlterConfigOpType.SET, AlterConfigOpType.APPEND
INVALID_CONFIG, INVALID_REQUEST = 40, 42
# Kafka 4.0's topic keys that have no effect on one broker, with Kafka's defaults.
STORED_DEFAULTS = {
    "segment.jitter.ms": "0", "segment.index.bytes": "10485760", "file.delete.delay.ms": "60000",
    "preallocate": "false", "min.insync.replicas": "1", "unclean.leader.election.enable": "false",
    "message.downconversion.enable": "true", "leader.replication.throttled.replicas": "",
    "follower.replication.throttled.replicas": "", "remote.storage.enable": "false",
    "local.retention.ms": "-2", "local.retention.bytes": "-2", "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
}


def admin_for(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})


def described(admin: AdminClient, rtype: ConfigResource.Type, name: str) -> dict:
    res = ConfigResource(rtype, name)
    return admin.describe_configs([res], request_timeout=15)[res].result(20)


def alter_code(admin: AdminClient, res: ConfigResource) -> int:
    """0, or the Kafka error code the broker answered for ``res``."""
    try:
        admin.incremental_alter_configs([res], request_timeout=15)[res].result(20)
    except KafkaException as exc:
        return exc.args[0].code()
    return 0


def topic_ops(name: str, *ops: tuple[str, str, AlterConfigOpType]) -> ConfigResource:
    return ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in ops])


def test_every_kafka_topic_key_is_accepted_stored_and_described(broker) -> None:
    admin = admin_for(broker.bootstrap)
    topic = unique_topic("kafka-keys")
    given = {"min.insync.replicas": "2", "unclean.leader.election.enable": "true",
             "segment.jitter.ms": "1000", "preallocate": "TRUE", "file.delete.delay.ms": "500"}
    admin.create_topics([NewTopic(topic, 1, 1, config=given)])[topic].result(20)

    got = described(admin, ConfigResource.Type.TOPIC, topic)
    assert set(STORED_DEFAULTS) <= set(got)
    for key, value in {**given, "preallocate": "true"}.items():
        assert (got[key].value, got[key].source) == (
            value, ConfigSource.DYNAMIC_TOPIC_CONFIG.value), key
    for key in set(STORED_DEFAULTS) - set(given):
        assert (got[key].value or "", got[key].source, got[key].is_default) == (
            STORED_DEFAULTS[key], ConfigSource.DEFAULT_CONFIG.value, True), key
    assert got["retention.ms"].value == "604800000"  # the keys served before are still there

    # IncrementalAlterConfigs: SET a number, APPEND to a LIST key from its empty default.
    res = topic_ops(topic, ("local.retention.ms", "5000", SET),
                    ("follower.replication.throttled.replicas", "0:1", APPEND))
    assert alter_code(admin, res) == 0
    got = described(admin, ConfigResource.Type.TOPIC, topic)
    assert got["local.retention.ms"].value == "5000"
    assert got["follower.replication.throttled.replicas"].value == "0:1"
    assert got["min.insync.replicas"].value == "2"  # incremental: the others are kept

    # Kafka's checks and error codes.
    for key, value in (("min.insync.replicas", "0"), ("preallocate", "maybe"),
                       ("segment.index.bytes", "3"), ("remote.storage.enable", "true"),
                       ("leader.replication.throttled.replicas", "one"),
                       ("no.such.topic.key", "1")):
        assert alter_code(admin, topic_ops(topic, (key, value, SET))) == INVALID_CONFIG, key
    assert described(admin, ConfigResource.Type.TOPIC, topic)["min.insync.replicas"].value == "2"


def test_kafka_python_legacy_alter_keeps_kafka_keys(broker) -> None:
    """AlterConfigs (kafka-python, the legacy API) with Kafka's keys: stored, described."""
    topic = unique_topic("kp-kafka-keys")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        create_topic(broker.bootstrap, topic)
        out = admin.alter_configs([KpResource("TOPIC", topic, configs={
            "unclean.leader.election.enable": "true", "segment.index.bytes": "4096"})],
            incremental=False)
        assert out == {"topic": {topic: "OK"}}
        got = admin.describe_configs([KpResource("TOPIC", topic)], include_synonyms=True,
                                     config_filter="all")["topic"][topic]
        unclean = got["unclean.leader.election.enable"]
        assert (unclean["value"], unclean["config_source"], unclean["config_type"]) == (
            "true", "DYNAMIC_TOPIC_CONFIG", "BOOLEAN")
        assert [(s["name"], s["value"], s["source"]) for s in unclean["synonyms"]] == [
            ("unclean.leader.election.enable", "true", "DYNAMIC_TOPIC_CONFIG"),
            ("unclean.leader.election.enable", "false", "DEFAULT_CONFIG")]
        index = got["segment.index.bytes"]
        assert (index["value"], index["config_type"]) == ("4096", "INT")
        assert index["synonyms"][1]["name"] == "log.index.size.max.bytes"
    finally:
        admin.close()


@pytest.mark.parametrize("key, value", [
    ("background.threads", "12"), ("sasl.kerberos.min.time.before.relogin", "30000"),
    ("num.network.threads", "4"), ("log.preallocate", "true")])
def test_dynamic_broker_keys_kafka_knows_are_answered_no_error(broker, key: str,
                                                               value: str) -> None:
    """As Kafka: NO_ERROR, the value stored for this broker and described as its dynamic
    config (the key changes nothing here, which docs/operations.md says)."""
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        out = admin.alter_configs([KpResource("BROKER", "1", configs={key: value})],
                                  incremental=False)
        assert out == {"broker": {"1": "OK"}}
        got = admin.describe_configs([KpResource("BROKER", "1")], include_synonyms=True,
                                     config_filter="all")["broker"]["1"]
        assert (got[key]["value"], got[key]["config_source"], got[key]["read_only"]) == (
            value, "DYNAMIC_BROKER_CONFIG", False)
    finally:
        admin.close()
    confluent = admin_for(broker.bootstrap)
    res = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
        ConfigEntry(key, value, incremental_operation=SET)])
    assert alter_code(confluent, res) == 0
    assert described(confluent, ConfigResource.Type.BROKER, "1")[key].value == value


def test_dynamic_broker_key_with_a_bad_value_is_refused(broker) -> None:
    admin = admin_for(broker.bootstrap)
    res = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
        ConfigEntry("background.threads", "many", incremental_operation=SET)])
    assert alter_code(admin, res) == INVALID_REQUEST
    assert described(admin, ConfigResource.Type.BROKER, "1")["background.threads"].value == "10"


# -- group configs (resource type GROUP) --------------------------------------------------------

def heartbeat_interval(port: int, group_id: str, topic: str) -> int:
    """The heartbeat interval a joining member of the consumer group protocol is answered."""
    req = ConsumerGroupHeartbeatRequest[0](
        group_id=group_id, member_id=str(uuid.uuid4()), member_epoch=0, instance_id=None,
        rack_id=None, rebalance_timeout_ms=30_000, subscribed_topic_names=[topic],
        server_assignor=None, topic_partitions=[])
    wire = Wire(port)
    try:
        resp = wire.request(req, ConsumerGroupHeartbeatResponse)
    finally:
        wire.close()
    assert resp.error_code == 0, resp.error_message
    return resp.heartbeat_interval_ms


def test_group_configs_with_both_admin_clients(broker_factory) -> None:
    """kafka-python sets a group's session timeout, librdkafka its heartbeat interval; both
    read them back with their source; they survive a restart; the coordinator answers the
    group's interval to a joining member and the broker's to another group's; a bad value
    is INVALID_CONFIG."""
    broker = broker_factory()
    topic, grp = unique_topic("group-configs"), unique_topic("group-configs-g")
    create_topic(broker.bootstrap, topic)
    kp = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        out = kp.alter_configs([KpResource("GROUP", grp, configs={
            "consumer.session.timeout.ms": ("SET", "50000")})], incremental=True)
        assert out == {"group": {grp: "OK"}}
    finally:
        kp.close()
    admin = admin_for(broker.bootstrap)
    res = ConfigResource(ConfigResource.Type.GROUP, grp, incremental_configs=[
        ConfigEntry("consumer.heartbeat.interval.ms", "7000", incremental_operation=SET)])
    assert alter_code(admin, res) == 0
    bad = ConfigResource(ConfigResource.Type.GROUP, grp, incremental_configs=[
        ConfigEntry("consumer.heartbeat.interval.ms", "60000", incremental_operation=SET)])
    assert alter_code(admin, bad) == INVALID_CONFIG  # not below the session timeout
    del admin

    broker.restart()
    admin = admin_for(broker.bootstrap)
    got = described(admin, ConfigResource.Type.GROUP, grp)
    assert (got["consumer.session.timeout.ms"].value, got["consumer.session.timeout.ms"].source
            ) == ("50000", ConfigSource.GROUP_CONFIG.value)
    assert got["consumer.heartbeat.interval.ms"].value == "7000"
    other = described(admin, ConfigResource.Type.GROUP, grp + "-other")
    assert (other["consumer.session.timeout.ms"].value, other["consumer.session.timeout.ms"]
            .source) == ("45000", ConfigSource.DEFAULT_CONFIG.value)
    assert heartbeat_interval(broker.port, grp, topic) == 7000
    assert heartbeat_interval(broker.port, grp + "-other", topic) == 5000
