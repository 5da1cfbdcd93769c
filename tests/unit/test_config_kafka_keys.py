"""Kafka's server.properties as a newcomer brings it: Kafka's aliases served, Kafka's other
keys accepted and named once, typos refused all at once with a suggestion."""

from __future__ import annotations

import pytest

from broker.config import KEYS, BrokerConfig, ConfigError
from broker.kafka_keys import KAFKA_BROKER_KEYS

# Kafka 4's config/server.properties (KRaft, combined mode), its keys and values as shipped.
KAFKA4_STOCK = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@localhost:9093
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
inter.broker.listener.name=PLAINTEXT
advertised.listeners=PLAINTEXT://localhost:9092,CONTROLLER://localhost:9093
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
num.network.threads=3
num.io.threads=8
socket.send.buffer.bytes=102400
socket.receive.buffer.bytes=102400
socket.request.max.bytes=104857600
log.dirs=/tmp/kraft-combined-logs
num.partitions=1
num.recovery.threads.per.data.dir=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
log.retention.hours=168
log.segment.bytes=1073741824
log.retention.check.interval.ms=300000
"""


def test_kafka4_stock_file_is_read_whole(tmp_path):
    props = tmp_path / "server.properties"
    props.write_text(KAFKA4_STOCK)
    cfg = BrokerConfig.from_properties(props)
    assert cfg["log.retention.ms"] == 168 * 3_600_000
    assert cfg["log.dirs"] == ["/tmp/kraft-combined-logs"]
    # The controller's listener is not bound, nor advertised.
    assert [(s.name, s.port) for s in cfg.listener_specs()] == [("PLAINTEXT", 9092)]
    assert cfg.advertised_endpoints() == {"PLAINTEXT": ("localhost", 9092)}
    assert cfg.unused_keys == sorted([
        "process.roles", "controller.quorum.voters",
        "num.network.threads", "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor", "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr"])


def test_internal_topic_replication_keys_are_used_in_cluster_mode_only() -> None:
    """A single broker keeps one replica of each internal topic: the keys are named unused
    there; in cluster mode they are read (Kafka's defaults 3, 3 and 2)."""
    keys = {"offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1"}
    assert BrokerConfig.from_dict(keys).unused_keys == sorted(keys)
    clustered = BrokerConfig.from_dict({**keys, "minibroker.etcd.endpoints": "127.0.0.1:2379"})
    assert clustered.unused_keys == []
    assert clustered["offsets.topic.replication.factor"] == 1
    defaults = BrokerConfig.from_dict({})
    assert [defaults[k] for k in keys] == [3, 3, 2]


@pytest.mark.parametrize("raw, expected", [
    ({"log.retention.hours": "1"}, 3_600_000),
    ({"log.retention.minutes": "5"}, 300_000),
    ({"log.retention.minutes": "5", "log.retention.hours": "1"}, 300_000),  # minutes win
    ({"log.retention.ms": "42", "log.retention.minutes": "5", "log.retention.hours": "1"}, 42),
    ({"log.retention.hours": "-1"}, -1),  # Kafka: any negative retention is "never"
    ({}, 604_800_000),
])
def test_retention_aliases_in_kafkas_precedence(raw, expected):
    assert BrokerConfig.from_dict(raw)["log.retention.ms"] == expected


def test_aliases_of_roll_dir_and_broker_id():
    cfg = BrokerConfig.from_dict({"log.roll.hours": "2", "log.dir": "/one",
                                  "broker.id": "7"})
    assert cfg["log.roll.ms"] == 7_200_000
    assert cfg["log.dirs"] == ["/one"]
    assert cfg["node.id"] == 7
    assert cfg.unused_keys == []
    both = BrokerConfig.from_dict({"log.dirs": "/a,/b", "log.dir": "/one",
                                   "log.roll.ms": "5", "log.roll.hours": "2"})
    assert both["log.dirs"] == ["/a", "/b"] and both["log.roll.ms"] == 5
    assert both.unused_keys == ["log.dir", "log.roll.hours"]  # overridden: named as unused
    assert BrokerConfig.from_dict({"broker.id": "3", "node.id": "3"})["node.id"] == 3


@pytest.mark.parametrize("raw, message", [
    ({"broker.id": "3", "node.id": "4"}, r"broker\.id=3 and node\.id=4"),
    ({"log.retention.hours": "a week"}, r"invalid value 'a week' for log\.retention\.hours"),
    ({"log.roll.hours": "0"}, r"log\.roll\.hours: must be >= 1"),
])
def test_alias_refusals_name_the_alias(raw, message):
    with pytest.raises(ConfigError, match=message):
        BrokerConfig.from_dict(raw)


def test_unknown_keys_are_all_named_at_once_with_a_suggestion():
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_dict({"log.retension.ms": "1", "num.partitons": "2",
                                "completely.made.up": "x", "min.insync.replicas": "2"})
    message = str(caught.value)
    assert "log.retension.ms (did you mean log.retention.ms?)" in message
    assert "num.partitons (did you mean num.partitions?)" in message
    assert "completely.made.up" in message and "completely.made.up (" not in message
    assert "min.insync.replicas" not in message  # Kafka's: accepted, not an error


def test_kafkas_keys_not_used_are_accepted_and_listed():
    cfg = BrokerConfig.from_dict({"replica.selector.class": "RackAwareReplicaSelector",
                                  "log.message.downconversion.enable": "true",
                                  "listener.name.plaintext.sasl.kerberos.service.name": "k",
                                  "listener.name.plaintext.ssl.protocol": "TLSv1.2"})
    assert cfg.unused_keys == ["listener.name.plaintext.sasl.kerberos.service.name",
                               "listener.name.plaintext.ssl.protocol",
                               "log.message.downconversion.enable",
                               "replica.selector.class"]
    # Served now: the defaults of preallocate, segment.jitter.ms (from either name), ...
    served = BrokerConfig.from_dict({"log.preallocate": "true", "log.roll.jitter.hours": "1",
                                     "log.index.size.max.bytes": "4096",
                                     "log.segment.delete.delay.ms": "0"})
    assert served.unused_keys == []
    assert served["log.preallocate"] is True and served["log.roll.jitter.ms"] == 3_600_000


def test_kafka_key_list_holds_what_kafka_defines():
    # A sample across Kafka's ConfigDefs, and every served key bar our own is among them.
    for key in ("log.dir", "broker.id", "process.roles", "controller.quorum.voters",
                "group.share.enable", "remote.log.storage.system.enable",
                "sasl.kerberos.service.name", "transactional.id.expiration.ms",
                "delegation.token.secret.key", "password.encoder.secret"):
        assert key in KAFKA_BROKER_KEYS, key
    ours = {"request.processing.mode", "metrics.listener", "log.format", "log.level"}
    assert {k for k in KEYS if k not in KAFKA_BROKER_KEYS
            and not k.startswith("minibroker.")} == ours
    assert not [k for k in KAFKA_BROKER_KEYS if k.startswith(("zookeeper.", "minibroker."))]


@pytest.mark.parametrize("policy", ["bidirectional", "upgrade", "downgrade"])
def test_migration_policies_not_served_are_refused(policy):
    with pytest.raises(ConfigError, match="only disabled is served"):
        BrokerConfig.from_dict({"group.consumer.migration.policy": policy})
    assert BrokerConfig.from_dict({"group.consumer.migration.policy": "disabled"})[
        "group.consumer.migration.policy"] == "disabled"


def test_all_listeners_for_the_controller_leaves_none():
    with pytest.raises(ConfigError, match="at least one listener"):
        BrokerConfig.from_dict({"listeners": "CONTROLLER://127.0.0.1:0",
                                "controller.listener.names": "CONTROLLER",
                                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT"})
