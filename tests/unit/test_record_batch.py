"""RecordBatch v2 header view, CRC32C, produce validation and in-place offset assignment.

Batches come from kafka-python's own builder so the bytes are what a real client sends.
"""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from protocol.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CREATE_TIME,
    LOG_APPEND_TIME,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    InvalidRecordError,
    RecordBatchError,
    RecordTooLargeError,
    UnsupportedCompressionTypeError,
    assign_offsets,
    check_produce_request_version,
    iter_batches,
    validate_produce_records,
)

CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]
TS = 1_700_000_000_000


def build(
    n: int = 3,
    codec: int = COMPRESSION_NONE,
    *,
    magic: int = 2,
    ts: int = TS,
    producer: tuple[int, int, int] | None = None,
    value_size: int = 100,
) -> bytearray:
    """One batch of ``n`` compressible records, timestamps ``ts .. ts + n - 1``."""
    kwargs = {}
    if producer is not None:
        pid, epoch, seq = producer
        kwargs = dict(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    b = MemoryRecordsBuilder(magic, codec, batch_size=1 << 24, **kwargs)
    for i in range(n):
        b.append(
            timestamp=ts + i,
            key=f"key-{i}".encode(),
            value=(b"v%d-" % i) * value_size,
            headers=[("h", b"x")] if magic >= 2 else None,
        )
    b.close()
    return bytearray(b.buffer())


def read_back(buf: bytes | bytearray) -> list[tuple[int, int, int, bytes | None]]:
    """(offset, timestamp, timestamp_type, key) for every record, decoded by kafka-python."""
    out = []
    records = MemoryRecords(bytes(buf))
    while records.has_next():
        batch = records.next_batch()
        for r in batch:
            out.append((r.offset, r.timestamp, r.timestamp_type, r.key))
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_header_fields_match_kafka_python(codec: int) -> None:
    buf = build(5, codec)
    h = BatchHeader(buf)
    ref = DefaultRecordBatch(bytes(buf))
    assert ref.compression_type == codec  # compressible data: the builder really compressed
    assert h.base_offset == 0
    assert h.size_in_bytes == len(buf) == h.batch_length + 12
    assert h.partition_leader_epoch == ref.leader_epoch
    assert h.magic == 2
    assert h.crc == ref.crc
    assert h.attributes == ref.attributes
    assert h.compression_type == codec
    assert h.last_offset_delta == 4 and h.last_offset == 4 and h.next_offset == 5
    assert h.record_count == 5
    assert h.base_timestamp == TS
    assert h.max_timestamp == TS + 4
    assert h.producer_id == -1 and h.producer_epoch == -1 and h.base_sequence == -1
    assert not h.has_producer_id
    assert h.timestamp_type == CREATE_TIME
    assert not h.is_transactional and not h.is_control
    assert h.is_valid()
    assert h.compute_crc() == h.crc
    assert h.fields()[0] == 0 and len(h.fields()) == 13


def test_header_views_memoryview_at_offset() -> None:
    a, b = build(2), build(3)
    buf = memoryview(bytes(a + b))
    h = BatchHeader(buf, len(a))
    assert h.record_count == 3 and h.is_valid()


def test_idempotent_producer_fields() -> None:
    h = BatchHeader(build(2, producer=(42, 7, 100)))
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (42, 7, 100)
    assert h.has_producer_id


@pytest.mark.parametrize("where", [RECORD_BATCH_OVERHEAD - 2, RECORD_BATCH_OVERHEAD + 5, -1, 21])
def test_flipped_byte_breaks_crc(where: int) -> None:
    buf = build(4, COMPRESSION_GZIP)
    assert BatchHeader(buf).is_valid()
    buf[where] ^= 0x01
    assert not BatchHeader(buf).is_valid()
    with pytest.raises(CorruptRecordError) as ei:
        validate_produce_records(buf)
    assert ei.value.error_code == 2


@pytest.mark.parametrize("where", [0, 7, 12, 15])
def test_base_offset_and_leader_epoch_not_covered_by_crc(where: int) -> None:
    buf = build(2)
    buf[where] ^= 0x10
    assert BatchHeader(buf).is_valid()


def test_iter_batches_stops_at_partial_tail() -> None:
    a, b, c = build(1), build(2), build(3, COMPRESSION_LZ4)
    whole = a + b + c
    assert [(p, h.record_count) for p, h in iter_batches(whole)] == [
        (0, 1),
        (len(a), 2),
        (len(a) + len(b), 3),
    ]
    for cut in (1, 11, 12, 17, 60, len(c) - 1):
        got = [h.record_count for _p, h in iter_batches(whole[: len(whole) - cut])]
        assert got == [1, 2]
    assert list(iter_batches(b"")) == []
    # pos/end window
    assert [h.record_count for _p, h in iter_batches(whole, len(a), len(a) + len(b))] == [2]


def test_iter_batches_impossible_length() -> None:
    buf = build(2)
    struct.pack_into(">i", buf, 8, 10)
    with pytest.raises(CorruptRecordError, match="length 10"):
        list(iter_batches(buf))
    struct.pack_into(">i", buf, 8, -5)
    with pytest.raises(CorruptRecordError):
        list(iter_batches(buf))


@pytest.mark.parametrize("codec", CODECS)
def test_validate_summary(codec: int) -> None:
    buf = build(7, codec)
    info = validate_produce_records(buf, max_batch_bytes=1 << 20)
    assert info.num_batches == 1
    assert info.num_records == info.offset_count == 7
    assert info.size_in_bytes == len(buf)
    assert info.max_timestamp == TS + 6
    assert info.offset_delta_of_max_timestamp == 6
    assert info.compression_type == codec
    assert info.positions == [0]


def test_validate_multiple_batches_when_allowed() -> None:
    a, b = build(2, ts=TS + 50), build(3, COMPRESSION_SNAPPY, ts=TS)
    buf = a + b
    with pytest.raises(InvalidRecordError, match="exactly one"):
        validate_produce_records(buf)
    info = validate_produce_records(buf, single_batch=False)
    assert (info.num_batches, info.num_records) == (2, 5)
    assert info.positions == [0, len(a)]
    assert info.max_timestamp == TS + 51
    assert info.offset_delta_of_max_timestamp == 1  # last offset of the first batch


@pytest.mark.parametrize("magic", [0, 1])
def test_old_magic_refused_with_invalid_record(magic: int) -> None:
    buf = build(3, magic=magic)
    with pytest.raises(InvalidRecordError) as ei:
        validate_produce_records(buf)
    assert ei.value.error_code == 87
    assert isinstance(ei.value, RecordBatchError)


def test_empty_and_trailing_garbage() -> None:
    with pytest.raises(InvalidRecordError):
        validate_produce_records(b"")
    buf = build(2)
    with pytest.raises(CorruptRecordError) as ei:
        validate_produce_records(buf[:-1])
    assert ei.value.error_code == 2
    with pytest.raises(CorruptRecordError):
        validate_produce_records(buf + b"\x00\x00\x00")


def test_count_and_delta_rules() -> None:
    buf = build(3)
    struct.pack_into(">i", buf, 57, 2)  # count 2 but delta 2 -> inconsistent
    _fix_crc(buf)
    with pytest.raises(InvalidRecordError, match="inconsistent") as ei:
        validate_produce_records(buf)
    assert ei.value.error_code == 87
    buf = build(1)
    struct.pack_into(">i", buf, 57, 0)
    struct.pack_into(">i", buf, 23, -1)
    _fix_crc(buf)
    with pytest.raises(InvalidRecordError):
        validate_produce_records(buf)


def test_base_offset_must_be_zero() -> None:
    buf = build(2)
    BatchHeader(buf).set_base_offset(5)
    with pytest.raises(InvalidRecordError, match="base offset"):
        validate_produce_records(buf)


def test_control_batch_refused() -> None:
    buf = build(1)
    struct.pack_into(">h", buf, 21, 0x20)
    _fix_crc(buf)
    with pytest.raises(InvalidRecordError, match="control"):
        validate_produce_records(buf)


def test_idempotent_batch_without_sequence_refused() -> None:
    buf = build(1, producer=(9, 0, 0))
    struct.pack_into(">i", buf, 53, -1)
    _fix_crc(buf)
    with pytest.raises(InvalidRecordError, match="sequence"):
        validate_produce_records(buf)


def test_too_large() -> None:
    buf = build(10)
    with pytest.raises(RecordTooLargeError) as ei:
        validate_produce_records(buf, max_batch_bytes=len(buf) - 1)
    assert ei.value.error_code == 10
    validate_produce_records(buf, max_batch_bytes=len(buf))


def test_zstd_needs_produce_v7() -> None:
    buf = build(5, COMPRESSION_ZSTD)
    with pytest.raises(UnsupportedCompressionTypeError) as ei:
        check_produce_request_version(buf, 6)
    assert ei.value.error_code == 76
    check_produce_request_version(buf, 7)
    check_produce_request_version(build(5, COMPRESSION_GZIP), 3)
    check_produce_request_version(build(2, magic=1), 3)  # left to validate_produce_records


@pytest.mark.parametrize("codec", CODECS)
def test_assign_offsets_in_place(codec: int) -> None:
    buf = build(4, codec)
    before = bytes(buf)
    info = validate_produce_records(buf)
    last = assign_offsets(buf, 1000, info=info)
    assert last == 1003
    h = BatchHeader(buf)
    assert h.base_offset == 1000 and h.last_offset == 1003
    assert h.is_valid()
    assert buf[8:] == before[8:]  # only the base offset changed
    assert [r[0] for r in read_back(buf)] == [1000, 1001, 1002, 1003]
    assert [r[1] for r in read_back(buf)] == [TS, TS + 1, TS + 2, TS + 3]


def test_assign_offsets_many_batches_and_epoch() -> None:
    a, b, c = build(2), build(1, COMPRESSION_GZIP), build(3)
    buf = a + b + c
    last = assign_offsets(buf, 10, partition_leader_epoch=4)
    assert last == 15
    assert [r[0] for r in read_back(buf)] == list(range(10, 16))
    assert all(h.partition_leader_epoch == 4 and h.is_valid() for _p, h in iter_batches(buf))


@pytest.mark.parametrize("codec", CODECS)
def test_log_append_time(codec: int) -> None:
    buf = build(3, codec)
    now = TS + 99_999
    assign_offsets(buf, 50, now)
    h = BatchHeader(buf)
    assert h.timestamp_type == LOG_APPEND_TIME
    assert h.max_timestamp == now
    assert h.base_timestamp == TS  # Kafka leaves firstTimestamp alone
    assert h.compression_type == codec
    assert h.is_valid()
    recs = read_back(buf)
    assert [(o, t, tt) for o, t, tt, _k in recs] == [(50, now, 1), (51, now, 1), (52, now, 1)]
    assert [k for *_x, k in recs] == [b"key-0", b"key-1", b"key-2"]


def test_set_max_timestamp_noop_keeps_crc() -> None:
    buf = build(2)
    h = BatchHeader(buf)
    crc = h.crc
    h.set_max_timestamp(CREATE_TIME, h.max_timestamp)
    assert h.crc == crc
    h.set_log_append_time(5)
    h.set_max_timestamp(CREATE_TIME, TS + 1)
    assert h.timestamp_type == CREATE_TIME and h.crc == crc


def test_exceptions_carry_codes() -> None:
    assert CorruptRecordError("x").error_code == 2
    assert InvalidRecordError("x").error_code == 87
    assert RecordBatchError("x", error_code=42).error_code == 42


def _fix_crc(buf: bytearray) -> None:
    h = BatchHeader(buf)
    struct.pack_into(">I", buf, 17, h.compute_crc())
