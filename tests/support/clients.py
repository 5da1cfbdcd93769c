"""Real Kafka clients driven the same way from every integration test.

Each helper opens its client, does one job against a broker on loopback and closes it, with a
deadline on every wait. Records travel as `Rec` and come back as `Got`, so tests compare every
byte of key, value, headers and timestamp whatever client produced or consumed them.

No consumer groups: consumers use assign() + seek (group APIs are not served yet), and they never
commit. librdkafka insists on a group.id, so it gets one that is never used.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
CODEC_ID = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
# Explicit CreateTime timestamps: an hour ago, so no default time-based retention (7 days) can
# touch them, yet distinct from the broker's clock.
BASE_TS = (int(time.time()) - 3600) * 1000 + 123

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp: int = BASE_TS


@dataclass(frozen=True)
class Got:
    """A consumed record, normalised across clients."""

    offset: int
    rec: Rec
    timestamp_type: str


class ClientError(AssertionError):
    """A client reported an error where none was allowed."""


# -- records ---------------------------------------------------------------------------------


def sample_records(
    n: int = 40, *, seed: int = 0, both_null: bool = False, null_header: bool = True
) -> list[Rec]:
    """Records covering the awkward cases: null key, null value, empty key/value, all 256 byte
    values, binary and duplicate and null-valued and non-ASCII headers, large compressible values.

    Values are mostly repetitive text so every codec really shrinks the batch (librdkafka sends a
    batch uncompressed when compression would not make it smaller).
    kafka-python and aiokafka refuse a record whose key and value are both null (`both_null`
    adds one for clients that accept it); kafka-python refuses a null header value.
    """
    rnd = random.Random(seed)
    all_bytes = bytes(range(256))
    special = [
        Rec(None, b"value with a null key"),
        Rec(b"key-with-null-value", None),
        Rec(b"", b""),
        Rec(all_bytes, all_bytes[::-1], (("bin", all_bytes),)),
        Rec(
            b"k-headers",
            b"v-headers",
            (("dup", b"first"), ("dup", b"second"), ("empty", b""),
             ("null", None if null_header else b"\x00"), ("ключ-ü", "значение".encode())),
        ),
        Rec(b"big", b"compressible text block " * 2000),  # ~48 KB
    ]
    if both_null:
        special.append(Rec(None, None, (("only", b"headers"),)))
    out: list[Rec] = []
    for i in range(n):
        if i < len(special):
            base = special[i]
        else:
            text = f"record {i} " + "lorem ipsum dolor sit amet " * rnd.randint(1, 40)
            headers: Headers = ()
            if i % 3 == 0:
                headers = (("idx", str(i).encode()), ("rnd", rnd.randbytes(rnd.randint(0, 16))))
            key = None if i % 7 == 0 else f"key-{i}".encode() + rnd.randbytes(3)
            value = None if i % 11 == 0 else text.encode() + rnd.randbytes(8)
            base = Rec(key, value, headers)
        out.append(Rec(base.key, base.value, base.headers, BASE_TS + i * 1013 + seed))
    return out


def numbered(n: int, prefix: str = "m", *, start: int = 0, ts: int | None = None) -> list[Rec]:
    """Small plain records, one per index, easy to spot in a failure message."""
    return [
        Rec(f"{prefix}-k{i}".encode(), f"{prefix}-v{i}".encode(), (("i", str(i).encode()),),
            ts if ts is not None else BASE_TS + i)
        for i in range(start, start + n)
    ]


def _headers(raw: Iterable[tuple[str, bytes | None]] | None) -> Headers:
    return tuple((str(k), None if v is None else bytes(v)) for k, v in (raw or ()))


def assert_roundtrip(got: Sequence[Got], sent: Sequence[Rec], first_offset: int = 0) -> None:
    """Every byte of every record, CreateTime, and consecutive offsets from first_offset."""
    assert len(got) == len(sent), f"got {len(got)} records, sent {len(sent)}"
    for i, (g, r) in enumerate(zip(got, sent, strict=True)):
        assert g.offset == first_offset + i, f"record {i}: offset {g.offset}"
        assert g.rec.key == r.key, f"record {i}: key {g.rec.key!r:.80} != {r.key!r:.80}"
        assert g.rec.value == r.value, f"record {i}: value {g.rec.value!r:.80} != {r.value!r:.80}"
        assert g.rec.headers == r.headers, f"record {i}: headers {g.rec.headers} != {r.headers}"
        assert g.rec.timestamp == r.timestamp, f"record {i}: timestamp {g.rec.timestamp}"
        assert g.timestamp_type == CREATE_TIME, f"record {i}: timestamp type {g.timestamp_type}"


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- confluent-kafka (librdkafka) ------------------------------------------------------------


def _confluent_base(bootstrap: str, errors: list) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "error_cb": errors.append,
        "socket.timeout.ms": 10000,
        "broker.address.family": "v4",
    }


def create_topic(
    bootstrap: str, topic: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    errors: list = []
    admin = AdminClient(_confluent_base(bootstrap, errors))
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=10,
        request_timeout=15,
    )
    futures[topic].result(timeout=20)
    if errors:
        raise ClientError(f"admin errors: {errors}")


def confluent_produce(
    bootstrap: str,
    topic: str,
    records: Sequence[Rec],
    *,
    compression: str = "none",
    partition: int = 0,
    one_batch_each: bool = False,
    extra: dict | None = None,
    timeout: float = 30,
) -> list[int]:
    """Produce with acks=all; returns the offset of each record, in order. Any error raises."""
    from confluent_kafka import Producer

    errors: list = []
    conf = {
        **_confluent_base(bootstrap, errors),
        "compression.type": compression,
        "acks": "all",
        "enable.idempotence": False,
        "linger.ms": 0 if one_batch_each else 20,
        "message.timeout.ms": int(timeout * 1000),
        **(extra or {}),
    }
    producer = Producer(conf)
    offsets: list[int | None] = [None] * len(records)

    def report(i: int):
        def cb(err, msg) -> None:
            if err is not None:
                errors.append(err)
            else:
                offsets[i] = msg.offset()

        return cb

    deadline = time.monotonic() + timeout
    for i, r in enumerate(records):
        producer.produce(
            topic, value=r.value, key=r.key, partition=partition, timestamp=r.timestamp,
            headers=list(r.headers) or None, on_delivery=report(i),
        )
        if one_batch_each:
            producer.flush(max(0.1, deadline - time.monotonic()))
    remaining = producer.flush(max(0.1, deadline - time.monotonic()))
    if errors or remaining:
        raise ClientError(f"confluent produce: errors={errors} undelivered={remaining}")
    assert all(o is not None for o in offsets)
    return offsets  # type: ignore[return-value]


def confluent_consumer(bootstrap: str, errors: list, extra: dict | None = None):
    from confluent_kafka import Consumer

    return Consumer({
        **_confluent_base(bootstrap, errors),
        "group.id": f"never-joined-{uuid.uuid4().hex[:8]}",  # required by librdkafka, unused
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        **(extra or {}),
    })


def _confluent_got(msg) -> Got:
    from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME

    ts_type, ts = msg.timestamp()
    kind = {TIMESTAMP_CREATE_TIME: CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME: LOG_APPEND_TIME}
    return Got(msg.offset(), Rec(msg.key(), msg.value(), _headers(msg.headers()), ts),
               kind.get(ts_type, str(ts_type)))


def confluent_consume(
    bootstrap: str, topic: str, count: int, *, partition: int = 0, start: int = 0,
    timeout: float = 30,
) -> list[Got]:
    """Read `count` records from `start` with assign(); raises on any error or on timeout."""
    from confluent_kafka import TopicPartition

    errors: list = []
    consumer = confluent_consumer(bootstrap, errors)
    out: list[Got] = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                errors.append(msg.error())
                continue
            out.append(_confluent_got(msg))
    finally:
        consumer.close()
    if errors:
        raise ClientError(f"confluent consume: {errors}")
    if len(out) < count:
        raise ClientError(f"confluent consume: {len(out)} of {count} records in {timeout}s")
    return out


def watermarks(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, int]:
    """(log start offset, high watermark) from ListOffsets earliest/latest, never cached."""
    from confluent_kafka import TopicPartition

    errors: list = []
    consumer = confluent_consumer(bootstrap, errors)
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10, cached=False
        )
    finally:
        consumer.close()
    if errors:
        raise ClientError(f"watermarks: {errors}")
    return low, high


# -- aiokafka --------------------------------------------------------------------------------


def _aio_codec(compression: str) -> str | None:
    return None if compression == "none" else compression


def aiokafka_produce(
    bootstrap: str, topic: str, records: Sequence[Rec], *, compression: str = "none",
    partition: int = 0, timeout: float = 30,
) -> list[int]:
    return asyncio.run(asyncio.wait_for(
        _aiokafka_produce(bootstrap, topic, records, compression, partition), timeout
    ))


async def _aiokafka_produce(
    bootstrap: str, topic: str, records: Sequence[Rec], compression: str, partition: int
) -> list[int]:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, compression_type=_aio_codec(compression), acks="all",
        enable_idempotence=False, linger_ms=20, max_request_size=4 << 20,
        request_timeout_ms=15000,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, value=r.value, key=r.key, partition=partition, timestamp_ms=r.timestamp,
                headers=list(r.headers),
            )
            for r in records
        ]
        return [(await f).offset for f in futures]
    finally:
        await producer.stop()


def aiokafka_consume(
    bootstrap: str, topic: str, count: int, *, partition: int = 0, start: int = 0,
    timeout: float = 30,
) -> list[Got]:
    return asyncio.run(asyncio.wait_for(
        _aiokafka_consume(bootstrap, topic, count, partition, start, timeout), timeout + 10
    ))


async def _aiokafka_consume(
    bootstrap: str, topic: str, count: int, partition: int, start: int, timeout: float
) -> list[Got]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        auto_offset_reset="earliest", fetch_max_wait_ms=100, request_timeout_ms=15000,
    )
    await consumer.start()
    out: list[Got] = []
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            batches = await consumer.getmany(tp, timeout_ms=300)
            for m in batches.get(tp, []):
                kind = CREATE_TIME if m.timestamp_type == 0 else LOG_APPEND_TIME
                out.append(Got(m.offset, Rec(m.key, m.value, _headers(m.headers), m.timestamp),
                               kind))
    finally:
        await consumer.stop()
    if len(out) < count:
        raise ClientError(f"aiokafka consume: {len(out)} of {count} records in {timeout}s")
    return out


# -- kafka-python ----------------------------------------------------------------------------


def kafka_python_produce(
    bootstrap: str, topic: str, records: Sequence[Rec], *, compression: str = "none",
    partition: int = 0, timeout: float = 30,
) -> list[int]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, compression_type=_aio_codec(compression), acks="all",
        enable_idempotence=False, linger_ms=20, max_request_size=4 << 20,
        request_timeout_ms=15000, max_block_ms=int(timeout * 1000),
    )
    try:
        futures = [
            producer.send(
                topic, value=r.value, key=r.key, partition=partition, timestamp_ms=r.timestamp,
                headers=list(r.headers),
            )
            for r in records
        ]
        producer.flush(timeout)
        return [f.get(timeout=timeout).offset for f in futures]
    finally:
        producer.close(timeout=5)


def kafka_python_consume(
    bootstrap: str, topic: str, count: int, *, partition: int = 0, start: int = 0,
    timeout: float = 30,
) -> list[Got]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
        auto_offset_reset="earliest", fetch_max_wait_ms=100, request_timeout_ms=15000,
    )
    out: list[Got] = []
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for m in consumer.poll(timeout_ms=300).get(tp, []):
                kind = CREATE_TIME if m.timestamp_type == 0 else LOG_APPEND_TIME
                out.append(Got(m.offset, Rec(m.key, m.value, _headers(m.headers), m.timestamp),
                               kind))
    finally:
        consumer.close(autocommit=False)
    if len(out) < count:
        raise ClientError(f"kafka-python consume: {len(out)} of {count} records in {timeout}s")
    return out


# What each producer can express: kafka-python and aiokafka refuse key and value both null,
# kafka-python refuses a null header value.
PRODUCER_LIMITS = {
    "confluent": {"both_null": True, "null_header": True},
    "aiokafka": {"both_null": False, "null_header": True},
    "kafka-python": {"both_null": False, "null_header": False},
}

PRODUCERS = {
    "confluent": confluent_produce,
    "aiokafka": aiokafka_produce,
    "kafka-python": kafka_python_produce,
}
CONSUMERS = {
    "confluent": confluent_consume,
    "aiokafka": aiokafka_consume,
    "kafka-python": kafka_python_consume,
}


# -- what is on disk -------------------------------------------------------------------------

_BATCH_HEADER = struct.Struct(">qiiBIhiqqqhii")  # the 61-byte RecordBatch v2 header


@dataclass(frozen=True)
class DiskBatch:
    segment: Path
    position: int
    base_offset: int
    length: int
    magic: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int

    @property
    def codec(self) -> int:
        return self.attributes & 0x7

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


def partition_dir(log_dir: Path, topic: str, partition: int = 0) -> Path:
    return log_dir / f"{topic}-{partition}"


def segment_files(log_dir: Path, topic: str, partition: int = 0) -> list[Path]:
    """`.log` segments of a partition, oldest first (names are zero-padded base offsets)."""
    return sorted(partition_dir(log_dir, topic, partition).glob("*.log"))


def disk_batches(log_dir: Path, topic: str, partition: int = 0) -> list[DiskBatch]:
    """Walk every batch header of every segment, the way Kafka's DumpLogSegments would."""
    out: list[DiskBatch] = []
    for seg in segment_files(log_dir, topic, partition):
        data = seg.read_bytes()
        pos = 0
        while pos + _BATCH_HEADER.size <= len(data):
            (base, length, _epoch, magic, _crc, attrs, lod, first_ts, max_ts, pid, epoch, seq,
             count) = _BATCH_HEADER.unpack_from(data, pos)
            out.append(DiskBatch(seg, pos, base, length, magic, attrs, lod, first_ts, max_ts,
                                 count, pid, epoch, seq))
            pos += 12 + length
        assert pos == len(data), f"{seg}: {len(data) - pos} trailing bytes after last batch"
    return out


def assert_idempotent_batches(log_dir: Path, topic: str, partition: int, records: int) -> None:
    """Every batch carries one producer id and epoch, and sequence numbers run 0.. without gap
    or repeat, in step with the offsets: what the broker stored is exactly one copy of each."""
    batches = disk_batches(log_dir, topic, partition)
    assert batches, f"{topic}-{partition}: no batches on disk"
    ids = {(b.producer_id, b.producer_epoch) for b in batches}
    assert len(ids) == 1 and next(iter(ids))[0] >= 0, f"{topic}-{partition}: producer ids {ids}"
    seq = 0
    for b in batches:
        assert b.base_sequence == seq, f"{topic}-{partition}: batch {b} expected sequence {seq}"
        assert b.base_offset == seq, f"{topic}-{partition}: batch {b} expected offset {seq}"
        seq += b.record_count
    assert seq == records, f"{topic}-{partition}: {seq} records stored, {records} produced"


def wait_until(predicate, timeout: float, what: str = "condition", interval: float = 0.1):
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what} (last: {result!r})")
        time.sleep(interval)


def assert_stored_as_sent(batches: Sequence[DiskBatch], codec: str) -> None:
    """Batches keep the producer's codec: never recompressed, never decompressed.

    librdkafka sends a batch uncompressed when compression would not shrink it (a lone small
    record, typically the first one sent), so only batches of several records must carry it.
    """
    wanted = CODEC_ID[codec]
    assert {b.codec for b in batches} <= {wanted, 0}, "a batch was stored with another codec"
    multi = [b for b in batches if b.record_count > 1]
    assert multi, "no batch of several records to check"
    assert all(b.codec == wanted for b in multi), [(b.codec, b.record_count) for b in batches]
