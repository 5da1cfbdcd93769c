"""What a newcomer meets first: Kafka's stock server.properties starts the broker, and a
configured limit is one the broker keeps (group.max.size, with a real client)."""

from __future__ import annotations

import subprocess
import sys
import time

from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient

from broker.testing import EmbeddedBroker
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    assert_roundtrip,
    confluent_consume,
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
)
from tests.unit.test_config_kafka_keys import KAFKA4_STOCK


def test_kafka4_stock_server_properties_starts_and_serves(tmp_path) -> None:
    props = tmp_path / "server.properties"
    props.write_text(KAFKA4_STOCK)
    # Loopback and ephemeral ports instead of the file's :9092/:9093; everything else as shipped.
    broker = BrokerProcess(tmp_path / "b", {
        "listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
        "advertised.listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://localhost:9093",
    }, properties=props).start()
    try:
        assert list(broker.ports) == ["PLAINTEXT"]  # the controller's listener is not bound
        [warning] = [e for e in broker.new_log_lines() if e.get("level") == "warning"]
        assert warning["keys"] == sorted([
            # inter.broker.listener.name is used now: it names the listener brokers talk on.
            "process.roles", "controller.quorum.voters",
            "num.network.threads", "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor", "transaction.state.log.min.isr",
            "share.coordinator.state.topic.replication.factor",
            "share.coordinator.state.topic.min.isr"])
        topic = unique_topic("stock")
        create_topic(broker.bootstrap, topic)
        sent = numbered(5)
        confluent_produce(broker.bootstrap, topic, sent)
        assert_roundtrip(confluent_consume(broker.bootstrap, topic, len(sent)), sent)
    finally:
        assert broker.stop() == 0


def _consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 500})


def _members(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [described] = admin.describe_consumer_groups([group]).values()
    return len(described.result(10).members)


def test_a_second_member_past_group_max_size_is_refused() -> None:
    with EmbeddedBroker(**{"group.max.size": "1"}) as broker:
        bootstrap = broker.bootstrap_servers
        topic, group = unique_topic("capped"), unique_topic("capped-group")
        create_topic(bootstrap, topic, partitions=2)
        first, second = _consumer(bootstrap, group), _consumer(bootstrap, group)
        try:
            first.subscribe([topic])
            deadline = time.monotonic() + 30
            while not first.assignment() and time.monotonic() < deadline:
                first.poll(0.2)
            assert len(first.assignment()) == 2
            second.subscribe([topic])
            refused = None
            deadline = time.monotonic() + 30
            while refused is None and time.monotonic() < deadline:
                first.poll(0.05)
                msg = second.poll(0.2)
                if msg is not None and msg.error() is not None:
                    refused = msg.error()
            assert refused is not None and refused.code() == KafkaError.GROUP_MAX_SIZE_REACHED
            assert second.assignment() == []
            first.poll(0.5)
            assert len(first.assignment()) == 2  # the member in the group keeps its share
            assert _members(bootstrap, group) == 1
        finally:
            second.close()
            first.close()


_EMBED = """
import logging, sys
if sys.argv[1] == "info":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from broker.testing import EmbeddedBroker
with EmbeddedBroker():
    pass
"""


def test_an_embedded_broker_logs_through_standard_logging_when_structlog_is_not_set_up():
    """A host (a user's pytest run) that set nothing up sees none of the broker's INFO lines;
    one that asks for INFO from the standard logging module gets them there."""
    quiet = subprocess.run([sys.executable, "-c", _EMBED, "quiet"], capture_output=True,
                           text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert "broker started" not in quiet.stdout + quiet.stderr
    info = subprocess.run([sys.executable, "-c", _EMBED, "info"], capture_output=True,
                          text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert "INFO:broker:broker started" in info.stderr and info.stdout == ""
