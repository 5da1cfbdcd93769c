"""Kafka's LogDirFailureChannel and KafkaStorageException: a disk fault takes its log dir offline.

Any OSError while a log dir's files are written, fsynced, truncated or read (ENOSPC, EIO ...)
means the disk can no longer be trusted with that dir. Kafka's rule, kept here:

* The code that saw the error reports the dir once to the channel and raises
  KafkaStorageError (KAFKA_STORAGE_ERROR, 56), which the ReplicaManager answers per partition;
  a request is never failed as a whole for it, and the connection stays open.
* From then on nothing of that dir is written: every Log checks the channel's offline set
  before writing (a set lookup, no syscall), so a batch is never acknowledged on a dir that
  already failed, and a failed fsync is never retried (after one, Linux may have dropped the
  dirty pages and a second fsync could succeed without them).
* The dir stays offline until the broker restarts; recovery then brings it back, because a
  dir that failed gets no clean-shutdown marker.

Failures are seen on the event loop (append, read) and on flusher or checkpoint threads
(fsync, checkpoints), so the channel is thread-safe and listeners must be too (the
ReplicaManager's hands the work to its event loop).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from protocol.errors import ErrorCode, KafkaError

__all__ = ["KafkaStorageError", "LogDirFailureChannel"]

logger = structlog.get_logger("broker.log")


class KafkaStorageError(KafkaError):
    """Kafka's KafkaStorageException: the disk of a log dir failed, now or earlier.

    Retriable for clients: they refresh metadata and retry, as after a leader change.
    """

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, message)


class LogDirFailureChannel:
    """The broker's offline log dirs, each reported once, and who to tell about a new one.

    ``offline`` is read without the lock (membership tests only, atomic under the GIL): that
    is the check every Log makes before writing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.offline: set[str] = set()
        self._listeners: list[Callable[[str], None]] = []

    def has_offline_log_dir(self, log_dir: str) -> bool:
        return log_dir in self.offline

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(log_dir)`` once per dir that goes offline, on the reporting thread."""
        with self._lock:
            self._listeners.append(listener)

    def maybe_add_offline_log_dir(self, log_dir: str, message: str, error: OSError) -> bool:
        """Take ``log_dir`` offline; the first report is logged at error level and told to the
        listeners, later ones (other files of the same failing disk) only at debug. True for
        the first report."""
        with self._lock:
            if log_dir in self.offline:
                first = False
            else:
                self.offline.add(log_dir)
                first = True
            listeners = list(self._listeners)
        if not first:
            logger.debug("log dir already offline", log_dir=log_dir, reason=message,
                         error=str(error))
            return False
        logger.error("log dir offline: its partitions answer KAFKA_STORAGE_ERROR until a restart",
                     log_dir=log_dir, reason=message, error=str(error),
                     errno=error.errno, strerror=error.strerror)
        for listener in listeners:
            listener(log_dir)
        return True
