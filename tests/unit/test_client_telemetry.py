"""Client telemetry (KIP-714): GetTelemetrySubscriptions and PushTelemetry as Kafka's
ClientMetricsManager answers them.

The requests go through the handlers as the request channel calls them (parsed by a
Connection's own parser, responses encoded for their version and decoded again), on the broker's
real parts (tests/support/components.py); the bound on remembered instances is checked on
ClientTelemetry itself, where sixteen thousand subscriptions take milliseconds.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from broker.apis import get_telemetry_subscriptions, push_telemetry
from broker.client_telemetry import MAX_INSTANCES, ClientTelemetry
from protocol.errors import ErrorCode
from protocol.messages import GetTelemetrySubscriptionsRequest, PushTelemetryRequest
from tests.support.components import Components, build, parse, wire_roundtrip

ZERO = uuid.UUID(int=0)
METRICS = ["org.apache.kafka.producer.", "org.apache.kafka.consumer.fetch"]
PUSH_INTERVAL_MS = 500
MAX_BYTES = 1024
# Kafka's order of preference: zstd, lz4, gzip, snappy (CompressionType ids).
ACCEPTED = [4, 3, 1, 2]
PAYLOAD = b"\x0a\x00"  # the bytes are not read, only counted


def _build(tmp_path: Path, overrides: dict[str, str]) -> Components:
    return build(tmp_path / "logs", {"offsets.topic.num.partitions": "1", **overrides})


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = _build(tmp_path, {
        "minibroker.client.telemetry.metrics": ",".join(METRICS),
        "minibroker.client.telemetry.push.interval.ms": str(PUSH_INTERVAL_MS),
        "telemetry.max.bytes": str(MAX_BYTES),
    })
    yield c
    await c.close()


def subscribe(c: Components, instance_id: uuid.UUID = ZERO):
    req = parse(GetTelemetrySubscriptionsRequest(version=0, client_instance_id=instance_id))
    return wire_roundtrip(req, get_telemetry_subscriptions.handle(c.context, req))


def push(c: Components, instance_id: uuid.UUID, subscription_id: int, *,
         terminating: bool = False, compression: int = 0, metrics: bytes = PAYLOAD) -> int:
    req = parse(PushTelemetryRequest(
        version=0, client_instance_id=instance_id, subscription_id=subscription_id,
        terminating=terminating, compression_type=compression, metrics=metrics))
    return wire_roundtrip(req, push_telemetry.handle(c.context, req)).error_code


def new_instance(c: Components) -> tuple[uuid.UUID, int]:
    r = subscribe(c)
    return r.client_instance_id, r.subscription_id


# -- GetTelemetrySubscriptions --------------------------------------------------------------------


async def test_first_request_gets_a_new_instance_id_and_the_subscription(
        parts: Components) -> None:
    """A zero instance id is a client's first request: it is given an id of its own (a new one
    each time) and the configured subscription."""
    first, second = subscribe(parts), subscribe(parts)
    assert first.error_code == 0
    assert first.client_instance_id not in (None, ZERO)
    assert second.client_instance_id not in (None, ZERO, first.client_instance_id)
    assert first.requested_metrics == METRICS
    assert first.push_interval_ms == PUSH_INTERVAL_MS
    assert first.accepted_compression_types == ACCEPTED
    assert first.telemetry_max_bytes == MAX_BYTES
    assert first.delta_temporality is True


async def test_a_known_instance_keeps_its_subscription(parts: Components) -> None:
    """Asking again (after a push interval with nothing requested, or after an error) gives
    the same subscription id: the subscription has not changed."""
    instance, sid = new_instance(parts)
    again = subscribe(parts, instance)
    assert (again.error_code, again.subscription_id) == (0, sid)
    assert again.requested_metrics == METRICS


async def test_a_known_instance_is_answered_its_own_id(parts: Components) -> None:
    """Kafka's ClientMetricsManager answers the instance id in use, also when the client sent
    it. The Java client (4.x) validates every answer's id and refuses zero; librdkafka adopts
    whatever id it is given, so a zero answer makes it ask for a new instance next time."""
    instance, _sid = new_instance(parts)
    assert subscribe(parts, instance).client_instance_id == instance


async def test_default_configuration_requests_no_metrics(tmp_path: Path) -> None:
    """Without minibroker.client.telemetry.metrics clients are asked for nothing, and ask again
    only after Kafka's default push interval (5 minutes)."""
    c = _build(tmp_path, {})
    try:
        r = subscribe(c)
        assert (r.error_code, r.requested_metrics, r.push_interval_ms) == (0, [], 300000)
        assert r.client_instance_id not in (None, ZERO)
        assert r.telemetry_max_bytes == 1048576
    finally:
        await c.close()


def test_subscription_ids_are_stable_per_instance_and_configuration() -> None:
    """The subscription id depends on the instance and the configuration only: the same after
    a restart with the same settings, different for another instance or other settings (so a
    client pushing for an old subscription is told UNKNOWN_SUBSCRIPTION_ID)."""
    one, two = uuid.uuid4(), uuid.uuid4()
    before, after = (ClientTelemetry(METRICS, PUSH_INTERVAL_MS, MAX_BYTES) for _ in range(2))
    sid = before.subscribe(one)[1].subscription_id
    assert after.subscribe(one)[1].subscription_id == sid
    assert before.subscribe(two)[1].subscription_id != sid
    other_metrics = ClientTelemetry(METRICS[:1], PUSH_INTERVAL_MS, MAX_BYTES)
    assert other_metrics.subscribe(one)[1].subscription_id != sid
    other_interval = ClientTelemetry(METRICS, PUSH_INTERVAL_MS * 2, MAX_BYTES)
    assert other_interval.subscribe(one)[1].subscription_id != sid


# -- PushTelemetry --------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [0, *ACCEPTED])
async def test_push_accepted_with_each_codec(parts: Components, compression: int) -> None:
    instance, sid = new_instance(parts)
    assert push(parts, instance, sid, compression=compression) == ErrorCode.NONE


async def test_push_with_a_zero_instance_id_is_invalid(parts: Components) -> None:
    _instance, sid = new_instance(parts)
    assert push(parts, ZERO, sid) == ErrorCode.INVALID_REQUEST


async def test_push_for_an_unknown_instance_or_subscription(parts: Components) -> None:
    """The client then asks for its subscription again."""
    instance, sid = new_instance(parts)
    assert push(parts, uuid.uuid4(), sid) == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    assert push(parts, instance, sid + 1) == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    assert push(parts, instance, sid) == ErrorCode.NONE


async def test_push_larger_than_telemetry_max_bytes(parts: Components) -> None:
    instance, sid = new_instance(parts)
    assert push(parts, instance, sid, metrics=b"m" * MAX_BYTES) == ErrorCode.NONE
    assert push(parts, instance, sid, metrics=b"m" * (MAX_BYTES + 1)) == (
        ErrorCode.TELEMETRY_TOO_LARGE)


@pytest.mark.parametrize("compression", [5, 99, -1])
async def test_push_with_an_unknown_codec(parts: Components, compression: int) -> None:
    instance, sid = new_instance(parts)
    assert push(parts, instance, sid, compression=compression) == (
        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)


async def test_no_push_after_the_terminating_one(parts: Components) -> None:
    """A client's last push says it is terminating; anything after that is refused."""
    instance, sid = new_instance(parts)
    assert push(parts, instance, sid) == ErrorCode.NONE
    assert push(parts, instance, sid, terminating=True) == ErrorCode.NONE
    assert push(parts, instance, sid) == ErrorCode.INVALID_REQUEST
    assert push(parts, instance, sid, terminating=True) == ErrorCode.INVALID_REQUEST


async def test_pushes_counted_by_result(parts: Components) -> None:
    """What minibroker_client_telemetry_pushes_total and _bytes_total export."""
    instance, sid = new_instance(parts)
    push(parts, instance, sid, metrics=b"x" * 10)
    push(parts, instance, sid, metrics=b"x" * 20)
    push(parts, instance, sid + 1)
    push(parts, instance, sid, metrics=b"x" * (MAX_BYTES + 1))
    push(parts, ZERO, sid)
    telemetry = parts.context.telemetry
    assert telemetry.pushes == {"NONE": 2, "UNKNOWN_SUBSCRIPTION_ID": 1,
                                "TELEMETRY_TOO_LARGE": 1, "INVALID_REQUEST": 1}
    assert telemetry.pushed_bytes == 30


# -- bounded memory -------------------------------------------------------------------------------


@pytest.fixture
def telemetry() -> Iterator[ClientTelemetry]:
    yield ClientTelemetry(METRICS, PUSH_INTERVAL_MS, MAX_BYTES)


def _subscribed(t: ClientTelemetry) -> tuple[uuid.UUID, int]:
    instance, sub = t.subscribe(ZERO)
    return instance, sub.subscription_id


def test_instances_are_bounded_oldest_forgotten_first(telemetry: ClientTelemetry) -> None:
    """Clients inventing instance ids cannot grow the broker's memory: past MAX_INSTANCES the
    least recently subscribed instance is forgotten (its next push is told to subscribe
    again), and an instance that asked again recently is kept."""
    oldest, oldest_sid = _subscribed(telemetry)
    kept, kept_sid = _subscribed(telemetry)
    for _ in range(MAX_INSTANCES - 2):
        _subscribed(telemetry)
    telemetry.subscribe(kept)  # asks again: now the most recent
    newest, newest_sid = _subscribed(telemetry)  # one too many: `oldest` goes
    assert len(telemetry._instances) == MAX_INSTANCES
    assert telemetry.push(oldest, oldest_sid, False, 0, PAYLOAD) == (
        ErrorCode.UNKNOWN_SUBSCRIPTION_ID)
    assert telemetry.push(kept, kept_sid, False, 0, PAYLOAD) == ErrorCode.NONE
    assert telemetry.push(newest, newest_sid, False, 0, PAYLOAD) == ErrorCode.NONE
    again, sub = telemetry.subscribe(oldest)  # a forgotten client simply subscribes again
    assert (again, sub.subscription_id) == (oldest, oldest_sid)
    assert telemetry.push(oldest, oldest_sid, False, 0, PAYLOAD) == ErrorCode.NONE
