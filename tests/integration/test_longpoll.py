"""Long-poll fetches park in the fetch purgatory and complete on events.

Raw FetchRequest v12 on one socket, ProduceRequest on another, against an EmbeddedBroker whose
fetch purgatory counts how each fetch completed (by an event, or expired by the timer):
- a fetch parked on an empty partition (max_wait_ms 5000, min_bytes 1) is completed by the
  produce that brings data, not at its timeout;
- a fetch with max_wait_ms 500 and no data is answered at its timeout, never before (an append
  to another topic meanwhile does not wake it);
- a fetch whose min_bytes exceeds one small record stays parked after that record and is
  answered when enough bytes arrive.
How soon after the produce a parked fetch is answered is bench.longpoll's figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from broker.testing import EmbeddedBroker
from purgatory import Purgatory
from tests.support.clients import create_topic, unique_topic
from tests.support.requests import (
    correlation_id_of,
    fetch_request,
    fetch_response,
    fetched_values,
    produce_request,
    produce_response,
    record_batch,
)
from tests.support.wire import Wire

# How long a response is waited for before the test fails: a hang guard, not a latency bound
# (the fetch purgatory's counts say whether a fetch was completed by its event).
READ_DEADLINE_S = 10.0


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    """Embedded brokers with chosen server properties, each stopped at the end of the test."""
    with ExitStack() as stack:
        made: list[EmbeddedBroker] = []

        def make(overrides: dict[str, str] | None = None) -> EmbeddedBroker:
            made.append(EmbeddedBroker(tmp_path / f"broker-{len(made)}", **(overrides or {})))
            return stack.enter_context(made[-1])

        yield make


@pytest.fixture
def broker(broker_factory: Callable[..., EmbeddedBroker]) -> EmbeddedBroker:
    return broker_factory()


def fetch_purgatory(broker: EmbeddedBroker) -> Purgatory:
    assert broker.broker is not None and broker.broker.replica_manager is not None
    return broker.broker.replica_manager.fetch_purgatory


def counts(purgatory: Purgatory) -> tuple[int, int, int]:
    """(parked, completed by an event, expired) so far."""
    return purgatory.parked, purgatory.completed_by_event, purgatory.expired


def wait_parked(purgatory: Purgatory, parked: int) -> None:
    """Until the broker has parked the fetch just sent (it reads it on its own thread)."""
    deadline = time.monotonic() + READ_DEADLINE_S
    while purgatory.parked < parked:
        assert time.monotonic() < deadline, "the fetch was never parked"
        time.sleep(0.005)


def _fetch_partition(frame: bytes, topic: str):
    resp = fetch_response(frame)
    assert resp.error_code == 0, resp
    [t] = resp.responses
    assert t.topic == topic
    [p] = t.partitions
    assert p.error_code == 0, p
    return p


def _read_both(fetch: Wire, producer: Wire, timeout: float = READ_DEADLINE_S
               ) -> tuple[dict, dict]:
    """Read one frame from each socket; returns ({wire: frame}, {wire: arrival time})."""
    frames: dict[Wire, bytes] = {}
    times: dict[Wire, float] = {}
    deadline = time.monotonic() + timeout
    while len(frames) < 2:
        assert time.monotonic() < deadline, (
            f"only {len(frames)} of 2 responses arrived within {timeout}s")
        for w in (fetch, producer):
            if w not in frames and w.readable(0.0005):
                frames[w] = w.read_frame()
                times[w] = time.monotonic()
    return frames, times


@pytest.mark.parametrize(
    "overrides",
    [{}, {"log.flush.interval.messages": "1"}],
    ids=["hw-on-append", "hw-after-fsync"],
)
def test_parked_fetch_answered_right_after_produce(
        broker_factory: Callable[..., EmbeddedBroker], overrides: dict[str, str]) -> None:
    """With fsync per message the high watermark, and so the fetch, moves after the fsync: the
    DelayedFetch is then completed by the flusher's high-watermark advance."""
    broker = broker_factory(overrides)
    topic = unique_topic("longpoll")
    create_topic(broker.bootstrap_servers, topic)
    purgatory = fetch_purgatory(broker)
    fetch, producer = Wire(broker.port), Wire(broker.port)
    try:
        for i in range(20):
            parked, by_event, expired = counts(purgatory)
            fetch.send(fetch_request([(topic, 0, i)], max_wait_ms=5000, min_bytes=1), 2 * i)
            assert not fetch.readable(0.3 if i == 0 else 0.05), (
                f"round {i}: fetch answered before any data was produced")
            wait_parked(purgatory, parked + 1)
            assert counts(purgatory) == (parked + 1, by_event, expired), f"round {i}"
            value = b"long-poll-%d" % i
            producer.send(produce_request(topic, record_batch([value]), acks=1), 2 * i + 1)
            frames, _ = _read_both(fetch, producer)
            assert produce_response(frames[producer]) == (0, i)
            assert correlation_id_of(frames[fetch]) == 2 * i
            part = _fetch_partition(frames[fetch], topic)
            assert part.high_watermark == i + 1
            assert fetched_values(part.records) == [(i, value)]
            # Completed by the append (or the fsync's high-watermark advance), not the timer.
            assert counts(purgatory) == (parked + 1, by_event + 1, expired), f"round {i}"
    finally:
        fetch.close()
        producer.close()


def test_fetch_without_data_answered_at_its_timeout(broker: EmbeddedBroker) -> None:
    topic, other = unique_topic("idle"), unique_topic("busy")
    create_topic(broker.bootstrap_servers, topic)
    create_topic(broker.bootstrap_servers, other)
    purgatory = fetch_purgatory(broker)
    fetch, producer = Wire(broker.port), Wire(broker.port)
    elapsed: list[float] = []
    try:
        for i, max_wait_ms in enumerate((500, 500, 200, 500)):
            parked, by_event, expired = counts(purgatory)
            started = time.monotonic()
            fetch.send(fetch_request([(topic, 0, 0)], max_wait_ms=max_wait_ms), i)
            if i == 1:  # an append elsewhere must not wake this fetch
                time.sleep(0.1)
                producer.send(produce_request(other, record_batch([b"elsewhere"]), acks=1), 99)
                assert produce_response(producer.read_frame())[0] == 0
            frame = fetch.read_frame()
            took = time.monotonic() - started
            elapsed.append(took)
            assert correlation_id_of(frame) == i
            part = _fetch_partition(frame, topic)
            assert fetched_values(part.records) == []
            assert part.high_watermark == 0
            assert took >= max_wait_ms / 1000, (
                f"fetch with max_wait_ms={max_wait_ms} answered after {took * 1000:.1f} ms")
            # Answered by its deadline: the timer expired it, no event completed it.
            assert counts(purgatory) == (parked + 1, by_event, expired + 1), (
                f"fetch with max_wait_ms={max_wait_ms} was not expired by the timer")
    finally:
        fetch.close()
        producer.close()
    print(f"\nidle fetches answered after (ms): {[round(e * 1000, 1) for e in elapsed]}")


def test_min_bytes_waits_for_enough_data(broker: EmbeddedBroker) -> None:
    topic = unique_topic("minbytes")
    create_topic(broker.bootstrap_servers, topic)
    purgatory = fetch_purgatory(broker)
    fetch, producer = Wire(broker.port), Wire(broker.port)
    try:
        parked, by_event, expired = counts(purgatory)
        fetch.send(fetch_request([(topic, 0, 0)], max_wait_ms=5000, min_bytes=3000), 1)
        assert not fetch.readable(0.2)
        wait_parked(purgatory, parked + 1)
        producer.send(produce_request(topic, record_batch([b"small"]), acks=1), 2)
        assert produce_response(producer.read_frame()) == (0, 0)
        assert not fetch.readable(0.4), "answered with fewer than min_bytes before the timeout"
        assert counts(purgatory) == (parked + 1, by_event, expired)

        big = b"B" * 4000
        producer.send(produce_request(topic, record_batch([big]), acks=1), 3)
        frames, _ = _read_both(fetch, producer)
        assert produce_response(frames[producer]) == (0, 1)
        part = _fetch_partition(frames[fetch], topic)
        assert fetched_values(part.records) == [(0, b"small"), (1, big)]
        assert len(part.records) >= 3000
        # Completed by the append that brought enough bytes, not at its timeout.
        assert counts(purgatory) == (parked + 1, by_event + 1, expired)
    finally:
        fetch.close()
        producer.close()
