"""LogManager: every partition log under ``log.dirs``, their checkpoints and background work.

Per log dir, as Kafka lays it out:

* ``<topic>-<partition>/``: one Log each.
* ``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint``: text files,
  a version line (``0``), a count line, then ``topic partition offset`` lines; written to a
  temp file, fsynced and renamed over the old one.
* ``.kafka_cleanshutdown``: written last by ``shutdown()``. On ``load()`` its presence means
  every log was flushed and closed, so recovery is skipped; it is deleted once loaded. Absent,
  each log is recovered from its checkpointed recovery point, except those the opened-logs
  file below proves untouched since the last clean shutdown.
* ``mini-broker-opened-logs`` (ours): written at a clean start, then one ``topic partition``
  line appended and fsynced before a log left closed at start opens (or is deleted), i.e.
  before anything can change its files. After a crash, every log the last clean shutdown
  recorded (``mini-broker-leader-epochs``) and not named here is still exactly as that
  shutdown left it, fsynced: it opens on first use as after a clean start, so a restart
  recovers only the logs used since the last clean start, not every log there is. A clean
  shutdown removes the file before it writes the new epochs file.
* ``.lock``: an exclusive flock held while the manager is open, so two brokers can not share
  a directory.

Flushing and retention are scheduled by the broker (the ReplicaManager's group-commit flusher
moves high watermarks when an fsync completes); ``checkpoint`` is a blocking call it runs in an
executor. Logs with flush.messages=1 are written and fsynced by their dir's writer thread
(broker/log/writer.py, one per dir, owned here and stopped by ``shutdown``); the others'
appends are written where they happen.

File handles (broker/log/handles.py): each log written to holds its active segment's ``.log``
fd; other segments borrow one from an LRU bounded by ``max_open_files`` when read. After a
clean shutdown a start opens no log: each opens on first use (``Log.deferred``). Running out of
descriptors while creating a log fails that creation alone (OpenFileLimitError, nothing
left behind on disk) and never takes a dir offline.

A disk error in a dir takes that dir offline (``failure_channel``, Kafka's
LogDirFailureChannel): its logs are no longer written, checkpointed or flushed, new logs go to
the live dirs only, and shutdown closes its files without writing and leaves it without a
clean-shutdown marker, so the next start recovers it from its last checkpoint. The other dirs
keep working. ``offline_dirs`` counts them (Kafka's OfflineLogDirectoryCount).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from broker.log import disk
from broker.log.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from broker.log.config import LogConfig
from broker.log.dir_failure import KafkaStorageError, LogDirFailureChannel
from broker.log.handles import (
    HANDLES,
    RESERVE,
    OpenFileLimitError,
    is_fd_exhaustion,
    open_file_limit,
    open_file_limit_error,
    raise_open_file_limit,
)
from broker.log.log import Log, parse_topic_partition_dir
from broker.log.recovery import STATS as RECOVERY_STATS
from broker.log.writer import LogDirWriter
from purgatory.clock import WallClock

if TYPE_CHECKING:
    from broker.log.cleaner import CleanerConfig, LogCleaner

__all__ = [
    "LogManager",
    "TopicPartition",
    "CLEAN_SHUTDOWN_FILE",
    "RECOVERY_POINT_CHECKPOINT_FILE",
    "LOG_START_OFFSET_CHECKPOINT_FILE",
]

logger = structlog.get_logger("broker.log.manager")

TopicPartition = tuple[str, int]

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILE = "log-start-offset-checkpoint"
LOCK_FILE = ".lock"
#: ours, not Kafka's: each log's latest leader epoch, written by a clean shutdown before its
#: marker, so a clean start opens no log to learn the epoch its partition leads in
LEADER_EPOCHS_FILE = "mini-broker-leader-epochs"
#: ours, not Kafka's: the logs opened or deleted since the last clean start (module docstring)
OPENED_LOGS_FILE = "mini-broker-opened-logs"
_OPENED_LOGS_VERSION = "0"
class LogDirLockedError(RuntimeError):
    """A log dir's lock is held by another process (another broker on the same dir)."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(f"log dir {log_dir} is locked by another process")
        self.log_dir = log_dir


class LogManager:
    """Owns the Logs of this broker. Methods run on the event loop unless said otherwise."""

    def __init__(
        self,
        log_dirs: list[Path],
        default_config: LogConfig,
        *,
        config_for: Callable[[str], LogConfig] | None = None,
        failure_channel: LogDirFailureChannel | None = None,
        log_dir_writers: bool = True,
        clock: WallClock | None = None,
        max_open_files: int | None = None,
        recovery_threads_per_data_dir: int = 1,
    ) -> None:
        """``config_for(topic)`` gives a topic's config at load time (default: the default).
        ``log_dir_writers=False`` keeps flush.messages=1 logs writing on the loop and fsyncing
        on the ReplicaManager's flusher, as before the writers. ``clock`` is the broker's wall
        clock, handed to every log (the system's by default). ``max_open_files`` bounds the
        inactive segments' open ``.log`` files (minibroker.log.max.open.files);
        ``recovery_threads_per_data_dir`` logs of a dir are loaded at once after a crash
        (Kafka's num.recovery.threads.per.data.dir)."""
        if not log_dirs:
            raise ValueError("at least one log dir is required")
        self.log_dirs = [Path(d) for d in log_dirs]
        self.default_config = default_config
        self._config_for = config_for
        self.failure_channel = failure_channel or LogDirFailureChannel()
        self.failure_channel.add_listener(self._on_log_dir_failure)
        self.logs: dict[TopicPartition, Log] = {}
        self._dir_of: dict[TopicPartition, Path] = {}
        #: logs per dir, kept with ``_dir_of``: where the next log goes, without a count over
        #: every log per new partition
        self._logs_in: dict[Path, int] = dict.fromkeys(self.log_dirs, 0)
        self._lock_fds: list[int] = []
        #: the log cleaner, once ``start_cleaner`` ran (compaction of ``compact`` logs)
        self.cleaner: LogCleaner | None = None
        #: one writer thread per log dir (flush.messages=1 logs write and fsync there)
        self.writers: dict[Path, LogDirWriter] = {}
        self.log_dir_writers = log_dir_writers
        self.clock = clock
        self.recovery_threads_per_data_dir = max(recovery_threads_per_data_dir, 1)
        #: serialises appends to the opened-logs files (logs open on several threads)
        self._opened_lock = threading.Lock()
        #: (soft, hard) RLIMIT_NOFILE once raised at start (``for_broker``), for the logs
        self.open_file_limit: tuple[int, int] | None = None
        if max_open_files is not None:
            HANDLES.resize(max_open_files)
        RESERVE.fill()

    @classmethod
    def for_broker(cls, log_dirs: list[Path], default_config: LogConfig,
                   config: Mapping[str, Any], clock: WallClock | None = None,
                   config_for: Callable[[str], LogConfig] | None = None) -> LogManager:
        """The broker's LogManager, from its configuration; raises the process's soft
        open-file limit to the hard one first (each partition holds one descriptor) and keeps
        both for the broker's start line."""
        limit = raise_open_file_limit()
        manager = cls(log_dirs, default_config, config_for=config_for, clock=clock,
                      max_open_files=config["minibroker.log.max.open.files"],
                      recovery_threads_per_data_dir=config["num.recovery.threads.per.data.dir"])
        manager.open_file_limit = limit
        return manager

    # -- log dir health ----------------------------------------------------------------------
    @property
    def offline_dirs(self) -> int:
        """How many of ``log.dirs`` are offline (Kafka's OfflineLogDirectoryCount)."""
        offline = self.failure_channel.offline
        return sum(1 for d in self.log_dirs if str(d) in offline)

    def is_log_dir_online(self, log_dir: Path) -> bool:
        return str(log_dir) not in self.failure_channel.offline

    @property
    def live_log_dirs(self) -> list[Path]:
        return [d for d in self.log_dirs if self.is_log_dir_online(d)]

    def log_dir_of(self, tp: TopicPartition) -> Path | None:
        """The log dir holding a partition's log (Kafka's parentDir), None if it has none."""
        return self._dir_of.get(tp)

    def _dir_failed(self, log_dir: Path, action: str, error: OSError) -> None:
        self.failure_channel.maybe_add_offline_log_dir(
            str(log_dir), f"error while {action} in dir {log_dir}", error)

    def _on_log_dir_failure(self, log_dir: str) -> None:
        """Kafka's LogManager.handleLogDirFailure, minus the halt: with every dir offline the
        broker stays up, answering KAFKA_STORAGE_ERROR for every partition."""
        offline = [f"{t}-{p}" for (t, p), d in list(self._dir_of.items()) if str(d) == log_dir]
        logger.warning("stopped serving logs in an offline log dir", log_dir=log_dir,
                       partitions=len(offline), offline_dirs=self.offline_dirs)
        if not self.live_log_dirs:
            logger.error("every log dir is offline", log_dirs=[str(d) for d in self.log_dirs])

    # -- startup -------------------------------------------------------------------------------
    def load(self) -> dict[TopicPartition, Log]:
        """Lock each dir, open every ``topic-N`` log (recovering unless shut down cleanly).

        A clean start opens only each log's active segment (the rest is read when needed).
        After a crash each log rereads only what lies past its recovery point, up to
        ``recovery_threads_per_data_dir`` logs of a dir at once. Running out of descriptors
        raises OpenFileLimitError with one line saying what to raise."""
        self.lock_dirs()
        for log_dir in self.log_dirs:
            marker = log_dir / CLEAN_SHUTDOWN_FILE
            clean = marker.exists()
            opened = None if clean else self._read_opened(log_dir)
            if not clean:
                logger.info(
                    "no clean shutdown marker: recovering logs from their recovery points",
                    log_dir=str(log_dir),
                    only_logs_opened_since_clean_start=opened is not None,
                )
            recovery_points = read_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT_FILE)
            start_offsets = read_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT_FILE)
            recorded = self._read_epochs(log_dir) if clean or opened is not None else {}
            # the logs that may stay closed until first used: as the clean shutdown left them
            epochs = {tp: e for tp, e in recorded.items() if not opened or tp not in opened}
            found: list[tuple[TopicPartition, Path]] = []
            for entry in sorted(os.scandir(log_dir), key=lambda e: e.name):
                if not entry.is_dir():
                    continue
                tp = parse_topic_partition_dir(entry.name)
                if tp is None or entry.name.endswith(("-delete", "-future", "-stray")):
                    continue
                if tp in self.logs:
                    raise RuntimeError(
                        f"duplicate log directories for {tp[0]}-{tp[1]}: "
                        f"{self._dir_of[tp]} and {log_dir}"
                    )
                found.append((tp, log_dir / entry.name))  # one name parsed, not a path

            load_one = functools.partial(self._load_log, clean=clean,
                                         recovery_points=recovery_points,
                                         start_offsets=start_offsets, epochs=epochs)
            threads = 1 if clean else self.recovery_threads_per_data_dir
            reread_before = RECOVERY_STATS.bytes
            try:
                if threads > 1 and len(found) > 1:
                    with ThreadPoolExecutor(threads, thread_name_prefix="log-recovery") as pool:
                        loaded = list(pool.map(load_one, found))
                else:
                    loaded = [load_one(item) for item in found]
            except OSError as e:
                if not is_fd_exhaustion(e):
                    raise
                raise self._cannot_open(log_dir, len(found), e) from None
            except OpenFileLimitError as e:
                raise self._cannot_open(log_dir, len(found), e) from None
            for (tp, _path), log in zip(found, loaded, strict=True):
                self._add(tp, log, log_dir)
            deferred = [log for log in loaded if not log.opened]
            logger.info(
                "loaded logs",
                log_dir=str(log_dir),
                logs=len(loaded),
                deferred=len(deferred),
                clean_shutdown=clean,
                reread_bytes=RECOVERY_STATS.bytes - reread_before,
            )
            if clean:
                # every recorded log not left closed now counts as opened from the start
                closed = {(log.topic, log.partition) for log in deferred}
                self._write_opened(log_dir, [tp for tp in recorded if tp not in closed])
                marker.unlink()
                disk.fsync_dir(log_dir)  # no crash from here on may find the marker again
            record = self._record_open  # one bound method shared by every log
            for log in deferred:
                log.on_open = record
        return dict(self.logs)

    # -- the logs opened since the last clean start (OPENED_LOGS_FILE) --------------------------
    @staticmethod
    def _read_opened(log_dir: Path) -> set[TopicPartition] | None:
        """The logs opened since the last clean start; None when unknown (no file, or one
        this version can not read): then every log of the dir is recovered. A line the
        crash cut short names at worst a log that needs no recovery (its opening had not
        returned, so nothing of it was written): read as whatever it names."""
        try:
            text = (log_dir / OPENED_LOGS_FILE).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as e:
            logger.warning("ignoring the opened-logs file", log_dir=str(log_dir), reason=str(e))
            return None
        lines = text.split("\n")
        if lines[0] != _OPENED_LOGS_VERSION:
            return None
        opened: set[TopicPartition] = set()
        for line in lines[1:]:
            topic, _, index = line.partition(" ")
            if topic and index.isdigit():
                opened.add((topic, int(index)))
        return opened

    @staticmethod
    def _write_opened(log_dir: Path, opened: list[TopicPartition]) -> None:
        """A new opened-logs file for a clean start (fsynced before the marker goes)."""
        text = "".join(f"{topic} {index}\n" for topic, index in opened)
        disk.atomic_write(log_dir / OPENED_LOGS_FILE,
                          f"{_OPENED_LOGS_VERSION}\n{text}".encode())

    def _record_open(self, log: Log) -> None:
        """Durably name ``log`` in its dir's opened-logs file before it opens (``Log.on_open``)
        or is deleted: from then on a crash recovers it. Each line starts on a new line, so a
        line a crash cut short never swallows the next one."""
        line = f"\n{log.topic} {log.partition}\n".encode()
        with self._opened_lock:
            fd = disk.open_file(Path(log.log_dir) / OPENED_LOGS_FILE,
                                os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                disk.write(fd, line)
                disk.fsync(fd)
            finally:
                os.close(fd)

    @staticmethod
    def _forget_opened(log_dir: Path) -> None:
        """A clean shutdown's first step: the opened-logs file goes, durably, before the new
        epochs file names logs it does not list (an interrupted shutdown recovers them all)."""
        path = log_dir / OPENED_LOGS_FILE
        if path.exists():
            path.unlink()
            disk.fsync_dir(log_dir)

    def lock_dirs(self) -> None:
        """Create and lock every log dir, all of them before any is read (a no-op once
        locked): a dir another broker holds fails the start before anything is touched, the
        clean-shutdown markers included."""
        if self._lock_fds:
            return
        for log_dir in self.log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
            self._lock_dir(log_dir)

    @staticmethod
    def _read_epochs(log_dir: Path) -> dict[TopicPartition, int]:
        """The latest epochs the clean shutdown wrote; an unreadable file only means every
        log of the dir is opened at start, as before the file existed."""
        try:
            return read_offset_checkpoint(log_dir / LEADER_EPOCHS_FILE)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            logger.warning("ignoring the leader epochs file", log_dir=str(log_dir),
                           reason=str(e))
            return {}

    def _load_log(self, item: tuple[TopicPartition, Path], *, clean: bool,
                  recovery_points: dict[TopicPartition, int],
                  start_offsets: dict[TopicPartition, int],
                  epochs: dict[TopicPartition, int]) -> Log:
        """A log as the last clean shutdown left it (in ``epochs``), whose offsets were
        checkpointed, opens on first use (``Log.deferred``); any other is loaded (and
        recovered unless ``clean``) now."""
        tp, path = item
        config = self._config_for(tp[0]) if self._config_for else self.default_config
        if tp in epochs:
            end = recovery_points.get(tp)
            start = start_offsets.get(tp)
            epoch = epochs.get(tp)
            if end is not None and start is not None and epoch is not None:
                return Log.deferred(path, config, tp[0], tp[1], log_end_offset=end,
                                    log_start_offset=start,
                                    latest_epoch=epoch if epoch >= 0 else None,
                                    failure_channel=self.failure_channel, clock=self.clock)
        return Log.load(
            path,
            config,
            tp[0],
            tp[1],
            clean,
            recovery_point=recovery_points.get(tp, 0),
            log_start_offset=start_offsets.get(tp, 0),
            failure_channel=self.failure_channel,
            clock=self.clock,
        )

    def _cannot_open(self, log_dir: Path, logs: int, error: Exception) -> OpenFileLimitError:
        """The one line a start that cannot open its logs ends with (the logs opened so far
        are closed; nothing on disk changed, so a start with a higher limit succeeds)."""
        for log in self.logs.values():
            log._close_files()
        soft, hard = open_file_limit()
        return OpenFileLimitError(
            f"cannot open the {logs} partition logs of {log_dir}: the open-file limit is "
            f"{soft} (hard limit {hard}) and each partition needs one descriptor; raise "
            f"ulimit -n (LimitNOFILE=, --ulimit nofile=) to at least partitions + 200 ({error})")

    def _lock_dir(self, log_dir: Path) -> None:
        fd = os.open(log_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LogDirLockedError(log_dir) from None
        self._lock_fds.append(fd)

    # -- logs ------------------------------------------------------------------------------------
    def _add(self, tp: TopicPartition, log: Log, log_dir: Path) -> None:
        self.logs[tp] = log
        if self._dir_of.get(tp) != log_dir:
            self._unplace(tp)
            self._dir_of[tp] = log_dir
            self._logs_in[log_dir] = self._logs_in.get(log_dir, 0) + 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # outside a loop (tools, sync tests): every write is made where it happens
        if self.log_dir_writers:
            log.writer = self._writer_of(log_dir, loop)

    def _writer_of(self, log_dir: Path, loop: asyncio.AbstractEventLoop) -> LogDirWriter:
        """The dir's writer (its threads report to ``loop``)."""
        writer = self.writers.get(log_dir)
        if writer is None:
            writer = self.writers[log_dir] = LogDirWriter(str(log_dir), loop)
        return writer

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self.logs.get(tp)

    def create_log(self, topic: str, partition: int, config: LogConfig | None = None) -> Log:
        """Create (or return the existing) log in the live log dir holding the fewest logs
        (ties: the first in ``log.dirs``), as Kafka's nextLogDirs. A dir that fails to create
        it goes offline and the next one is tried; KafkaStorageError when none can.

        No descriptor left (EMFILE, ENFILE) is not the dir's fault: OpenFileLimitError (also a
        KafkaStorageError, answered KAFKA_STORAGE_ERROR) for this log alone, after the
        partition directory it made is removed again, and every dir stays online."""
        tp = (topic, partition)
        existing = self.logs.get(tp)
        if existing is not None:
            return existing
        counts = self._logs_in
        for log_dir in sorted(self.live_log_dirs, key=lambda d: counts.get(d, 0)):
            path = log_dir / f"{topic}-{partition}"
            existed = path.exists()
            try:
                log = self._new_log(path, config or self.default_config, topic, partition)
            except OSError as e:
                if not is_fd_exhaustion(e):
                    if not existed:
                        shutil.rmtree(path, ignore_errors=True)  # nothing half-made stays
                    self._dir_failed(log_dir, f"creating the log of {topic}-{partition}", e)
                    continue
                with RESERVE.released():  # the cleanup and the log line need descriptors
                    if not existed:
                        shutil.rmtree(path, ignore_errors=True)
                    raise open_file_limit_error(
                        f"creating the log of {topic}-{partition} in dir {log_dir}", e) from e
            except OpenFileLimitError:
                with RESERVE.released():
                    if not existed:
                        shutil.rmtree(path, ignore_errors=True)
                raise
            self._add(tp, log, log_dir)
            return log
        raise KafkaStorageError(
            f"no live log dir to create {topic}-{partition} in: tried "
            f"{', '.join(str(d) for d in self.log_dirs)}")

    def _new_log(self, path: Path, config: LogConfig, topic: str, partition: int) -> Log:
        """A new Log; on EMFILE the handle cache gives back half of its descriptors and the
        creation is tried once more."""
        try:
            return Log(path, config, topic, partition, failure_channel=self.failure_channel,
                       clock=self.clock)
        except OSError as e:
            if not is_fd_exhaustion(e) or not HANDLES.shrink():
                raise
        return Log(path, config, topic, partition, failure_channel=self.failure_channel,
                   clock=self.clock)

    def delete_log(self, tp: TopicPartition) -> None:
        """Close and remove a partition's directory; unknown partitions are ignored. A clean
        of it in progress is dropped and its cleaner checkpoint entry goes (Kafka's
        abortCleaning and updateCheckpoints)."""
        cleaner = self.cleaner
        if cleaner is not None:
            cleaner.abort_and_pause(tp)
        try:
            log = self.logs.get(tp)
            if log is not None and log.on_open is not None:
                try:
                    self._record_open(log)  # a crash mid-delete must not find it untouched
                except OSError as e:
                    self._dir_failed(Path(log.log_dir),
                                     f"recording the deletion of {tp[0]}-{tp[1]}", e)
                    raise KafkaStorageError(
                        f"cannot delete the log of {tp[0]}-{tp[1]}: {e}") from e
            log = self.logs.pop(tp, None)
            if log is not None:
                log.delete()
            if cleaner is not None:
                cleaner.remove_partition(tp)
            self._unplace(tp)
        finally:
            if cleaner is not None:
                cleaner.resume(tp)

    # -- the log cleaner -------------------------------------------------------------------------
    def start_cleaner(self, config: CleanerConfig,
                      loop: asyncio.AbstractEventLoop | None) -> LogCleaner:
        """Start the log cleaner's threads (none when disabled); call after the logs are
        loaded, on the event loop its swaps run on."""
        from broker.log.cleaner import LogCleaner

        if self.cleaner is None:
            self.cleaner = LogCleaner(config, self)
        else:
            self.cleaner.reconfigure(config)
        self.cleaner.start(loop)
        return self.cleaner

    # -- flush and checkpoints (blocking: call from a worker thread, or at shutdown) ------------
    def flush_all(self) -> None:
        """fsync every log of the live dirs, then checkpoint the recovery points. Blocking."""
        for log in list(self.logs.values()):
            if not log.closed and not log.offline:
                try:
                    log.flush()
                except KafkaStorageError:
                    pass  # its dir is offline now, reported once by the channel
        self.checkpoint()

    def checkpoint(self) -> None:
        """Write both offset checkpoints for every live log dir. Blocking (fsyncs).

        A dir whose checkpoint can not be written goes offline; the others are still written,
        and this never raises for it (a checkpoint loop must outlive one bad disk).
        """
        for log_dir in self.live_log_dirs:
            try:
                self._checkpoint_dir(log_dir)
            except OSError as e:
                self._dir_failed(log_dir, "writing the offset checkpoints", e)

    def _unplace(self, tp: TopicPartition) -> None:
        log_dir = self._dir_of.pop(tp, None)
        if log_dir is not None:
            self._logs_in[log_dir] -= 1

    def _checkpoint_dir(self, log_dir: Path) -> None:
        recovery: dict[TopicPartition, int] = {}
        starts: dict[TopicPartition, int] = {}
        for tp, d in list(self._dir_of.items()):
            if d != log_dir:
                continue
            log = self.logs.get(tp)
            if log is None:
                continue
            recovery[tp] = log.recovery_point
            starts[tp] = log.log_start_offset
        write_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT_FILE, recovery)
        write_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT_FILE, starts)

    def shutdown(self) -> None:
        """Flush and close every log, checkpoint, then write the clean-shutdown markers.

        As Kafka, only in the live dirs: an offline dir's logs are closed without writing and
        it gets neither checkpoints nor a marker, so the next start recovers it. The cleaner
        stops first, so no swap races the closes.
        """
        if self.cleaner is not None:
            self.cleaner.shutdown()
        closed: list[Log] = []
        for log in list(self.logs.values()):
            try:
                if log.opened and not log.closed:
                    log.close(sync=False)
                    closed.append(log)
                else:
                    log.close()
            except KafkaStorageError:
                pass  # its dir is offline now, reported once by the channel
        for writer in self.writers.values():
            writer.close()
        self._sync_closed(closed)
        self.checkpoint()
        for log_dir in self.live_log_dirs:
            try:
                self._forget_opened(log_dir)
                self._write_epochs(log_dir)
                self._write_clean_shutdown_marker(log_dir)
            except OSError as e:
                self._dir_failed(log_dir, "writing the clean-shutdown marker", e)
        for fd in self._lock_fds:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._lock_fds = []

    def abandon(self) -> None:
        """Let go of the logs as a killed process does: files closed without writing, no
        checkpoint, no clean-shutdown marker, so the next start on these dirs recovers them.

        The cleaner stops first and the dir writers drain what is queued (a crash may or may
        not have lost it; nothing queued was acknowledged) before the files close under them.
        The dir locks are released, so another manager can open the dirs.
        """
        if self.cleaner is not None:
            self.cleaner.shutdown()
        for writer in self.writers.values():
            writer.close()
        for log in list(self.logs.values()):
            log._close_files()
        for fd in self._lock_fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the fd drops its flock
        self._lock_fds = []

    def _sync_closed(self, closed: list[Log]) -> None:
        """One file-system sync per live dir makes what its logs' closes wrote durable (data,
        indexes, producer snapshots, epoch checkpoints), then their recovery points move to
        their ends: a shutdown costs a sync per dir, not fsyncs per partition. A dir whose
        sync fails goes offline and keeps its recovery points (the next start recovers it)."""
        synced: set[str] = set()
        for log_dir in self.live_log_dirs:
            try:
                disk.sync_file_system(log_dir)
            except OSError as e:
                self._dir_failed(log_dir, "syncing the closed logs", e)
                continue
            synced.add(str(log_dir))
        for log in closed:
            if log.log_dir in synced and not log.offline:
                log.closed_durable()

    def _write_epochs(self, log_dir: Path) -> None:
        """Each closed log's latest leader epoch (-1: none), for ``Log.deferred`` at the next
        clean start; written before the marker, so a marker always comes with its file."""
        epochs: dict[TopicPartition, int] = {}
        for tp, d in list(self._dir_of.items()):
            log = self.logs.get(tp)
            if d == log_dir and log is not None:
                epoch = log.latest_epoch
                epochs[tp] = -1 if epoch is None else epoch
        write_offset_checkpoint(log_dir / LEADER_EPOCHS_FILE, epochs)

    @staticmethod
    def _write_clean_shutdown_marker(log_dir: Path) -> None:
        marker = log_dir / CLEAN_SHUTDOWN_FILE
        fd = disk.open_file(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            disk.fsync(fd)
        finally:
            os.close(fd)
        disk.fsync_dir(log_dir)
