"""DescribeConfigs of a broker started from a properties file that uses Kafka's other names
(broker.id, log.dir, log.retention.hours, log.roll.hours, log.roll.jitter.hours), read by
real clients with synonyms: each name is an entry of its own, its synonyms in Kafka's order
with Kafka's sources, as Kafka's ConfigHelper answers (a key given only under another name is
null with DEFAULT_CONFIG, the synonyms before its own name dropped)."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from kafka.admin import ConfigResource as KpResource
from kafka.admin import KafkaAdminClient

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, unique_topic

HOUR = 3_600_000


def _kp_broker(bootstrap: str) -> dict:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    try:
        return admin.describe_configs([KpResource("BROKER", "1")], include_synonyms=True,
                                      config_filter="all")["broker"]["1"]
    finally:
        admin.close()


def _syn(entry: dict) -> list[tuple[str, str | None, str]]:
    return [(s["name"], s["value"], s["source"]) for s in entry["synonyms"]]


def test_aliases_are_described_with_kafkas_synonyms(tmp_path: Path) -> None:
    logs = tmp_path / "b" / "kafka-logs"
    props = tmp_path / "server.properties"
    props.write_text("broker.id=1\n"
                     f"log.dir={logs}\n"
                     "log.retention.hours=24\n"
                     "log.roll.hours=2\n"
                     "log.roll.jitter.hours=1\n"
                     "log.segment.delete.delay.ms=1234\n")
    broker = BrokerProcess(tmp_path / "b", properties=props)
    del broker.overrides["log.dirs"]  # the file's log.dir decides
    broker.start()
    try:
        assert logs.is_dir()
        got = _kp_broker(broker.bootstrap)
        assert (got["log.dir"]["value"], got["log.dir"]["config_source"]) == (
            str(logs), "STATIC_BROKER_CONFIG")
        assert (got["log.dirs"]["value"], got["log.dirs"]["config_source"],
                got["log.dirs"]["synonyms"]) == (None, "DEFAULT_CONFIG", [])
        # KafkaConfig.populateSynonyms: broker.id given, node.id takes its value.
        for key in ("broker.id", "node.id"):
            assert (got[key]["value"], got[key]["config_source"]) == (
                "1", "STATIC_BROKER_CONFIG"), key
        assert _syn(got["log.retention.hours"]) == [
            ("log.retention.hours", "24", "STATIC_BROKER_CONFIG"),
            ("log.retention.hours", "168", "DEFAULT_CONFIG")]
        assert got["log.retention.hours"]["config_type"] == "INT"
        for key in ("log.retention.ms", "log.roll.ms", "log.roll.jitter.ms"):
            assert (got[key]["value"], got[key]["config_source"], got[key]["synonyms"]) == (
                None, "DEFAULT_CONFIG", []), key
        assert _syn(got["log.roll.hours"])[0] == ("log.roll.hours", "2", "STATIC_BROKER_CONFIG")
        assert _syn(got["log.roll.jitter.hours"]) == [
            ("log.roll.jitter.hours", "1", "STATIC_BROKER_CONFIG"),
            ("log.roll.jitter.hours", "0", "DEFAULT_CONFIG")]
        assert _syn(got["log.segment.delete.delay.ms"]) == [
            ("log.segment.delete.delay.ms", "1234", "STATIC_BROKER_CONFIG"),
            ("log.segment.delete.delay.ms", "60000", "DEFAULT_CONFIG")]

        topic = unique_topic("aliases")
        create_topic(broker.bootstrap, topic)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        cfg = admin.describe_configs([res], request_timeout=15)[res].result(20)
        assert cfg["retention.ms"].value == str(24 * HOUR)  # what the hours say
        assert cfg["segment.ms"].value == str(2 * HOUR)
        assert cfg["segment.jitter.ms"].value == str(HOUR)
        assert cfg["file.delete.delay.ms"].value == "1234"

        # A dynamic log.retention.ms on this broker: first, the static hours after it.
        node = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
            ConfigEntry("log.retention.ms", "5000",
                        incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([node], request_timeout=15)[node].result(20)
        got = _kp_broker(broker.bootstrap)
        assert (got["log.retention.ms"]["value"], _syn(got["log.retention.ms"])) == ("5000", [
            ("log.retention.ms", "5000", "DYNAMIC_BROKER_CONFIG"),
            ("log.retention.hours", "24", "STATIC_BROKER_CONFIG"),
            ("log.retention.hours", "168", "DEFAULT_CONFIG")])
        cfg = admin.describe_configs([res], request_timeout=15)[res].result(20)
        assert (cfg["retention.ms"].value, cfg["retention.ms"].source) == (
            "5000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    finally:
        assert broker.stop() == 0
