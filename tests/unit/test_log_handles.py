"""File handles as Kafka spends them, and recovery proportional to what was not flushed.

* A partition holds one descriptor: its active segment's ``.log``. Rolled segments give theirs
  back; read later, they borrow one from the LRU (``minibroker.log.max.open.files``) and are
  read correctly; indexes hold none and are read only when needed.
* EMFILE while creating a log is an error for that log alone (OpenFileLimitError, answered
  KAFKA_STORAGE_ERROR), nothing of it left on disk, the dir online.
* After a crash, recovery rereads only what lies past each log's recovery point.
* After a clean shutdown a start opens no log: each opens on first use (``Log.deferred``).
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
from broker.log.producer_state import SNAPSHOT_FILE_SUFFIX
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


MANY = 2000


def test_thousands_of_partitions_open_on_first_use_and_hold_one_descriptor_each(
        tmp_path: Path) -> None:
    """A few thousand logs, every 100th with segments rolled long ago: the handles stay
    within partitions + a constant; after a clean shutdown the start opens none of them,
    and a log opens (one descriptor) when first read or written, its old segments holding
    none until read, then read correctly; nothing is lost across the restarts."""
    raise_open_file_limit()
    dirs = [tmp_path / "logs"]
    lm = LogManager(dirs, LogConfig())
    lm.load()
    before = open_fds()
    for p in range(MANY):
        log = lm.create_log(f"t{p // 100}", p % 100)
        log.append(record_batch([b"first-%d" % p]), T0)
        if p % 100 == 7:
            for i in range(5):
                log.roll(T0)
                log.append(record_batch([b"old-%d-%d" % (p, i)]), T0)
    assert open_fds() - before <= MANY + 8
    lm.shutdown()

    before = open_fds()
    again = LogManager(dirs, LogConfig())
    logs = again.load()
    try:
        assert len(logs) == MANY
        assert not any(log.opened for log in logs.values())
        assert open_fds() - before <= 4  # the dir lock and the descriptor reserve
        # Offsets and epochs come from the checkpoints, without opening anything.
        assert all(log.log_end_offset == (6 if p % 100 == 7 else 1)
                   for (t, p), log in logs.items())
        assert all(log.latest_epoch == 0 for log in logs.values())
        assert not any(log.opened for log in logs.values())
        # A read at the log end opens nothing either (an idle consumer's fetch).
        log = logs[("t3", 7)]
        assert log.read(log.log_end_offset, 1 << 20) == b""
        assert not log.opened
        # The first real read opens it: its rolled segments hold nothing until read, and
        # reads borrow from the bounded cache; the first append takes the active segment's.
        assert values(log) == [b"first-307"] + [b"old-307-%d" % i for i in range(5)]
        assert log.opened and log.num_segments == 6
        assert not any(s.holds_fd for s in log.segments)
        log.append(record_batch([b"new-307"]), T0)
        assert log.active_segment.holds_fd and not any(s.holds_fd for s in log.segments[:-1])
        # Writes open the others, one descriptor each.
        for p in range(0, MANY, 2):
            logs[(f"t{p // 100}", p % 100)].append(record_batch([b"second-%d" % p]), T0)
        opened = sum(1 for log in logs.values() if log.opened)
        assert opened == MANY // 2 + 1
        assert open_fds() - before <= opened + 4 + len(HANDLES)
    finally:
        again.shutdown()

    third = LogManager(dirs, LogConfig())
    logs = third.load()
    try:
        for p in (0, 1, 307, MANY - 2, MANY - 1):
            expected = [b"first-%d" % p]
            if p % 100 == 7:
                expected += [b"old-%d-%d" % (p, i) for i in range(5)]
            if p == 307:
                expected.append(b"new-307")
            if p % 2 == 0:
                expected.append(b"second-%d" % p)
            assert values(logs[(f"t{p // 100}", p % 100)]) == expected
    finally:
        third.shutdown()


def test_a_deferred_log_that_cannot_open_fails_that_request_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EMFILE while a deferred log opens fails that use alone; the next use opens it."""
    dirs = [tmp_path / "logs"]
    lm = LogManager(dirs, LogConfig())
    lm.load()
    lm.create_log("t", 0).append(record_batch([b"kept"]), T0)
    lm.shutdown()
    again = LogManager(dirs, LogConfig())
    log = again.load()[("t", 0)]
    try:
        real = disk.open_file

        def no_descriptors(path: str, flags: int, *mode: int) -> int:
            raise OSError(errno.EMFILE, "Too many open files", str(path))

        monkeypatch.setattr(disk, "open_file", no_descriptors)
        with pytest.raises(OpenFileLimitError):
            log.append(record_batch([b"refused"]), T0)
        assert not log.opened and again.offline_dirs == 0 and log.log_end_offset == 1
        monkeypatch.setattr(disk, "open_file", real)
        log.append(record_batch([b"next"]), T0)
        assert values(log) == [b"kept", b"next"]
    finally:
        again.shutdown()


def test_many_logs_recovered_after_a_kill_write_no_fsynced_snapshot_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Producer state rebuilt by recovery is snapshotted without an fsync per log; the next
    flush fsyncs it before the recovery point passes it, so a second crash never loads a
    snapshot of data it lost, and nothing acknowledged (flushed) is lost."""
    dirs = [tmp_path / "logs"]
    config = LogConfig(flush_interval_messages=1)
    lm = LogManager(dirs, config)
    lm.load()
    for p in range(40):
        log = lm.create_log("t", p)
        log.append(record_batch([b"checkpointed-%d" % p]), T0)
        log.flush()
    lm.checkpoint()
    unflushed = 0
    for log in lm.logs.values():
        unflushed += log.append(record_batch([b"acked-%d" % log.partition]), T0).size
        log.flush()  # flush.messages=1: acknowledged once fsynced, not yet checkpointed
    lm.abandon()
    fsynced: list[int] = []
    real_fsync = disk.fsync

    def counting(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(disk, "fsync", counting)
    STATS.reset()
    again = LogManager(dirs, config, recovery_threads_per_data_dir=2)
    logs = again.load()
    try:
        assert STATS.bytes == unflushed  # only what the checkpoint did not cover
        assert fsynced == []  # no snapshot, index or checkpoint fsynced per log
        for p in range(40):
            log = logs[("t", p)]
            assert values(log) == [b"checkpointed-%d" % p, b"acked-%d" % p]
            assert log.recovery_point == 1 and log.log_end_offset == 2
            snapshot = log.dir / f"{2:020d}{SNAPSHOT_FILE_SUFFIX}"
            assert snapshot.exists() and snapshot in log._unsynced_snapshots
        monkeypatch.setattr(disk, "fsync", real_fsync)
        logs[("t", 0)].flush()
        assert logs[("t", 0)].recovery_point == 2 and not logs[("t", 0)]._unsynced_snapshots
    finally:
        again.shutdown()
