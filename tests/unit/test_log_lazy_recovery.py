"""Recovery after a crash rereads only the logs opened since the last clean start: the others
open on first use, as after a clean start, and lose nothing acknowledged."""

from __future__ import annotations

import os
from pathlib import Path

from kafka.record.memory_records import MemoryRecordsBuilder

from broker.log import LogConfig, LogManager
from broker.log.manager import CLEAN_SHUTDOWN_FILE, LEADER_EPOCHS_FILE, OPENED_LOGS_FILE
from broker.log.recovery import STATS
from protocol.record_batch import iter_batches

T0 = 1_700_000_000_000


def batch(n: int = 2) -> bytearray:
    b = MemoryRecordsBuilder(2, 0, batch_size=1 << 20)
    for i in range(n):
        b.append(timestamp=T0 + i, key=b"k", value=b"v" * 50)
    b.close()
    return bytearray(b.buffer())


def crash(mgr: LogManager) -> None:
    """A SIGKILL: no shutdown, no checkpoint, no marker; the locks die with the process."""
    for fd in mgr._lock_fds:
        os.close(fd)
    mgr._lock_fds = []


def offsets(log_bytes: bytes | memoryview) -> list[int]:
    data = bytes(log_bytes)
    out: list[int] = []
    for _pos, header in iter_batches(data):
        out.extend(range(header.base_offset, header.last_offset + 1))
    return out


def written(tmp_path: Path, partitions: int, batches: int, cfg: LogConfig) -> None:
    """``partitions`` logs of ``batches`` two-record batches each, shut down cleanly."""
    mgr = LogManager([tmp_path], cfg)
    mgr.load()
    for p in range(partitions):
        log = mgr.create_log("t", p)
        for _ in range(batches):
            log.append(batch(), T0)
    mgr.shutdown()


def test_a_crash_after_a_clean_start_recovers_only_the_logs_opened_since(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=len(batch()) * 3)
    written(tmp_path, 4, 5, cfg)

    mgr = LogManager([tmp_path], cfg)
    logs = mgr.load()
    assert not any(log.opened for log in logs.values())
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    logs[("t", 1)].append(batch(), T0)  # opened since the clean start: offsets 10-11
    logs[("t", 1)].flush()
    crash(mgr)
    assert "t 1" in (tmp_path / OPENED_LOGS_FILE).read_text().split("\n")

    STATS.reset()
    again = LogManager([tmp_path], cfg)
    logs = again.load()
    assert [tp for tp, log in sorted(logs.items()) if log.opened] == [("t", 1)]
    assert STATS.segments == 1  # only the opened log's segment past its recovery point
    assert logs[("t", 1)].log_end_offset == 12
    for p in (0, 2, 3):  # first touched after the restart: every record there
        log = logs[("t", p)]
        assert log.log_end_offset == 10
        assert offsets(log.read(0, 1 << 20)) == list(range(6))  # the first segment
        assert offsets(log.read(6, 1 << 20)) == list(range(6, 10))
    assert STATS.segments == 1  # opening them recovered nothing
    again.shutdown()
    assert not (tmp_path / OPENED_LOGS_FILE).exists()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


def test_a_log_first_used_after_a_crash_restart_is_recorded_for_the_next(tmp_path: Path) -> None:
    """Two crashes in a row: the log opened between them is recovered by the second restart,
    with its unflushed tail cut as recovery cuts it."""
    cfg = LogConfig()
    written(tmp_path, 2, 3, cfg)
    mgr = LogManager([tmp_path], cfg)
    mgr.load()
    crash(mgr)  # nothing opened

    mgr = LogManager([tmp_path], cfg)
    logs = mgr.load()
    assert not any(log.opened for log in logs.values())
    log = logs[("t", 0)]
    log.append(batch(), T0)  # 6-7
    log.flush()
    log.append(batch(), T0)  # 8-9, never flushed
    crash(mgr)
    segment = tmp_path / "t-0" / f"{0:020d}.log"
    os.truncate(segment, segment.stat().st_size - 5)  # the unflushed batch torn by the crash

    logs = LogManager([tmp_path], cfg).load()
    assert logs[("t", 0)].opened and not logs[("t", 1)].opened
    assert logs[("t", 0)].log_end_offset == 8
    assert offsets(logs[("t", 0)].read(0, 1 << 20)) == list(range(8))
    assert offsets(logs[("t", 1)].read(0, 1 << 20)) == list(range(6))


def test_a_corrupt_tail_found_at_first_use_is_truncated_as_at_start(tmp_path: Path) -> None:
    cfg = LogConfig()
    written(tmp_path, 2, 4, cfg)
    mgr = LogManager([tmp_path], cfg)
    mgr.load()
    crash(mgr)
    for p in (0, 1):  # the same damage to both: one found at start, one at first use
        segment = tmp_path / f"t-{p}" / f"{0:020d}.log"
        data = segment.read_bytes()
        segment.write_bytes(data + data[: len(batch()) // 2])  # half a batch more

    at_start = end_found_at_start(tmp_path, cfg, ("t", 0))
    logs = LogManager([tmp_path], cfg).load()
    lazy = logs[("t", 1)]
    assert not lazy.opened
    assert offsets(lazy.read(0, 1 << 20)) == list(range(8))
    assert lazy.log_end_offset == at_start == 8
    size = (tmp_path / "t-1" / f"{0:020d}.log").stat().st_size
    assert size == (tmp_path / "t-0" / f"{0:020d}.log").stat().st_size == len(batch()) * 4
    lazy.append(batch(), T0)
    assert offsets(lazy.read(8, 1 << 20)) == [8, 9]


def end_found_at_start(tmp_path: Path, cfg: LogConfig, tp: tuple[str, int]) -> int:
    """The log end offset recovery at start finds for ``tp`` (opened-logs file naming it)."""
    with open(tmp_path / OPENED_LOGS_FILE, "a") as f:
        f.write(f"\n{tp[0]} {tp[1]}\n")
    mgr = LogManager([tmp_path], cfg)
    log = mgr.load()[tp]
    assert log.opened
    end = log.log_end_offset
    crash(mgr)
    log._close_files()
    return end


def test_deleting_an_unopened_log_is_recorded(tmp_path: Path) -> None:
    """A delete a crash interrupts leaves a log that must not be trusted as clean."""
    written(tmp_path, 2, 1, LogConfig())
    mgr = LogManager([tmp_path], LogConfig())
    mgr.load()
    mgr.delete_log(("t", 0))
    assert "t 0" in (tmp_path / OPENED_LOGS_FILE).read_text().split("\n")
    mgr.shutdown()


def test_without_the_opened_logs_file_a_crash_recovers_everything(tmp_path: Path) -> None:
    """A crash during a clean shutdown (opened-logs file gone, new epochs file written, no
    marker) or a file this version can not read: every log is recovered."""
    written(tmp_path, 2, 2, LogConfig())
    assert (tmp_path / LEADER_EPOCHS_FILE).exists()
    (tmp_path / CLEAN_SHUTDOWN_FILE).unlink()
    logs = LogManager([tmp_path], LogConfig()).load()
    assert all(log.opened for log in logs.values())
    assert [log.log_end_offset for log in logs.values()] == [4, 4]


def test_a_log_created_after_the_clean_start_is_recovered(tmp_path: Path) -> None:
    written(tmp_path, 1, 1, LogConfig())
    mgr = LogManager([tmp_path], LogConfig())
    mgr.load()
    log = mgr.create_log("new", 0)
    log.append(batch(), T0)
    log.flush()
    mgr.checkpoint()
    crash(mgr)
    logs = LogManager([tmp_path], LogConfig()).load()
    assert logs[("new", 0)].opened and not logs[("t", 0)].opened
    assert logs[("new", 0)].log_end_offset == 2
