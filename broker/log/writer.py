"""LogDirWriter: one thread per log dir that writes and fsyncs appended batches, in order.

For a log that fsyncs every batch (``flush.messages=1``) the append on the event loop
validates, assigns offsets and updates the log's in-memory state in arrival order, then hands
the batch's bytes here. This thread writes them (contiguous writes to one file as one
``pwritev``) and fsyncs every log it wrote, in submission order, then tells the event loop up
to which offset each log is durable; the high watermark moves on that event. So the loop never
waits on the disk on that path, and everything queued while one fsync runs is covered by the
next one (a group commit across the dir's logs).

A failed write or fsync takes the dir offline through the log's failure channel. Whatever was
queued behind it is never written (every log of the dir refuses writes from then on), so
nothing past the failure becomes durable or visible, and recovery after the restart cuts any
torn tail. ``drain`` waits until everything submitted so far is done: a segment's files are
closed, deleted or swapped only after it, so no queued write ever lands on a closed fd.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from broker.log import disk
from broker.log.dir_failure import KafkaStorageError

if TYPE_CHECKING:
    from broker.log.log import Log

__all__ = ["LogDirWriter", "WriteCoalescer", "Write", "write_all"]

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
    """The writer thread of one log dir, started on the first submit.

    ``submit`` and ``drain`` may be called from any thread but the writer's own; completions
    are delivered on ``loop`` through ``Log.on_written``.
    """

    def __init__(self, log_dir: str, loop: asyncio.AbstractEventLoop) -> None:
        self.log_dir = log_dir
        self._loop = loop
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._submitted = 0
        self._completed = 0
        self._stopping = False
        self._thread: threading.Thread | None = None

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
            if self._thread is None:
                self._start()
            self._cond.notify()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"log-writer {self.log_dir}",
                                        daemon=True)
        self._thread.start()

    def drain(self) -> None:
        """Wait until everything submitted so far is written and fsynced, or dropped because
        the dir failed. Never call it from the writer thread (it would wait for itself)."""
        if threading.current_thread() is self._thread:
            return
        with self._cond:
            target = self._submitted
            while self._completed < target:
                self._cond.wait()

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- the writer thread ------------------------------------------------------------------
    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._stopping:
                    cond.wait()
                batch, self._queue = self._queue, []
                if not batch:
                    return  # stopping, and nothing left
            try:
                durable = self._process(batch)
            except Exception:  # a bug, not the disk: never leave a drain waiting
                logger.exception("log dir writer failed", log_dir=self.log_dir)
                durable = {}
            with cond:
                self._completed += len(batch)
                cond.notify_all()
            if durable:
                self._deliver(durable)

    def _process(self, batch: list[_Request]) -> Durable:
        """Write the batch in order, then fsync each log written; what became durable."""
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
        durable: Durable = {}
        for log, end in ends.items():
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


class WriteCoalescer:
    """The appends of one event-loop iteration, written together at its end, on the loop.

    For logs that do not fsync every batch: each append adds its write here instead of
    making it, and the first one of an iteration schedules ``flush`` (``loop.call_soon``), which
    writes each log's batches of the iteration (contiguous ones as one ``pwritev``), then tells
    each log (``Log.coalesced_written``: its high watermark moves) and then runs the callbacks
    waiting on the iteration's writes (acks=1 answers), so no answer leaves before its write.
    A failed write takes its dir offline; the other dirs' writes go on.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.get_ident()
        self._pending: dict[Log, list[Write]] = {}
        self._after: list[Callable[[], object]] = []
        self._scheduled = False

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def add(self, log: Log, writes: list[Write]) -> None:
        queued = self._pending.get(log)
        if queued is None:
            self._pending[log] = writes
        else:
            queued.extend(writes)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def after_write(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` once this iteration's writes are made (or failed)."""
        self._after.append(callback)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def flush_here(self) -> None:
        """Write what is pending now, if called on the loop's thread (a close, a delete or a
        swap waits for no iteration's end); elsewhere nothing (the loop writes it soon)."""
        if self._pending and threading.get_ident() == self._thread:
            self.flush()

    def flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for log, writes in pending.items():
            if log.offline or log.closed:
                continue  # its dir failed earlier in this flush, or before
            try:
                write_all(writes)
            except OSError as e:
                log.dir_failed("writing", e)
                continue
            log.coalesced_written()
        after, self._after = self._after, []
        for callback in after:
            callback()
