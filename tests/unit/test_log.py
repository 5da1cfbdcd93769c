"""Log: append/read across segments, index use, rolling, retention, read limits, ListOffsets.

Batches are built by kafka-python, as a producer would send them, and read back with
kafka-python's reader, as a consumer would.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from broker.log import Log, LogConfig, OffsetOutOfRangeError, RecordBatchTooLargeError
from protocol.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    BatchHeader,
    CorruptRecordError,
    InvalidRecordError,
    RecordTooLargeError,
    iter_batches,
)

T0 = 1_700_000_000_000


def batch(
    n: int = 3, ts: int = T0, codec: int = COMPRESSION_NONE, tag: str = "", size: int = 40
) -> bytearray:
    b = MemoryRecordsBuilder(2, codec, batch_size=1 << 24)
    for i in range(n):
        b.append(
            timestamp=ts + i,
            key=f"{tag}k{i}".encode(),
            value=(f"{tag}v{i}-".encode()) * size,
            headers=[("h", tag.encode())],
        )
    b.close()
    return bytearray(b.buffer())


def decode(data: bytes | memoryview) -> list[tuple[int, int, bytes]]:
    out = []
    records = MemoryRecords(bytes(data))
    while records.has_next():
        for r in records.next_batch():
            out.append((r.offset, r.timestamp, r.key))
    return out


def read_all(log: Log, start: int | None = None) -> list[tuple[int, int, bytes]]:
    out: list[tuple[int, int, bytes]] = []
    offset = log.log_start_offset if start is None else start
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20, None, True)
        recs = [r for r in decode(data) if r[0] >= offset]
        assert recs, f"no progress at {offset}"
        out += recs
        offset = recs[-1][0] + 1
    return out


@pytest.fixture
def cfg() -> LogConfig:
    return LogConfig(segment_bytes=4096, index_interval_bytes=512)


def new_log(tmp_path: Path, cfg: LogConfig) -> Log:
    return Log(tmp_path / "topic-0", cfg, "topic", 0)


def test_defaults_are_kafkas() -> None:
    c = LogConfig()
    assert c.segment_bytes == 1 << 30
    assert c.roll_ms == c.retention_ms == 604_800_000
    assert c.retention_bytes == -1
    assert c.flush_interval_messages == c.flush_interval_ms == 2**63 - 1
    assert c.index_interval_bytes == 4096
    assert c.message_timestamp_type == "CreateTime"
    assert c.max_message_bytes == 1048588
    with pytest.raises(ValueError):
        LogConfig(message_timestamp_type="Whenever")


def test_append_read_round_trip_across_rolls(tmp_path: Path, cfg: LogConfig) -> None:
    log = new_log(tmp_path, cfg)
    assert (log.log_start_offset, log.log_end_offset, log.num_segments) == (0, 0, 1)
    expected = []
    stored = bytearray()
    codecs = [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_SNAPPY, COMPRESSION_LZ4]
    codecs.append(COMPRESSION_ZSTD)
    for i in range(60):
        b = batch(3, T0 + 10 * i, codecs[i % 5], tag=str(i))
        info = log.append(b, T0 + 10 * i)
        assert (info.first_offset, info.last_offset) == (3 * i, 3 * i + 2)
        assert info.num_records == 3 and info.size == len(b)
        assert info.log_append_time == -1
        assert info.max_timestamp == T0 + 10 * i + 2
        stored += b  # assign_offsets rewrote b in place: these are the stored bytes
        expected += [(3 * i + j, T0 + 10 * i + j, f"{i}k{j}".encode()) for j in range(3)]
    assert log.log_end_offset == 180
    assert log.num_segments > 3
    assert read_all(log) == expected
    # .log files, named by base offset, concatenate to exactly the stored batches
    names = sorted(p.name for p in (tmp_path / "topic-0").iterdir())
    logs = [n for n in names if n.endswith(".log")]
    assert logs[0] == "00000000000000000000.log"
    assert {n[:20] + ".index" for n in logs} <= set(names)
    assert {n[:20] + ".timeindex" for n in logs} <= set(names)
    on_disk = b"".join((tmp_path / "topic-0" / n).read_bytes() for n in logs)
    assert on_disk == bytes(stored)
    for seg in log.segments:
        first = BatchHeader(seg.read_bytes(0, 61))
        assert first.base_offset == seg.base_offset
        assert seg.size <= cfg.segment_bytes
    log.close()


def test_every_read_offset_lands_in_the_right_batch(tmp_path: Path, cfg: LogConfig) -> None:
    log = new_log(tmp_path, cfg)
    for i in range(40):
        log.append(batch(1 + i % 4, T0 + i), T0)
    for offset in range(log.log_end_offset):
        data = log.read(offset, 1, None, True)  # exactly one batch
        headers = [h for _p, h in iter_batches(data)]
        assert len(headers) == 1
        assert headers[0].base_offset <= offset <= headers[0].last_offset
    log.close()


def test_offset_index_entries_point_at_batch_starts(tmp_path: Path, cfg: LogConfig) -> None:
    log = new_log(tmp_path, cfg)
    for i in range(60):
        log.append(batch(2, T0 + i), T0)
    checked = 0
    for seg in log.segments:
        for n in range(seg.offset_index.entries):
            offset, pos = seg.offset_index.entry(n)
            h = BatchHeader(seg.read_bytes(pos, 61))
            assert h.last_offset == offset  # Kafka indexes the batch's last offset
            checked += 1
        if seg is not log.active_segment:  # the final entry is written on roll and close
            assert seg.time_index.last_entry()[0] == seg.max_timestamp_so_far
    assert checked > 0
    log.close()


def test_roll_on_size(tmp_path: Path) -> None:
    one = len(batch(3))
    log = new_log(tmp_path, LogConfig(segment_bytes=3 * one))
    for i in range(7):
        log.append(batch(3, T0 + i), T0)
    assert [s.base_offset for s in log.segments] == [0, 9, 18]
    assert [s.size for s in log.segments] == [3 * one, 3 * one, one]
    log.close()


def test_batch_bigger_than_segment_refused(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(segment_bytes=1000))
    with pytest.raises(RecordBatchTooLargeError) as ei:
        log.append(batch(10), T0)
    assert ei.value.error_code == 18
    assert log.log_end_offset == 0 and log.size_in_bytes == 0
    log.close()


def test_roll_on_age_uses_record_timestamps(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(roll_ms=1000))
    log.append(batch(1, T0), T0)
    log.append(batch(1, T0 + 900), T0 + 900)
    assert log.num_segments == 1
    log.append(batch(1, T0 + 1001), T0 + 1001)
    assert log.num_segments == 2 and log.active_segment.base_offset == 2
    log.roll()  # explicit roll
    assert log.num_segments == 3
    log.roll()  # active segment empty: nothing to roll
    assert log.num_segments == 3
    log.close()


def test_retention_by_time_advances_log_start(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(retention_ms=10_000))
    for i in range(3):
        log.append(batch(2, T0 + i * 5_000), T0)
        log.roll()
    log.append(batch(2, T0 + 100_000), T0)
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6]
    # now - largest timestamp > 10 s: segments 0 (T0+1) and 2 (T0+5001)
    assert log.delete_old_segments(T0 + 15_002) == 2
    assert log.log_start_offset == 4
    assert [s.base_offset for s in log.segments] == [4, 6]
    assert not (tmp_path / "topic-0" / "00000000000000000000.log").exists()
    with pytest.raises(OffsetOutOfRangeError) as ei:
        log.read(3, 1000)
    assert ei.value.error_code == 1
    assert [r[0] for r in read_all(log)] == [4, 5, 6, 7]
    # everything expired, active included: roll a fresh empty segment, delete all the rest
    assert log.delete_old_segments(T0 + 10**9) == 2
    assert (log.log_start_offset, log.log_end_offset) == (8, 8)
    assert [s.base_offset for s in log.segments] == [8]
    assert log.read(8, 1000) == b""
    log.append(batch(1, T0 + 10**9), T0 + 10**9)
    assert read_all(log) == [(8, T0 + 10**9, b"k0")]
    log.close()


def test_retention_respects_high_watermark(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(retention_ms=1))
    log.append(batch(2, T0), T0)
    log.roll()
    log.append(batch(2, T0), T0)
    assert log.delete_old_segments(T0 + 10**6, high_watermark=1) == 0
    assert log.delete_old_segments(T0 + 10**6, high_watermark=2) == 1
    assert log.log_start_offset == 2
    log.close()


def test_retention_by_size(tmp_path: Path) -> None:
    one = len(batch(2))
    log = new_log(tmp_path, LogConfig(segment_bytes=2 * one, retention_bytes=3 * one))
    for i in range(7):
        log.append(batch(2, T0 + i), T0)
    assert [s.size for s in log.segments] == [2 * one, 2 * one, 2 * one, one]
    # 7 batches, keep at most 3: dropping whole segments, oldest first, while still over
    assert log.delete_old_segments(T0) == 2
    assert log.size_in_bytes == 3 * one
    assert log.log_start_offset == 8
    assert log.delete_old_segments(T0) == 0
    log.close()


def test_unlimited_retention(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(retention_ms=-1, retention_bytes=-1))
    log.append(batch(1, 0), 0)
    log.roll()
    assert log.delete_old_segments(T0 * 10) == 0
    log.close()


def test_read_limits(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig())
    sizes = []
    for i in range(5):
        b = batch(2, T0 + i, size=10 * (i + 1))
        sizes.append(len(b))
        log.append(b, T0)
    # max_bytes cuts at a whole batch
    data = log.read(0, sizes[0] + sizes[1] + 5)
    assert len(data) == sizes[0] + sizes[1]
    # first batch larger than max_bytes: KIP-74 returns it whole, else nothing
    assert len(log.read(2, 10, None, True)) == sizes[1]
    assert log.read(2, 10, None, False) == b""
    assert len(log.read(2, 0, None, True)) == sizes[1]
    # fetch offset inside a batch: the whole batch containing it
    assert [r[0] for r in decode(log.read(3, 1 << 20))][0] == 2
    # max_offset (high watermark) is exclusive and never split a batch
    assert [r[0] for r in decode(log.read(0, 1 << 20, 6))] == [0, 1, 2, 3, 4, 5]
    assert [r[0] for r in decode(log.read(0, 1 << 20, 5))] == [0, 1, 2, 3]
    assert [r[0] for r in decode(log.read(0, 1 << 20, 5, True))] == [0, 1, 2, 3]
    assert log.read(6, 1 << 20, 6, True) == b""
    assert log.read(4, 1 << 20, 5, True) == b""  # batch 4-5 reaches past the bound
    # end of log and out of range
    assert log.read(10, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(11, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    log.close()


def test_read_stays_in_one_segment(tmp_path: Path) -> None:
    one = len(batch(1))
    log = new_log(tmp_path, LogConfig(segment_bytes=2 * one))
    for i in range(6):
        log.append(batch(1, T0 + i), T0)
    assert [r[0] for r in decode(log.read(1, 1 << 20))] == [1]
    assert [r[0] for r in decode(log.read(2, 1 << 20))] == [2, 3]
    log.close()


def test_log_append_time(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(message_timestamp_type="LogAppendTime"))
    now = T0 + 123_456
    info = log.append(batch(3, T0, COMPRESSION_GZIP), now)
    assert info.log_append_time == now and info.max_timestamp == now
    data = log.read(0, 1 << 20)
    h = BatchHeader(data)
    assert h.timestamp_type == 1 and h.is_valid() and h.max_timestamp == now
    assert decode(data) == [(0, now, b"k0"), (1, now, b"k1"), (2, now, b"k2")]
    assert log.offset_for_timestamp(now) == (0, now)
    assert log.max_timestamp_offset() == (0, now)
    log.close()


def test_leader_epoch_is_stamped(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig())
    log.append(batch(1), T0, leader_epoch=7)
    assert BatchHeader(log.read(0, 1000)).partition_leader_epoch == 7
    log.close()


def test_bad_input_leaves_log_untouched(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(max_message_bytes=2000))
    log.append(batch(2), T0)
    size, leo = log.size_in_bytes, log.log_end_offset
    bad = batch(2)
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append(bad, T0)
    with pytest.raises(RecordTooLargeError):
        log.append(batch(50), T0)
    with pytest.raises(InvalidRecordError):
        log.append(batch(1) + batch(1), T0)  # one batch per partition, as Kafka
    old = MemoryRecordsBuilder(1, 0, batch_size=1 << 20)
    old.append(timestamp=T0, key=b"k", value=b"v")
    old.close()
    with pytest.raises(InvalidRecordError) as ei:
        log.append(bytearray(old.buffer()), T0)
    assert ei.value.error_code == 87
    assert (log.size_in_bytes, log.log_end_offset) == (size, leo)
    assert [r[0] for r in read_all(log)] == [0, 1]
    log.close()


def test_offset_for_timestamp_record_level(tmp_path: Path, cfg: LogConfig) -> None:
    log = new_log(tmp_path, cfg)
    # batch i holds timestamps T0+100*i .. T0+100*i+3 at offsets 4i .. 4i+3
    for i in range(40):
        log.append(batch(4, T0 + 100 * i, [COMPRESSION_NONE, COMPRESSION_LZ4][i % 2]), T0)
    assert log.num_segments > 1
    assert log.offset_for_timestamp(0) == (0, T0)
    assert log.offset_for_timestamp(T0 + 1) == (1, T0 + 1)
    assert log.offset_for_timestamp(T0 + 100 * 17 + 2) == (4 * 17 + 2, T0 + 1702)
    assert log.offset_for_timestamp(T0 + 100 * 17 + 50) == (4 * 18, T0 + 1800)
    assert log.offset_for_timestamp(T0 + 100 * 39 + 3) == (159, T0 + 3903)
    assert log.offset_for_timestamp(T0 + 100 * 39 + 4) is None
    assert log.max_timestamp_offset() == (159, T0 + 3903)
    log.close()


def test_max_timestamp_out_of_order(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig())
    assert log.max_timestamp_offset() == (-1, -1)
    assert log.offset_for_timestamp(T0) is None
    log.append(batch(2, T0 + 50), T0)
    log.append(batch(3, T0 + 500), T0)  # max T0+502 at offset 4
    log.append(batch(2, T0 + 10), T0)
    assert log.max_timestamp_offset() == (4, T0 + 502)
    assert log.offset_for_timestamp(T0 + 20) == (0, T0 + 50)
    log.close()


def test_flush_and_recovery_point(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(flush_interval_messages=5, segment_bytes=2000))
    assert log.recovery_point == 0 and log.unflushed_messages == 0
    log.append(batch(3), T0)
    assert log.unflushed_messages == 3 and not log.flush_due(T0)
    log.append(batch(3), T0)
    assert log.flush_due(T0)
    log.flush()
    assert log.recovery_point == 6 and log.unflushed_messages == 0
    assert not log.flush_due(T0)
    log.close()


def test_flush_from_a_thread_while_appending(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(segment_bytes=3000, retention_bytes=20_000))
    stop = threading.Event()
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                log.flush()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(300):
            log.append(batch(2, T0 + i), T0 + i)
            if i % 50 == 0:
                log.delete_old_segments(T0 + i)
    finally:
        stop.set()
        t.join()
    assert not errors
    log.flush()
    assert log.recovery_point == log.log_end_offset == 600
    log.close()


def test_reopen_clean_keeps_state(tmp_path: Path, cfg: LogConfig) -> None:
    log = new_log(tmp_path, cfg)
    for i in range(30):
        log.append(batch(2, T0 + i), T0)
    before = read_all(log)
    segs = [(s.base_offset, s.size, s.max_timestamp_so_far) for s in log.segments]
    log.close()
    again = Log(tmp_path / "topic-0", cfg, "topic", 0)
    assert again.log_end_offset == 60 and again.recovery_point == 60
    assert [(s.base_offset, s.size, s.max_timestamp_so_far) for s in again.segments] == segs
    assert read_all(again) == before
    again.append(batch(1, T0 + 99), T0)
    assert again.log_end_offset == 61
    again.close()


def test_delete_removes_directory(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig())
    log.append(batch(1), T0)
    log.delete()
    assert not (tmp_path / "topic-0").exists()


def test_leftover_files_are_cleaned_on_load(tmp_path: Path) -> None:
    d = tmp_path / "topic-0"
    log = Log(d, LogConfig(), "topic", 0)
    log.append(batch(1), T0)
    log.close()
    (d / "00000000000000000000.log.deleted").write_bytes(b"x")
    (d / "00000000000000000099.index").write_bytes(b"")  # index without a log
    Log(d, LogConfig(), "topic", 0).close()
    assert sorted(os.listdir(d)) == [
        "00000000000000000000.index",
        "00000000000000000000.log",
        "00000000000000000000.timeindex",
        "00000000000000000001.snapshot",  # producer state at the log end offset (close)
        "leader-epoch-checkpoint",  # epoch 0 from offset 0, written by the close's flush
    ]
