"""Tests written as a user of mini-broker's pytest plugin writes them: only the fixtures
(mini_broker, mini_broker_factory) and the public API of broker.testing, real clients.

Run with `pytest examples/`; `pytest examples/ --kafka-bootstrap host:9092` runs them against a
real cluster instead, where the tests that need an embedded broker (faults, kill, a manual
clock) are skipped.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient


def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str, values: list[bytes], **config: object) -> list:
    """Produces ``values``; returns each message's delivery error (None when delivered)."""
    errors: list = []
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    for value in values:
        producer.produce(topic, value, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    return errors


def consume(bootstrap: str, topic: str, n: int, timeout: float = 20.0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_round_trip(mini_broker):
    topic = topic_name()
    assert produce(mini_broker.bootstrap_servers, topic, [b"a", b"b", b"c"]) == [None] * 3
    assert consume(mini_broker.bootstrap_servers, topic, 3) == [b"a", b"b", b"c"]


def test_not_leader_is_retried_by_the_producer(mini_broker):
    topic = topic_name()
    assert produce(mini_broker.bootstrap_servers, topic, [b"warm-up"]) == [None]
    before = mini_broker.fault_counts.get(("error", "Produce"), 0)
    mini_broker.inject_errors("Produce", "NOT_LEADER_OR_FOLLOWER", count=2, topic=topic)

    assert produce(mini_broker.bootstrap_servers, topic, [b"once"], **{"retry.backoff.ms": 10}) \
        == [None]

    assert mini_broker.fault_counts[("error", "Produce")] == before + 2
    # Answered with an error, nothing was appended: the record is there exactly once.
    assert consume(mini_broker.bootstrap_servers, topic, 2) == [b"warm-up", b"once"]
    consumer = Consumer({"bootstrap.servers": mini_broker.bootstrap_servers, "group.id": "w"})
    assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 2)
    consumer.close()


def test_a_delayed_response_times_the_client_out(mini_broker):
    topic = topic_name()
    assert produce(mini_broker.bootstrap_servers, topic, [b"warm-up"]) == [None]
    mini_broker.delay("Produce", 5000, count=None)
    try:
        started = time.monotonic()
        errors = produce(mini_broker.bootstrap_servers, topic, [b"late"],
                         **{"message.timeout.ms": 1000, "request.timeout.ms": 500})
        assert [e.code() for e in errors] == [KafkaError._MSG_TIMED_OUT]
        assert time.monotonic() - started < 5
    finally:
        mini_broker.clear_faults()


def test_a_killed_broker_recovers_what_it_acknowledged(mini_broker_factory):
    with mini_broker_factory() as broker:
        topic = topic_name()
        values = [f"m{i}".encode() for i in range(100)]
        assert produce(broker.bootstrap_servers, topic, values, acks="all") == [None] * 100

        broker.kill()  # no flush, no clean-shutdown marker
        broker.start()  # same port; the logs are recovered

        assert broker.recovered
        assert consume(broker.bootstrap_servers, topic, 100) == values


def test_a_group_session_expires_on_advance_without_waiting(mini_broker_factory):
    with mini_broker_factory(clock="manual") as broker:
        topic = topic_name()
        assert produce(broker.bootstrap_servers, topic, [b"x"]) == [None]
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "g",
                             "session.timeout.ms": 30000, "heartbeat.interval.ms": 100,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        try:
            deadline = time.monotonic() + 20
            while not consumer.assignment() and time.monotonic() < deadline:
                consumer.poll(0.1)
            first = consumer.memberid()
            assert first and consumer.assignment()

            started = time.monotonic()
            broker.advance(30_001)  # the broker's 30 s pass at once; the member is gone
            while consumer.memberid() == first and time.monotonic() < deadline:
                consumer.poll(0.1)  # the next heartbeat learns it and the client rejoins

            assert consumer.memberid() != first
            assert time.monotonic() - started < 10  # far less than the 30 s session
        finally:
            consumer.close()


def test_starts_in_under_a_second(mini_broker_factory):
    started = time.perf_counter()
    with mini_broker_factory() as broker:
        elapsed = time.perf_counter() - started
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        assert admin.list_topics(timeout=10).brokers
    assert elapsed < 1.0
    assert broker.start_seconds < 1.0


@pytest.mark.parametrize("api", ["Fetch", "Metadata"])
def test_errors_are_answered_in_the_api_layout(mini_broker, api):
    # A smoke check that other APIs take injected errors too (and the fault clears itself).
    fault = mini_broker.inject_errors(api, "LEADER_NOT_AVAILABLE", count=1)
    AdminClient({"bootstrap.servers": mini_broker.bootstrap_servers}).list_topics(timeout=10)
    if api == "Metadata":
        assert fault.remaining == 0
    mini_broker.clear_faults()
