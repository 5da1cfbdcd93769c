"""The log dir's writer thread (broker/log/writer.py): with flush.messages=1 the event loop
assigns offsets and the writer writes and fsyncs, in order, off the loop.

Each test runs the broker's real parts (tests/support/components.py) on log dirs ``a`` and
``b`` and checks the contract: the loop never writes nor fsyncs a batch itself, the high
watermark (and every acknowledgement) waits for the write and its fsync, writes land in
append order, a failed write or fsync takes only its dir offline with nothing past it
readable or acknowledged, closing waits for what is queued, and a torn tail left by a crash
mid-write is cut at the next start with every acknowledged record kept.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from broker.log import disk
from broker.log.manager import CLEAN_SHUTDOWN_FILE
from broker.log.writer import write_all
from protocol.errors import ErrorCode
from tests.support.components import build
from tests.support.requests import record_batch
from tests.unit.test_disk_faults import (
    STORAGE,
    TOPIC,
    TP,
    DiskFault,
    TwoDirs,
    fetch,
    produce,
    read_all,
    start,
    wait,
)

FLUSH_EACH = {"flush.messages": "1"}


class Calls:
    """Records which thread made each write or fsync of a ``.log`` file (and the position of
    each write), passing every call on to the real disk."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str, str, int]] = []  # (call, thread, path, position)
        for name in ("pwrite", "pwritev", "fsync"):
            monkeypatch.setattr(disk, name, self._wrap(name, getattr(disk, name)))

    def _wrap(self, name: str, real: Any) -> Any:
        def call(fd: int, *args: Any) -> Any:
            path = os.readlink(f"/proc/self/fd/{fd}")
            if path.endswith(".log"):
                position = args[1] if args else -1
                self.calls.append((name, threading.current_thread().name, path, position))
            return real(fd, *args)
        return call

    def on_loop(self) -> list[tuple[str, str, str, int]]:
        main = threading.main_thread().name
        return [c for c in self.calls if c[1] == main]


async def test_the_loop_never_writes_and_every_answer_waits_for_the_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = start(tmp_path, FLUSH_EACH)
    c = d.c
    calls = Calls(monkeypatch)
    try:
        parked = [produce(c, tp, [f"{tp[1]}-{i}".encode() * 50], acks=ack)
                  for i in range(40) for tp, ack in ((d.tp_a, -1), (d.tp_b, 1))]
        assert all(not isinstance(p, dict) for p in parked), "answered before the fsync"
        assert d.partition(d.tp_a).log_end_offset == 40, "offsets are assigned on append"
        answers = [await wait(p) for p in parked]
        assert all(r.error == ErrorCode.NONE for a in answers for r in a.values())
        for tp in (d.tp_a, d.tp_b):
            p = d.partition(tp)
            assert (p.high_watermark, p.log.recovery_point, p.log_end_offset) == (40, 40, 40)
            assert read_all(c, tp) == [(i, f"{tp[1]}-{i}".encode() * 50) for i in range(40)]
        assert calls.on_loop() == []
        assert {(c[0], c[1]) for c in calls.calls} <= {
            (call, f"{thread} {log_dir}") for log_dir in (d.a, d.b)
            for call, thread in (("pwrite", "log-writer"), ("pwritev", "log-writer"),
                                 ("fsync", "log-syncer"))}
        # In order: each write of a file starts where the one before it ended (or after).
        for path in {c[2] for c in calls.calls}:
            positions = [c[3] for c in calls.calls if c[2] == path and c[0] != "fsync"]
            assert positions == sorted(positions) and positions[0] == 0
    finally:
        await c.close()


async def test_reads_stop_at_the_high_watermark_while_writes_are_queued(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fsync held back keeps the high watermark, and every client read, at what is durable."""
    d = start(tmp_path, FLUSH_EACH)
    c, tp = d.c, d.tp_b
    release = threading.Event()
    real_fsync = disk.fsync

    def held(fd: int) -> None:
        release.wait(10)
        real_fsync(fd)

    try:
        first = await wait(produce(c, tp, [b"durable"], acks=-1))
        assert first[tp].error == ErrorCode.NONE
        monkeypatch.setattr(disk, "fsync", held)
        parked = [produce(c, tp, [b"queued-%d" % i], acks=-1) for i in range(5)]
        await asyncio.sleep(0.05)
        p = d.partition(tp)
        assert (p.high_watermark, p.log_end_offset) == (1, 6)
        assert read_all(c, tp) == [(0, b"durable")]
        assert not any(f.done() for f in parked)
        release.set()
        for f in parked:
            assert (await wait(f))[tp].error == ErrorCode.NONE
        assert p.high_watermark == 6
        assert [v for _, v in read_all(c, tp)][1:] == [b"queued-%d" % i for i in range(5)]
    finally:
        release.set()
        await c.close()


async def test_a_failed_write_on_the_writer_answers_storage_error_and_writes_nothing_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = start(tmp_path, FLUSH_EACH)
    c, tp_a, tp_b = d.c, d.tp_a, d.tp_b
    try:
        assert (await wait(produce(c, tp_b, [b"kept"], acks=-1)))[tp_b].error == ErrorCode.NONE
        size_before = _log_size(d, tp_b)
        faults = [DiskFault(monkeypatch, call, d.b, suffix=".log")
                  for call in ("pwrite", "pwritev")]
        parked_fetch = fetch(c, tp_b, 1, max_wait_ms=30_000)
        answers = [produce(c, tp_b, [b"lost-%d" % i * 300], acks=ack)
                   for i, ack in enumerate((-1, 1, -1))]
        for f in answers:
            assert (await wait(f))[tp_b].error == STORAGE
        [fetched] = await wait(parked_fetch)
        assert fetched.error == STORAGE
        assert sum(f.failed for f in faults) == 1, "written after the dir failed"
        for f in faults:
            f.armed = False
        pb = d.partition(tp_b)
        assert (pb.high_watermark, pb.log.recovery_point) == (1, 1)
        assert _log_size(d, tp_b) == size_before
        assert c.log_manager.offline_dirs == 1
        assert (await wait(produce(c, tp_a, [b"a"], acks=-1)))[tp_a].error == ErrorCode.NONE
    finally:
        await c.close()
    assert not (d.b / CLEAN_SHUTDOWN_FILE).exists()
    again = start(tmp_path)
    try:
        assert read_all(again.c, tp_b) == [(0, b"kept")]
        assert (await wait(produce(again.c, tp_b, [b"next"], acks=-1)))[tp_b].base_offset == 1
    finally:
        await again.c.close()


async def test_closing_waits_for_the_queued_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shut down (and delete a topic) while the writer is held: every queued batch is written
    before a file closes, so the clean restart reads them all."""
    d = start(tmp_path, FLUSH_EACH)
    c, tp = d.c, d.tp_b
    release = threading.Event()
    real_pwrite = disk.pwrite

    def held(fd: int, data: Any, position: int) -> int:
        release.wait(10)
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(disk, "pwrite", held)
    parked = [produce(c, tp, [b"v%d" % i], acks=1) for i in range(10)]
    c.topics.create_topic("gone", 1, FLUSH_EACH)
    produce(c, ("gone", 0), [b"g"], acks=1)
    threading.Timer(0.1, release.set).start()
    c.topics.delete_topic("gone")
    await c.close()
    assert [f.done() for f in parked] == [True] * 10
    assert (d.b / CLEAN_SHUTDOWN_FILE).exists()
    monkeypatch.setattr(disk, "pwrite", real_pwrite)
    again = start(tmp_path)
    try:
        assert read_all(again.c, tp) == [(i, b"v%d" % i) for i in range(10)]
    finally:
        await again.c.close()


async def test_a_crash_mid_write_leaves_a_torn_tail_that_the_next_start_cuts(
        tmp_path: Path) -> None:
    d = start(tmp_path, FLUSH_EACH)
    c, tp = d.c, d.tp_b
    acked = []
    try:
        for i in range(5):
            answer = await wait(produce(c, tp, [b"acked-%d" % i], acks=-1))
            acked.append((answer[tp].base_offset, b"acked-%d" % i))
    finally:
        await c.close()
    # What a crash in the writer's pwrite leaves: part of the next batch, no marker.
    torn = record_batch([b"never acknowledged" * 20])
    segment = sorted((d.b / f"{tp[0]}-{tp[1]}").glob("*.log"))[-1]
    with open(segment, "ab") as f:
        f.write(torn[: len(torn) // 2])
    (d.b / CLEAN_SHUTDOWN_FILE).unlink()
    again = start(tmp_path, FLUSH_EACH)
    try:
        assert read_all(again.c, tp) == acked
        answer = await wait(produce(again.c, tp, [b"after"], acks=-1))
        assert answer[tp].base_offset == 5
        assert read_all(again.c, tp)[-1] == (5, b"after")
    finally:
        await again.c.close()


async def test_leaving_flush_per_message_drains_the_writer_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append written on the loop after the switch never lands before queued ones."""
    d = start(tmp_path, FLUSH_EACH)
    c, tp = d.c, d.tp_b
    calls = Calls(monkeypatch)
    try:
        parked = [produce(c, tp, [b"q%d" % i], acks=1) for i in range(5)]
        c.topics.alter_topic_configs(tp[0], {"flush.messages": "10"})
        after = produce(c, tp, [b"after"], acks=1)
        if not isinstance(after, dict):
            after = await wait(after)
        assert after[tp].base_offset == 5
        for f in parked:
            assert (await wait(f))[tp].error == ErrorCode.NONE
        positions = [x[3] for x in calls.calls if x[0] != "fsync" and x[2].startswith(str(d.b))]
        assert positions == sorted(positions)
        assert [v for _, v in read_all(c, tp)] == [b"q%d" % i for i in range(5)] + [b"after"]
    finally:
        await c.close()


def test_write_all_coalesces_contiguous_writes_and_finishes_short_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    seen: list[int] = []
    real = os.pwritev

    def short_pwritev(fd_: int, bufs: list[Any], position: int) -> int:
        seen.append(len(bufs))
        whole = b"".join(bytes(b) for b in bufs)
        return real(fd_, [whole[: len(whole) // 2 + 1]], position)

    monkeypatch.setattr(disk, "pwritev", short_pwritev)
    try:
        write_all([(fd, b"aaa", 0), (fd, bytearray(b"bbbb"), 3), (fd, memoryview(b"cc"), 7),
                   (fd, b"zz", 20)])
        assert seen == [3]
        assert os.pread(fd, 22, 0) == b"aaabbbbcc" + b"\0" * 11 + b"zz"
    finally:
        os.close(fd)


def _log_size(d: TwoDirs, tp: TP) -> int:
    return sum(p.stat().st_size for p in (d.b / f"{tp[0]}-{tp[1]}").glob("*.log"))


async def test_without_writers_flush_per_message_still_waits_for_the_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LogManager(log_dir_writers=False): the loop writes, the flusher fsyncs, and the high
    watermark never passes either."""
    a = tmp_path / "c"
    c = build(a, {"offsets.topic.num.partitions": "1"})
    c.log_manager.log_dir_writers = False
    c.topics.create_topic(TOPIC, 1, FLUSH_EACH)
    tp = (TOPIC, 0)
    try:
        parked = [produce(c, tp, [b"v%d" % i], acks=ack)
                  for i, ack in enumerate((1, -1, 1, -1))]
        p = c.replica_manager.partitions[tp]
        assert p.log.writer is None and p.high_watermark == 0
        for f in parked:
            assert (await wait(f))[tp].error == ErrorCode.NONE
        assert (p.high_watermark, p.log.recovery_point) == (4, 4)
        assert [v for _, v in read_all(c, tp)] == [b"v%d" % i for i in range(4)]
    finally:
        await c.close()
