"""A roll flushes the rolled segment off the event loop, as Kafka's roll schedules
``flushUptoOffsetExclusive`` of the new segment's base offset.

* Once the log dir writer's flusher is done, every rolled segment (``.log`` and indexes) and
  the partition directory were fsynced by it, not by the loop, and the recovery point is the
  active segment's base offset; the checkpoint written then makes a restart after a kill
  reread the active segment alone.
* A kill before that flush finished loses nothing: the checkpoint still holds the old
  recovery point and the restart rereads every segment from there.
* A truncation while a roll's flush is under way keeps the recovery point at or below the
  log end offset.

Each test runs a real LogManager on a running loop (so its logs get the dir's writer), with
the default flush policy (no flush by count or time): only the rolls flush.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from broker.log import disk
from broker.log.config import LogConfig
from broker.log.log import Log
from broker.log.manager import LogManager
from broker.log.recovery import STATS
from tests.support.requests import record_batch
from tests.unit.test_log_handles import values

T0 = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)
BATCHES = 60


class Fsyncs:
    """The path and thread of every fsync, passed on to the real disk."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        real = disk.fsync

        def fsync(fd: int) -> Any:
            self.calls.append((os.readlink(f"/proc/self/fd/{fd}"),
                               threading.current_thread().name))
            return real(fd)
        monkeypatch.setattr(disk, "fsync", fsync)

    def paths(self) -> set[str]:
        return {path for path, _thread in self.calls}

    def on_loop(self) -> list[tuple[str, str]]:
        main = threading.main_thread().name
        return [c for c in self.calls if c[1] == main]


def fill(log: Log, n: int = BATCHES) -> list[bytes]:
    """Append ``n`` batches (several rolls at 4 KB segments); their values."""
    sent = []
    for i in range(n):
        value = b"value-%03d-" % i + b"x" * 200
        log.append(record_batch([value]), T0 + i)
        sent.append(value)
    return sent


def open_manager(logs: Path) -> LogManager:
    lm = LogManager([logs], CONFIG)
    lm.load()
    return lm


async def wait_flushed(lm: LogManager, logs: Path) -> None:
    await asyncio.to_thread(lm.writers[logs].wait_flushed)


async def test_rolled_segments_are_flushed_and_a_restart_rereads_only_the_active_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs = tmp_path / "logs"
    lm = open_manager(logs)
    log = lm.create_log("t", 0)
    fsyncs = Fsyncs(monkeypatch)
    sent = fill(log)
    assert log.num_segments >= 4
    await wait_flushed(lm, logs)
    active = log.active_segment
    assert log.recovery_point == active.base_offset
    assert log.unflushed_messages == log.log_end_offset - active.base_offset
    rolled = log.segments[:-1]
    fsynced = fsyncs.paths()
    for seg in rolled:
        assert str(seg.log_path) in fsynced, f"{seg.log_path.name} not fsynced"
    assert str(log.dir) in fsynced, "the new segments' directory entries were not fsynced"
    assert fsyncs.on_loop() == [], "the loop fsynced a rolled segment itself"
    active_size = active.size

    lm.checkpoint()
    lm.abandon()  # as a SIGKILL: no flush, no clean-shutdown marker
    STATS.reset()
    again = open_manager(logs)
    try:
        assert (STATS.segments, STATS.bytes) == (1, active_size)
        loaded = again.get_log(("t", 0))
        assert loaded is not None
        assert values(loaded) == sent
    finally:
        again.shutdown()


async def test_a_kill_before_the_rolls_flush_loses_nothing(tmp_path: Path) -> None:
    logs, crashed = tmp_path / "logs", tmp_path / "crashed"
    lm = open_manager(logs)
    log = lm.create_log("t", 0)
    log._flush_lock.acquire()  # the flusher waits here: the roll's flush has not happened
    try:
        sent = fill(log)
        segments = log.num_segments
        assert segments >= 4
        assert log.recovery_point == 0
        lm.checkpoint()
        shutil.copytree(logs, crashed)  # the files as a kill now leaves them
    finally:
        log._flush_lock.release()
    await wait_flushed(lm, logs)
    assert log.recovery_point == log.active_segment.base_offset
    lm.abandon()

    (crashed / ".lock").unlink(missing_ok=True)
    STATS.reset()
    again = open_manager(crashed)
    try:
        assert STATS.segments == segments  # from the checkpointed recovery point 0
        loaded = again.get_log(("t", 0))
        assert loaded is not None
        assert loaded.log_end_offset == BATCHES
        assert values(loaded) == sent
    finally:
        again.shutdown()


def hold_flusher(log: Log, when: str, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold the roll's flush ``before`` it starts (on the log's flush lock) or ``during`` it
    (in its first fsync, after it took the segments to flush) until the event is set."""
    go = threading.Event()
    if when == "before":
        log._flush_lock.acquire()

        def release() -> None:
            go.wait(10)
            log._flush_lock.release()
        threading.Thread(target=release).start()
        return go
    real = disk.fsync

    def fsync(fd: int) -> Any:
        if threading.current_thread().name.startswith("log-flusher"):
            go.wait(10)
        return real(fd)
    monkeypatch.setattr(disk, "fsync", fsync)
    return go


@pytest.mark.parametrize("when", ["before", "during"])
async def test_a_truncation_around_the_rolls_flush_keeps_the_recovery_point_in_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    logs = tmp_path / "logs"
    lm = open_manager(logs)
    log = lm.create_log("t", 0)
    go = hold_flusher(log, when, monkeypatch)
    try:
        fill(log)
        assert log.active_segment.base_offset > 5
        if when == "during":
            for _ in range(5000):  # until the flusher took the segments (5 s at most)
                if log._flush_lock.locked():
                    break
                await asyncio.sleep(0.001)
            assert log._flush_lock.locked(), "the roll's flush never started"
        assert log.truncate_to(5)
    finally:
        go.set()
    await wait_flushed(lm, logs)
    assert log.log_end_offset == 5
    assert log.recovery_point <= 5
    fill(log, 1)
    assert log.log_end_offset == 6
    assert log.recovery_point <= 5, "offset 5 was never fsynced"
    lm.shutdown()
