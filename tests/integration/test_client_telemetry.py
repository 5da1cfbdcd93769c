"""Client telemetry (KIP-714) with librdkafka (confluent-kafka), which asks for its telemetry
subscription as soon as the broker advertises GetTelemetrySubscriptions (only when
minibroker.client.telemetry.metrics asks for metrics) and pushes what it is asked for
(`enable.metrics.push` defaults to true).

What the broker saw is read from its Prometheus endpoint (the request counts by API, and
minibroker_client_telemetry_pushes_total by result); what the client saw from librdkafka's own
log lines, delivered through a Python logger.
"""

from __future__ import annotations

import logging
import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, unique_topic

PUSH_INTERVAL_MS = 500
PRODUCER_METRICS = "org.apache.kafka.producer."
NO_SUCH_METRICS = "org.apache.kafka.no.such.metric."  # telemetry advertised, nothing to push
ZERO_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the zero Uuid as librdkafka prints it
ID_CHANGE = re.compile(r"Telemetry client instance id changed from (\S+) to (\S+)")


def metrics(broker: BrokerProcess) -> dict[tuple[str, tuple], float]:
    """Every sample of the broker's exposition: (name, sorted labels) -> value."""
    assert broker.metrics_port, "metrics are off"
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def requests(broker: BrokerProcess, api: str) -> float:
    return sum(v for (name, labels), v in metrics(broker).items()
               if name == "minibroker_requests_total" and ("api", api) in labels)


def pushes(broker: BrokerProcess) -> dict[str, float]:
    """minibroker_client_telemetry_pushes_total by result."""
    return {dict(labels)["result"]: v for (name, labels), v in metrics(broker).items()
            if name == "minibroker_client_telemetry_pushes_total"}


def broker_errors(broker: BrokerProcess) -> list[dict]:
    return [ln for ln in broker.new_log_lines() if ln.get("level") in ("error", "critical")]


class ClientLog(logging.Handler):
    """librdkafka's log lines, as confluent-kafka hands them to a Python logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))

    def id_changes(self) -> list[tuple[str, str]]:
        return [m.groups() for _lvl, line in self.lines if (m := ID_CHANGE.search(line))]

    def telemetry_problems(self) -> list[str]:
        """Warnings and errors about telemetry (librdkafka names them by facility)."""
        return [line for lvl, line in self.lines if lvl >= logging.WARNING
                and re.search(r"telemetry|subscriptions|push", line, re.IGNORECASE)]


@pytest.fixture
def client_log() -> Iterator[ClientLog]:
    handler = ClientLog()
    logger = logging.getLogger(f"rdkafka-telemetry-{id(handler)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    handler.logger = logger  # type: ignore[attr-defined]
    yield handler
    logger.removeHandler(handler)


def produce_for(broker: BrokerProcess, topic: str, seconds: float, log: ClientLog) -> int:
    """A producer sending a record every 50 ms for `seconds`, then closed; returns how many
    were acknowledged (every one, or the test fails)."""
    errors: list = []
    acked: list[int] = []
    producer = Producer({
        "bootstrap.servers": broker.bootstrap,
        "broker.address.family": "v4",
        "acks": "all",
        "linger.ms": 5,
        "error_cb": errors.append,
        "logger": log.logger,  # type: ignore[attr-defined]
    })
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        producer.produce(topic, value=b"v%d" % sent,
                         on_delivery=lambda err, msg: acked.append(err is None))
        sent += 1
        producer.poll(0.05)
    assert producer.flush(20) == 0
    del producer  # destroyed: a terminating push, if it was pushing
    assert not errors, errors
    assert acked == [True] * sent
    return sent


def test_default_configuration_does_not_advertise_telemetry(
        broker_factory, client_log: ClientLog) -> None:
    """By default the broker asks for no client metrics, so ApiVersions leaves the telemetry
    APIs out, as Kafka does without a telemetry receiver: the client never asks for a
    subscription, pushes nothing, and logs nothing about telemetry (librdkafka's notice)."""
    broker = broker_factory()
    topic = unique_topic("telemetry-default")
    create_topic(broker.bootstrap, topic)
    produce_for(broker, topic, 1.5, client_log)
    assert requests(broker, "Produce") >= 1
    assert requests(broker, "GetTelemetrySubscriptions") == 0
    assert requests(broker, "PushTelemetry") == 0
    assert sum(pushes(broker).values()) == 0
    assert client_log.id_changes() == []
    said = [line for _lvl, line in client_log.lines if "telemetry" in line.lower()]
    assert not said, said
    assert not broker_errors(broker)


def test_requested_metrics_are_pushed(broker_factory, client_log: ClientLog) -> None:
    """Asked for the producer's metrics every 500 ms, the client pushes them, and every push is
    accepted: the count grows while it runs; nothing is refused, nothing logged as an
    error on either side."""
    broker = broker_factory({
        "minibroker.client.telemetry.metrics": PRODUCER_METRICS,
        "minibroker.client.telemetry.push.interval.ms": str(PUSH_INTERVAL_MS),
    })
    topic = unique_topic("telemetry-push")
    create_topic(broker.bootstrap, topic)
    errors: list = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4",
                         "error_cb": errors.append, "logger": client_log.logger})
    accepted: list[float] = []  # sampled while the producer runs
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not accepted or accepted[-1] < 3):
        producer.produce(topic, value=b"x")
        producer.poll(0.2)
        accepted.append(pushes(broker).get("accepted", 0))
    assert producer.flush(10) == 0
    del producer
    first = next((i for i, n in enumerate(accepted) if n >= 1), None)
    assert first is not None and accepted[-1] >= 3, f"accepted pushes over time: {accepted}"
    results = pushes(broker)
    assert set(results) == {"accepted"}, results
    assert any(v > 0 for (name, _), v in metrics(broker).items()
               if name == "minibroker_client_telemetry_bytes_total")
    assert not errors, errors
    assert len(client_log.id_changes()) == 1, client_log.id_changes()
    assert not client_log.telemetry_problems()
    assert not broker_errors(broker)


@pytest.mark.slow
def test_instance_id_kept_while_pushing_nothing(broker_factory, client_log: ClientLog) -> None:
    """Asked only for metrics it does not have, the client pushes an empty payload each push
    interval, every one accepted, under the one instance id the broker gave it (librdkafka
    adopts whatever id an answer carries: a zero one makes it start over as a new
    instance)."""
    broker = broker_factory({
        "minibroker.client.telemetry.metrics": NO_SUCH_METRICS,
        "minibroker.client.telemetry.push.interval.ms": str(PUSH_INTERVAL_MS)})
    topic = unique_topic("telemetry-again")
    create_topic(broker.bootstrap, topic)
    produce_for(broker, topic, 3.0, client_log)
    assert requests(broker, "GetTelemetrySubscriptions") >= 1
    results = pushes(broker)
    assert results.get("accepted", 0) >= 3 and set(results) == {"accepted"}, results
    changes = client_log.id_changes()
    assert len(changes) == 1 and changes[0][0] == ZERO_ID, (
        f"the client's instance id changed {len(changes)} times: {changes[:4]}")
    assert not client_log.telemetry_problems()
    assert not broker_errors(broker)
