"""LogValidator on crafted batches: record-level refusals and recompression, as Kafka's.

Batches come from kafka-python's builder (what a client sends); records are read back with
kafka-python's reader, so every byte of key, value, headers and timestamp is compared.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker.log.config import LogConfig
from broker.log.log import Log
from broker.log.validator import LONG_MAX, LogValidator, compress
from broker.metadata.file_store import validate_topic_configs
from protocol.errors import ErrorCode, KafkaError
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
    RecordBatchError,
    validate_produce_records,
)

CODECS = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4, COMPRESSION_ZSTD]
NAMES = {0: "uncompressed", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
NOW = 1_700_000_000_000
HOUR = 3_600_000
Rec = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]


def recs(n: int = 5, ts: int = NOW - 1000) -> list[Rec]:
    """Records with awkward content: empty and null values, binary and null-valued headers."""
    out: list[Rec] = []
    for i in range(n):
        value = None if i == 1 else b"" if i == 2 else (b"value %d " % i) * 40 + bytes(range(256))
        headers = [("h", bytes([i])), ("null", None), ("ü", b"\x00\xff")] if i % 2 else []
        out.append((b"key-%d" % i, value, headers, ts + i))
    return out


def batch(
    records: list[Rec],
    codec: int = COMPRESSION_NONE,
    *,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
    offsets: list[int] | None = None,
) -> bytearray:
    pid, epoch, seq = producer
    b = DefaultRecordBatchBuilder(2, codec, transactional, pid, epoch, seq, 1 << 30)
    for i, (key, value, headers, ts) in enumerate(records):
        b.append(i if offsets is None else offsets[i], ts, key, value, headers)
    out = bytearray(b.build())
    assert BatchHeader(out).compression_type == codec, "kafka-python did not compress"
    return out


def read(buf: bytes | bytearray | memoryview) -> list[tuple[int, Rec]]:
    return [
        (r.offset, (r.key, r.value, r.headers, r.timestamp))
        for r in DefaultRecordBatch(bytes(buf))
    ]


def run(config: LogConfig, buf: bytearray, now: int = NOW):
    info = validate_produce_records(buf, config.max_message_bytes)
    return LogValidator(config, "t-0").validate(buf, info, now)


def refusal(config: LogConfig, buf: bytearray, now: int = NOW) -> KafkaError:
    before = bytes(buf)
    with pytest.raises(KafkaError) as exc:
        run(config, buf, now)
    assert bytes(buf) == before, "a refused batch was modified"
    return exc.value


def reset_crc(buf: bytearray) -> None:
    struct.pack_into(">I", buf, 17, BatchHeader(buf).compute_crc())


# -- the header-only path ------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_defaults_keep_the_batch_byte_for_byte(codec: int) -> None:
    buf = batch(recs(), codec)
    sent = bytes(buf)
    out, info = run(LogConfig(), buf)
    assert out is buf and bytes(out) == sent
    assert info.max_timestamp == NOW - 1000 + 4


def test_defaults_never_decompress() -> None:
    """A gzip payload that does not decompress (valid CRC) passes: only headers were read."""
    buf = batch(recs(), COMPRESSION_GZIP)
    buf[RECORD_BATCH_OVERHEAD : RECORD_BATCH_OVERHEAD + 4] = b"junk"
    reset_crc(buf)
    out, _ = run(LogConfig(message_timestamp_after_max_ms=HOUR), buf)
    assert out is buf
    # ...and a rule that needs the records does decompress it, refusing as Kafka does.
    err = refusal(LogConfig(cleanup_policy="compact"), buf)
    assert err.error_code == ErrorCode.UNKNOWN_SERVER_ERROR


@pytest.mark.parametrize("codec", [COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_same_codec_other_level_is_not_recompressed(codec: int) -> None:
    buf = batch(recs(), codec)
    sent = bytes(buf)
    config = LogConfig(compression_type=NAMES[codec], compression_gzip_level=1,
                       compression_lz4_level=17, compression_zstd_level=19)
    out, _ = run(config, buf)
    assert bytes(out) == sent


# -- recompression ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", CODECS)
@pytest.mark.parametrize("source", CODECS)
def test_other_codec_is_recompressed_keeping_every_record(source: int, target: int) -> None:
    records = recs(7)
    buf = batch(records, source, producer=(42, 3, 1000), transactional=True)
    sent = bytes(buf)
    out, info = run(LogConfig(compression_type=NAMES[target]), buf)
    if source == target:
        assert bytes(out) == sent
        return
    header = BatchHeader(out)
    assert header.is_valid()
    assert header.compression_type == target == info.compression_type
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 1000)
    assert header.is_transactional and header.timestamp_type == CREATE_TIME
    assert (header.record_count, header.last_offset_delta) == (7, 6)
    assert (header.base_timestamp, header.max_timestamp) == (NOW - 1000, NOW - 1000 + 6)
    assert info.size_in_bytes == len(out) == header.size_in_bytes
    assert (info.num_records, info.max_timestamp) == (7, NOW - 1000 + 6)
    assert read(out) == list(enumerate(records))


def test_recompression_stores_the_codec_even_when_it_does_not_shrink() -> None:
    """kafka-python's builder would fall back to uncompressed here; Kafka keeps the codec."""
    tiny = [(b"k", b"v", [], NOW)]
    out, _ = run(LogConfig(compression_type="gzip"), batch(tiny))
    assert BatchHeader(out).compression_type == COMPRESSION_GZIP
    assert BatchHeader(out).size_in_bytes > len(batch(tiny))
    assert read(out) == [(0, tiny[0])]


@pytest.mark.parametrize(
    "codec, key, levels",
    [
        (COMPRESSION_GZIP, "compression_gzip_level", (1, 9)),
        (COMPRESSION_LZ4, "compression_lz4_level", (9, 17)),
        (COMPRESSION_ZSTD, "compression_zstd_level", (-50, 19)),
    ],
)
def test_topic_level_is_used(codec: int, key: str, levels: tuple[int, int]) -> None:
    records = [(b"k%d" % i, b"some fairly repetitive text, again and again " * 30, [], NOW)
               for i in range(20)]
    raw = batch(records)
    payloads = []
    for level in levels:
        level_key: dict[str, Any] = {key: level}
        out, _ = run(LogConfig(compression_type=NAMES[codec], **level_key), bytearray(raw))
        assert read(out) == list(enumerate(records))
        payload = bytes(out[RECORD_BATCH_OVERHEAD:])
        assert payload == compress(codec, bytes(raw[RECORD_BATCH_OVERHEAD:]), level) or (
            codec == COMPRESSION_GZIP  # gzip stamps the time into its header
        )
        payloads.append(payload)
    assert len(payloads[0]) != len(payloads[1]), "the level made no difference"


def test_rebuilt_batch_over_max_message_bytes_is_too_large() -> None:
    records = [(b"k", b"z" * 5000, [], NOW)]
    buf = batch(records, COMPRESSION_ZSTD)
    config = LogConfig(compression_type="uncompressed", max_message_bytes=len(buf) + 100)
    err = refusal(config, buf)
    assert isinstance(err, RecordBatchError)
    assert err.error_code == ErrorCode.MESSAGE_TOO_LARGE


# -- inner offsets and counts ----------------------------------------------------------------


def test_compressed_batch_with_gapped_inner_offsets_is_rebuilt_when_walked() -> None:
    """Kafka's compressed path rewrites inner offsets that are not 0..n-1."""
    records = recs(3)
    buf = batch(records, COMPRESSION_GZIP, offsets=[0, 0, 2])
    assert [o for o, _ in read(buf)] == [0, 0, 2]
    out, _ = run(LogConfig(cleanup_policy="compact"), buf)
    assert out is not buf and BatchHeader(out).compression_type == COMPRESSION_GZIP
    assert read(out) == list(enumerate(records))


def test_uncompressed_batch_with_gapped_inner_offsets_is_kept_when_walked() -> None:
    """Kafka's uncompressed in-place path does not look at inner offsets."""
    buf = batch(recs(3), offsets=[0, 0, 2])
    sent = bytes(buf)
    out, _ = run(LogConfig(cleanup_policy="compact"), buf)
    assert bytes(out) == sent


def test_declared_count_beyond_the_records_is_invalid_record() -> None:
    buf = batch(recs(3), COMPRESSION_LZ4)
    struct.pack_into(">i", buf, 23, 3)  # lastOffsetDelta
    struct.pack_into(">i", buf, 57, 4)  # recordCount: one record more than there is
    reset_crc(buf)
    err = refusal(LogConfig(compression_type="gzip"), buf)
    assert err.error_code == ErrorCode.INVALID_RECORD and not err.record_errors


def test_records_beyond_the_declared_count_are_invalid_record() -> None:
    buf = batch(recs(3))
    struct.pack_into(">i", buf, 23, 1)
    struct.pack_into(">i", buf, 57, 2)
    reset_crc(buf)
    err = refusal(LogConfig(cleanup_policy="compact,delete"), buf)
    assert err.error_code == ErrorCode.INVALID_RECORD


# -- compacted topics --------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("policy", ["compact", "delete,compact", "compact,delete"])
def test_compacted_topic_refuses_records_without_key(codec: int, policy: str) -> None:
    records = recs(5)
    records[1] = (None, b"v", [], NOW)
    records[3] = (None, None, [], NOW)
    err = refusal(LogConfig(cleanup_policy=policy), batch(records, codec))
    assert err.error_code == ErrorCode.INVALID_RECORD
    assert [i for i, _ in err.record_errors] == [1, 3]
    assert all("without a key" in (m or "") for _, m in err.record_errors)
    assert "2 record errors" in str(err) and "batchIndex=3" in str(err)


def test_compacted_topic_accepts_empty_keys_and_delete_topic_accepts_none() -> None:
    records = [(b"", b"v" * 100, [], NOW), (b"k", None, [], NOW)]
    out, _ = run(LogConfig(cleanup_policy="compact"), batch(records, COMPRESSION_SNAPPY))
    assert read(out) == list(enumerate(records))
    keyless = batch([(None, b"v", [], NOW)])
    assert run(LogConfig(cleanup_policy="delete"), keyless)[0] is keyless


# -- timestamps ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_LZ4])
def test_timestamp_after_the_bound_is_invalid_timestamp(codec: int) -> None:
    records = recs(4, ts=NOW)
    records[2] = (b"k", b"v", [], NOW + HOUR + 1)
    err = refusal(LogConfig(message_timestamp_after_max_ms=HOUR), batch(records, codec))
    assert err.error_code == ErrorCode.INVALID_TIMESTAMP
    assert [i for i, _ in err.record_errors] == [2]
    assert f"[-inf, {NOW + HOUR}]" in (err.record_errors[0][1] or "")
    # exactly at the bound is allowed
    records[2] = (b"k", b"v", [], NOW + HOUR)
    run(LogConfig(message_timestamp_after_max_ms=HOUR), batch(records, codec))


def test_timestamp_before_the_bound_is_found_below_the_first_record() -> None:
    """The header has the first and the max timestamp, not the min: the records are read."""
    records = recs(4, ts=NOW)
    records[2] = (b"k", b"v", [], NOW - 2 * HOUR)
    err = refusal(LogConfig(message_timestamp_before_max_ms=HOUR), batch(records))
    assert err.error_code == ErrorCode.INVALID_TIMESTAMP
    assert [i for i, _ in err.record_errors] == [2]


def test_records_without_timestamp_and_log_append_time_topics_skip_the_bounds() -> None:
    old = [(b"k", b"v", [], -1), (b"k", b"v", [], NOW - 10 * HOUR)]
    strict: dict[str, Any] = dict(message_timestamp_before_max_ms=HOUR,
                                  message_timestamp_after_max_ms=0)
    err = refusal(LogConfig(**strict), batch(old))
    assert [i for i, _ in err.record_errors] == [1]
    buf = batch(old)
    out, _ = run(LogConfig(message_timestamp_type="LogAppendTime", **strict), buf)
    assert out is buf


def test_key_and_timestamp_errors_together_are_invalid_timestamp() -> None:
    v = b"v" * 100
    records = [(None, v, [], NOW + 2 * HOUR), (b"k", v, [], NOW + 2 * HOUR),
               (None, v, [], NOW), (b"k", v, [], NOW)]
    config = LogConfig(cleanup_policy="compact", message_timestamp_after_max_ms=HOUR)
    err = refusal(config, batch(records, COMPRESSION_ZSTD))
    assert err.error_code == ErrorCode.INVALID_TIMESTAMP
    by_index = dict(err.record_errors)
    assert sorted(by_index) == [0, 1, 2]
    assert "without a key" in (by_index[0] or "")  # the key is judged first
    assert "out of range" in (by_index[1] or "")


def test_true_max_timestamp_replaces_the_header_when_records_are_read() -> None:
    buf = batch(recs(3))
    struct.pack_into(">q", buf, 35, NOW - 5000)  # a max timestamp below the records'
    reset_crc(buf)
    out, info = run(LogConfig(cleanup_policy="compact"), buf)
    assert BatchHeader(out).max_timestamp == info.max_timestamp == NOW - 1000 + 2
    assert BatchHeader(out).is_valid()


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_LZ4])
def test_a_header_without_max_timestamp_gets_the_records_max(codec: int) -> None:
    """Old clients (sarama 1.22) send max timestamp -1 with timestamped records; Kafka stores
    the records' max, so ListOffsets by timestamp finds them."""
    buf = batch(recs(3), codec)
    struct.pack_into(">q", buf, 35, -1)
    reset_crc(buf)
    out, info = run(LogConfig(), buf)
    assert BatchHeader(out).max_timestamp == info.max_timestamp == NOW - 1000 + 2
    assert BatchHeader(out).is_valid()
    assert [r for _o, r in read(out)] == recs(3)


# -- batches the producer marked LogAppendTime ----------------------------------------------


def lat_batch(max_ts: int, n: int = 3) -> bytearray:
    buf = batch(recs(n))
    BatchHeader(buf).set_max_timestamp(LOG_APPEND_TIME, max_ts)
    return buf


def test_producer_log_append_time_on_create_time_topic_becomes_create_time() -> None:
    buf = lat_batch(NOW - 7)
    out, info = run(LogConfig(), buf)
    header = BatchHeader(out)
    assert header.timestamp_type == CREATE_TIME and header.max_timestamp == NOW - 7
    assert header.is_valid() and info.max_timestamp == NOW - 7


@pytest.mark.parametrize(
    "config, max_ts",
    [
        (LogConfig(message_timestamp_type="LogAppendTime"), NOW),
        (LogConfig(), -1),
        (LogConfig(message_timestamp_after_max_ms=HOUR), NOW + 2 * HOUR),
    ],
)
def test_producer_log_append_time_refused(config: LogConfig, max_ts: int) -> None:
    err = refusal(config, lat_batch(max_ts))
    assert err.error_code == ErrorCode.INVALID_TIMESTAMP
    assert [i for i, _ in err.record_errors] == [0, 1, 2]


# -- through Log.append ------------------------------------------------------------------------


def test_log_stores_the_recompressed_batch_and_nothing_of_a_refused_one(tmp_path: Path) -> None:
    config = LogConfig(compression_type="zstd", compression_zstd_level=7, cleanup_policy="compact")
    log = Log(tmp_path / "t-0", config, "t", 0)
    records = recs(6)
    info = log.append(batch(records, COMPRESSION_LZ4, producer=(9, 0, 0)), NOW, leader_epoch=4)
    assert (info.first_offset, info.last_offset, info.num_records) == (0, 5, 6)
    stored = bytes(log.read(0, 1 << 20))
    header = BatchHeader(stored)
    assert header.compression_type == COMPRESSION_ZSTD and header.is_valid()
    assert header.partition_leader_epoch == 4 and info.size == len(stored)
    assert read(stored) == list(enumerate(records))
    # a retry of the same lz4 batch is recognised from the rebuilt batch's producer fields
    retry = log.append(batch(records, COMPRESSION_LZ4, producer=(9, 0, 0)), NOW)
    assert retry.duplicate and retry.first_offset == 0
    keyless = [(None, b"v" * 100, [], NOW)] * 2
    with pytest.raises(KafkaError):
        log.append(batch(keyless, COMPRESSION_LZ4), NOW)
    assert log.log_end_offset == 6 and log.size_in_bytes == len(stored)


def test_log_config_from_topic_configs() -> None:
    config = LogConfig.from_topic_configs({
        "compression.type": "zstd", "compression.zstd.level": "-3",
        "compression.gzip.level": "9", "compression.lz4.level": "1",
        "cleanup.policy": "compact", "message.timestamp.before.max.ms": "10",
        "message.timestamp.after.max.ms": "20", "segment.bytes": "5000",
    })
    assert (config.compression_type, config.compression_zstd_level) == ("zstd", -3)
    assert (config.compression_gzip_level, config.compression_lz4_level) == (9, 1)
    assert config.cleanup_policy == "compact" and config.segment_bytes == 5000
    assert (config.message_timestamp_before_max_ms, config.message_timestamp_after_max_ms) == (
        10, 20)
    defaults = LogConfig()
    assert (defaults.compression_type, defaults.compression_gzip_level) == ("producer", -1)
    assert (defaults.compression_lz4_level, defaults.compression_zstd_level) == (9, 3)
    assert defaults.message_timestamp_before_max_ms == LONG_MAX
    assert defaults.message_timestamp_after_max_ms == LONG_MAX


@pytest.mark.parametrize(
    "configs, ok",
    [
        ({"compression.type": "gzip", "compression.gzip.level": "-1"}, True),
        ({"compression.gzip.level": "9"}, True),
        ({"compression.gzip.level": "0"}, False),
        ({"compression.gzip.level": "-2"}, False),
        ({"compression.lz4.level": "17"}, True),
        ({"compression.lz4.level": "18"}, False),
        ({"compression.zstd.level": "-131072"}, True),
        ({"compression.zstd.level": "23"}, False),
        ({"compression.type": "producer"}, True),
        ({"compression.type": "uncompressed"}, True),
        ({"compression.type": "none"}, False),
        ({"compression.type": "GZIP"}, False),
        ({"cleanup.policy": "delete,compact"}, True),
        ({"cleanup.policy": "compacted"}, False),
        ({"message.timestamp.after.max.ms": "0"}, True),
        ({"message.timestamp.after.max.ms": "-1"}, False),
        ({"message.timestamp.before.max.ms": str(LONG_MAX)}, True),
        ({"message.timestamp.before.max.ms": str(LONG_MAX + 1)}, False),
    ],
)
def test_topic_config_validation(configs: dict[str, str], ok: bool) -> None:
    if ok:
        validate_topic_configs(configs)
        LogConfig.from_topic_configs(configs)
        return
    with pytest.raises(KafkaError) as exc:
        validate_topic_configs(configs)
    assert exc.value.error_code == ErrorCode.INVALID_CONFIG
