"""File handles as Kafka spends them, and recovery proportional to what was not flushed.

* A partition holds one descriptor: its active segment's ``.log``. Rolled segments give theirs
  back; read later, they borrow one from the LRU (``minibroker.log.max.open.files``) and are
  read correctly; indexes hold none and are read only when needed.
* EMFILE while creating a log is an error for that log alone (OpenFileLimitError, answered
  KAFKA_STORAGE_ERROR), nothing of it left on disk, the dir online.
* After a crash, recovery rereads only what lies past each log's recovery point.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from broker.log import disk
from broker.log.config import LogConfig
from broker.log.handles import HANDLES, OpenFileLimitError, raise_open_file_limit
from broker.log.manager import LogManager
from broker.log.recovery import STATS
from protocol.errors import ErrorCode
from tests.support.requests import BASE_TS, record_batch

PARTITIONS = 400
T0 = 1_700_000_000_000


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def values(log, start: int = 0) -> list[bytes]:  # noqa: ANN001
    """Every value from ``start`` to the log end, read batch by batch."""
    from kafka.record.default_records import DefaultRecordBatch

    from protocol.record_batch import iter_batches

    out: list[bytes] = []
    offset = start
    while offset < log.log_end_offset:
        data = bytes(log.read(offset, 1 << 20))
        assert data, f"nothing read at {offset}"
        for _pos, header in iter_batches(data):
            out += [r.value for r in DefaultRecordBatch(data[_pos:_pos + header.size_in_bytes])]
            offset = header.next_offset
    return out


@pytest.fixture
def manager(tmp_path: Path):  # noqa: ANN201
    lm = LogManager([tmp_path / "logs"], LogConfig())
    lm.load()
    yield lm
    lm.shutdown()


def test_a_partition_holds_one_descriptor_and_rolled_segments_none(
        manager: LogManager, tmp_path: Path) -> None:
    raise_open_file_limit()
    before = open_fds()
    logs = [manager.create_log("t", p) for p in range(PARTITIONS)]
    assert open_fds() - before <= PARTITIONS + 8
    # One log rolls 30 segments: the rolled ones give their descriptors back.
    log = logs[0]
    for i in range(30):
        log.append(record_batch([b"v%d" % i]), T0)
        log.roll(T0)
    assert log.num_segments == 31
    assert not any(s.holds_fd for s in log.segments[:-1]) and log.active_segment.holds_fd
    assert open_fds() - before <= PARTITIONS + 8
    # Read long after: each segment borrows a descriptor from the bounded cache, and the
    # data read back is exactly what was written.
    HANDLES.resize(8)
    try:
        assert values(log) == [b"v%d" % i for i in range(30)]
        assert len(HANDLES) <= 8
        assert open_fds() - before <= PARTITIONS + 8 + 8
    finally:
        HANDLES.resize(128)


def test_a_clean_start_opens_only_active_segments_and_reads_indexes_lazily(
        tmp_path: Path) -> None:
    lm = LogManager([tmp_path / "logs"], LogConfig(index_interval_bytes=1))
    lm.load()
    for p in range(20):
        log = lm.create_log("t", p)
        for i in range(5):
            log.append(record_batch([b"p%d-%d" % (p, i)]), T0 + i)
            log.append(record_batch([b"q%d-%d" % (p, i)]), T0 + i)
            log.roll(T0)
    lm.shutdown()
    before = open_fds()
    again = LogManager([tmp_path / "logs"], LogConfig(index_interval_bytes=1))
    again.load()
    try:
        assert open_fds() - before <= 20 + 4  # + the dir lock and the descriptor reserve
        log = again.get_log(("t", 3))
        assert log is not None and log.num_segments == 6
        inactive = log.segments[:-1]
        assert not any(s.holds_fd for s in inactive)
        assert not any(s.offset_index.loaded or s.time_index.loaded for s in inactive)
        # A read in the middle loads that one segment's index, and reads right.
        assert values(log, 6) == [b"p3-3", b"q3-3", b"p3-4", b"q3-4"]
        assert log.segments[3].offset_index.loaded
        assert not log.segments[1].offset_index.loaded
        # ListOffsets by timestamp reads the time indexes it needs, lazily too.
        assert log.offset_for_timestamp(BASE_TS) == (0, BASE_TS)
    finally:
        again.shutdown()


def test_emfile_fails_one_creation_leaves_nothing_and_keeps_the_dir_online(
        manager: LogManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = manager.create_log("kept", 0)
    kept.append(record_batch([b"before"]), T0)
    real = disk.open_file

    def no_descriptors(path: str, flags: int, *mode: int) -> int:
        if "full-0" in str(path):
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        return real(path, flags, *mode)

    monkeypatch.setattr(disk, "open_file", no_descriptors)
    with pytest.raises(OpenFileLimitError) as refused:
        manager.create_log("full", 0)
    assert refused.value.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert "open-file limit" in str(refused.value)
    assert not (tmp_path / "logs" / "full-0").exists()
    assert manager.get_log(("full", 0)) is None
    assert manager.offline_dirs == 0
    monkeypatch.setattr(disk, "open_file", real)
    kept.append(record_batch([b"after"]), T0)
    assert values(kept) == [b"before", b"after"]
    assert manager.create_log("full", 0) is manager.get_log(("full", 0))


def test_emfile_on_a_read_fails_that_read_only(
        manager: LogManager, monkeypatch: pytest.MonkeyPatch) -> None:
    log = manager.create_log("t", 0)
    log.append(record_batch([b"old"]), T0)
    log.roll(T0)
    log.append(record_batch([b"new"]), T0)
    HANDLES.forget(log.segments[0])
    real = disk.open_file

    def no_descriptors(path: str, flags: int, *mode: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files", str(path))

    monkeypatch.setattr(disk, "open_file", no_descriptors)
    with pytest.raises(OpenFileLimitError):
        log.read(0, 1 << 20)
    assert manager.offline_dirs == 0 and not log.offline
    monkeypatch.setattr(disk, "open_file", real)
    assert values(log) == [b"old", b"new"]


@pytest.mark.parametrize("threads", [1, 3])
def test_recovery_rereads_only_what_was_not_flushed(tmp_path: Path, threads: int) -> None:
    """Every log: flushed batches in rolled segments, half of them one more batch unflushed.
    After the kill, only the unflushed batches are reread, and nothing is lost."""
    dirs = [tmp_path / "logs"]
    lm = LogManager(dirs, LogConfig())
    lm.load()
    unflushed = 0
    for p in range(60):
        log = lm.create_log("t", p)
        for i in range(3):
            log.append(record_batch([b"flushed-%d" % i] * 20), T0)
            log.roll(T0)
        log.flush()
        if p % 2:
            info = log.append(record_batch([b"unflushed-%d" % p]), T0)
            unflushed += info.size
    lm.checkpoint()
    lm.abandon()  # as a SIGKILL: no flush, no clean-shutdown marker
    STATS.reset()
    again = LogManager(dirs, LogConfig(), recovery_threads_per_data_dir=threads)
    again.load()
    try:
        assert STATS.bytes == unflushed
        for p in range(60):
            log = again.get_log(("t", p))
            assert log is not None
            expected = [b"flushed-%d" % i for i in range(3) for _ in range(20)]
            if p % 2:
                expected.append(b"unflushed-%d" % p)
            assert values(log) == expected
    finally:
        again.shutdown()


def test_recovery_inside_one_segment_starts_at_the_recovery_point(tmp_path: Path) -> None:
    """The segment holding the recovery point is reread from there, not from its start: the
    state below comes from its flushed indexes, and every batch is still read back."""
    dirs = [tmp_path / "logs"]
    lm = LogManager(dirs, LogConfig(index_interval_bytes=200))
    lm.load()
    log = lm.create_log("t", 0)
    for i in range(40):
        log.append(record_batch([b"flushed-%d" % i]), T0)
    log.flush()
    flushed_size = log.size_in_bytes
    for i in range(3):
        log.append(record_batch([b"late-%d" % i]), T0)
    unflushed = log.size_in_bytes - flushed_size
    lm.checkpoint()
    lm.abandon()
    STATS.reset()
    again = LogManager(dirs, LogConfig(index_interval_bytes=200))
    again.load()
    try:
        assert (STATS.segments, STATS.bytes) == (1, unflushed)
        log = again.get_log(("t", 0))
        assert log is not None and log.num_segments == 1
        assert values(log) == [b"flushed-%d" % i for i in range(40)] + [
            b"late-%d" % i for i in range(3)]
        assert values(log, 39) == [b"flushed-39", b"late-0", b"late-1", b"late-2"]
        log.append(record_batch([b"next"]), T0)
        assert values(log, 43) == [b"next"]
    finally:
        again.shutdown()


async def test_emfile_while_adding_partitions_records_none_of_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CreatePartitions is all or nothing, as CreateTopics: the new count is recorded only
    once every new partition's log exists, so a restart never meets a partition without one."""
    from tests.support.components import build

    c = build(tmp_path / "logs", offsets_topic=False)
    try:
        c.topics.create_topic("grow", 2, {})
        real = disk.open_file

        def no_descriptors(path: str, flags: int, *mode: int) -> int:
            if "grow-3" in str(path):
                raise OSError(errno.EMFILE, "Too many open files", str(path))
            return real(path, flags, *mode)

        monkeypatch.setattr(disk, "open_file", no_descriptors)
        with pytest.raises(OpenFileLimitError):
            c.topics.add_partitions("grow", 4)
        assert c.metadata.topics["grow"].partitions == 2
        assert not any((tmp_path / "logs" / f"grow-{i}").exists() for i in (2, 3))
        assert c.log_manager.get_log(("grow", 2)) is None
        monkeypatch.setattr(disk, "open_file", real)
        c.topics.add_partitions("grow", 4)
        assert c.metadata.topics["grow"].partitions == 4
        assert all(c.log_manager.get_log(("grow", i)) is not None for i in range(4))
    finally:
        await c.close()
