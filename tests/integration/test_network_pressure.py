"""The network layer under pressure, against a real broker: a client that never reads its
fetch responses cannot take the broker's memory while others keep being served, and the
connection limits (max.connections.per.ip, connections.max.idle.ms) close what they should."""

from __future__ import annotations

import socket
import time
import urllib.request

from confluent_kafka import Producer
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.support.clients import (
    assert_roundtrip,
    confluent_consume,
    confluent_produce,
    create_topic,
    numbered,
    wait_until,
)
from tests.support.requests import fetch_request
from tests.support.wire import Wire

MIB = 1 << 20
RECORD = 64 * 1024
DATA_MIB = 16
HOSTILE_CONNECTIONS = 4
FETCHES_EACH = 40  # 160 fetches of 16 MiB: 2.5 GiB of responses if nothing bounded them
RSS_GROWTH_BOUND_MIB = 300  # queued.max.request.bytes is 100 MiB by default


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def fill(bootstrap: str, topic: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(DATA_MIB * MIB // RECORD):
        p.produce(topic, value=bytes([i % 251]) * RECORD)
        p.poll(0)
    assert p.flush(30) == 0


def never_reading_client(port: int, topic: str) -> list[socket.socket]:
    """Sends FETCHES_EACH large fetches on each connection and reads nothing back."""
    socks = []
    for _ in range(HOSTILE_CONNECTIONS):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(0.5)
        socks.append(s)
    for i in range(FETCHES_EACH):
        for s in socks:
            req = fetch_request([(topic, 0, 0)], max_wait_ms=0, max_bytes=DATA_MIB * MIB,
                                partition_max_bytes=DATA_MIB * MIB)
            try:
                s.sendall(Wire.encode(req, i + 1))
            except (TimeoutError, OSError):
                pass  # the broker stopped reading this connection: as it should
    return socks


def test_a_client_that_never_reads_cannot_take_the_brokers_memory(broker) -> None:
    create_topic(broker.bootstrap, "big")
    create_topic(broker.bootstrap, "calm")
    fill(broker.bootstrap, "big")
    pid = broker.proc.pid
    before = rss_mib(pid)
    socks = never_reading_client(broker.port, "big")
    peak = before
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        peak = max(peak, rss_mib(pid))
        time.sleep(0.1)
    # Others are served meanwhile: metadata, and a produce-consume round trip.
    wire = Wire(broker.port)
    meta = wire.request(MetadataRequest[9](topics=None, allow_auto_topic_creation=False,
                                           include_cluster_authorized_operations=False,
                                           include_topic_authorized_operations=False),
                        MetadataResponse)
    assert {t.name for t in meta.topics} >= {"big", "calm"}
    sent = numbered(20)
    confluent_produce(broker.bootstrap, "calm", sent)
    assert_roundtrip(confluent_consume(broker.bootstrap, "calm", len(sent)), sent)
    peak = max(peak, rss_mib(pid))
    for s in socks:
        s.close()
    assert peak - before < RSS_GROWTH_BOUND_MIB, (before, peak)
    assert broker.proc.poll() is None


def metric(broker, name: str, labels: str = "") -> float:
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + labels + " ") or line.startswith(name + labels + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not exposed")


def closed_by_broker(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_connections_over_the_per_ip_limit_are_closed_at_once(broker_factory) -> None:
    broker = broker_factory({"max.connections.per.ip": "2"})
    a, b = Wire(broker.port), Wire(broker.port)
    for w in (a, b):  # both admitted and served
        assert w.request(MetadataRequest[1](topics=[]), MetadataResponse).brokers
    third = socket.create_connection(("127.0.0.1", broker.port))
    assert closed_by_broker(third, 5)
    assert metric(broker, "minibroker_connections_refused_total",
                  '{limit="max.connections.per.ip"}') == 1
    a.sock.close()
    wait_until(lambda: metric(broker, "minibroker_connections") <= 2, 5, "slot freed")
    again = Wire(broker.port)
    assert again.request(MetadataRequest[1](topics=[]), MetadataResponse).brokers


def test_idle_connections_are_closed_and_busy_ones_are_not(broker_factory) -> None:
    broker = broker_factory({"connections.max.idle.ms": "500"})
    idle = socket.create_connection(("127.0.0.1", broker.port))
    busy = Wire(broker.port)
    started = time.monotonic()
    while time.monotonic() - started < 1.5:  # traffic every 100 ms keeps it open
        assert busy.request(MetadataRequest[1](topics=[]), MetadataResponse).brokers
        time.sleep(0.1)
    assert closed_by_broker(idle, 3)
    assert time.monotonic() - started >= 0.5
    assert busy.request(MetadataRequest[1](topics=[]), MetadataResponse).brokers
    assert metric(broker, "minibroker_connections_idle_closed_total") >= 1


def test_the_per_ip_limit_lowered_at_run_time_binds_new_connections(broker) -> None:
    """IncrementalAlterConfigs on this broker's max.connections.per.ip: as Kafka, the new
    limit refuses the next connection; the ones already open stay."""
    from kafka.protocol.admin import (
        IncrementalAlterConfigsRequest,
        IncrementalAlterConfigsResponse,
    )

    inc = IncrementalAlterConfigsRequest.AlterConfigsResource
    a = Wire(broker.port)
    b = Wire(broker.port)
    req = IncrementalAlterConfigsRequest(resources=[inc(
        resource_type=4, resource_name="1", configs=[inc.AlterableConfig(
            name="max.connections.per.ip", config_operation=0, value="2")])],
        validate_only=False, version=1)
    [res] = a.request(req, IncrementalAlterConfigsResponse).responses
    assert res.error_code == 0, res
    for w in (a, b):  # already open: still served
        assert w.request(MetadataRequest[1](topics=[]), MetadataResponse).brokers
    third = socket.create_connection(("127.0.0.1", broker.port))
    assert closed_by_broker(third, 5)
