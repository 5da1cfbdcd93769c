"""Idempotent producer state: duplicates, gaps, epochs, wrap-around, rebuild, snapshots, retention.

Batches are built by kafka-python exactly as an idempotent producer sends them (producer id,
epoch, base sequence in the v2 header) and appended through ``Log.append``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.log import Log, LogConfig
from broker.log.producer_state import (
    INT32_MAX,
    BatchMetadata,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    ProducerStateManager,
    in_sequence,
    increment_sequence,
    read_snapshot,
    snapshot_file_name,
    write_snapshot,
)
from protocol.errors import ErrorCode
from protocol.record_batch import iter_batches
from tests.support.log_batches import T0, new_log, plain, producer_batch


def pbatch(
    pid: int, epoch: int, seq: int, n: int = 3, ts: int = T0, size: int = 20
) -> bytearray:
    return producer_batch(pid, epoch, seq, n, ts=ts, size=size)


def log_bytes(log: Log) -> list[bytes]:
    return [s.read_bytes(0, s.size) for s in log.segments]


def snapshot_files(log: Log) -> list[str]:
    return sorted(n for n in os.listdir(log.dir) if n.endswith(".snapshot"))


# -- sequence arithmetic -----------------------------------------------------------------------
def test_sequence_wraps_after_int32_max() -> None:
    assert increment_sequence(5, 2) == 7
    assert increment_sequence(INT32_MAX - 1, 1) == INT32_MAX
    assert increment_sequence(INT32_MAX - 1, 2) == 0
    assert increment_sequence(INT32_MAX, 3) == 2
    assert in_sequence(4, 5) and not in_sequence(4, 6) and not in_sequence(4, 4)
    assert in_sequence(INT32_MAX, 0) and not in_sequence(INT32_MAX, 1)


# -- the append path ----------------------------------------------------------------------------
def test_duplicate_is_answered_with_original_offsets_and_not_appended(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(plain(2), T0)  # offsets 0-1, no producer
    a = log.append(pbatch(7, 0, 0, 3), T0)
    b = log.append(pbatch(7, 0, 3, 4), T0)
    assert (a.first_offset, a.last_offset, b.first_offset, b.last_offset) == (2, 4, 5, 8)
    assert not a.duplicate and not b.duplicate
    before = log_bytes(log)

    for retry, want in ((pbatch(7, 0, 0, 3), (2, 4)), (pbatch(7, 0, 3, 4), (5, 8))):
        info = log.append(retry, T0 + 5)
        assert info.duplicate
        assert (info.first_offset, info.last_offset) == want
        assert info.size == 0 and info.num_records == 0 and info.log_append_time == -1
    assert log.log_end_offset == 9
    assert log_bytes(log) == before
    nxt = log.append(pbatch(7, 0, 7, 1), T0)
    assert (nxt.first_offset, nxt.duplicate) == (9, False)


def test_only_the_last_five_batches_are_remembered(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    for i in range(6):
        log.append(pbatch(1, 0, 2 * i, 2), T0)
    entry = log.producer_state.last_entry(1)
    assert entry is not None and [b.first_seq for b in entry.batches] == [2, 4, 6, 8, 10]
    assert log.append(pbatch(1, 0, 2, 2), T0).first_offset == 2  # oldest retained: duplicate
    with pytest.raises(OutOfOrderSequenceError):
        log.append(pbatch(1, 0, 0, 2), T0)  # forgotten: just out of order now
    # same first sequence, different last: not a duplicate
    with pytest.raises(OutOfOrderSequenceError):
        log.append(pbatch(1, 0, 10, 1), T0)


def test_log_append_time_duplicate_carries_the_original_time(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(message_timestamp_type="LogAppendTime"))
    first = log.append(pbatch(3, 0, 0), T0 + 1000)
    again = log.append(pbatch(3, 0, 0), T0 + 2000)
    assert again.duplicate and again.log_append_time == first.log_append_time == T0 + 1000


def test_gap_is_out_of_order_and_leaves_the_log_untouched(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(pbatch(2, 0, 0, 3), T0)
    before = log_bytes(log)
    with pytest.raises(OutOfOrderSequenceError) as exc:
        log.append(pbatch(2, 0, 4, 1), T0)  # 3 missing
    assert exc.value.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER == 45
    with pytest.raises(OutOfOrderSequenceError):
        log.append(pbatch(2, 0, 1, 3), T0)  # overlaps, not a retained range
    assert log.log_end_offset == 3 and log_bytes(log) == before
    assert log.append(pbatch(2, 0, 3, 1), T0).first_offset == 3


def test_stale_epoch_is_fenced(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(pbatch(4, 5, 0, 2), T0)
    before = log_bytes(log)
    with pytest.raises(InvalidProducerEpochError) as exc:
        log.append(pbatch(4, 4, 2, 2), T0)
    assert exc.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH == 47
    with pytest.raises(InvalidProducerEpochError):
        log.append(pbatch(4, 4, 0, 2), T0)  # even a "duplicate" of another epoch
    assert log.log_end_offset == 2 and log_bytes(log) == before


def test_epoch_bump_restarts_at_sequence_zero(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(pbatch(5, 0, 0, 10), T0)
    with pytest.raises(OutOfOrderSequenceError):
        log.append(pbatch(5, 1, 10, 1), T0)  # a new epoch must start at 0
    bumped = log.append(pbatch(5, 1, 0, 2), T0)
    assert bumped.first_offset == 10 and not bumped.duplicate
    entry = log.producer_state.last_entry(5)
    assert entry is not None and entry.producer_epoch == 1 and len(entry.batches) == 1
    with pytest.raises(InvalidProducerEpochError):
        log.append(pbatch(5, 0, 0, 10), T0)  # the old epoch's retry is fenced, not a duplicate
    assert log.append(pbatch(5, 1, 2, 1), T0).first_offset == 12


def test_unknown_producer_may_start_anywhere(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    assert log.append(pbatch(9, 3, 1234, 2), T0).first_offset == 0
    assert log.append(pbatch(10, 0, 77, 1), T0).first_offset == 2
    assert log.append(pbatch(9, 3, 1236, 1), T0).first_offset == 3
    with pytest.raises(OutOfOrderSequenceError):
        log.append(pbatch(10, 0, 79, 1), T0)  # known now: 78 must come next
    assert log.producer_state.producer_id_count == 2


def test_sequence_wrap_around(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(pbatch(6, 0, INT32_MAX - 2, 3), T0)  # ends exactly at Int32.MAX
    log.append(pbatch(6, 0, 0, 2), T0)  # wraps to 0
    log.append(pbatch(6, 0, 2, 3), T0)
    entry = log.producer_state.last_entry(6)
    assert entry is not None and entry.last_seq == 4

    log2 = Log(tmp_path / "topic-1", LogConfig(), "topic", 1)
    log2.append(pbatch(6, 0, INT32_MAX - 1, 3), T0)  # MAX-1, MAX, 0: wraps inside the batch
    e2 = log2.producer_state.last_entry(6)
    assert e2 is not None and (e2.batches[-1].first_seq, e2.last_seq) == (INT32_MAX - 1, 0)
    assert log2.append(pbatch(6, 0, INT32_MAX - 1, 3), T0).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        log2.append(pbatch(6, 0, 0, 1), T0)
    assert log2.append(pbatch(6, 0, 1, 1), T0).first_offset == 3


def test_batches_without_producer_id_are_not_tracked(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    for _ in range(3):
        log.append(plain(2), T0)
    assert log.log_end_offset == 6 and log.producer_state.producer_id_count == 0
    assert log.producer_state.map_end_offset == 6


def test_check_follows_earlier_batches_of_the_same_append() -> None:
    """Kafka judges a second batch of the same producer in one append against the first."""
    ps = ProducerStateManager(Path("/nonexistent"))
    ps.update(1, 0, BatchMetadata(0, 4, 0, 4, T0))
    assert ps.check(1, 0, 5, 6) is None
    assert ps.check(1, 0, 7, 7, pending=(0, 6)) is None
    with pytest.raises(OutOfOrderSequenceError):
        ps.check(1, 0, 5, 6, pending=(0, 6))
    with pytest.raises(OutOfOrderSequenceError):
        ps.check(2, 1, 3, 3, pending=(0, 9))  # new epoch after a pending batch: must be 0
    with pytest.raises(InvalidProducerEpochError):
        ps.check(2, 0, 10, 10, pending=(1, 0))
    assert ps.check(2, 0, 50, 50, pending=(0, 9)) is None  # unknown producer: any sequence


# -- rebuilding -------------------------------------------------------------------------------
def _fill(log: Log, producers: dict[int, int], rounds: int) -> list[tuple[int, int, int]]:
    """Append ``rounds`` batches per producer; returns (pid, first seq, first offset)."""
    seqs = dict.fromkeys(producers, 0)
    sent = []
    for _ in range(rounds):
        for pid, epoch in producers.items():
            info = log.append(pbatch(pid, epoch, seqs[pid], 2), T0)
            sent.append((pid, seqs[pid], info.first_offset))
            seqs[pid] += 2
        log.append(plain(1), T0)
    return sent


def _state(log: Log) -> dict[int, tuple[int, list[BatchMetadata]]]:
    return {
        pid: (e.producer_epoch, list(e.batches)) for pid, e in log.producer_state.producers.items()
    }


def test_rebuild_from_the_log_after_a_crash_without_snapshots(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=1024, index_interval_bytes=128)
    log = new_log(tmp_path, cfg)
    sent = _fill(log, {11: 0, 12: 3}, 12)
    assert log.num_segments > 3
    want = _state(log)
    end = log.log_end_offset
    for name in snapshot_files(log):
        os.unlink(log.dir / name)
    # crash: nothing closed, no snapshot, recovery point never checkpointed
    again = Log.load(log.dir, cfg, "topic", 0, clean_shutdown=False, recovery_point=0)
    assert again.log_end_offset == end
    assert again.producer_state.loaded_from == 0
    assert again.producer_state.scanned_batches == 36  # every batch header, once
    assert _state(again) == want
    pid, seq, offset = sent[-2]  # the last batch of producer 11: still a duplicate
    info = again.append(pbatch(pid, 0, seq, 2), T0)
    assert info.duplicate and info.first_offset == offset
    assert again.log_end_offset == end
    # a snapshot at the end was written, so the next start needs no scan
    assert snapshot_file_name(end) in snapshot_files(again)


def test_crash_loads_the_newest_snapshot_at_or_below_the_recovery_point(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=1024, index_interval_bytes=128)
    log = new_log(tmp_path, cfg)
    _fill(log, {21: 0}, 6)
    log.flush()
    recovery_point = log.recovery_point
    snaps = log.producer_snapshot_offsets()
    assert snaps and snaps[-1] <= recovery_point
    more = [log.append(pbatch(21, 0, 12 + 2 * i, 2), T0) for i in range(8)]
    assert more[-1].last_offset + 1 == log.log_end_offset
    want = _state(log)
    later = [s for s in log.producer_snapshot_offsets() if s > recovery_point]
    assert later, "expected rolls after the flush"
    floor = max(s for s in log.producer_snapshot_offsets() if s <= recovery_point)
    again = Log.load(
        log.dir, cfg, "topic", 0, clean_shutdown=False, recovery_point=recovery_point
    )
    assert again.producer_state.loaded_from == floor
    assert 0 < again.producer_state.scanned_batches < 14
    assert _state(again) == want


def test_clean_shutdown_loads_the_snapshot_and_scans_nothing(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=1024, index_interval_bytes=128)
    log = new_log(tmp_path, cfg)
    sent = _fill(log, {31: 0, 32: 1, 33: 2}, 8)
    want = _state(log)
    end = log.log_end_offset
    log.close()
    assert snapshot_file_name(end) in snapshot_files(log)
    again = Log.load(log.dir, cfg, "topic", 0, clean_shutdown=True)
    assert again.producer_state.scanned_batches == 0
    assert again.producer_state.loaded_from == end
    assert _state(again) == want
    for pid, seq, offset in sent[-3:]:
        info = again.append(pbatch(pid, pid - 31, seq, 2), T0)
        assert info.duplicate and info.first_offset == offset
    again.close()
    assert snapshot_files(again) == snapshot_files(log)  # nothing new to snapshot


def test_snapshot_keeps_all_five_batches(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    for i in range(7):
        log.append(pbatch(41, 2, 3 * i, 3, ts=T0 + 10 * i), T0)
    log.close()
    entries = read_snapshot(log.dir / snapshot_file_name(21), 21)
    assert len(entries) == 1 and entries[0].producer_epoch == 2
    assert [b.first_seq for b in entries[0].batches] == [6, 9, 12, 15, 18]
    assert entries[0].batches[-1] == BatchMetadata(18, 20, 18, 20, T0 + 60 + 2)
    again = Log.load(log.dir, LogConfig(), "topic", 0, clean_shutdown=True)
    assert again.append(pbatch(41, 2, 6, 3), T0).first_offset == 6  # oldest of the five


def test_corrupt_snapshot_falls_back_to_the_log(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    for i in range(4):
        log.append(pbatch(51, 0, 2 * i, 2), T0)
    want = _state(log)
    log.close()
    path = log.dir / snapshot_file_name(8)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    again = Log.load(log.dir, LogConfig(), "topic", 0, clean_shutdown=True)
    assert again.producer_state.scanned_batches == 4 and again.producer_state.loaded_from == 0
    assert _state(again) == want
    assert read_snapshot(path, 8)  # rewritten whole after the scan


def test_snapshots_beyond_the_log_end_are_deleted(tmp_path: Path) -> None:
    """After a crash truncated the log, a snapshot of lost data must not be used."""
    log = new_log(tmp_path)
    log.append(pbatch(61, 0, 0, 2), T0)
    log.close()
    stale = log.dir / snapshot_file_name(500)
    write_snapshot(stale, 500, [], sync=False)  # whole and valid, of data the log lacks
    again = Log.load(log.dir, LogConfig(), "topic", 0, clean_shutdown=False, recovery_point=600)
    assert not stale.exists()
    assert again.producer_state.loaded_from == 2 and 61 in again.producer_state.producers


# -- retention --------------------------------------------------------------------------------
def test_retention_removes_producers_whose_last_batch_is_gone(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=700, index_interval_bytes=128, retention_bytes=1400)
    log = new_log(tmp_path, cfg)
    log.append(pbatch(71, 0, 0, 2), T0)  # producer 71 writes once, at the start
    seq = 0
    for _ in range(30):
        log.append(pbatch(72, 0, seq, 2), T0)  # producer 72 keeps writing
        seq += 2
    assert log.num_segments > 3
    assert set(log.producer_state.producers) == {71, 72}
    assert log.delete_old_segments(T0) > 0
    lso = log.log_start_offset
    assert lso > 1
    assert set(log.producer_state.producers) == {72}
    assert all(s >= lso for s in log.producer_snapshot_offsets())
    assert all(int(n[:20]) >= lso for n in snapshot_files(log))
    # 72 is still checked; 71 is unknown again, so any sequence is accepted
    with pytest.raises(OutOfOrderSequenceError):
        log.append(pbatch(72, 0, seq + 1, 1), T0)
    assert not log.append(pbatch(71, 0, 40, 1), T0).duplicate
    # the same holds after a crash: state is rebuilt only from what the log still holds
    end = log.log_end_offset
    again = Log.load(
        log.dir, cfg, "topic", 0, clean_shutdown=False, recovery_point=0, log_start_offset=lso
    )
    assert again.log_end_offset == end
    assert set(again.producer_state.producers) == {71, 72}
    assert again.producer_state.last_entry(71).last_seq == 40  # type: ignore[union-attr]


def test_old_snapshots_are_deleted_keeping_the_last_two(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=600, index_interval_bytes=128)
    log = new_log(tmp_path, cfg)
    for i in range(20):
        log.append(pbatch(81, 0, 2 * i, 2), T0)
    # no flush yet: every snapshot is above the recovery point, each may still be needed
    assert log.recovery_point == 0
    assert len(log.producer_snapshot_offsets()) == log.num_segments - 1 > 3
    log.flush()
    for i in range(20, 30):
        log.append(pbatch(81, 0, 2 * i, 2), T0)
    snaps = log.producer_snapshot_offsets()
    floor = max(s for s in snaps if s <= log.recovery_point)
    assert snaps[0] == min(floor, snaps[-2])
    log.flush()
    log.roll(T0)
    snaps = log.producer_snapshot_offsets()
    assert len(snaps) == 2
    assert [int(n[:20]) for n in snapshot_files(log)] == snaps


def test_rolled_snapshot_is_fsynced_by_the_next_flush(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=600, index_interval_bytes=128)
    log = new_log(tmp_path, cfg)
    for i in range(8):
        log.append(pbatch(91, 0, 2 * i, 2), T0)
    assert log._unsynced_snapshots
    log.flush()
    assert not log._unsynced_snapshots


def test_headers_only(tmp_path: Path) -> None:
    """The rebuild walks batch headers: a log of big compressed batches scans as many batches."""
    log = new_log(tmp_path)
    for i in range(3):
        log.append(pbatch(99, 0, 50 * i, 50, size=2000), T0)
    n = sum(1 for _ in iter_batches(log.segments[0].read_bytes(0, log.segments[0].size)))
    for name in snapshot_files(log):
        os.unlink(log.dir / name)
    again = Log.load(log.dir, LogConfig(), "topic", 0, clean_shutdown=False)
    assert again.producer_state.scanned_batches == n == 3
