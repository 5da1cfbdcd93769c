"""LogDirWriter: per log dir, threads that write and fsync appended batches, in order.

For a log that fsyncs every batch (``flush.messages=1``) the append on the event loop
validates, assigns offsets and updates the log's in-memory state in arrival order, then hands
the batch's bytes here. A write thread writes them in submission order (contiguous writes to
one file as one ``pwritev``); a sync thread fsyncs each log up to what is written, then tells
the event loop up to which offset each log is durable; the high watermark moves on that event.
So the loop never waits on the disk on that path, and everything written while one fsync runs
is covered by the next one (a group commit across the dir's logs).

A failed write or fsync takes the dir offline through the log's failure channel. Whatever was
queued behind it is never written (every log of the dir refuses writes from then on), so
nothing past the failure becomes durable or visible, and recovery after the restart cuts any
torn tail. ``drain`` waits until everything submitted so far is done: a segment's files are
closed, deleted or swapped only after it, so no queued write ever lands on a closed fd.

A third thread, started by the first roll, flushes the rolled segments of the dir's logs
not written here (``flush_later``, the flush Kafka's roll schedules): their data and indexes
are fsynced and the log's recovery point moves to the new segment's base offset, off the loop
and without holding up the fsyncs that acknowledgements wait for.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import TYPE_CHECKING

import structlog

from broker.log import disk
from broker.log.dir_failure import KafkaStorageError

if TYPE_CHECKING:
    from broker.log.log import Log

__all__ = ["LogDirWriter", "Write", "write_all"]

logger = structlog.get_logger("broker.log")

#: One positional write: (fd, bytes, file position).
Write = tuple[int, "bytes | bytearray | memoryview", int]
#: What the loop is told per log: (durable end offset, seconds the fsync took).
Durable = dict["Log", tuple[int, float]]

try:
    _IOV_MAX = os.sysconf("SC_IOV_MAX")
except (ValueError, OSError):
    _IOV_MAX = 1024


def write_all(writes: list[Write]) -> None:
    """Write every ``(fd, data, position)``; runs of contiguous writes to one fd go as one
    ``pwritev``, a lone write as one ``pwrite``. Raises the first OSError, with the fd it
    failed on as its ``fd`` attribute."""
    i, n = 0, len(writes)
    while i < n:
        fd, data, pos = writes[i]
        end = pos + len(data)
        j = i + 1
        while j < n and j - i < _IOV_MAX and writes[j][0] == fd and writes[j][2] == end:
            end += len(writes[j][1])
            j += 1
        try:
            if j == i + 1:
                _pwrite_all(fd, data, pos)
            else:
                _pwritev_all(fd, [w[1] for w in writes[i:j]], pos)
        except OSError as e:
            e.fd = fd  # type: ignore[attr-defined]
            raise
        i = j


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
    view = memoryview(data)
    written, n = 0, len(view)
    while written < n:
        written += disk.pwrite(fd, view[written:], pos + written)


def _pwritev_all(fd: int, bufs: list[bytes | bytearray | memoryview], pos: int) -> None:
    done = disk.pwritev(fd, bufs, pos)
    if done == sum(len(b) for b in bufs):
        return
    # A short write (a disk filling up): finish buffer by buffer from where it stopped.
    offset = pos
    for buf in bufs:
        size = len(buf)
        if done >= size:
            done -= size
        else:
            _pwrite_all(fd, memoryview(buf)[done:], offset + done)
            done = 0
        offset += size


class _Request:
    __slots__ = ("log", "writes", "end_offset")

    def __init__(self, log: Log, writes: list[Write], end_offset: int) -> None:
        self.log = log
        self.writes = writes
        self.end_offset = end_offset


class LogDirWriter:
    """The writer of one log dir: a write thread and a sync thread, started on first submit.

    The write thread writes each queued batch as soon as it can; the sync thread fsyncs each
    log up to what the write thread finished, so the next batches are written while an fsync
    runs and the next fsync covers all of them (a group commit, as one flusher behind a
    writing loop has, without the loop). ``submit`` and ``drain`` may be called from any
    thread but the writer's own; completions are delivered on ``loop`` through
    ``Log.on_written``.
    """

    def __init__(self, log_dir: str, loop: asyncio.AbstractEventLoop) -> None:
        self.log_dir = log_dir
        self._loop = loop
        # One lock, three conditions, so each event wakes only who waits for it.
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the write thread: something queued
        self._synced = threading.Condition(lock)  # drains: something fsynced
        self._written = threading.Condition(lock)  # the sync thread: something written
        self._queue: list[_Request] = []
        #: written, not yet fsynced: the highest end offset per log, and the last request
        #: number covered (requests are numbered from 1 as submitted).
        self._to_sync: dict[Log, int] = {}
        self._flushed = threading.Condition(lock)  # the flusher: a roll to flush; its waiters
        #: rolled logs to flush, each up to the base offset of its newest segment
        self._rolls: dict[Log, int] = {}
        self._flushing = False
        self._flusher: threading.Thread | None = None
        self._written_seq = 0
        self._submitted = 0
        self._completed = 0
        self._stopping = False
        self._threads: list[threading.Thread] = []

    @property
    def pending(self) -> bool:
        """Whether something submitted is not yet written and fsynced (or dropped)."""
        return self._completed < self._submitted

    def submit(self, log: Log, writes: list[Write], end_offset: int) -> None:
        """Queue ``writes`` of ``log``; once written and fsynced, ``log.on_written(end_offset,
        seconds)`` runs on the loop."""
        with self._cond:
            if self._stopping:
                raise RuntimeError(f"the writer of {self.log_dir} is closed")
            self._queue.append(_Request(log, writes, end_offset))
            self._submitted += 1
            if not self._threads:
                self._start()
            self._cond.notify()

    def flush_later(self, log: Log, offset: int) -> None:
        """Flush ``log`` below ``offset`` on the flusher thread (``Log.flush_rolled``); one
        pending flush per log, to its highest offset. Dropped once the writer closes: the
        close of the log flushes everything."""
        with self._flushed:
            if self._stopping:
                return
            if offset > self._rolls.get(log, -1):
                self._rolls[log] = offset
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._run_flushes, daemon=True,
                                                 name=f"log-flusher {self.log_dir}")
                self._flusher.start()
            self._flushed.notify_all()

    def wait_flushed(self) -> None:
        """Wait until the rolled logs handed over so far are flushed (or dropped)."""
        with self._flushed:
            while self._rolls or self._flushing:
                self._flushed.wait()

    def _start(self) -> None:
        for target, name in ((self._run_writes, "log-writer"), (self._run_syncs, "log-syncer")):
            thread = threading.Thread(target=target, name=f"{name} {self.log_dir}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def drain(self) -> None:
        """Wait until everything submitted so far is written and fsynced, or dropped because
        the dir failed. Never call it from the writer's threads (they would wait for
        themselves)."""
        if threading.current_thread() in self._threads:
            return
        with self._synced:
            target = self._submitted
            while self._completed < target:
                self._synced.wait()

    def close(self) -> None:
        """Finish what is queued, then stop the threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            self._written.notify_all()
            self._flushed.notify_all()
            threads = list(self._threads)
            if self._flusher is not None:
                threads.append(self._flusher)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()

    # -- the write thread -------------------------------------------------------------------
    def _run_writes(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._stopping:
                    cond.wait()
                batch, self._queue = self._queue, []
                if not batch:
                    return  # stopping, and nothing left
            try:
                ends = self._write(batch)
            except Exception:  # a bug, not the disk: never leave a drain waiting
                logger.exception("log dir writer failed", log_dir=self.log_dir)
                ends = {}
            with cond:
                for log, end in ends.items():
                    self._to_sync[log] = end
                self._written_seq += len(batch)
                self._written.notify()

    def _write(self, batch: list[_Request]) -> dict[Log, int]:
        """Write the batch in order; each log's end offset written (none if a write failed)."""
        writes: list[Write] = []
        ends: dict[Log, int] = {}
        owners: dict[int, Log] = {}
        for request in batch:
            log = request.log
            if log.offline or log.closed:
                continue  # its dir failed earlier: never written (or closed: nothing to do)
            writes.extend(request.writes)
            ends[log] = request.end_offset
            for fd, _data, _pos in request.writes:
                owners[fd] = log
        if not ends:
            return {}
        try:
            write_all(writes)
        except OSError as e:
            failed = owners.get(getattr(e, "fd", -1)) or next(iter(ends))
            failed.dir_failed("writing", e)  # the whole dir goes offline: nothing more is written
            return {}
        return ends

    # -- the flusher thread -----------------------------------------------------------------
    def _run_flushes(self) -> None:
        cond = self._flushed
        while True:
            with cond:
                while not self._rolls and not self._stopping:
                    cond.wait()
                rolls, self._rolls = self._rolls, {}
                if not rolls:
                    return  # stopping, and nothing left
                self._flushing = True
            try:
                for log, offset in rolls.items():
                    if log.offline or log.closed:
                        continue
                    try:
                        log.flush_rolled(offset)
                    except KafkaStorageError:
                        pass  # the dir is offline (logged once): the recovery point stays
                    except Exception:  # a bug, not the disk: the next flush covers it
                        logger.exception("flushing a rolled segment failed",
                                         log_dir=self.log_dir, log=repr(log))
            finally:
                with cond:
                    self._flushing = False
                    cond.notify_all()

    # -- the sync thread --------------------------------------------------------------------
    def _run_syncs(self) -> None:
        cond = self._written
        while True:
            with cond:
                while self._written_seq == self._completed and not (
                        self._stopping and not self._queue and not self._to_sync
                        and self._written_seq == self._submitted):
                    cond.wait()
                if self._written_seq == self._completed:
                    return  # stopping, and everything is done
                to_sync, self._to_sync = self._to_sync, {}
                covered = self._written_seq
            try:
                durable = self._sync(to_sync)
            except Exception:  # a bug, not the disk: never leave a drain waiting
                logger.exception("log dir syncer failed", log_dir=self.log_dir)
                durable = {}
            with cond:
                self._completed = covered
                self._synced.notify_all()
            if durable:
                self._deliver(durable)

    @staticmethod
    def _sync(to_sync: dict[Log, int]) -> Durable:
        """fsync each log up to what was written; what became durable."""
        durable: Durable = {}
        for log, end in to_sync.items():
            if log.offline or log.closed:
                continue
            started = time.monotonic()
            try:
                log.sync_written(end)
            except KafkaStorageError:
                return durable  # the fsync failed: the dir is offline (logged once)
            durable[log] = (end, time.monotonic() - started)
        return durable

    def _deliver(self, durable: Durable) -> None:
        loop = self._loop
        if loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(_on_written, durable)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody waits any more


def _on_written(durable: Durable) -> None:
    for log, (end, seconds) in durable.items():
        log.on_written(end, seconds)
