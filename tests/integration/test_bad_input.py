"""Bad input over raw sockets, while a well-behaved client keeps working on the same broker.

Framing errors, unknown APIs and unsupported versions close that one connection, logged once;
an unsupported ApiVersions version gets UNSUPPORTED_VERSION with the API list in v0 form (the
connection stays open); a batch with a bad CRC gets CORRUPT_MESSAGE and a magic v1 batch gets
INVALID_RECORD, as Kafka's ProduceRequest.validateRecords and LogValidator answer, and nothing
is appended. Through all of it a confluent-kafka producer and consumer on another topic see
not a single error and lose not a single record.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer, TopicPartition
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    BASE_TS,
    Rec,
    assert_roundtrip,
    confluent_consume,
    confluent_consumer,
    create_topic,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.wire import Wire

MAX_REQUEST = 262_144  # socket.request.max.bytes for this broker
CORRUPT_MESSAGE = 2
UNSUPPORTED_VERSION = 35
INVALID_RECORD = 87

# -- raw wire helpers ------------------------------------------------------------------------


def request_header(key: int, version: int, correlation_id: int, flexible: bool = False) -> bytes:
    """Request header v1 (v2 with flexible: an empty tagged-field section after client_id)."""
    client = b"bad-input-test"
    head = struct.pack(">hhih", key, version, correlation_id, len(client)) + client
    return head + (b"\x00" if flexible else b"")


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


# -- the well-behaved client -----------------------------------------------------------------


class SteadyTraffic:
    """A confluent-kafka producer and consumer on their own topic, in a thread."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.errors: list = []
        self.sent = 0
        self.acked: dict[int, int] = {}  # offset -> record number
        self.consumed: list = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-traffic", daemon=True)

    def start(self) -> SteadyTraffic:
        self._thread.start()
        return self

    def _record(self, i: int) -> Rec:
        return Rec(f"steady-k{i}".encode(), f"steady-v{i}".encode() * 5,
                   (("n", str(i).encode()),), BASE_TS + i)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # surfaced by stop()
            self.failure = exc

    def _loop(self) -> None:
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 2,
            "enable.idempotence": False, "error_cb": self.errors.append,
            "message.timeout.ms": 20000,
        })
        consumer = confluent_consumer(self.bootstrap, self.errors)
        consumer.assign([TopicPartition(self.topic, 0, 0)])

        def on_delivery(i: int):
            def cb(err, msg) -> None:
                if err is not None:
                    self.errors.append(err)
                else:
                    self.acked[msg.offset()] = i
            return cb

        def take(msg) -> None:
            if msg is None:
                return
            if msg.error():
                self.errors.append(msg.error())
            else:
                self.consumed.append(msg)

        while not self._stop.is_set():
            r = self._record(self.sent)
            producer.produce(self.topic, key=r.key, value=r.value, headers=list(r.headers),
                             partition=0, timestamp=r.timestamp, on_delivery=on_delivery(self.sent))
            self.sent += 1
            producer.poll(0)
            take(consumer.poll(0.01))
        remaining = producer.flush(15)
        if remaining:
            self.errors.append(f"{remaining} records never acknowledged")
        deadline = time.monotonic() + 15
        while len(self.consumed) < self.sent and time.monotonic() < deadline:
            take(consumer.poll(0.1))
        consumer.close()

    def wait_acked(self, n: int, timeout: float = 20) -> None:
        wait_until(lambda: len(self.acked) >= n or self.failure, timeout,
                   what=f"{n} steady records acknowledged")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(45)
        assert not self._thread.is_alive(), "steady traffic did not stop"
        if self.failure is not None:
            raise self.failure

    def check(self) -> None:
        assert self.errors == [], f"the well-behaved client saw errors: {self.errors[:5]}"
        assert sorted(self.acked) == list(range(self.sent))
        assert all(self.acked[o] == o for o in self.acked), "acknowledged out of order"
        assert [m.offset() for m in self.consumed] == list(range(self.sent))
        for m in self.consumed:
            r = self._record(m.offset())
            assert (m.key(), m.value(), m.headers(), m.timestamp()[1]) == (
                r.key, r.value, list(r.headers), r.timestamp)


# -- the bad requests ------------------------------------------------------------------------


def _metadata_garbage_body() -> bytes:
    # Metadata v4 claims 2**31-1 topics, then ends two bytes later.
    return framed(request_header(3, 4, 1) + b"\x7f\xff\xff\xff\xde\xad")


CLOSING_CASES: dict[str, Callable[[], bytes]] = {
    "malformed body": _metadata_garbage_body,
    "frame shorter than a header": lambda: framed(b"\x00\x03\x00"),
    "oversized frame": lambda: struct.pack(">i", MAX_REQUEST + 1) + b"\x00\x03\x00\x0c" + b"x" * 64,
    "negative size": lambda: struct.pack(">i", -16) + b"x" * 16,
    "unknown api key": lambda: framed(request_header(999, 0, 2) + b"\x00" * 8),
    "unsupported metadata version": lambda: framed(request_header(3, 99, 3, True) + b"\x00" * 8),
    "unsupported produce version": lambda: framed(request_header(0, 2, 4) + b"\x00" * 16),
}


def _batch(codec: int = 0, *, value: bytes = b"value") -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )
    for i in range(3):
        builder.append(i, timestamp=BASE_TS + i, key=b"key%d" % i, value=value * 20,
                       headers=[("h", b"x")])
    return bytes(builder.build())


def _produce(raw: Wire, topic: str, records: bytes, correlation_id: int):
    req = ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=5000,
        topic_data=[ProduceRequest.TopicProduceData(
            name=topic,
            partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(
                index=0, records=records)],
        )],
    )
    req.with_header(correlation_id=correlation_id, client_id="bad-input-test")
    raw.send_raw(req.encode(header=True, framed=True))
    resp = ProduceResponse.decode(raw.read_frame(), version=9, header=True)
    assert resp.header.correlation_id == correlation_id
    [topic_resp] = resp.responses
    assert topic_resp.name == topic
    [part] = topic_resp.partition_responses
    return part


# -- the test --------------------------------------------------------------------------------


@pytest.fixture
def bad_broker(broker_factory) -> BrokerProcess:
    return broker_factory({"socket.request.max.bytes": str(MAX_REQUEST)})


def test_bad_input_is_contained(bad_broker: BrokerProcess) -> None:
    b = bad_broker
    steady_topic, crc_topic = unique_topic("steady"), unique_topic("crc")
    create_topic(b.bootstrap, steady_topic)
    create_topic(b.bootstrap, crc_topic)
    steady = SteadyTraffic(b.bootstrap, steady_topic).start()
    try:
        steady.wait_acked(30)
        closed_peers = _closing_cases(b)
        _api_versions_unsupported(b)
        _bad_batches(b, crc_topic)
        before = len(steady.acked)
        steady.wait_acked(before + 30)
    finally:
        steady.stop()
    steady.check()
    assert steady.sent >= 60

    assert b.proc is not None and b.proc.poll() is None, "broker died"
    lines = b.new_log_lines()
    closing = [ln for ln in lines if ln.get("event") == "closing connection"]
    for case, peer in closed_peers.items():
        mine = [ln for ln in closing if ln.get("peer") == peer]
        assert len(mine) == 1, f"{case}: expected one 'closing connection' for {peer}: {mine}"
    strangers = [ln for ln in closing if ln.get("peer") not in closed_peers.values()]
    assert not strangers, f"connections closed that did nothing wrong: {strangers}"
    assert not [ln for ln in lines if ln.get("level") in ("error", "critical")]


def _closing_cases(b: BrokerProcess, rounds: int = 5) -> dict[str, str]:
    """Every closing case, several rounds (spread over the steady client's traffic)."""
    peers: dict[str, str] = {}
    for n in range(rounds):
        for case, payload in CLOSING_CASES.items():
            raw = Wire(b.port)
            try:
                raw.send_raw(payload())
                closed, sent_back = raw.closed_by_broker(timeout=5)
                assert closed, f"{case}: connection still open"
                assert sent_back == b"", f"{case}: broker answered {sent_back[:40]!r} instead"
                peers[f"{case} #{n}"] = raw.peer
            finally:
                raw.close()
        time.sleep(0.05)
    # Each was logged once, with its reason, before the socket closed.
    wait_until(
        lambda: {ln.get("peer") for ln in b.new_log_lines()
                 if ln.get("event") == "closing connection"} >= set(peers.values()),
        timeout=5, what="every bad connection logged",
    )
    return peers


def _api_versions_unsupported(b: BrokerProcess) -> None:
    raw = Wire(b.port)
    try:
        # What a newer client sends: a flexible header and a v3-shaped body, at version 99.
        body = b"\x06newer\x041.0\x00"
        raw.send_raw(framed(request_header(18, 99, 77, flexible=True) + body))
        frame = raw.read_frame()
        (correlation_id,) = struct.unpack_from(">i", frame)
        assert correlation_id == 77
        resp = ApiVersionsResponse.decode(frame[4:], version=0)  # header v0, body v0
        assert resp.error_code == UNSUPPORTED_VERSION
        served = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert served[18] == (0, 4)
        assert served[0] == (0, 11)  # min 0 advertised as Kafka 4 does
        assert served[1] == (4, 16)
        assert served[2] == (1, 8)
        assert served[3][1] == 12
        assert {19, 20, 23, 32, 37, 60} <= served.keys()

        # The connection stays usable: the client retries with a version both sides know.
        req = ApiVersionsRequest[3](client_software_name="bad-input-test",
                                    client_software_version="1.0")
        req.with_header(correlation_id=78, client_id="bad-input-test")
        raw.send_raw(req.encode(header=True, framed=True))
        frame = raw.read_frame()
        assert struct.unpack_from(">i", frame) == (78,)
        ok = ApiVersionsResponse.decode(frame[4:], version=3)
        assert ok.error_code == 0
        assert {k.api_key: (k.min_version, k.max_version) for k in ok.api_keys} == served
    finally:
        raw.close()


def _bad_batches(b: BrokerProcess, topic: str) -> None:
    raw = Wire(b.port)
    try:
        good = _batch()
        part = _produce(raw, topic, good, 100)
        assert (part.error_code, part.base_offset) == (0, 0)
        assert watermarks(b.bootstrap, topic) == (0, 3)

        for codec in (0, 1, 4):  # none, gzip, zstd: the CRC is checked without decompressing
            bad = bytearray(_batch(codec, value=b"other"))
            bad[-3] ^= 0x5A  # inside the records; the CRC covers it, the length does not change
            part = _produce(raw, topic, bytes(bad), 101 + codec)
            assert part.error_code == CORRUPT_MESSAGE, f"codec {codec}: {part}"
            assert part.base_offset == -1

        legacy = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
        legacy.append(0, timestamp=BASE_TS, key=b"old", value=b"magic one")
        part = _produce(raw, topic, bytes(legacy.build()), 110)
        # ProduceRequest.validateRecords: v3+ takes magic 2 only (InvalidRecordException).
        assert part.error_code == INVALID_RECORD, part
        assert part.base_offset == -1

        # The connection survived every refusal, and nothing was appended.
        part = _produce(raw, topic, _batch(value=b"last"), 111)
        assert (part.error_code, part.base_offset) == (0, 3)
    finally:
        raw.close()
    assert watermarks(b.bootstrap, topic) == (0, 6)
    got = confluent_consume(b.bootstrap, topic, 6)
    expected = [Rec(b"key%d" % i, v * 20, (("h", b"x"),), BASE_TS + i)
                for v in (b"value", b"last") for i in range(3)]
    assert_roundtrip(got, expected)
