"""LogManager: loading dirs, clean-shutdown marker, checkpoints, locking, background loops."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kafka.record.memory_records import MemoryRecordsBuilder

from broker.log import LogConfig, LogManager
from broker.log.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from broker.log.manager import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
)
from protocol.record_batch import iter_batches

T0 = 1_700_000_000_000


def batch(n: int = 2, ts: int = T0) -> bytearray:
    b = MemoryRecordsBuilder(2, 0, batch_size=1 << 24)
    for i in range(n):
        b.append(timestamp=ts + i, key=b"k", value=b"v" * 50)
    b.close()
    return bytearray(b.buffer())


def test_checkpoint_file_format(tmp_path: Path) -> None:
    path = tmp_path / RECOVERY_POINT_CHECKPOINT_FILE
    write_offset_checkpoint(path, {("b-topic", 1): 42, ("a", 0): 7})
    assert path.read_text() == "0\n2\na 0 7\nb-topic 1 42\n"
    assert read_offset_checkpoint(path) == {("a", 0): 7, ("b-topic", 1): 42}
    assert read_offset_checkpoint(tmp_path / "missing") == {}
    path.write_text("0\n3\na 0 7\n")
    with pytest.raises(ValueError):
        read_offset_checkpoint(path)


def test_create_load_shutdown_cycle(tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    mgr = LogManager(dirs, LogConfig())
    assert mgr.load() == {}
    logs = [mgr.create_log("orders", p) for p in range(4)]
    assert mgr.create_log("orders", 0) is logs[0]
    assert {log.dir.parent for log in logs} == set(dirs)  # spread over the dirs
    for i, log in enumerate(logs):
        for _ in range(i + 1):
            log.append(batch(), T0)
    mgr.shutdown()
    for d in dirs:
        assert (d / CLEAN_SHUTDOWN_FILE).exists()
        rp = read_offset_checkpoint(d / RECOVERY_POINT_CHECKPOINT_FILE)
        assert all(v == 2 * (p + 1) for (_t, p), v in rp.items())
        assert set(read_offset_checkpoint(d / LOG_START_OFFSET_CHECKPOINT_FILE).values()) == {0}

    again = LogManager(dirs, LogConfig())
    loaded = again.load()
    assert sorted(loaded) == [("orders", p) for p in range(4)]
    assert [loaded[("orders", p)].log_end_offset for p in range(4)] == [2, 4, 6, 8]
    for d in dirs:
        assert not (d / CLEAN_SHUTDOWN_FILE).exists()  # consumed on load
    again.delete_log(("orders", 3))
    assert again.get_log(("orders", 3)) is None
    assert not any((d / "orders-3").exists() for d in dirs)
    again.shutdown()


def test_log_dir_is_locked(tmp_path: Path) -> None:
    mgr = LogManager([tmp_path], LogConfig())
    mgr.load()
    with pytest.raises(RuntimeError, match="locked"):
        LogManager([tmp_path], LogConfig()).load()
    mgr.shutdown()
    LogManager([tmp_path], LogConfig()).load()


def test_marker_skips_recovery_and_absence_recovers_from_checkpoint(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=len(batch()) * 3)
    mgr = LogManager([tmp_path], cfg)
    mgr.load()
    log = mgr.create_log("t", 0)
    for _ in range(7):
        log.append(batch(), T0)
    mgr.flush_all()  # recovery point 14 checkpointed
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT_FILE) == {("t", 0): 14}
    log.append(batch(), T0)  # offsets 14-15: never flushed
    # "crash": no shutdown. Damage a flushed segment and the unflushed tail.
    files = sorted((tmp_path / "t-0").glob("*.log"))
    first, last = files[0], files[-1]
    data = bytearray(first.read_bytes())
    data[80] ^= 1
    first.write_bytes(data)
    tail = last.read_bytes()
    last.write_bytes(tail[:-3])
    for fd in mgr._lock_fds:  # a dead broker's locks die with its process
        os.close(fd)
    mgr2 = LogManager([tmp_path], cfg)
    log2 = mgr2.load()[("t", 0)]
    # the torn batch is gone; the damaged flushed segment was trusted, not truncated
    assert log2.log_end_offset == 14
    assert first.stat().st_size == len(data)
    assert log2.recovery_point == 14
    mgr2.shutdown()


def test_clean_marker_means_no_recovery(tmp_path: Path) -> None:
    mgr = LogManager([tmp_path], LogConfig())
    mgr.load()
    log = mgr.create_log("t", 0)
    for _ in range(3):
        log.append(batch(), T0)
    mgr.shutdown()
    f = tmp_path / "t-0" / f"{0:020d}.log"
    data = bytearray(f.read_bytes())
    second = [p for p, _h in iter_batches(bytes(data))][1]
    data[second + 70] ^= 1  # bad CRC in the middle: only recovery would notice
    f.write_bytes(data)
    log = LogManager([tmp_path], LogConfig()).load()[("t", 0)]
    assert log.log_end_offset == 6
    log.close()


def _idempotent_batch(pid: int, seq: int, n: int = 2) -> bytearray:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=pid,
        producer_epoch=0, base_sequence=seq, batch_size=1 << 20,
    )
    for i in range(n):
        b.append(i, timestamp=T0 + i, key=b"k", value=b"v" * 50, headers=[])
    return bytearray(b.build())


def test_producer_state_after_clean_shutdown_and_after_crash(tmp_path: Path) -> None:
    """A clean restart reads each partition's snapshot and scans nothing; after a crash the
    state is rebuilt from batch headers; either way a retried batch is a duplicate."""
    cfg = LogConfig(segment_bytes=1024)
    mgr = LogManager([tmp_path], cfg)
    mgr.load()
    for p in range(3):
        log = mgr.create_log("idem", p)
        for i in range(10):
            log.append(_idempotent_batch(100 + p, 2 * i), T0)
    mgr.shutdown()

    mgr = LogManager([tmp_path], cfg)
    logs = mgr.load()
    for p in range(3):
        ps = logs[("idem", p)].producer_state
        assert ps.scanned_batches == 0 and ps.loaded_from == 20
        assert ps.last_entry(100 + p).last_seq == 19  # type: ignore[union-attr]
        logs[("idem", p)].append(_idempotent_batch(100 + p, 20), T0)  # offsets 20-21
    for fd in mgr._lock_fds:  # crash: no shutdown, no snapshot at the end
        os.close(fd)

    logs = LogManager([tmp_path], cfg).load()
    for p in range(3):
        log = logs[("idem", p)]
        assert log.log_end_offset == 22
        assert log.producer_state.scanned_batches > 0
        info = log.append(_idempotent_batch(100 + p, 20), T0)
        assert info.duplicate and (info.first_offset, info.last_offset) == (20, 21)
        assert log.log_end_offset == 22
