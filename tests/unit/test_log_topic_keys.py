"""Topic keys applied to the log: segment.jitter.ms and segment.index.bytes (Kafka's
LogSegment.shouldRoll), file.delete.delay.ms (Kafka's asyncDeleteSegment)."""

from __future__ import annotations

from pathlib import Path

from broker.log import Log, LogConfig
from broker.log.index import OffsetIndex, TimeIndex
from tests.unit.test_log import T0, batch


def test_topic_keys_reach_the_log_config() -> None:
    cfg = LogConfig.from_topic_configs({"segment.jitter.ms": "250",
                                        "segment.index.bytes": "4096",
                                        "file.delete.delay.ms": "5"})
    assert (cfg.roll_jitter_ms, cfg.max_index_size, cfg.file_delete_delay_ms) == (250, 4096, 5)
    assert (LogConfig().roll_jitter_ms, LogConfig().max_index_size,
            LogConfig().file_delete_delay_ms) == (0, 10_485_760, 60_000)


def test_segment_jitter_is_drawn_below_jitter_and_segment_ms() -> None:
    bounds: list[int] = []

    def rng(n: int) -> int:
        bounds.append(n)
        return n - 1

    assert LogConfig(roll_ms=1000).random_segment_jitter(rng) == 0  # no jitter: no draw
    assert bounds == []
    assert LogConfig(roll_ms=1000, roll_jitter_ms=300).random_segment_jitter(rng) == 299
    assert LogConfig(roll_ms=1000, roll_jitter_ms=5000).random_segment_jitter(rng) == 999
    assert bounds == [300, 1000]


def test_segment_rolls_at_segment_ms_less_its_jitter(tmp_path: Path) -> None:
    log = Log(tmp_path / "t-0", LogConfig(roll_ms=1000, roll_jitter_ms=300), "t", 0)
    log.jitter_rng = lambda n: n - 1  # the largest jitter: 299 ms
    log.active_segment.roll_jitter_ms = log.config.random_segment_jitter(log.jitter_rng)
    log.append(batch(1, T0), T0)
    log.append(batch(1, T0 + 701), T0 + 701)  # waited 701 = 1000 - 299: not yet
    assert log.num_segments == 1
    log.append(batch(1, T0 + 702), T0 + 702)  # waited 702 > 1000 - 299: rolls
    assert log.num_segments == 2
    assert log.active_segment.roll_jitter_ms == 299  # each new segment draws its own
    log.close()


def test_segment_without_jitter_rolls_at_segment_ms_exactly(tmp_path: Path) -> None:
    log = Log(tmp_path / "t-0", LogConfig(roll_ms=1000), "t", 0)
    assert log.active_segment.roll_jitter_ms == 0
    log.append(batch(1, T0), T0)
    log.append(batch(1, T0 + 1000), T0 + 1000)
    assert log.num_segments == 1
    log.append(batch(1, T0 + 1001), T0 + 1001)
    assert log.num_segments == 2
    log.close()


def test_segment_rolls_when_its_offset_index_is_full(tmp_path: Path) -> None:
    # index.interval.bytes=0: an offset index entry per batch; 3 entries fit 31 bytes. One
    # timestamp throughout: the time index keeps one entry and is never the full one.
    cfg = LogConfig(index_interval_bytes=0, max_index_size=3 * OffsetIndex.entry_size + 7)
    log = Log(tmp_path / "t-0", cfg, "t", 0)
    for _ in range(12):
        log.append(batch(1, T0), T0)
    full = [len(s.offset_index) for s in log.segments[:-1]]
    assert len(log.segments) > 1 and full == [3] * len(full)
    assert all(len(s.time_index) < 2 for s in log.segments)
    log.close()


def test_segment_rolls_when_its_time_index_is_full(tmp_path: Path) -> None:
    # 30 bytes: 3 offset entries but only 2 time index entries (12 bytes each). As Kafka,
    # a segment's first batch gets no entry: 3 batches fill the time index.
    cfg = LogConfig(index_interval_bytes=0, max_index_size=2 * TimeIndex.entry_size + 6)
    log = Log(tmp_path / "t-0", cfg, "t", 0)
    for i in range(7):
        log.append(batch(1, T0 + i), T0)
    assert [s.base_offset for s in log.segments] == [0, 3, 6]
    assert [(len(s.time_index), len(s.offset_index)) for s in log.segments[:2]] == [(2, 2)] * 2
    log.close()


def _names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.suffix != ".snapshot")


def test_retention_renames_segments_deleted_and_removes_them_after_the_delay(
        tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    one = len(batch(1))
    log = Log(d, LogConfig(segment_bytes=one, retention_ms=1000, file_delete_delay_ms=500),
              "t", 0)
    now = T0 + 10_000
    for ts in (T0, T0 + 1, now):  # the last is recent: its segment stays
        log.append(batch(1, ts), T0)
    first = log.segments[0]
    log_batch_0 = first.log_path.read_bytes()
    assert log.delete_old_segments(now) == 2  # the active segment (offset 2) stays
    assert log.log_start_offset == 2 and log.pending_deletes == 2
    assert "00000000000000000000.log.deleted" in _names(d)
    assert "00000000000000000000.log" not in _names(d)
    held = first.read(0, one, None)  # a reader still holding the segment reads on
    assert held is not None and bytes(held) == bytes(log_batch_0)
    assert log.delete_due_segments(now + 499) == 0
    assert log.delete_due_segments(now + 500) == 2
    assert log.pending_deletes == 0
    assert not [n for n in _names(d) if n.endswith(".deleted")]
    log.close()


def test_without_delay_retention_removes_segments_at_once(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    one = len(batch(1))
    log = Log(d, LogConfig(segment_bytes=one, retention_ms=1000, file_delete_delay_ms=0),
              "t", 0)
    for ts in (T0, T0 + 10_000):
        log.append(batch(1, ts), T0)
    assert log.delete_old_segments(T0 + 10_000) == 1
    assert log.pending_deletes == 0
    assert not [n for n in _names(d) if n.startswith("00000000000000000000")]
    log.close()


def test_close_removes_the_deleted_files_still_waiting(tmp_path: Path) -> None:
    d = tmp_path / "t-0"
    one = len(batch(1))
    log = Log(d, LogConfig(segment_bytes=one, retention_ms=1000), "t", 0)  # delay 60 s
    for ts in (T0, T0 + 10_000):
        log.append(batch(1, ts), T0)
    assert log.delete_old_segments(T0 + 10_000) == 1
    assert any(n.endswith(".deleted") for n in _names(d))
    log.close()
    assert not [n for n in _names(d) if n.endswith(".deleted")]
    reopened = Log(d, LogConfig(), "t", 0)
    assert reopened.log_start_offset == 1 and reopened.log_end_offset == 2
    reopened.close()
