"""KIP-227 fetch sessions over a raw socket, and kafka-python's consumer that relies on them.

FetchRequest v12 (topic names): epoch 0 creates a session; an incremental request (epoch n)
names only partitions whose position changed and its response carries only partitions with
news (records, an error, a moved high watermark or log start offset); forgotten partitions
leave the session; a wrong epoch is INVALID_FETCH_SESSION_EPOCH (71) and an unknown id
FETCH_SESSION_ID_NOT_FOUND (70); epoch -1 closes the session.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer import fetcher as kafka_fetcher

from broker.testing import EmbeddedBroker
from tests.support.clients import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    Got,
    Rec,
    _headers,
    assert_roundtrip,
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
)
from tests.support.requests import (
    fetch_request,
    fetch_response,
    fetched_values,
    produce_request,
    produce_response,
    record_batch,
)
from tests.support.wire import Wire

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


@pytest.fixture
def broker(mini_broker_factory: Callable[..., Any]) -> Iterator[EmbeddedBroker]:
    """An embedded broker of its own for each test (the fixture broker.testing ships)."""
    with mini_broker_factory() as b:
        yield b


class Session:
    """A raw socket speaking Fetch v12 for one topic, tracking the correlation id."""

    def __init__(self, broker: EmbeddedBroker, topic: str) -> None:
        self.wire = Wire(broker.port)
        self.producer = Wire(broker.port)
        self.topic = topic
        self.cid = 0

    def produce(self, partition: int, *values: bytes) -> int:
        self.cid += 1
        self.producer.send(produce_request(self.topic, record_batch(list(values)),
                                           partition=partition), self.cid)
        error, base = produce_response(self.producer.read_frame())
        assert error == 0
        return base

    def send_fetch(self, positions: dict[int, int], *, session_id: int, epoch: int,
                   forgotten: list[int] | None = None, max_wait_ms: int = 0) -> int:
        self.cid += 1
        self.wire.send(fetch_request(
            [(self.topic, p, o) for p, o in positions.items()], max_wait_ms=max_wait_ms,
            session_id=session_id, session_epoch=epoch,
            forgotten=[(self.topic, forgotten)] if forgotten else None,
        ), self.cid)
        return self.cid

    def read(self, cid: int):
        resp = fetch_response(self.wire.read_frame())
        assert resp.header.correlation_id == cid
        return resp

    def fetch(self, positions: dict[int, int], **kwargs):
        return self.read(self.send_fetch(positions, **kwargs))

    def close(self) -> None:
        self.wire.close()
        self.producer.close()


def _partitions(resp, topic: str) -> dict[int, tuple[int, int, list]]:
    """partition -> (error code, high watermark, [(offset, value)]) of a fetch response."""
    out = {}
    for t in resp.responses:
        assert t.topic == topic
        for p in t.partitions:
            assert p.partition_index not in out
            out[p.partition_index] = (p.error_code, p.high_watermark, fetched_values(p.records))
    return out


def test_raw_fetch_session_lifecycle(broker: EmbeddedBroker) -> None:
    topic = unique_topic("session")
    create_topic(broker.bootstrap_servers, topic, partitions=2)
    s = Session(broker, topic)
    try:
        s.produce(0, b"a0", b"a1", b"a2")
        s.produce(1, b"b0", b"b1")

        # A full fetch with epoch 0 creates a session.
        resp = s.fetch({0: 0, 1: 0}, session_id=0, epoch=0)
        assert resp.error_code == 0
        sid = resp.session_id
        assert sid != 0, "no session created"
        assert _partitions(resp, topic) == {
            0: (0, 3, [(0, b"a0"), (1, b"a1"), (2, b"a2")]),
            1: (0, 2, [(0, b"b0"), (1, b"b1")]),
        }

        # Epoch 1 moves both positions to the end: nothing is new, nothing comes back.
        resp = s.fetch({0: 3, 1: 2}, session_id=sid, epoch=1)
        assert (resp.error_code, resp.session_id) == (0, sid)
        assert _partitions(resp, topic) == {}

        # Epoch 2 names no partition; the session remembers both; still no news.
        resp = s.fetch({}, session_id=sid, epoch=2)
        assert (resp.error_code, resp.session_id) == (0, sid)
        assert _partitions(resp, topic) == {}

        # Data on partition 1 only: only partition 1 is in the response.
        s.produce(1, b"b2")
        resp = s.fetch({}, session_id=sid, epoch=3)
        assert (resp.error_code, resp.session_id) == (0, sid)
        assert _partitions(resp, topic) == {1: (0, 3, [(2, b"b2")])}

        # A long poll inside the session parks and wakes with only the partition that got data.
        cid = s.send_fetch({1: 3}, session_id=sid, epoch=4, max_wait_ms=5000)
        assert not s.wire.readable(0.3), "incremental fetch with no news answered at once"
        s.produce(0, b"a3")
        assert s.wire.readable(2.0), "parked incremental fetch not woken by the produce"
        resp = s.read(cid)
        assert (resp.error_code, resp.session_id) == (0, sid)
        assert _partitions(resp, topic) == {0: (0, 4, [(3, b"a3")])}

        # Forget partition 0: it leaves the session, news on it is no longer reported.
        resp = s.fetch({}, session_id=sid, epoch=5, forgotten=[0])
        assert resp.error_code == 0
        assert _partitions(resp, topic) == {}
        s.produce(0, b"a4")
        s.produce(1, b"b3")
        resp = s.fetch({}, session_id=sid, epoch=6)
        assert resp.error_code == 0
        assert _partitions(resp, topic) == {1: (0, 4, [(3, b"b3")])}

        # A wrong epoch is refused and leaves the session as it was.
        for wrong in (6, 8, 1):
            resp = s.fetch({}, session_id=sid, epoch=wrong)
            assert resp.error_code == INVALID_FETCH_SESSION_EPOCH, wrong
            assert resp.responses == []
        resp = s.fetch({1: 4}, session_id=sid, epoch=7)
        assert (resp.error_code, resp.session_id) == (0, sid)
        assert _partitions(resp, topic) == {}

        # Partition 0 joins again: new to the session, so it is answered in full once.
        resp = s.fetch({0: 4}, session_id=sid, epoch=8)
        assert (resp.error_code, resp.session_id) == (0, sid)
        assert _partitions(resp, topic) == {0: (0, 5, [(4, b"a4")])}
        resp = s.fetch({0: 5}, session_id=sid, epoch=9)
        assert _partitions(resp, topic) == {}

        # An id the broker never gave out.
        other = sid + 7919 if sid < 2**30 else sid - 7919
        resp = s.fetch({}, session_id=other, epoch=1)
        assert resp.error_code == FETCH_SESSION_ID_NOT_FOUND
        assert resp.responses == []

        # Epoch -1 closes the session: a sessionless full answer, then the id is gone.
        resp = s.fetch({0: 4, 1: 4}, session_id=sid, epoch=-1)
        assert (resp.error_code, resp.session_id) == (0, 0)
        assert set(_partitions(resp, topic)) == {0, 1}
        assert _partitions(resp, topic)[0] == (0, 5, [(4, b"a4")])
        resp = s.fetch({}, session_id=sid, epoch=10)
        assert resp.error_code == FETCH_SESSION_ID_NOT_FOUND
    finally:
        s.close()


def test_kafka_python_consumer_uses_one_session(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kafka-python's KafkaConsumer (incremental fetch sessions on by default) reads 1,000
    records with assign() + seek_to_beginning(), in many small fetches of one session."""
    topic = unique_topic("kp-session")
    create_topic(broker.bootstrap_servers, topic)
    sent = numbered(1000, "kp")
    offsets = confluent_produce(broker.bootstrap_servers, topic, sent,
                                extra={"batch.num.messages": 25})
    assert offsets == list(range(len(sent)))

    seen: list[tuple[int, int]] = []  # (top-level error code, session id) of every response
    original = kafka_fetcher.FetchSessionHandler.handle_response

    def spy(self, response):  # type: ignore[no-untyped-def]
        seen.append((response.error_code, response.session_id))
        return original(self, response)

    monkeypatch.setattr(kafka_fetcher.FetchSessionHandler, "handle_response", spy)

    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, group_id=None, enable_auto_commit=False,
        fetch_max_wait_ms=100, max_partition_fetch_bytes=4096, request_timeout_ms=15000,
    )
    got = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + 30
        while len(got) < len(sent) and time.monotonic() < deadline:
            got.extend(consumer.poll(timeout_ms=300).get(tp, []))
    finally:
        consumer.close(autocommit=False)

    assert_roundtrip(
        [Got(m.offset, Rec(m.key, m.value, _headers(m.headers), m.timestamp),
             CREATE_TIME if m.timestamp_type == 0 else LOG_APPEND_TIME) for m in got],
        sent,
    )
    assert len(seen) >= 5, f"only {len(seen)} fetch responses: records were not fetched in " \
        "small pieces"
    assert all(code == 0 for code, _ in seen), f"fetch session errors: {seen}"
    session_ids = {sid for _, sid in seen}
    assert len(session_ids) == 1 and 0 not in session_ids, (
        f"expected one fetch session for the whole read, saw ids {session_ids}")
