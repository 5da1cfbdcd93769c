"""preallocate (Kafka's LogConfig.initFileSize): a new segment's file is made segment.bytes
long at once and cut to its data when the segment is rolled or the log closed; the data's
size is kept apart from the file's length, so reads, the recovery point and recovery after a
crash never take the zero-filled tail for data."""

from __future__ import annotations

from pathlib import Path

from broker.log import Log, LogConfig
from tests.unit.test_log import T0, batch, read_all

SEGMENT = 64 * 1024


def _log(path: Path, **changes: object) -> Log:
    return Log(path, LogConfig(segment_bytes=SEGMENT, preallocate=True, **changes), "t", 0)  # type: ignore[arg-type]


def _length(log: Log, i: int = -1) -> int:
    return log.segments[i].log_path.stat().st_size


def test_a_new_segment_file_is_segment_bytes_long_and_holds_no_data(tmp_path: Path) -> None:
    log = _log(tmp_path / "t-0")
    assert _length(log) == SEGMENT and log.active_segment.size == 0
    assert log.read(0, 1 << 20) == b""  # nothing past the written end is read
    log.append(batch(3, T0), T0)
    written = log.active_segment.size
    assert 0 < written < SEGMENT and _length(log) == SEGMENT
    assert [k for _o, _t, k in read_all(log)] == [b"k0", b"k1", b"k2"]
    assert log.read(3, 1 << 20) == b""  # the log end: the zeros after it are not a batch
    assert log.size_in_bytes == written
    log.close()


def test_roll_and_close_trim_the_file_to_its_data(tmp_path: Path) -> None:
    log = _log(tmp_path / "t-0")
    log.append(batch(3, T0), T0)
    first = log.active_segment.size
    log.roll()
    assert _length(log, 0) == first  # the rolled segment: cut to its data
    assert _length(log, 1) == SEGMENT  # the new active one: preallocated
    log.append(batch(2, T0), T0)
    second = log.active_segment.size
    log.close()
    files = sorted((tmp_path / "t-0").glob("*.log"))
    assert [f.stat().st_size for f in files] == [first, second]
    again = Log.load(tmp_path / "t-0", LogConfig(segment_bytes=SEGMENT, preallocate=True),
                     "t", 0, clean_shutdown=True)
    assert again.log_end_offset == 5 and len(read_all(again)) == 5
    again.close()


def test_a_segment_rolls_at_segment_bytes_of_data_not_of_file(tmp_path: Path) -> None:
    log = _log(tmp_path / "t-0")
    while log.num_segments == 1:
        log.append(batch(3, T0, size=200), T0)
    assert 0 < _length(log, 0) <= SEGMENT and _length(log, 0) == log.segments[0].size
    log.close()


def test_crash_with_a_preallocated_tail_recovers_every_record_and_nothing_more(
        tmp_path: Path) -> None:
    log = _log(tmp_path / "t-0")
    for i in range(4):
        log.append(batch(2, T0 + i, tag=str(i)), T0)
    log.flush()
    point = log.recovery_point
    log.append(batch(2, T0, tag="late"), T0)  # written, past the recovery point
    end = log.log_end_offset
    data = log.active_segment.size
    log._close_files()  # the crash: nothing trimmed, no clean shutdown
    assert _length_of(tmp_path) == SEGMENT
    again = Log.load(tmp_path / "t-0", LogConfig(segment_bytes=SEGMENT, preallocate=True),
                     "t", 0, clean_shutdown=False, recovery_point=point)
    assert again.log_end_offset == end == 10
    assert again.active_segment.size == data and _length_of(tmp_path) == data
    assert [k for _o, _t, k in read_all(again)][-2:] == [b"latek0", b"latek1"]
    again.append(batch(1, T0, tag="next"), T0)  # appends continue right after the data
    assert read_all(again, 10)[0][0] == 10
    again.close()


def test_crash_with_the_recovery_point_at_the_log_end(tmp_path: Path) -> None:
    """Everything flushed: the trusted prefix ends where the zeros begin."""
    log = _log(tmp_path / "t-0")
    log.append(batch(3, T0), T0)
    log.flush()
    assert log.recovery_point == 3
    log._close_files()
    again = Log.load(tmp_path / "t-0", LogConfig(segment_bytes=SEGMENT, preallocate=True),
                     "t", 0, clean_shutdown=False, recovery_point=3)
    assert again.log_end_offset == 3 and again.recovery_point == 3
    assert _length_of(tmp_path) == again.active_segment.size
    again.close()


def test_a_crash_before_any_append_leaves_an_empty_log(tmp_path: Path) -> None:
    log = _log(tmp_path / "t-0")
    log._close_files()
    again = Log.load(tmp_path / "t-0", LogConfig(segment_bytes=SEGMENT, preallocate=True),
                     "t", 0, clean_shutdown=False)
    assert again.log_end_offset == 0 and _length_of(tmp_path) == 0
    again.close()


def test_without_preallocate_the_file_grows_with_its_data(tmp_path: Path) -> None:
    log = Log(tmp_path / "t-0", LogConfig(segment_bytes=SEGMENT), "t", 0)
    assert _length(log) == 0
    log.append(batch(3, T0), T0)
    assert _length(log) == log.active_segment.size
    log.close()


def _length_of(tmp_path: Path) -> int:
    [active] = sorted((tmp_path / "t-0").glob("*.log"))[-1:]
    return active.stat().st_size
