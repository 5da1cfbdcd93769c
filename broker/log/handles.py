"""Open file handles of the log, spent as Kafka spends them.

Kafka keeps about one descriptor per segment and maps its indexes lazily; here:

* The active segment of a partition holds its ``.log`` fd (appends go straight to it), from
  its first append on; a partition no one wrote since it was created, or since a clean start
  (its log is deferred, broker/log/log.py), holds none.
* Every other segment's ``.log`` is opened when it is read and kept in one LRU of open
  handles (``FileHandleCache``), bounded by ``minibroker.log.max.open.files``: a segment no
  one reads holds nothing.
* Index files hold no descriptor at all: their entries live in memory, are read from the
  file when first needed and written back on flush and close (broker/log/index.py).

Running out of descriptors (EMFILE for the process, ENFILE for the system) is not a disk
fault: it fails the one request that needed a file (``OpenFileLimitError``), logged with the
limit, and never takes a log dir offline. ``raise_open_file_limit`` lifts the soft limit to the
hard one at start, as a JVM does for Kafka.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import structlog

from broker.log import disk
from broker.log.dir_failure import KafkaStorageError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "DEFAULT_MAX_OPEN_FILES",
    "FileHandleCache",
    "HANDLES",
    "OpenFileLimitError",
    "RESERVE",
    "is_fd_exhaustion",
    "open_file_limit",
    "open_file_limit_error",
    "raise_open_file_limit",
]

logger = structlog.get_logger("broker.log")

#: inactive segments' ``.log`` files kept open at most (minibroker.log.max.open.files).
DEFAULT_MAX_OPEN_FILES = 128

_EXHAUSTED = (errno.EMFILE, errno.ENFILE)


def is_fd_exhaustion(error: BaseException) -> bool:
    """Whether ``error`` says the process (EMFILE) or the system (ENFILE) has no fd left."""
    return isinstance(error, OSError) and error.errno in _EXHAUSTED


def open_file_limit() -> tuple[int, int]:
    """The process's (soft, hard) RLIMIT_NOFILE."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


class OpenFileLimitError(KafkaStorageError):
    """No file descriptor left to open a log's file (EMFILE, ENFILE): this request fails, the
    log dir stays online.

    Answered as KAFKA_STORAGE_ERROR (56, retriable), the code a Kafka client sees when a
    broker cannot create or open a log (Kafka's LogManager wraps the IOException in a
    KafkaStorageException); unlike Kafka, the dir is not taken offline, since the disk is fine
    and the next request may find a descriptor free.
    """


def open_file_limit_error(action: str, error: OSError) -> OpenFileLimitError:
    """Log one line naming the limit; the error to raise for the request that hit it."""
    soft, hard = open_file_limit()
    open_now = _open_fd_count()
    logger.error("open-file limit reached: this request fails, every other partition keeps "
                 "serving (raise ulimit -n, or lower minibroker.log.max.open.files)",
                 action=action, errno=error.errno, strerror=error.strerror,
                 soft_limit=soft, hard_limit=hard, open_fds=open_now,
                 cached_segment_files=len(HANDLES))
    return OpenFileLimitError(
        f"{action}: {error.strerror} (open-file limit {soft}, {open_now} open)")


def _open_fd_count() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def raise_open_file_limit() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit (a partition's active segment costs
    one descriptor). Returns the (soft, hard) now in force, which the broker logs once it has
    started (a start that fails says one line and nothing else)."""
    soft, hard = open_file_limit()
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            logger.warning("could not raise the open-file limit", soft=soft, hard=hard,
                           error=str(e))
    return soft, hard


class _HasLogPath(Protocol):
    @property
    def log_path(self) -> Path: ...


class FileHandleCache:
    """An LRU of open ``.log`` descriptors of inactive segments, keyed by segment.

    ``fd_of`` opens on a miss and closes the least recently used one past ``capacity``; on
    EMFILE it gives back half of what it holds and tries once more. Used on the event loop
    (reads, recovery, cleaning snapshots); a lock keeps it safe anyway. Descriptors handed
    out are valid only until the next call: callers never keep them.
    """

    __slots__ = ("capacity", "_fds", "_lock")

    def __init__(self, capacity: int = DEFAULT_MAX_OPEN_FILES) -> None:
        self.capacity = max(capacity, 1)
        self._fds: OrderedDict[object, int] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._fds)

    def fd_of(self, owner: _HasLogPath) -> int:
        """``owner``'s descriptor of its ``log_path``, opened read-write if not cached."""
        with self._lock:
            fds = self._fds
            fd = fds.get(owner)
            if fd is not None:
                fds.move_to_end(owner)
                return fd
            path = owner.log_path
            try:
                fd = disk.open_file(path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as e:
                if not is_fd_exhaustion(e) or not fds:
                    raise
                self._evict(max(len(fds) // 2, 1))
                fd = disk.open_file(path, os.O_RDWR | os.O_CLOEXEC)
            fds[owner] = fd
            if len(fds) > self.capacity:
                self._evict(len(fds) - self.capacity)
            return fd

    def forget(self, owner: object) -> None:
        """Close ``owner``'s descriptor if cached (its segment closes or goes away)."""
        with self._lock:
            fd = self._fds.pop(owner, None)
        if fd is not None:
            os.close(fd)

    def resize(self, capacity: int) -> None:
        with self._lock:
            self.capacity = max(capacity, 1)
            if len(self._fds) > self.capacity:
                self._evict(len(self._fds) - self.capacity)

    def shrink(self) -> int:
        """Close half of the cached descriptors (someone else needs one); returns how many."""
        with self._lock:
            n = len(self._fds) // 2 or len(self._fds)
            self._evict(n)
            return n

    def _evict(self, n: int) -> None:
        fds = self._fds
        for _ in range(min(n, len(fds))):
            _owner, fd = fds.popitem(last=False)
            os.close(fd)


class DescriptorReserve:
    """A few descriptors held back (on /dev/null) so that, at the limit, the cleanup of a
    failed creation and its log line still get the descriptors they need: ``released``
    gives them back for the duration of a block and takes them again after."""

    __slots__ = ("size", "_fds", "_lock")

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._fds: list[int] = []
        self._lock = threading.Lock()

    def fill(self) -> None:
        with self._lock:
            while len(self._fds) < self.size:
                try:
                    self._fds.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
                except OSError:
                    return  # at the limit now: filled again after the next release

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        with self._lock:
            fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)
        try:
            yield
        finally:
            self.fill()


#: the process's cache (a LogManager sets its capacity from its configuration).
HANDLES = FileHandleCache()
#: descriptors kept for cleaning up after EMFILE (a LogManager fills it).
RESERVE = DescriptorReserve()
