"""Structured logs: the JSON lines of a real run carry their facts as fields.

Start (the ready line, then the effective configuration as its own event), topic creation and
a rebalance at info; connection open and close and one line per request at debug; never a
record payload.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from broker.logging import redact
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    Rec,
    confluent_consumer,
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
    wait_until,
)
from tests.support.requests import produce_request, produce_response, record_batch
from tests.support.wire import Wire

PAYLOAD = b"payload-that-must-never-be-logged-7f3a"


def events(broker: BrokerProcess, name: str) -> list[dict]:
    return [e for e in broker.new_log_lines() if e.get("event") == name]


def test_start_connection_and_topic_events_are_structured(broker_factory) -> None:
    broker: BrokerProcess = broker_factory({"group.initial.rebalance.delay.ms": "0"})
    lines = broker.new_log_lines()
    assert lines and all({"event", "level", "timestamp"} <= set(e) for e in lines)
    [started] = events(broker, "broker started")
    assert started["level"] == "info"
    assert started["port"] == broker.port and started["metrics_port"] == broker.metrics_port
    [effective] = events(broker, "effective configuration")
    config = effective["config"]
    assert config["log.dirs"] == [str(broker.data_dir / "logs")]
    assert config["metrics.listener"] == "http://127.0.0.1:0/metrics"
    assert config["log.level"] == "INFO" and config["num.io.threads"] == 8

    wire = Wire(broker.port)
    wire.request(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"),
                 ApiVersionsResponse)
    wire.close()

    topic = unique_topic("logged")
    create_topic(broker.bootstrap, topic, partitions=3)
    [created] = wait_until(lambda: [e for e in events(broker, "topic created")
                                    if e["topic"] == topic], 10, what="topic created")
    assert created["partitions"] == 3 and created["level"] == "info"

    confluent_produce(broker.bootstrap, topic, numbered(4))
    errors: list = []
    consumer = confluent_consumer(broker.bootstrap, errors,
                                  {"group.id": "logged-group", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not events(broker, "group stable"):
            consumer.poll(0.2)
    finally:
        consumer.close()
    [rebalance, *_] = [e for e in events(broker, "rebalance started")
                       if e["group"] == "logged-group"]
    assert {"generation", "reason", "members"} <= set(rebalance)
    assert [e for e in events(broker, "group stable") if e["group"] == "logged-group"]
    broker.stop()
    assert events(broker, "broker stopped cleanly")
    # Connections come and go at debug: at info, none of them is a line (all written by now).
    assert not events(broker, "connection opened") and not events(broker, "connection closed")


def test_debug_level_logs_each_request_without_payloads(broker_factory) -> None:
    broker: BrokerProcess = broker_factory({"log.level": "DEBUG"})
    topic = unique_topic("debug")
    create_topic(broker.bootstrap, topic)
    wire = Wire(broker.port)
    try:
        wire.send(produce_request(topic, record_batch([PAYLOAD]), acks=1), 42)
        assert produce_response(wire.read_frame()) == (0, 0)
    finally:
        wire.close()
    [line] = wait_until(lambda: [e for e in events(broker, "request")
                                 if e.get("api") == "Produce" and e["correlation_id"] == 42],
                        10, what="the produce's debug line")
    assert line["level"] == "debug" and line["version"] == 9 and line["peer"] == wire.peer
    assert line["client_id"] == "wire-test" and line["bytes"] > len(PAYLOAD)
    assert {"queue_ms", "local_ms", "remote_ms", "ms"} <= set(line)
    opened = wait_until(lambda: [e for e in events(broker, "connection opened")
                                 if e["peer"] == wire.peer], 10, what="connection opened")
    closed = wait_until(lambda: [e for e in events(broker, "connection closed")
                                 if e["peer"] == wire.peer], 10, what="connection closed")
    assert opened[0]["level"] == "debug" and isinstance(opened[0]["channel"], int)
    assert closed[0]["level"] == "debug" and closed[0]["channel"] == opened[0]["channel"]
    assert PAYLOAD.decode() not in broker.log_text()


def test_info_level_has_no_request_lines(broker: BrokerProcess) -> None:
    topic = unique_topic("quiet")
    create_topic(broker.bootstrap, topic)
    confluent_produce(broker.bootstrap, topic, [Rec(b"k", PAYLOAD), *numbered(4)])
    assert not events(broker, "request")
    assert PAYLOAD.decode() not in broker.log_text()


def _run_logging(fmt: str) -> str:
    code = (
        "import logging, structlog\n"
        "from broker.logging import configure\n"
        f"configure('INFO', {fmt!r})\n"
        "structlog.get_logger().info('hello', answer=42)\n"
        "logging.getLogger('purgatory.timer').warning('from stdlib %s', 'logging')\n"
        "structlog.get_logger().debug('hidden')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr.decode()


def test_json_format_covers_stdlib_loggers_too() -> None:
    lines = [json.loads(line) for line in _run_logging("json").splitlines()]
    assert lines[0]["event"] == "hello" and lines[0]["answer"] == 42
    assert lines[1] == {**lines[1], "event": "from stdlib logging", "level": "warning",
                        "logger": "purgatory.timer"}
    assert len(lines) == 2  # debug filtered at INFO


def test_console_format_is_not_json() -> None:
    text = _run_logging("console")
    assert "hello" in text and "answer" in text and "from stdlib logging" in text
    assert not text.lstrip().startswith("{")


def test_secret_looking_keys_are_redacted() -> None:
    shown = redact({"sasl.jaas.config": "user=x password=y", "ssl.key.password": "p",
                    "listeners": "PLAINTEXT://h:1", "empty.password": ""})
    assert shown == {"sasl.jaas.config": "[redacted]", "ssl.key.password": "[redacted]",
                     "listeners": "PLAINTEXT://h:1", "empty.password": ""}
