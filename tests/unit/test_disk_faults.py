"""Disk faults take a log dir offline, as Kafka's LogDirFailureChannel and handleLogDirFailure do.

The broker's real parts (tests/support/components.py) run on two log dirs, ``a`` and ``b``; the
disk under ``b`` fails through the log's one file-I/O seam (broker/log/disk.py): a call made
on a file of ``b`` raises the OSError a full or broken disk raises there. Nothing of the
broker is replaced. Each test checks Kafka's contract: the partitions of ``b`` answer
KAFKA_STORAGE_ERROR, no failed batch is acknowledged or readable, the high watermark never
passes what was written, ``a`` goes on, and a restart brings ``b`` back with every
acknowledged record.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from broker.log import disk
from broker.log.manager import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT_FILE
from broker.replica.partition import Partition
from broker.replica.replica_manager import PartitionFetch
from protocol.errors import ErrorCode
from tests.support.components import Components, build, settle
from tests.support.requests import fetched_values, record_batch

TOPIC = "events"
PRODUCE_VERSION = 9
MAX_BYTES = 1 << 20
STORAGE = ErrorCode.KAFKA_STORAGE_ERROR
TP = tuple[str, int]


class DiskFault:
    """One of the seam's calls fails, for the files under ``under`` whose path ends with
    ``suffix``, with ``err``; ``short_write`` lets a pwrite take half its bytes first, as a
    disk filling up does. ``failed`` counts the calls that hit the fault."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, call: str, under: Path, *,
                 err: int = errno.ENOSPC, suffix: str = "", short_write: bool = False) -> None:
        self.call, self.under, self.err, self.suffix = call, str(under) + os.sep, err, suffix
        self.short_write = short_write
        self.real: Callable[..., Any] = getattr(disk, call)
        self.failed = 0
        self.armed = True
        monkeypatch.setattr(disk, call, self._call)

    def _call(self, target: int | str | Path, *args: Any) -> Any:
        path = os.readlink(f"/proc/self/fd/{target}") if isinstance(target, int) else str(target)
        if not (self.armed and path.startswith(self.under) and path.endswith(self.suffix)):
            return self.real(target, *args)
        self.failed += 1
        if self.short_write and self.failed == 1 and len(args[0]) > 1:
            data, position = args
            return self.real(target, bytes(data[: len(data) // 2]), position)
        raise OSError(self.err, os.strerror(self.err), path)


@dataclass
class TwoDirs:
    c: Components
    a: Path
    b: Path
    tp_a: TP  # a partition whose log is in a
    tp_b: TP  # one in b, whose disk fails

    def partition(self, tp: TP) -> Partition:
        return self.c.replica_manager.partitions[tp]


def start(tmp_path: Path, topic_configs: dict[str, str] | None = None) -> TwoDirs:
    """Components on log dirs a and b; TOPIC has one partition in each (fewest logs first)."""
    a, b = tmp_path / "a", tmp_path / "b"
    c = build(a, {"log.dirs": f"{a},{b}", "offsets.topic.num.partitions": "1"})
    if TOPIC not in c.metadata.topics:
        c.topics.create_topic(TOPIC, 2, topic_configs or {})
    dirs = {p: c.log_manager.log_dir_of((TOPIC, p)) for p in (0, 1)}
    [pa] = [p for p, d in dirs.items() if d == a]
    [pb] = [p for p, d in dirs.items() if d == b]
    return TwoDirs(c, a, b, (TOPIC, pa), (TOPIC, pb))


@pytest.fixture
async def dirs(tmp_path: Path) -> AsyncIterator[TwoDirs]:
    d = start(tmp_path)
    yield d
    await d.c.close()


def produce(c: Components, tp: TP, values: list[bytes], *, acks: int = 1) -> Any:
    return c.replica_manager.append_records([(tp, record_batch(values))], PRODUCE_VERSION, acks,
                                            30_000)


def produce_now(c: Components, tp: TP, values: list[bytes]) -> tuple[ErrorCode, int]:
    """(error, base offset) of an acks=1 produce that must be answered at once."""
    answer = produce(c, tp, values)
    assert answer.done(), "answered later: it was parked"
    result = answer.result()
    return result[tp].error, result[tp].base_offset


def fetch(c: Components, tp: TP, offset: int, **kw: int) -> Any:
    return c.replica_manager.fetch_messages([PartitionFetch(tp, offset, MAX_BYTES)], MAX_BYTES,
                                            kw.get("min_bytes", 1), kw.get("max_wait_ms", 0))


def read_all(c: Components, tp: TP) -> list[tuple[int, bytes | None]]:
    answer = fetch(c, tp, 0)
    assert answer.done(), "a fetch without a wait was parked"
    [result] = answer.result()
    assert result.error == ErrorCode.NONE, result
    return fetched_values(result.records)


async def wait(fut: Any, seconds: float = 10) -> Any:
    """Await what a flusher thread completes (bounded: a hang fails the test)."""
    try:
        return await asyncio.wait_for(asyncio.ensure_future(fut), seconds)
    except TimeoutError:
        raise AssertionError(f"not answered within {seconds}s") from None


def segment_sizes(log_dir: Path, tp: TP, suffix: str = ".log") -> list[int]:
    return [p.stat().st_size for p in sorted((log_dir / f"{tp[0]}-{tp[1]}").glob(f"*{suffix}"))]


def errors_logged(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["log_level"] == "error"]


# -- append ---------------------------------------------------------------------------------------

async def test_a_full_disk_on_append_takes_only_its_dir_offline(
        dirs: TwoDirs, monkeypatch: pytest.MonkeyPatch) -> None:
    c, tp_a, tp_b = dirs.c, dirs.tp_a, dirs.tp_b
    assert produce_now(c, tp_b, [b"b0", b"b1"]) == (ErrorCode.NONE, 0)
    assert produce_now(c, tp_a, [b"a0"]) == (ErrorCode.NONE, 0)
    before = segment_sizes(dirs.b, tp_b)
    fault = DiskFault(monkeypatch, "pwrite", dirs.b, suffix=".log", short_write=True)
    try:
        with capture_logs() as logs:
            assert produce_now(c, tp_b, [b"x" * 1000]) == (STORAGE, -1)
            await settle()
            assert fault.failed == 2, "the short write, then the refusal"
            assert segment_sizes(dirs.b, tp_b) == before, "half a batch stayed in the segment"
            # Offline: refused before any write, the dir is never touched again.
            assert produce_now(c, tp_b, [b"y"]) == (STORAGE, -1)
            assert fault.failed == 2
            [errors] = [errors_logged(logs)]
        assert len(errors) == 1, errors
        assert errors[0]["log_dir"] == str(dirs.b) and errors[0]["errno"] == errno.ENOSPC
        assert "No space left on device" in errors[0]["error"]
    finally:
        fault.armed = False
    pb = dirs.partition(tp_b)
    assert (pb.log_end_offset, pb.high_watermark) == (2, 2), "offsets moved for a failed batch"
    [result] = fetch(c, tp_b, 0).result()
    assert (result.error, result.records, result.high_watermark) == (STORAGE, b"", -1)
    assert c.replica_manager.partition_or_error(tp_b) == (None, STORAGE)
    assert c.log_manager.offline_dirs == 1
    assert c.log_manager.live_log_dirs == [dirs.a]
    # The other dir goes on, for writes and reads.
    assert produce_now(c, tp_a, [b"a1"]) == (ErrorCode.NONE, 1)
    assert read_all(c, tp_a) == [(0, b"a0"), (1, b"a1")]
    assert c.replica_manager.partition_or_error(tp_a) == (dirs.partition(tp_a), ErrorCode.NONE)
    # New logs go to the live dir only.
    c.topics.create_topic("later", 2, {})
    assert {c.log_manager.log_dir_of(("later", p)) for p in (0, 1)} == {dirs.a}


async def test_a_failed_index_write_takes_the_dir_offline_and_keeps_what_was_acknowledged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Index entries stay in memory until a flush writes them; writing them fails (EIO): the
    dir goes offline, and the batches acknowledged before are all there after the restart,
    their index rebuilt by recovery."""
    d = start(tmp_path, {"index.interval.bytes": "1"})
    c, tp_b = d.c, d.tp_b
    try:
        assert produce_now(c, tp_b, [b"first"]) == (ErrorCode.NONE, 0)
        assert produce_now(c, tp_b, [b"second"]) == (ErrorCode.NONE, 1)
        assert segment_sizes(d.b, tp_b, ".index") == [0], "written at append"
        fault = DiskFault(monkeypatch, "pwrite", d.b, err=errno.EIO, suffix=".index")
        c.log_manager.flush_all()
        assert fault.failed == 1
        fault.armed = False
        assert c.log_manager.offline_dirs == 1
        assert produce_now(c, tp_b, [b"refused"]) == (STORAGE, -1)
    finally:
        await c.close()
    again = start(tmp_path)
    try:
        assert read_all(again.c, tp_b) == [(0, b"first"), (1, b"second")]
        assert produce_now(again.c, tp_b, [b"third"]) == (ErrorCode.NONE, 2)
        assert read_all(again.c, tp_b)[-1] == (2, b"third")
    finally:
        await again.c.close()


async def test_a_failed_roll_assigns_no_offsets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next batch needs a new segment, whose file can not be created."""
    d = start(tmp_path, {"segment.bytes": "200"})
    c, tp_b = d.c, d.tp_b
    try:
        assert produce_now(c, tp_b, [b"x" * 100]) == (ErrorCode.NONE, 0)
        fault = DiskFault(monkeypatch, "open_file", d.b, suffix=".log")
        assert produce_now(c, tp_b, [b"y" * 100]) == (STORAGE, -1)
        assert fault.failed == 1
        fault.armed = False
        log = d.partition(tp_b).log
        assert (log.log_end_offset, log.num_segments) == (1, 1)
        assert [v for _, v in fetched_values(log.read(0, MAX_BYTES))] == [b"x" * 100]
        assert produce_now(c, d.tp_a, [b"a"]) == (ErrorCode.NONE, 0)
    finally:
        await c.close()


async def test_a_failed_read_answers_the_fetch_with_a_storage_error(
        dirs: TwoDirs, monkeypatch: pytest.MonkeyPatch) -> None:
    c = dirs.c
    produce_now(c, dirs.tp_b, [b"b"])
    produce_now(c, dirs.tp_a, [b"a"])
    fault = DiskFault(monkeypatch, "pread", dirs.b, err=errno.EIO, suffix=".log")
    try:
        answer = c.replica_manager.fetch_messages(
            [PartitionFetch(dirs.tp_b, 0, MAX_BYTES), PartitionFetch(dirs.tp_a, 0, MAX_BYTES)],
            MAX_BYTES, 1, 0)
    finally:
        fault.armed = False
    assert answer.done(), "a fetch without a wait was parked"
    results = answer.result()
    assert [r.error for r in results] == [STORAGE, ErrorCode.NONE]
    assert fetched_values(results[1].records) == [(0, b"a")]
    assert c.log_manager.offline_dirs == 1


# -- flush ----------------------------------------------------------------------------------------

async def test_a_failed_fsync_is_never_acknowledged_nor_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flush.messages=1: the high watermark (and acks=all) waits for the fsync. When it fails,
    the parked produce answers KAFKA_STORAGE_ERROR, a parked fetch answers too, and the high
    watermark stays at the last fsynced offset."""
    d = start(tmp_path, {"flush.messages": "1"})
    c, tp_a, tp_b = d.c, d.tp_a, d.tp_b
    try:
        first = await wait(produce(c, tp_b, [b"durable"], acks=-1))
        assert first[tp_b].error == ErrorCode.NONE
        pb = d.partition(tp_b)
        assert pb.high_watermark == pb.log.recovery_point == 1
        parked_fetch = fetch(c, tp_b, 1, max_wait_ms=30_000)
        assert not isinstance(parked_fetch, list)
        fault = DiskFault(monkeypatch, "fsync", d.b, err=errno.EIO)
        answer = await wait(produce(c, tp_b, [b"lost"], acks=-1))
        assert answer[tp_b].error == STORAGE  # the wire carries base offset -1 with an error
        [fetched] = await wait(parked_fetch)
        assert fetched.error == STORAGE
        assert fault.failed == 1
        assert (pb.high_watermark, pb.log.recovery_point) == (1, 1)
        # Refused from now on, without another fsync (after a failed one it proves nothing).
        again = await wait(produce(c, tp_b, [b"again"], acks=-1))
        assert again[tp_b].error == STORAGE
        assert c.log_manager.flush_all() is None and fault.failed == 1
        # The other dir still fsyncs and acknowledges.
        other = await wait(produce(c, tp_a, [b"a"], acks=-1))
        assert other[tp_a].error == ErrorCode.NONE
        assert d.partition(tp_a).high_watermark == 1
        fault.armed = False
    finally:
        await c.close()


async def test_a_produce_parked_on_two_dirs_answers_each_partition(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One acks=all request for a partition of each dir; b's fsync fails while a's is still
    running: b is answered KAFKA_STORAGE_ERROR, and the request still waits for a's fsync."""
    d = start(tmp_path, {"flush.messages": "1"})
    c, tp_a, tp_b = d.c, d.tp_a, d.tp_b
    a_may_finish = threading.Event()
    real_fsync = disk.fsync

    def slow_on_a(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(f"{d.a}{os.sep}"):
            a_may_finish.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(disk, "fsync", slow_on_a)
    fault = DiskFault(monkeypatch, "fsync", d.b, err=errno.EIO)
    try:
        parked = c.replica_manager.append_records(
            [(tp_a, record_batch([b"a"])), (tp_b, record_batch([b"b"]))], PRODUCE_VERSION, -1,
            30_000)
        assert not isinstance(parked, dict)
        for _ in range(1000):
            await asyncio.sleep(0.005)
            if c.log_manager.offline_dirs:
                break
        await settle()
        assert fault.failed == 1
        assert not parked.done(), "answered before the fsync of a"
        a_may_finish.set()
        answer = await wait(parked)
        assert (answer[tp_a].error, answer[tp_b].error) == (ErrorCode.NONE, STORAGE)
        assert (d.partition(tp_a).high_watermark, d.partition(tp_b).high_watermark) == (1, 0)
        fault.armed = False
    finally:
        a_may_finish.set()
        await c.close()


# -- checkpoint -----------------------------------------------------------------------------------

async def test_a_failed_checkpoint_takes_its_dir_offline_and_the_others_are_written(
        dirs: TwoDirs, monkeypatch: pytest.MonkeyPatch) -> None:
    c = dirs.c
    produce_now(c, dirs.tp_a, [b"a"])
    for d in (dirs.a, dirs.b):
        (d / RECOVERY_POINT_CHECKPOINT_FILE).unlink(missing_ok=True)
    fault = DiskFault(monkeypatch, "write", dirs.b)
    try:
        c.log_manager.checkpoint()  # never raises: a checkpoint loop outlives one bad disk
    finally:
        fault.armed = False
    assert fault.failed == 1
    assert (dirs.a / RECOVERY_POINT_CHECKPOINT_FILE).exists()
    assert not (dirs.b / RECOVERY_POINT_CHECKPOINT_FILE).exists()
    assert c.log_manager.offline_dirs == 1
    assert produce_now(c, dirs.tp_b, [b"b"]) == (STORAGE, -1)
    assert produce_now(c, dirs.tp_a, [b"a"]) == (ErrorCode.NONE, 1)


# -- restart --------------------------------------------------------------------------------------

async def test_a_restart_brings_the_dir_back_with_every_acknowledged_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = start(tmp_path, {"index.interval.bytes": "100"})
    c, tp_a, tp_b = d.c, d.tp_a, d.tp_b
    acked: list[tuple[int, bytes | None]] = []
    try:
        for i in range(20):
            values = [f"rec-{i}-{j}".encode() * (i + 1) for j in range(3)]
            error, base = produce_now(c, tp_b, values)
            assert error == ErrorCode.NONE
            acked += [(base + j, v) for j, v in enumerate(values)]
        c.log_manager.checkpoint()
        produce_now(c, tp_b, [b"after the checkpoint"])
        acked.append((60, b"after the checkpoint"))
        produce_now(c, tp_a, [b"a"])
        fault = DiskFault(monkeypatch, "pwrite", d.b, short_write=True)
        assert produce_now(c, tp_b, [b"z" * 5000]) == (STORAGE, -1)
        fault.armed = False
    finally:
        await c.close()
    # Only the live dir was closed cleanly: the failed one is recovered at the next start.
    assert (d.a / CLEAN_SHUTDOWN_FILE).exists()
    assert not (d.b / CLEAN_SHUTDOWN_FILE).exists()
    again = start(tmp_path)
    try:
        assert again.c.log_manager.offline_dirs == 0
        assert read_all(again.c, tp_b) == acked
        assert again.partition(tp_b).high_watermark == len(acked)
        assert produce_now(again.c, tp_b, [b"new"]) == (ErrorCode.NONE, len(acked))
        assert read_all(again.c, tp_a) == [(0, b"a")]
    finally:
        await again.c.close()
