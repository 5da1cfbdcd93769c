"""CleanerManager: the cleanable section of a log (Kafka's cleanableOffsets), the dirty ratio,
max.compaction.lag.ms, the choice of the filthiest log, pause/abort/resume, uncleanable
partitions and the cleaner checkpoint. Explicit times everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.log.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from broker.log.cleaner_manager import (
    CLEANER_OFFSET_CHECKPOINT_FILE,
    CleanerManager,
    LogToClean,
    cleanable_offsets,
    max_compaction_delay,
)
from broker.log.config import LogConfig
from broker.log.log import Log
from broker.log.manager import LogManager

T0 = 1_700_000_000_000
TP = ("t", 0)


def batch(key: str, ts: int = T0, pid: int = -1, transactional: bool = False) -> bytearray:
    b = DefaultRecordBatchBuilder(2, 0, transactional, pid, 0 if pid >= 0 else -1,
                                  0 if pid >= 0 else -1, 1 << 20)
    b.append(0, timestamp=ts, key=key.encode(), value=b"v" * 50, headers=[])
    return bytearray(b.build())


def config(**changes: object) -> LogConfig:
    base: dict[str, object] = dict(cleanup_policy="compact", min_cleanable_dirty_ratio=0.5)
    base.update(changes)
    return LogConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def lm(tmp_path: Path) -> LogManager:
    m = LogManager([tmp_path / "logs"], config())
    m.load()
    yield m  # type: ignore[misc]
    m.shutdown()


def segments(log: Log, stamps: list[int]) -> None:
    """One segment per timestamp, then an active segment with one batch."""
    for ts in stamps:
        log.append(batch("k", ts), T0)
        log.roll(T0)
    log.append(batch("k", stamps[-1] if stamps else T0), T0)


def test_the_section_ends_at_the_active_segment(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config())
    segments(log, [T0] * 4)
    assert cleanable_offsets(log, None, T0) == (0, 4, False)
    assert cleanable_offsets(log, 2, T0) == (2, 4, False)


def test_a_checkpoint_out_of_the_log_restarts_from_the_log_start(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config())
    segments(log, [T0] * 4)
    assert log.maybe_increment_log_start_offset(2, "test")
    assert cleanable_offsets(log, 1, T0) == (2, 4, True)
    assert cleanable_offsets(log, 99, T0) == (2, 4, True)


def test_the_section_stops_at_the_last_stable_offset(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config())
    segments(log, [T0] * 2)
    log.on_high_watermark_updated(1)
    assert cleanable_offsets(log, None, T0) == (0, 1, False)
    log.on_high_watermark_updated(log.log_end_offset)
    log.append(batch("k", pid=3, transactional=True), T0)  # open transaction at offset 3
    log.roll(T0)
    log.append(batch("z"), T0)
    log.on_high_watermark_updated(log.log_end_offset)
    assert cleanable_offsets(log, None, T0) == (0, 3, False)


def test_min_compaction_lag_stops_at_the_first_young_segment(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config(min_compaction_lag_ms=1000))
    segments(log, [T0, T0 + 500, T0 + 5000])
    assert cleanable_offsets(log, None, T0 + 1400) == (0, 1, False)
    assert cleanable_offsets(log, None, T0 + 1500) == (0, 2, False)  # T0+500 is 1000 old
    assert cleanable_offsets(log, None, T0 + 1501) == (0, 2, False)
    assert cleanable_offsets(log, None, T0 + 6001) == (0, 3, False)


def test_max_compaction_delay_measures_the_oldest_dirty_segment(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config(max_compaction_lag_ms=1000))
    segments(log, [T0, T0 + 500])
    assert max_compaction_delay(log, 0, T0 + 1000) == 0
    assert max_compaction_delay(log, 0, T0 + 1250) == 250
    assert max_compaction_delay(log, 1, T0 + 1250) == 0  # only the T0+500 segment is dirty
    unlimited = lm.create_log("u", 0, config())
    segments(unlimited, [T0])
    assert max_compaction_delay(unlimited, 0, T0 + 10**12) == 0


def test_dirty_ratio_counts_clean_and_cleanable_bytes(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config())
    segments(log, [T0] * 4)
    size = log.segments[0].size
    ltc = LogToClean.of(TP, log, 1, 4)
    assert (ltc.clean_bytes, ltc.cleanable_bytes, ltc.first_uncleanable_offset) == (
        size, 3 * size, 4)
    assert ltc.cleanable_ratio == pytest.approx(0.75)
    # the uncleanable offset inside a segment rounds down to its base
    assert LogToClean.of(TP, log, 0, 3).first_uncleanable_offset == 3


def test_grab_filthiest_picks_the_dirtiest_above_its_ratio(lm: LogManager) -> None:
    a = lm.create_log("a", 0, config())
    b = lm.create_log("b", 0, config())
    d = lm.create_log("d", 0, config(cleanup_policy="delete"))
    for log in (a, b, d):
        segments(log, [T0] * 4)
    write_offset_checkpoint(lm.log_dirs[0] / CLEANER_OFFSET_CHECKPOINT_FILE,
                            {("a", 0): 2, ("b", 0): 1})
    m = CleanerManager(lm)
    first = m.grab_filthiest(T0)
    assert first is not None and first.tp == ("b", 0)  # 3/4 dirty beats 2/4
    assert m.grab_filthiest(T0) is None  # a is at 0.5: not above the ratio; d is not compact
    m.done_cleaning(("b", 0), 4)
    assert m.checkpoint_of(("b", 0)) == 4
    assert m.dirty_ratios(T0) == {("a", 0): 0.5, ("b", 0): 0.0}
    m.write_checkpoints()
    assert read_offset_checkpoint(lm.log_dirs[0] / CLEANER_OFFSET_CHECKPOINT_FILE) == {
        ("a", 0): 2, ("b", 0): 4}


def test_a_tail_below_the_ratio_stays_dirty_and_ratio_zero_takes_any(lm: LogManager) -> None:
    # a clean stopped at the segment that then took one update: that tail alone is under the
    # ratio, so the older value of its key stays (Kafka's rule); at ratio 0 it is due, and a
    # log with nothing dirty is never grabbed, so the cleaner does not spin
    log = lm.create_log("t", 0, config(min_cleanable_dirty_ratio=0.3))
    segments(log, [T0] * 4)
    log.roll(T0)
    write_offset_checkpoint(lm.log_dirs[0] / CLEANER_OFFSET_CHECKPOINT_FILE, {TP: 4})
    m = CleanerManager(lm)
    assert m.dirty_ratios(T0)[TP] == pytest.approx(0.2)
    assert m.grab_filthiest(T0) is None
    log.update_config(config(min_cleanable_dirty_ratio=0.0))
    ltc = m.grab_filthiest(T0)
    assert ltc is not None and (ltc.first_dirty_offset, ltc.first_uncleanable_offset) == (4, 5)
    m.done_cleaning(TP, 5)
    assert m.dirty_ratios(T0)[TP] == 0.0
    assert m.grab_filthiest(T0) is None


def test_max_compaction_lag_makes_a_log_due_below_its_ratio(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config(min_cleanable_dirty_ratio=0.99,
                                       max_compaction_lag_ms=1000))
    segments(log, [T0] * 4)
    write_offset_checkpoint(lm.log_dirs[0] / CLEANER_OFFSET_CHECKPOINT_FILE, {TP: 2})
    m = CleanerManager(lm)
    assert m.grab_filthiest(T0 + 1000) is None
    ltc = m.grab_filthiest(T0 + 1001)
    assert ltc is not None and ltc.need_compaction_now


def test_pause_abort_and_resume(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config())
    segments(log, [T0] * 4)
    m = CleanerManager(lm)
    m.abort_and_pause(TP)
    m.abort_and_pause(TP)
    assert m.grab_filthiest(T0) is None and m.is_aborted(TP)
    m.resume(TP)
    assert m.grab_filthiest(T0) is None  # pauses nest
    m.resume(TP)
    ltc = m.grab_filthiest(T0)
    assert ltc is not None and not m.is_aborted(TP)
    m.abort_and_pause(TP)  # while in progress: the clean is dropped, no checkpoint
    assert m.is_aborted(TP)
    m.done_cleaning(TP, 4)
    assert m.checkpoint_of(TP) is None
    m.resume(TP)
    assert not m.is_aborted(TP)


def test_uncleanable_partitions_are_skipped_until_their_log_goes(lm: LogManager) -> None:
    log = lm.create_log("t", 0, config())
    segments(log, [T0] * 4)
    m = CleanerManager(lm)
    m.mark_uncleanable(TP, "test")
    assert m.grab_filthiest(T0) is None
    m.maintain_uncleanable()
    assert TP in m.uncleanable
    lm.delete_log(TP)
    m.maintain_uncleanable()
    assert TP not in m.uncleanable


def test_an_unreadable_checkpoint_reads_as_empty(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    d.mkdir()
    (d / CLEANER_OFFSET_CHECKPOINT_FILE).write_text("garbage\n")
    m = LogManager([d], config())
    m.load()
    try:
        assert CleanerManager(m).all_checkpoints() == {}
    finally:
        m.shutdown()
