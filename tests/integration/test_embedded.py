"""EmbeddedBroker and the pytest plugin with real clients: the async mode, the manual clock's
reach (retention, the wall clock of appends, independent brokers), connection drops, fault
metrics, and the plugin's --kafka-bootstrap against a broker standing in for an external one."""

from __future__ import annotations

import gc
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from broker.testing import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 86_400_000


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "w"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, n: int, **config: object) -> list:
    errors: list = []
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    for i in range(n):
        producer.produce(topic, f"m{i}".encode(), on_delivery=lambda e, m: errors.append(e))
    producer.flush(30)
    return errors


async def test_async_mode_in_the_callers_loop(tmp_path):
    async with EmbeddedBroker(tmp_path) as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait("a", f"v{i}".encode())
        finally:
            await producer.stop()
        await broker.kill_async()
        await broker.start_async()
        assert broker.recovered
        consumer = AIOKafkaConsumer("a", bootstrap_servers=broker.bootstrap_servers,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            got = [(await consumer.getone()).value for _ in range(5)]
        finally:
            await consumer.stop()
        assert got == [f"v{i}".encode() for i in range(5)]
    assert not (tmp_path / "logs" / ".lock").exists() or not broker.running


def test_retention_runs_on_the_manual_clock(tmp_path):
    with EmbeddedBroker(tmp_path, clock="manual", log_retention_ms=60_000) as broker:
        assert produce(broker.bootstrap_servers, "r", 10) == [None] * 10
        assert watermarks(broker.bootstrap_servers, "r") == (0, 10)
        broker.advance(299_000)  # retention is checked every 300 s: not yet
        assert watermarks(broker.bootstrap_servers, "r") == (0, 10)
        broker.advance(1_000)
        assert watermarks(broker.bootstrap_servers, "r") == (10, 10)


def test_appends_are_stamped_with_each_brokers_own_clock(tmp_path):
    with EmbeddedBroker(tmp_path / "manual", clock="manual") as manual, \
            EmbeddedBroker(tmp_path / "real") as real:
        for broker in (manual, real):
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            [future] = admin.create_topics([NewTopic("l", 1, 1, config={
                "message.timestamp.type": "LogAppendTime"})]).values()
            future.result(10)
        manual.advance(DAY_MS)
        stamps = {}
        for name, broker in (("manual", manual), ("real", real)):
            assert produce(broker.bootstrap_servers, "l", 1) == [None]
            consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                                 "group.id": "c", "auto.offset.reset": "earliest"})
            consumer.subscribe(["l"])
            msg = None
            deadline = time.monotonic() + 20
            while msg is None and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
            consumer.close()
            stamps[name] = msg.timestamp()[1]
        now = time.time() * 1000
        assert abs(stamps["real"] - now) < 60_000
        assert abs(stamps["manual"] - (now + DAY_MS)) < 60_000


def test_dropped_connections_are_survived_by_an_idempotent_producer(tmp_path):
    with EmbeddedBroker(tmp_path) as broker:
        assert produce(broker.bootstrap_servers, "d", 1) == [None]
        broker.drop_connections(after=0)
        assert produce(broker.bootstrap_servers, "d", 20, **{"enable.idempotence": True}) \
            == [None] * 20
        assert sum(n for (kind, _), n in broker.fault_counts.items() if kind == "drop") == 1
        assert watermarks(broker.bootstrap_servers, "d") == (0, 21)


def test_fired_faults_are_served_as_metrics(tmp_path):
    with EmbeddedBroker(tmp_path, metrics_listener="http://127.0.0.1:0/metrics") as broker:
        broker.inject_errors("Metadata", "LEADER_NOT_AVAILABLE", count=1)
        AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
        assert broker.fault_counts == {("error", "Metadata"): 1}
        assert broker.metrics_url is not None
        body = urllib.request.urlopen(broker.metrics_url, timeout=10).read().decode()
        assert 'minibroker_faults_injected_total{api="Metadata",kind="error"} 1.0' in body



def test_a_topic_fault_fires_on_fetches_naming_topic_ids(tmp_path):
    """librdkafka fetches at v13 or later, which name topics by id: a fault on one topic
    answers its partition with the error while the other topic of the same fetch is served."""
    with EmbeddedBroker(tmp_path, metrics_listener="http://127.0.0.1:0/metrics") as broker:
        bootstrap = broker.bootstrap_servers
        for topic in ("faulted", "served"):
            assert produce(bootstrap, topic, 3) == [None] * 3
        broker.inject_errors("Fetch", "TOPIC_AUTHORIZATION_FAILED", count=None, topic="faulted")
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "f",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition("faulted", 0, 0), TopicPartition("served", 0, 0)])
        try:
            got, errors = _poll(consumer, lambda got, errors: len(got) == 3 and errors)
            assert got == [("served", f"m{i}".encode()) for i in range(3)]
            assert ("faulted", KafkaError.TOPIC_AUTHORIZATION_FAILED) in errors
            assert {topic for topic, _ in errors} == {"faulted"}
            assert broker.metrics_url is not None
            body = urllib.request.urlopen(broker.metrics_url, timeout=10).read().decode()
            versions = [int(sample.labels["version"])
                        for family in text_string_to_metric_families(body)
                        for sample in family.samples
                        if sample.name == "minibroker_request_errors_total"
                        and sample.labels["api"] == "Fetch"
                        and sample.labels["error"] == "TOPIC_AUTHORIZATION_FAILED"]
            assert versions and min(versions) >= 13, "the fault answered fetches naming ids"
            fired = broker.fault_counts[("error", "Fetch")]
            assert fired >= 1
            broker.clear_faults()
            got, _ = _poll(consumer, lambda got, errors: len(got) == 3)
            assert got == [("faulted", f"m{i}".encode()) for i in range(3)]
            assert broker.fault_counts[("error", "Fetch")] == fired
        finally:
            consumer.close()


def _poll(consumer: Consumer, done, timeout: float = 30.0) -> tuple[list, list]:
    """Records as (topic, value) and errors as (topic, code) until ``done(records, errors)``."""
    got: list = []
    errors: list = []
    deadline = time.monotonic() + timeout
    while not done(got, errors) and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error() is not None:
            errors.append((msg.topic(), msg.error().code()))
        else:
            got.append((msg.topic(), msg.value()))
    return got, errors

def test_start_figure(tmp_path):
    """Empty data dir to listening, in process (the figure docs/testing.md quotes)."""
    times = []
    gc_before = gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()
    for i in range(5):
        with EmbeddedBroker(tmp_path / str(i)) as broker:
            times.append(broker.start_seconds)
            # The CLI's GC policy is the broker process's; an embedded broker leaves the
            # test process's collector as it found it.
            assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == gc_before
    print(f"embedded start (s): min {min(times):.4f} max {max(times):.4f}")
    assert max(times) < 1.0


def test_plugin_against_an_external_cluster(tmp_path):
    """--kafka-bootstrap: the fixtures hand out the given address; what needs an embedded
    broker is skipped, the rest passes (here against an embedded broker standing in)."""
    with EmbeddedBroker(tmp_path) as external:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             str(ROOT / "examples"), "--kafka-bootstrap", external.bootstrap_servers,
             "-k", "round_trip or not_leader or killed or starts"],
            cwd=ROOT, capture_output=True, text=True, timeout=240)
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0, run.stdout[-3000:]
    assert "1 passed" in summary and "3 skipped" in summary, summary


@pytest.mark.parametrize("clean", [True, False])
def test_restart_keeps_the_port(tmp_path, clean):
    with EmbeddedBroker(tmp_path) as broker:
        port = broker.port
        topic = f"p-{uuid.uuid4().hex[:6]}"
        assert produce(broker.bootstrap_servers, topic, 3) == [None] * 3
        broker.restart(clean=clean)
        assert broker.port == port and broker.recovered is not clean
        assert watermarks(broker.bootstrap_servers, topic) == (0, 3)
