"""Log: one partition's ordered segments (Kafka's UnifiedLog + LocalLog, leader only).

Invariants:

* ``segments`` is sorted by base offset and never empty; the last one is the active segment,
  the only one appended to. ``log_start_offset <= recovery_point <= log_end_offset``.
* Offsets are assigned here, on the event loop, by rewriting batch headers in place; the log
  holds exactly the validated request bytes (or, when ``compression.type`` asks for another
  codec, the batch rebuilt with it), so a fetch returns them unchanged.
* ``flush`` may run in a worker thread while the loop appends: it snapshots the end offset
  and the segment list under ``_lock`` (and dups the fds it will fsync), so a segment closed
  or deleted meanwhile is still safe to fsync. Everything else runs on the event loop.
* With flush.messages=1 and a writer (broker/log/writer.py) the append's bytes are written
  and fsynced by the log dir's writer thread, in append order; the end offset moves at once,
  the recovery point (and, through ``on_durable``, the high watermark) when both are done.
  Nothing closes, deletes or swaps a segment's files, and no flush counts an offset, before
  the writes queued for it are done (``_drain_writes``).
* A disk error (any OSError) while writing, fsyncing or reading takes the log's dir offline
  through its LogDirFailureChannel and raises KafkaStorageError; an append that fails leaves
  the log as it was (no offset assigned, nothing readable, nothing to acknowledge), and from
  then on nothing of the dir is written (Kafka's maybeHandleIOException).
* ``producer_state`` reflects exactly the batches below the log end offset. A batch from an
  idempotent producer is judged against it before offsets are assigned: a duplicate or a
  rejected batch leaves the log (and the state) untouched.
* Every aborted transaction whose ABORT marker is below the log end offset has its entry in
  the transaction index of the segment holding the marker, written before the marker itself
  (an entry without its marker is cut back, or dropped by the next load's rebuild).
* Only the log cleaner rewrites data, and only inactive segments: it reads them through dup'd
  fds on its own threads, and its cleaned segment replaces them on the event loop
  (``replace_segments``) with renames a crash can interrupt anywhere: the next load completes
  or drops the swap (``_complete_swap``), so no offset is lost or duplicated.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import struct
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import structlog

from broker.log import disk
from broker.log.config import LOG_APPEND_TIME, LogConfig
from broker.log.dir_failure import KafkaStorageError, LogDirFailureChannel
from broker.log.handles import is_fd_exhaustion, open_file_limit_error
from broker.log.index import IndexCorruptError
from broker.log.leader_epoch_cache import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    EpochEntry,
    LeaderEpochCheckpointError,
    LeaderEpochFileCache,
)
from broker.log.producer_state import (
    NO_SEQUENCE,
    BatchMetadata,
    ProducerStateManager,
    increment_sequence,
)
from broker.log.recovery import recover_segment, recover_segments
from broker.log.segment import INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, LogSegment
from broker.log.txn_index import (
    TXN_INDEX_FILE_SUFFIX,
    AbortedTxn,
    TransactionIndex,
    TxnIndexCorruptError,
)
from broker.log.validator import (
    LogValidator,
)
from broker.log.writer import LogDirWriter, Write
from broker.startup_error import StartupError
from protocol.errors import ErrorCode, KafkaError
from protocol.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_ABORT,
    CONTROL_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    CorruptRecordError,
    RecordBatchError,
    assign_offsets,
    build_end_txn_marker,
    iter_batches,
    read_end_txn_marker,
    validate_produce_records,
)
from purgatory.clock import SYSTEM_WALL_CLOCK, WallClock, system_wall_ms

__all__ = [
    "AppendOrigin",
    "LogConfig",
    "AppendInfo",
    "Log",
    "OffsetOutOfRangeError",
    "RecordBatchTooLargeError",
    "UnexpectedAppendOffsetError",
    "parse_topic_partition_dir",
]

logger = structlog.get_logger("broker.log")

#: serialises opening deferred logs (the loop, a flush thread and a cleaner thread may meet)
_OPEN_LOCK = threading.RLock()

CLEANED_FILE_SUFFIX = ".cleaned"
SWAP_FILE_SUFFIX = ".swap"
DELETED_FILE_SUFFIX = ".deleted"
_LEFTOVER_SUFFIXES = (DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX, ".tmp")
_SWAP_LOG_NAME = re.compile(r"^(\d{20})\.log\.swap$")
_SEGMENT_NAME = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")
# From attributes (21): attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId,
# producerEpoch, baseSequence: what producer state needs, in one unpack per batch.
_PRODUCER_FIELDS = struct.Struct(">hi8xqqhi")
_INT64 = struct.Struct(">q")


class AppendOrigin(Enum):
    """Who appends (Kafka's AppendOrigin): the checks differ.

    CLIENT is a producer: full validation, no control batches, sequences checked.
    COORDINATOR is the group or transaction coordinator: end-transaction markers and batches
    without a sequence (transactional offset commits) are allowed; producer epochs are
    still checked.
    """

    CLIENT = "client"
    COORDINATOR = "coordinator"


def parse_topic_partition_dir(name: str) -> tuple[str, int] | None:
    """``"my-topic-3"`` -> ``("my-topic", 3)``; None for names that are not partitions."""
    m = _PARTITION_DIR.match(name)
    if m is None:
        return None
    return m.group(1), int(m.group(2))


class OffsetOutOfRangeError(KafkaError):
    """Fetch offset outside [log_start_offset, log_end_offset] (OFFSET_OUT_OF_RANGE)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.OFFSET_OUT_OF_RANGE, message)


class UnexpectedAppendOffsetError(KafkaError):
    """A replicated batch does not follow the log end (Kafka's UnexpectedAppendOffsetException):
    the follower's fetch state and its log disagree."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNKNOWN_SERVER_ERROR, message)


class RecordBatchTooLargeError(RecordBatchError):
    """An append larger than a whole segment (Kafka's RecordBatchTooLargeException)."""

    error_code = ErrorCode.RECORD_LIST_TOO_LARGE




@dataclass(slots=True)
class AppendInfo:
    """What the produce response needs about one append."""

    first_offset: int
    last_offset: int
    log_append_time: int  # -1 with CreateTime
    max_timestamp: int
    num_records: int
    size: int
    offset_of_max_timestamp: int = field(default=-1)
    #: a retry of a batch already in the log: nothing was appended, the offsets are the
    #: original ones (Kafka answers them with error NONE), ``size`` and ``num_records`` are 0.
    duplicate: bool = field(default=False)


class Log:
    """One partition's log directory ``<log.dir>/<topic>-<partition>``.

    ``Log(dir, config, topic, partition)`` opens the directory (creating it and a first
    segment if needed) trusting what is there; ``Log.load(..., clean_shutdown=False)``
    recovers from ``recovery_point`` first. ``failure_channel`` is the broker's (the
    LogManager passes it); a log opened alone gets one of its own.
    """

    # Slotted: a broker holds tens of thousands of these, and a __dict__ was the largest
    # single piece of a partition's memory.
    __slots__ = (
        "_base_list", "_closed", "_deferred_end", "_deleted_segments", "_epoch_hint", "_epochs",
        "_flush_lock",
        "_lock", "_next_offset", "_offline_dirs", "_opened", "_pstate", "_rebuild_txn_indexes",
        "_release_after", "_segs", "_truncations", "_unsynced_snapshots", "_validator", "clock",
        "config",
        "dir", "failure_channel", "high_watermark", "jitter_rng", "last_flush_ms", "log_dir",
        "log_start_offset", "on_durable", "on_open", "on_segments_deleted", "partition",
        "recovery_point",
        "topic", "writer", "__weakref__",
    )
    _pstate: ProducerStateManager | None
    _epochs: LeaderEpochFileCache | None

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        topic: str,
        partition: int,
        *,
        clean_shutdown: bool = True,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        now_ms: int | None = None,
        failure_channel: LogDirFailureChannel | None = None,
        clock: WallClock | None = None,
    ) -> None:
        """``clock`` is the broker's wall clock: new segments' creation time (roll by time
        compares it with the appends' "now"). The time since the last flush is real time,
        as the time-based flusher that reads it (the system's wall clock)."""
        self._init_fields(dir, config, topic, partition, now_ms, failure_channel, clock)
        self._pstate = ProducerStateManager(self.dir, topic, partition)
        self._epochs = LeaderEpochFileCache(self.dir / LEADER_EPOCH_CHECKPOINT_FILE)
        self._opened = True
        try:
            self._load(clean_shutdown, recovery_point, log_start_offset,
                       self.clock.wall_ms() if now_ms is None else now_ms)
        except BaseException:
            self._close_files()  # nothing half-open stays behind a failed load
            raise

    def _init_fields(self, dir: Path, config: LogConfig, topic: str, partition: int,
                     now_ms: int | None, failure_channel: LogDirFailureChannel | None,
                     clock: WallClock | None) -> None:
        """The attributes every log has, opened or not (no I/O)."""
        self.dir = dir if isinstance(dir, Path) else Path(dir)  # not parsed again
        self.clock = SYSTEM_WALL_CLOCK if clock is None else clock
        self.config = config
        #: Draws each segment's roll jitter in [0, n): Kafka's per-segment random jitter.
        self.jitter_rng: Callable[[int], int] = random.randrange
        self.topic = topic
        self.partition = partition
        channel = failure_channel if failure_channel is not None else LogDirFailureChannel()
        self.failure_channel = channel
        self.log_dir = os.path.dirname(self.dir) or "."  # Kafka's parentDir: its log dir
        self._offline_dirs = channel.offline  # checked before every write: a set lookup
        self._validator: LogValidator | None = None  # built by the first append
        self._lock = threading.Lock()  # guards segment list changes vs. flush snapshots
        self._flush_lock = threading.Lock()  # one flush at a time per log
        self._segs: list[LogSegment] = []
        self._base_list: list[int] = []
        self._next_offset = 0
        self.log_start_offset = 0
        self.recovery_point = 0
        self.last_flush_ms = system_wall_ms() if now_ms is None else now_ms
        self._closed = False
        self._unsynced_snapshots: list[Path] = []  # written at roll, fsynced by the next flush
        #: counts truncations: a flush that began before one never moves the recovery point
        #: (the offsets it fsynced may be gone, and others appended in their place)
        self._truncations = 0
        #: (due wall ms, segment): segments out of the log (retention, the cleaner's swap),
        #: renamed ``.deleted``, waiting for file.delete.delay.ms before their files go.
        self._deleted_segments: list[tuple[int, LogSegment]] = []
        #: producer state and leader epochs (``producer_state``, ``leader_epoch_cache``):
        #: made when the log opens
        self._pstate = None
        self._epochs = None
        #: a deferred log (``Log.deferred``) is opened on first use; until then its latest
        #: leader epoch is this hint (None: unknown, the log opens to answer)
        self._epoch_hint: int | None = None
        self._opened = False
        #: a transaction index failed its check at load: rebuild them all from the log start.
        self._rebuild_txn_indexes = False
        #: the partition's high watermark, None while no partition tracks it (then the log
        #: end offset stands for it): the cleaner never cleans past it.
        self.high_watermark: int | None = None
        #: the log dir's writer thread (the LogManager sets it): with flush.messages=1 the
        #: appended bytes are written and fsynced there, off the event loop.
        self.writer: LogDirWriter | None = None
        #: the end offset of the last append handed to the writer since the last truncation
        self._deferred_end = -1
        #: told on the event loop ``(end offset, fsync seconds)`` when the writer made the log
        #: durable up to an offset (the partition moves its high watermark then).
        self.on_durable: Callable[[int, float], None] | None = None
        #: with writes for the old active segment still queued at a roll, the new base
        #: offset: once durable past it, the old segment's descriptor is closed.
        self._release_after: int | None = None
        #: told on the event loop (the wall ms of the change) when segments were renamed
        #: ``.deleted`` to be removed after file.delete.delay.ms: the owner schedules their
        #: removal (Kafka's scheduled deleteSegmentFiles). Without one, the next retention
        #: pass or the close removes them.
        self.on_segments_deleted: Callable[[int], None] | None = None
        #: called with the log before a deferred log opens, i.e. before anything can change
        #: its files (the LogManager records it durably: a crash later must recover it).
        self.on_open: Callable[[Log], None] | None = None

    @classmethod
    def load(
        cls,
        dir: Path,
        config: LogConfig,
        topic: str,
        partition: int,
        clean_shutdown: bool,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        failure_channel: LogDirFailureChannel | None = None,
        clock: WallClock | None = None,
    ) -> Log:
        """Open an existing (or new) log; without a clean shutdown, recover first."""
        return cls(
            dir,
            config,
            topic,
            partition,
            clean_shutdown=clean_shutdown,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            failure_channel=failure_channel,
            clock=clock,
        )

    @classmethod
    def deferred(
        cls,
        dir: Path,
        config: LogConfig,
        topic: str,
        partition: int,
        *,
        log_end_offset: int,
        log_start_offset: int,
        latest_epoch: int | None,
        failure_channel: LogDirFailureChannel | None = None,
        clock: WallClock | None = None,
    ) -> Log:
        """A log shut down cleanly, opened on first use (Kafka's lazy loading, taken to the
        whole log): no file is read or opened now. A clean shutdown fsynced it, closed it
        with a producer snapshot at its end and checkpointed ``log_end_offset`` as its
        recovery point, so until anything reads or writes it, the checkpoints say all the
        broker needs: its offsets and (``latest_epoch``) the epoch its partition leads in.
        The first read, append, flush of new data or retention pass opens it as a clean load
        would (``_open``)."""
        log = cls.__new__(cls)
        log._init_fields(dir, config, topic, partition, None, failure_channel, clock)
        log._next_offset = log_end_offset
        log.recovery_point = log_end_offset
        log.log_start_offset = log_start_offset
        log._epoch_hint = latest_epoch
        return log

    @property
    def opened(self) -> bool:
        """Whether the log's files were read (a deferred log is not, until first used)."""
        return self._opened

    def _open(self) -> None:
        """Open a deferred log: the clean load its start skipped. A disk error takes the dir
        offline; no descriptor left fails this request alone (the next use tries again)."""
        with _OPEN_LOCK:
            if self._opened:
                return
            if self._closed:
                raise KafkaStorageError(f"the log of {self.topic}-{self.partition} is closed")
            if self.log_dir in self._offline_dirs:
                raise self._offline_error()
            if self.on_open is not None:
                try:
                    self.on_open(self)
                except OSError as e:
                    raise self._dir_failed("recording the opening of", e) from e
                self.on_open = None
            expected = self._next_offset
            self._pstate = ProducerStateManager(self.dir, self.topic, self.partition)
            self._epochs = LeaderEpochFileCache(self.dir / LEADER_EPOCH_CHECKPOINT_FILE)
            self._opened = True  # the load below reads the log's own properties
            try:
                self._load(True, expected, self.log_start_offset, self.clock.wall_ms())
            except BaseException as e:
                self._opened = False
                for seg in self._segs:
                    seg.close_quietly()
                self._segs, self._base_list = [], []
                self._pstate = self._epochs = None
                self._next_offset = self.recovery_point = expected
                if isinstance(e, OSError):
                    raise self._dir_failed("opening", e) from e
                if isinstance(e, StartupError):
                    raise KafkaStorageError(str(e)) from e
                raise
            if self._next_offset != expected:
                logger.warning("log end offset differs from the checkpointed one",
                               topic=self.topic, partition=self.partition,
                               checkpointed=expected, found=self._next_offset)
            if self.high_watermark is not None:
                self._pstate.on_high_watermark_updated(self.high_watermark)

    def _ensure_open(self) -> None:
        if not self._opened:
            self._open()

    @property
    def segments(self) -> list[LogSegment]:
        if not self._opened:
            self._open()
        return self._segs

    @segments.setter
    def segments(self, value: list[LogSegment]) -> None:
        self._segs = value

    @property
    def _bases(self) -> list[int]:
        if not self._opened:
            self._open()
        return self._base_list

    @_bases.setter
    def _bases(self, value: list[int]) -> None:
        self._base_list = value

    @property
    def producer_state(self) -> ProducerStateManager:
        if not self._opened:
            self._open()
        return self._pstate  # type: ignore[return-value]

    @property
    def leader_epoch_cache(self) -> LeaderEpochFileCache:
        """Which leader epoch wrote which offsets (broker/log/leader_epoch_cache.py)."""
        if not self._opened:
            self._open()
        return self._epochs  # type: ignore[return-value]

    @leader_epoch_cache.setter
    def leader_epoch_cache(self, value: LeaderEpochFileCache) -> None:
        self._epochs = value

    # -- loading (Kafka's LogLoader) -------------------------------------------------------------
    def _load(
        self, clean_shutdown: bool, recovery_point: int, log_start_offset: int, now_ms: int | None
    ) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        # One listing of the dir serves the whole load (a second one only after debris was
        # cleared): with thousands of logs to recover, listings were the largest cost.
        listed = os.listdir(self.dir)
        swaps: list[int] = []
        debris = False
        for name in listed:
            m = _SWAP_LOG_NAME.match(name)
            if m is not None:
                swaps.append(int(m.group(1)))
            elif name.endswith(_LEFTOVER_SUFFIXES):
                os.unlink(self.dir / name)  # debris of an interrupted delete, clean or swap
                debris = True
        for base in sorted(swaps):
            self._complete_swap(base)
        if swaps or debris:
            listed = os.listdir(self.dir)
        bases: set[int] = set()
        names: set[str] = set()
        for name in listed:
            names.add(name)
            m = _SEGMENT_NAME.match(name)
            if m is not None and m.group(2) == "log":
                bases.add(int(m.group(1)))
        for name in list(names):
            m = _SEGMENT_NAME.match(name)
            if m is not None and m.group(2) != "log" and int(m.group(1)) not in bases:
                os.unlink(self.dir / name)  # an index without its log
                names.discard(name)
        # Only the last segment is opened (it is appended to); the others are stat'ed and
        # read when someone reads them (Kafka's lazy segment loading).
        ordered = sorted(bases)
        segments: list[LogSegment] = []
        try:
            for i, base in enumerate(ordered):
                segments.append(self._open_segment(base, now_ms, names,
                                                   active=i == len(ordered) - 1))
        except BaseException:
            for seg in segments:
                seg.close_quietly()
            raise
        if not clean_shutdown and segments:
            segments = recover_segments(segments, recovery_point)
        if not segments:
            segments = [
                LogSegment(self.dir, log_start_offset, self._index_interval(), now_ms=now_ms,
                           preallocate=self._init_file_size(), hold=False)
            ]
        elif not segments[-1].holds_fd:
            segments[-1].hold()  # recovery deleted the segments after a corrupt one
        self.segments = segments
        self._bases = [s.base_offset for s in segments]
        active = segments[-1]
        active.roll_jitter_ms = self.config.random_segment_jitter(self.jitter_rng)
        try:
            next_offset, end = active.scan_tail()
            if end != active.size:
                raise CorruptRecordError(f"torn tail at position {end} of {active.log_path}")
        except CorruptRecordError as e:
            # the tail of a log that should be whole is damaged anyway: recover that segment
            logger.warning(
                "recovering the torn tail of the active segment", dir=str(self.dir), reason=str(e)
            )
            recover_segment(active)
            next_offset = active.read_next_offset()
        self._next_offset = next_offset
        self.log_start_offset = min(
            max(log_start_offset, segments[0].base_offset), self._next_offset
        )
        if clean_shutdown:
            self.recovery_point = self._next_offset
        else:
            self.recovery_point = max(min(recovery_point, self._next_offset), self.log_start_offset)
        self._load_leader_epochs()
        # After a clean shutdown the last snapshot is at the log end offset: nothing to scan.
        # After a crash only data below the recovery point is known to be on disk, and with it
        # the snapshots of that data. The scan also rebuilds the transaction indexes from
        # where it starts, so a damaged one makes it start at the log start offset.
        if self._rebuild_txn_indexes:
            load_limit = self.log_start_offset
        elif clean_shutdown:
            load_limit = self._next_offset
        else:
            load_limit = self.recovery_point
        unsynced = self.producer_state.load(
            self.segments,
            self.log_start_offset,
            self._next_offset,
            load_limit,
            recovery_point=self.recovery_point,
            listed=names,
        )
        if unsynced is not None:
            self._unsynced_snapshots.append(unsynced)  # fsynced by the next flush
        # Loaded, the log holds no descriptor until its first append (reads borrow one): a
        # broker recovering more partitions than its open-file limit still starts.
        self.segments[-1].release()

    def _complete_swap(self, base: int) -> None:
        """Finish a segment swap a crash interrupted (Kafka's LogLoader swap recovery).

        A ``<base>.log.swap`` exists only once a cleaned segment was written whole and fsynced
        (see ``replace_segments``), so it replaces every segment whose base offset lies in the
        offsets it covers, ``[base, its next offset)``; the replaced segments' files may still
        be there under their own names or may already be gone (renamed ``.deleted``). Its
        index files are not trusted (they may be half renamed): the offset and time indexes
        are rebuilt when the segment opens, the transaction indexes by a producer-state scan
        from the log start.
        """
        swap = self.dir / f"{base:020d}.log{SWAP_FILE_SUFFIX}"
        end = max(_next_offset_of_file(swap, base), base + 1)
        for entry in list(os.scandir(self.dir)):
            m = _SEGMENT_NAME.match(entry.name)
            if m is None or m.group(2) != "log":
                continue
            other = int(m.group(1))
            if base <= other < end:
                for suffix in (".log", INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX,
                               TXN_INDEX_FILE_SUFFIX):
                    (self.dir / f"{other:020d}{suffix}").unlink(missing_ok=True)
        for suffix in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX):
            (self.dir / f"{base:020d}{suffix}").unlink(missing_ok=True)
        os.replace(swap, self.dir / f"{base:020d}.log")
        disk.fsync_dir(self.dir)
        self._rebuild_txn_indexes = True
        logger.info("completed an interrupted segment swap", dir=str(self.dir), base_offset=base,
                    next_offset=end)

    def _index_interval(self) -> int:
        return self.config.index_interval_bytes

    def _init_file_size(self) -> int:
        """Kafka's LogConfig.initFileSize: a new segment's file length (preallocate)."""
        return self.config.segment_bytes if self.config.preallocate else 0

    def _open_segment(self, base: int, now_ms: int | None, names: set[str],
                      active: bool) -> LogSegment:
        """Open a segment (only the ``active`` one holds a descriptor); missing indexes or
        ones of a broken size are rebuilt. Only the active segment's indexes are read here;
        as Kafka's lazy indexes, the others are read when first needed (segments past the
        recovery point are recovered anyway)."""
        prefix = f"{base:020d}"
        if prefix + TXN_INDEX_FILE_SUFFIX in names:
            txn_index_path = self.dir / (prefix + TXN_INDEX_FILE_SUFFIX)
            try:
                TransactionIndex(txn_index_path, base).sanity_check()
            except TxnIndexCorruptError as e:
                logger.warning(
                    "rebuilding transaction indexes", dir=str(self.dir), base_offset=base,
                    reason=str(e),
                )
                txn_index_path.unlink()
                self._rebuild_txn_indexes = True
        index_missing = (
            prefix + INDEX_FILE_SUFFIX not in names
            or prefix + TIME_INDEX_FILE_SUFFIX not in names
        )
        seg = LogSegment(self.dir, base, self._index_interval(), now_ms=now_ms, active=active)
        if not index_missing:
            try:
                _check_indexes(seg, full=active)
            except IndexCorruptError as e:
                logger.warning(
                    "rebuilding segment indexes", dir=str(self.dir), base_offset=base,
                    reason=str(e)
                )
                seg.close_quietly()
                for suffix in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX):
                    (self.dir / (prefix + suffix)).unlink(missing_ok=True)
                seg = LogSegment(self.dir, base, self._index_interval(), now_ms=now_ms,
                                 active=active)
                index_missing = True
        if index_missing and seg.size > 0:
            recover_segment(seg)
        return seg

    # -- state ----------------------------------------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        """The next offset to be assigned (Kafka's LEO)."""
        return self._next_offset

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def num_segments(self) -> int:
        return len(self.segments)

    @property
    def unflushed_messages(self) -> int:
        """Offsets appended but not yet fsynced (Kafka's unflushedMessages)."""
        return self._next_offset - self.recovery_point

    def flush_due(self, now_ms: int) -> bool:
        """Whether ``log.flush.interval.messages`` or ``log.flush.interval.ms`` says flush
        (never for a log whose writer thread fsyncs every batch itself)."""
        unflushed = self.unflushed_messages
        if unflushed <= 0 or self.offline or self.writes_on_writer:
            return False
        if unflushed >= self.config.flush_interval_messages:
            return True
        return now_ms - self.last_flush_ms >= self.config.flush_interval_ms

    def __repr__(self) -> str:
        return (
            f"Log({self.topic}-{self.partition}, start={self.log_start_offset}, "
            f"end={self._next_offset}, segments={len(self._segs) if self._opened else '?'})"
        )

    # -- disk faults ------------------------------------------------------------------------------
    @property
    def offline(self) -> bool:
        """Whether this log's dir failed: nothing of it is written until the broker restarts."""
        return self.log_dir in self._offline_dirs

    def _offline_error(self) -> KafkaStorageError:
        return KafkaStorageError(
            f"the log dir {self.log_dir} of {self.topic}-{self.partition} is offline after a "
            "disk error"
        )

    def _dir_failed(self, action: str, error: OSError) -> KafkaStorageError:
        """Report the dir to the failure channel (offline from now on); the error to raise.
        No descriptor left (EMFILE, ENFILE) is not a disk fault: only this request fails."""
        message = f"error while {action} {self.topic}-{self.partition} in dir {self.log_dir}"
        if is_fd_exhaustion(error):
            return open_file_limit_error(message, error)
        self.failure_channel.maybe_add_offline_log_dir(self.log_dir, message, error)
        return KafkaStorageError(f"{message}: {error}")

    dir_failed = _dir_failed  # the writer thread reports its failed writes through it

    # -- the log dir's writer -------------------------------------------------------------------
    @property
    def writes_on_writer(self) -> bool:
        """Whether appends are written and fsynced by the dir's writer thread: flush.messages=1
        and a writer (a log opened outside a LogManager on a running loop has none)."""
        return self.writer is not None and self.config.flush_interval_messages == 1

    def _drain_writes(self) -> None:
        """Wait for the writer to finish what is queued: before a segment's files are closed,
        deleted or swapped, and before a flush that must cover every append."""
        writer = self.writer
        if writer is not None and writer.pending:
            writer.drain()

    def _defer(self, writes: list[Write], end_offset: int) -> None:
        """Hand an append's writes to the writer thread (flush.messages=1), before the end
        offset moves, so a flush on another thread that reads the end offset then drains the
        writer covers no unwritten byte."""
        self.writer.submit(self, writes, end_offset)  # type: ignore[union-attr]
        self._deferred_end = end_offset

    @property
    def writer_covers_end(self) -> bool:
        """Whether the dir's writer was handed this log's appends up to its end: its fsync
        then makes all of it durable, what was appended before them included (the unflushed
        tail recovered at a start), with no flush asked for."""
        return self.writes_on_writer and self._deferred_end >= self._next_offset

    def sync_written(self, end_offset: int) -> None:
        """On the writer's sync thread, once everything below ``end_offset`` is written: fsync
        it (and advance the recovery point), as ``flush`` does. The segments' own fds are
        fsynced, not duplicates: no file of this log closes while its writer has work."""
        self._flush_to(end_offset, own_fds=True)

    def _release_inactive(self) -> None:
        """Close the own descriptors of segments no longer appended to (they borrow one from
        the cache when read): the active segment is the only one a partition keeps open."""
        self._release_after = None
        with self._lock:
            for seg in self.segments[:-1]:
                if seg.holds_fd:
                    seg.release()

    def on_written(self, end_offset: int, seconds: float) -> None:
        """On the event loop: the writer made everything below ``end_offset`` durable."""
        release_after = self._release_after
        if release_after is not None and end_offset >= release_after and not self._closed:
            self._release_inactive()
        listener = self.on_durable
        if listener is not None and not self._closed:
            listener(end_offset, seconds)

    # -- append ---------------------------------------------------------------------------------
    def append(
        self,
        records: bytearray | memoryview | bytes,
        now_ms: int,
        *,
        leader_epoch: int = 0,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> AppendInfo:
        """Validate a produce request's records, assign offsets in place, write them.

        A writable ``records`` (an owned request frame) is stamped and written as it is, so
        the caller must not reuse it: with a writer its write happens later,
        from that very buffer. Bytes and read-only views are copied once first.

        Raises the ``protocol.record_batch`` errors and the LogValidator's record errors (each
        with Kafka's ``error_code``) before touching the log. A batch may be stored recompressed
        when the topic's ``compression.type`` says so. ``leader_epoch`` is stamped into each
        batch as a Kafka leader does. KafkaStorageError when the dir is offline or the write
        fails (which takes it offline); the log is then as it was before the call.

        ``origin`` is Kafka's AppendOrigin: a CLIENT may not write control batches and its
        idempotent batches need a sequence; a COORDINATOR may write end-transaction markers
        and batches without a sequence (their sequences are not checked, their epochs are).
        A transactional batch opens its producer's transaction; a marker completes it, and an
        ABORT marker's transaction goes into the segment's transaction index.
        """
        if self.log_dir in self._offline_dirs:
            raise self._offline_error()
        config = self.config
        client = origin is AppendOrigin.CLIENT
        if isinstance(records, bytes) or (isinstance(records, memoryview) and records.readonly):
            records = bytearray(records)  # offsets are written in place: needs a copy
        info = validate_produce_records(records, config.max_message_bytes, client=client)
        # Producer state first (Kafka's analyzeAndValidateProducerState): header fields only,
        # one unpack and one dict lookup per batch of an idempotent producer; records are
        # decoded only for the one record of an end-transaction marker.
        producer_state = self.producer_state
        producer_batches: list[tuple[int, int, int, int, int, bool]] = []
        marker: tuple[int, int, int, int, bool] | None = None  # pos, pid, epoch, coord, abort
        is_control = False
        for pos in info.positions:
            attributes, delta, _ts, pid, epoch, first_seq = _PRODUCER_FIELDS.unpack_from(
                records, pos + ATTRIBUTES_OFFSET
            )
            if attributes & CONTROL_MASK:
                is_control = True
                if pid < 0:
                    continue
                control_type, coordinator_epoch = read_end_txn_marker(records, pos)
                producer_state.check_end_txn_marker(pid, epoch, coordinator_epoch)
                marker = (pos, pid, epoch, coordinator_epoch, control_type == CONTROL_ABORT)
                continue
            if pid < 0:
                continue
            transactional = bool(attributes & TRANSACTIONAL_MASK)
            if first_seq < 0:
                last_seq = NO_SEQUENCE  # a coordinator's batch (validation refused clients')
            else:
                last_seq = increment_sequence(first_seq, delta)
            # An earlier batch of this producer in the same append is what this one must
            # follow (Kafka's updatedEntry); only appends of several batches have one.
            pending = None
            for _pos, p_pid, p_epoch, _first, p_last, _txn in reversed(producer_batches):
                if p_pid == pid:
                    pending = (p_epoch, p_last)
                    break
            duplicate = producer_state.check(
                pid, epoch, first_seq, last_seq, pending, transactional=transactional,
                client=client,
            )
            if duplicate is not None:
                return self._duplicate_info(duplicate)
            producer_batches.append((pos, pid, epoch, first_seq, last_seq, transactional))
        if not is_control:
            # Record-level rules and recompression (Kafka's LogValidator); headers only
            # unless the topic's rules need the records. Control batches are written as the
            # coordinator built them.
            validator = self._validator
            if validator is None:
                validator = self._validator = LogValidator(
                    config, f"{self.topic}-{self.partition}")
            records, info = validator.validate(records, info, now_ms)
        if info.size_in_bytes > config.segment_bytes:
            raise RecordBatchTooLargeError(
                f"message batch size is {info.size_in_bytes} bytes which exceeds the maximum "
                f"configured segment size of {config.segment_bytes}"
            )
        first_offset = self._next_offset
        log_append_time = now_ms if config.message_timestamp_type == LOG_APPEND_TIME else None
        last_offset = assign_offsets(
            records, first_offset, log_append_time, partition_leader_epoch=leader_epoch, info=info
        )
        if leader_epoch != self.leader_epoch_cache.latest_epoch and leader_epoch >= 0:
            # Kafka's maybeAssignEpochStartOffset: every batch carries the stamped epoch.
            self.leader_epoch_cache.assign(leader_epoch, first_offset)
        if log_append_time is not None:
            max_timestamp = log_append_time
            offset_of_max_timestamp = last_offset
        else:
            max_timestamp = info.max_timestamp
            offset_of_max_timestamp = first_offset + info.offset_delta_of_max_timestamp
        completed = None
        deferred: list[Write] | None = [] if self.writes_on_writer else None
        try:
            segment = self._maybe_roll(info.size_in_bytes, max_timestamp, last_offset, now_ms)
            if marker is not None:
                completed = producer_state.completed_txn(marker[1], first_offset, marker[4])
                if completed is not None and completed.is_aborted:
                    # Kafka's updateTxnIndex, with the LSO before the transaction completes.
                    segment.txn_index.append(
                        AbortedTxn(
                            completed.producer_id,
                            completed.first_offset,
                            completed.last_offset,
                            producer_state.last_stable_offset(completed),
                        )
                    )
            try:
                segment.append(last_offset, max_timestamp, offset_of_max_timestamp, records,
                               deferred)
            except OSError:
                if completed is not None and completed.is_aborted:
                    _quietly(segment.txn_index.truncate_to, first_offset)
                raise
        except OSError as e:
            raise self._dir_failed("appending to", e) from e
        if deferred is not None:
            self._defer(deferred, last_offset + 1)
        self._next_offset = last_offset + 1
        for pos, pid, epoch, first_seq, last_seq, transactional in producer_batches:
            delta, batch_max_ts = _PRODUCER_FIELDS.unpack_from(records, pos + ATTRIBUTES_OFFSET)[
                1:3
            ]
            base = _INT64.unpack_from(records, pos)[0]
            producer_state.update(
                pid,
                epoch,
                BatchMetadata(first_seq, last_seq, base, base + delta, batch_max_ts),
                transactional,
            )
        if marker is not None:
            marker_ts = _PRODUCER_FIELDS.unpack_from(records, marker[0] + ATTRIBUTES_OFFSET)[2]
            producer_state.update_end_txn_marker(
                marker[1], marker[2], marker[3], first_offset, marker_ts
            )
        producer_state.map_end_offset = self._next_offset
        return AppendInfo(
            first_offset=first_offset,
            last_offset=last_offset,
            log_append_time=-1 if log_append_time is None else log_append_time,
            max_timestamp=max_timestamp,
            num_records=info.num_records,
            size=info.size_in_bytes,
            offset_of_max_timestamp=offset_of_max_timestamp,
        )

    def append_end_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
        now_ms: int,
        *,
        leader_epoch: int = 0,
    ) -> AppendInfo:
        """Append a COMMIT or ABORT marker for the producer's transaction (Kafka's
        appendAsLeader with AppendOrigin.COORDINATOR, as WriteTxnMarkers does).

        INVALID_PRODUCER_EPOCH for an older producer epoch, TRANSACTION_COORDINATOR_FENCED for
        an older coordinator epoch than the producer's last marker. A marker for a producer
        without an open transaction is written all the same, as Kafka does.
        """
        marker = build_end_txn_marker(
            producer_id, producer_epoch, coordinator_epoch, commit, now_ms
        )
        return self.append(
            marker, now_ms, leader_epoch=leader_epoch, origin=AppendOrigin.COORDINATOR
        )

    # -- the follower's side (Kafka's appendAsFollower, truncateTo) --------------------------
    def append_as_follower(
        self, records: bytes | bytearray | memoryview, now_ms: int
    ) -> AppendInfo | None:
        """Append the leader's batches as they are (Kafka's appendAsFollower, origin
        REPLICATION): offsets, partition leader epochs and producer fields are kept, nothing
        is assigned and no record is re-validated. Only the framing is checked: each whole
        batch's CRC, that the first offset is at or past the log end and that offsets
        increase (gaps are allowed: the leader's log may be compacted). A partial trailing
        batch (a fetch response may end with one) is left out. None when no whole batch.

        Producer state follows the batches without sequence checks, an ABORT marker's
        transaction goes into the transaction index, and each batch whose epoch is newer than
        the cache's latest starts that epoch. With a writer (flush.messages=1) the bytes are
        written and fsynced there as the leader's appends are.
        """
        if self.log_dir in self._offline_dirs:
            raise self._offline_error()
        if not isinstance(records, bytes):
            records = bytes(records)  # owned and immutable: a deferred write reads it later
        batches = self._follower_batches(records)
        if not batches:
            return None
        first_offset = batches[0][1].base_offset
        max_timestamp = -1
        offset_of_max_timestamp = -1
        num_records = 0
        producer_state = self.producer_state
        epochs = self.leader_epoch_cache
        for pos, header in batches:
            base = header.base_offset
            last = header.last_offset
            size = header.size_in_bytes
            batch_ts = header.max_timestamp
            num_records += header.record_count
            if batch_ts > max_timestamp:
                max_timestamp, offset_of_max_timestamp = batch_ts, last
            epoch = header.partition_leader_epoch
            if epoch >= 0 and epoch > epochs.latest_epoch:
                epochs.assign(epoch, base)
            deferred: list[Write] | None = [] if self.writes_on_writer else None
            try:
                segment = self._roll_for_follower(size, batch_ts, base, last, now_ms)
                segment.append(last, batch_ts, last, records[pos:pos + size], deferred)
                self._replicate_producer_batch(segment, records, pos, header)
            except OSError as e:
                raise self._dir_failed("appending as follower to", e) from e
            if deferred is not None:
                self._defer(deferred, last + 1)
            self._next_offset = last + 1
        producer_state.map_end_offset = self._next_offset
        return AppendInfo(
            first_offset=first_offset,
            last_offset=self._next_offset - 1,
            log_append_time=-1,
            max_timestamp=max_timestamp,
            num_records=num_records,
            size=batches[-1][0] + batches[-1][1].size_in_bytes - batches[0][0],
            offset_of_max_timestamp=offset_of_max_timestamp,
        )

    def _follower_batches(self, records: bytes) -> list[tuple[int, BatchHeader]]:
        """The whole batches of a fetched record set, checked for framing, CRC and offsets."""
        out: list[tuple[int, BatchHeader]] = []
        expected = self._next_offset
        for pos, header in iter_batches(records):
            if not header.is_valid():
                raise CorruptRecordError(
                    f"record batch at offset {header.base_offset} for {self.topic}-"
                    f"{self.partition} fails its CRC check")
            base = header.base_offset
            if base < expected or header.last_offset_delta < 0:
                raise UnexpectedAppendOffsetError(
                    f"batch [{base}, {header.last_offset}] for {self.topic}-{self.partition} "
                    f"does not follow offset {expected}")
            expected = header.last_offset + 1
            out.append((pos, header))
        return out

    def _roll_for_follower(
        self, size: int, max_timestamp: int, base: int, last: int, now_ms: int
    ) -> LogSegment:
        """The segment to append a replicated batch to: a new one when the active segment is
        due to roll or cannot hold the batch's offsets (then it starts at the batch's base
        offset, past any gap, as Kafka rolls at the first offset)."""
        segment = self._maybe_roll(size, max_timestamp, last, now_ms)
        if segment.can_append_offset(last) and segment.base_offset <= base:
            return segment
        if segment.size == 0:
            raise UnexpectedAppendOffsetError(
                f"batch [{base}, {last}] does not fit the empty segment at "
                f"{segment.base_offset} of {self.topic}-{self.partition}")
        self._next_offset = base  # the gap before the batch holds nothing
        return self.roll(now_ms)

    def _replicate_producer_batch(
        self, segment: LogSegment, records: bytes, pos: int, header: BatchHeader
    ) -> None:
        """Producer state for one replicated batch, unchecked (Kafka's REPLICATION origin)."""
        pid = header.producer_id
        if pid < 0:
            return
        producer_state = self.producer_state
        base = header.base_offset
        if header.is_control:
            if header.record_count == 0:
                return
            control_type, coordinator_epoch = read_end_txn_marker(records, pos)
            aborted = control_type == CONTROL_ABORT
            completed = producer_state.completed_txn(pid, base, aborted)
            if completed is not None and completed.is_aborted:
                segment.txn_index.append(AbortedTxn(
                    pid, completed.first_offset, completed.last_offset,
                    producer_state.last_stable_offset(completed)))
            producer_state.update_end_txn_marker(
                pid, header.producer_epoch, coordinator_epoch, base, header.max_timestamp)
            return
        first_seq = header.base_sequence
        last = header.last_offset
        last_seq = NO_SEQUENCE if first_seq < 0 else increment_sequence(
            first_seq, header.last_offset_delta)
        producer_state.update(
            pid, header.producer_epoch,
            BatchMetadata(first_seq, last_seq, base, last, header.max_timestamp),
            header.is_transactional)

    def truncate_to(self, offset: int) -> bool:
        """Remove everything at and after ``offset`` (Kafka's truncateTo): later segments go,
        the one holding it is cut at the batch holding it, its indexes with it; producer
        state is rebuilt from the newest snapshot at or below the new end, the leader epoch
        cache and the transaction indexes lose what lies past it. Whether anything was
        removed (nothing is when ``offset`` is at or past the log end; an epoch entry
        starting at the log end still goes: this replica led in that epoch and appended
        nothing, and the leader's log, which it follows now, has no such epoch)."""
        if offset < 0:
            raise ValueError(f"cannot truncate {self.topic}-{self.partition} to {offset}")
        if self.log_dir in self._offline_dirs:
            raise self._offline_error()
        if offset >= self._next_offset:
            self._truncate_epochs_from_end(self._next_offset)
            return False
        if offset <= max(self.log_start_offset, self.segments[0].base_offset):
            self.truncate_fully_and_start_at(offset)
            return True
        self._drain_writes()
        try:
            with self._lock:
                keep = bisect_right(self._bases, offset - 1)
                removed = self.segments[keep:]
                del self.segments[keep:]
                del self._bases[keep:]
            for seg in removed:  # at once: a later roll may reuse their names
                seg.delete()
            active = self.segments[-1]
            if not active.holds_fd:
                active.hold()
            found = active.translate_offset(offset)
            if found is not None:
                active.truncate_to_position(found[0])
                recover_segment(active)  # indexes, max timestamp and txn index of what stays
            active.txn_index.truncate_to(offset)
            new_end = active.read_next_offset()
            self._after_truncation(new_end)
        except OSError as e:
            raise self._dir_failed("truncating", e) from e
        logger.info("truncated log", topic=self.topic, partition=self.partition,
                    offset=offset, log_end_offset=new_end)
        return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start empty at ``offset`` (Kafka's
        truncateFullyAndStartAt): log start, log end and recovery point move there, the
        epoch cache is cleared and producer state forgotten with its snapshots."""
        if self.log_dir in self._offline_dirs:
            raise self._offline_error()
        self._drain_writes()
        now_ms = self.clock.wall_ms()
        try:
            with self._lock:
                removed = list(self.segments)
                for seg in removed:  # first: the new segment may take one's name
                    seg.delete()
                fresh = LogSegment(self.dir, offset, self._index_interval(), now_ms=now_ms,
                                   preallocate=self._init_file_size())
                fresh.roll_jitter_ms = self.config.random_segment_jitter(self.jitter_rng)
                self.segments = [fresh]
                self._bases = [offset]
                self.log_start_offset = offset
            self.leader_epoch_cache.clear()
            producer_state = self.producer_state
            for snap in list(producer_state.snapshots):
                producer_state._delete_snapshot(snap)
            self._after_truncation(offset)
        except OSError as e:
            raise self._dir_failed("truncating fully", e) from e
        logger.info("truncated log fully", topic=self.topic, partition=self.partition,
                    log_start_offset=offset)

    def _after_truncation(self, new_end: int) -> None:
        """The log end moved back to ``new_end``: offsets, epochs and producer state follow."""
        with self._lock:
            self._truncations += 1
            self._deferred_end = -1
            self._next_offset = new_end
            self.recovery_point = max(min(self.recovery_point, new_end), self.log_start_offset)
        if self.high_watermark is not None and self.high_watermark > new_end:
            self.high_watermark = new_end
        self._unsynced_snapshots = [
            p for p in self._unsynced_snapshots if p.exists()]
        self._truncate_epochs_from_end(new_end)
        self.producer_state.load(self.segments, self.log_start_offset, new_end, new_end,
                                 recovery_point=self.recovery_point)

    def _truncate_epochs_from_end(self, end_offset: int) -> None:
        """The epoch cache loses the entries starting at or after ``end_offset``, on disk
        too."""
        epochs = self.leader_epoch_cache
        epochs.truncate_from_end(end_offset)
        try:
            epochs.write_if_dirty()
        except OSError as e:
            raise self._dir_failed("truncating the leader epochs of", e) from e

    # -- transactions -----------------------------------------------------------------------------
    @property
    def first_undecided_offset(self) -> int | None:
        """First offset of the earliest open transaction, None when none is open.

        Never below the log start offset: retention may have taken the transaction's first
        batches (Kafka moves its first unstable offset up the same way).
        """
        return self._not_below_start(self.producer_state.first_undecided_offset)

    @property
    def first_unstable_offset(self) -> int | None:
        """Kafka's firstUnstableOffset: as ``first_undecided_offset``, but a decided
        transaction stays unstable until the high watermark passes its marker."""
        return self._not_below_start(self.producer_state.first_unstable_offset)

    def _not_below_start(self, offset: int | None) -> int | None:
        return None if offset is None else max(offset, self.log_start_offset)

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """The partition's high watermark moved: decided transactions below it are stable."""
        self.high_watermark = high_watermark
        if self._opened:  # else applied when the log opens
            self.producer_state.on_high_watermark_updated(high_watermark)

    @property
    def last_stable_offset(self) -> int:
        """Kafka's lastStableOffset: the first unstable offset, capped by the high watermark
        (the log end offset while no partition tracks one). The cleaner stops below it."""
        hw = self._next_offset if self.high_watermark is None else self.high_watermark
        unstable = self.first_unstable_offset
        return hw if unstable is None else min(unstable, hw)

    def last_records_of_active_producers(self) -> dict[int, tuple[int | None, int]]:
        """Per producer id: (offset of its last data batch or None, its epoch): the batches
        (or the marker) the cleaner keeps, even empty, so sequences and fencing survive
        (Kafka's lastRecordsOfActiveProducers)."""
        out: dict[int, tuple[int | None, int]] = {}
        for entry in self.producer_state.active_producers():
            last_data = entry.batches[-1].last_offset if entry.batches else None
            out[entry.producer_id] = (last_data, entry.producer_epoch)
        return out

    # -- cleaning: snapshot and swap -----------------------------------------------------------
    def segments_for_cleaning(self, upper_offset: int) -> list[tuple[LogSegment, int, int]]:
        """``(segment, dup'd .log fd, size)`` of each inactive segment whose base offset is
        below ``upper_offset``, taken under the lock (as ``flush`` does): the cleaner reads
        through the fds, which stay valid if the loop deletes or closes the segment meanwhile.
        The caller closes the fds."""
        out: list[tuple[LogSegment, int, int]] = []
        self._drain_writes()  # a segment's size counts bytes still queued for the writer
        with self._lock:
            if self._closed:
                return out
            try:
                for seg in self.segments[:-1]:
                    if seg.base_offset >= upper_offset or seg.closed:
                        break
                    out.append((seg, seg.dup_log_fd(), seg.size))
            except OSError:
                for _seg, fd, _size in out:
                    os.close(fd)
                raise
        return out

    def replace_segments(self, cleaned: LogSegment, old: list[LogSegment],
                         now_ms: int | None = None) -> bool:
        """Swap ``cleaned`` (its files named ``.cleaned``, written whole and fsynced) in for
        the consecutive inactive segments ``old``; on the event loop. False, with nothing
        changed, when ``old`` are no longer this log's (retention, DeleteRecords, a close or
        a delete got there first): the caller deletes the cleaned files.

        Crash-safe as Kafka's replaceSegments: ``.cleaned`` -> ``.swap`` (dir fsynced), each
        old segment's files -> ``.deleted`` (dir fsynced), ``.swap`` -> final names. The old
        segments then wait file.delete.delay.ms, as retention's do, so a reader holding one
        keeps reading it. ``_complete_swap`` finishes the job at load wherever a crash stopped
        it. A disk error takes the dir offline.
        """
        if self._closed or self.offline or not old:
            return False
        segments = self.segments
        try:
            i = next(k for k, seg in enumerate(segments) if seg is old[0])
        except StopIteration:
            return False
        if i + len(old) >= len(segments) or any(
            segments[i + k] is not seg for k, seg in enumerate(old)
        ):
            return False  # gone, or would reach the active segment
        if cleaned.base_offset != old[0].base_offset:
            raise ValueError(
                f"cleaned segment base {cleaned.base_offset} != first replaced base "
                f"{old[0].base_offset}")
        self._drain_writes()
        try:
            cleaned.change_file_suffix(SWAP_FILE_SUFFIX)
            disk.fsync_dir(self.dir)
            for seg in old:
                seg.change_file_suffix(DELETED_FILE_SUFFIX)
            disk.fsync_dir(self.dir)
            cleaned.change_file_suffix("")
        except OSError as e:
            raise self._dir_failed("swapping cleaned segments into", e) from e
        cleaned.index_interval_bytes = self.config.index_interval_bytes
        with self._lock:
            segments[i : i + len(old)] = [cleaned]
            self._bases[i : i + len(old)] = [cleaned.base_offset]
            cleaned.release()  # inactive: it borrows a descriptor when read
        try:
            self._delete_later(old, self.clock.wall_ms() if now_ms is None else now_ms)
        except OSError as e:
            raise self._dir_failed("deleting swapped-out segments of", e) from e
        return True

    def collect_aborted_transactions(
        self, start_offset: int, upper_bound_offset: int
    ) -> list[AbortedTxn]:
        """Aborted transactions overlapping [start_offset, upper_bound_offset), from the
        transaction indexes of the segment holding ``start_offset`` on (Kafka's
        collectAbortedTransactions): the search stops at the first entry whose last stable
        offset reaches the bound, since no transaction aborted later can start below it."""
        segments = self.segments
        i = max(bisect_right(self._bases, start_offset) - 1, 0)
        out: list[AbortedTxn] = []
        while i < len(segments):
            result = segments[i].txn_index.collect(start_offset, upper_bound_offset)
            out.extend(result.aborted)
            if result.complete:
                break
            i += 1
        return out

    def _duplicate_info(self, batch: BatchMetadata) -> AppendInfo:
        """The answer to a retried batch: its original offsets, nothing appended."""
        logger.info(
            "duplicate batch: answered with its original offsets",
            topic=self.topic,
            partition=self.partition,
            first_offset=batch.first_offset,
            last_offset=batch.last_offset,
        )
        log_append_time = (
            batch.timestamp if self.config.message_timestamp_type == LOG_APPEND_TIME else -1
        )
        return AppendInfo(
            first_offset=batch.first_offset,
            last_offset=batch.last_offset,
            log_append_time=log_append_time,
            max_timestamp=batch.timestamp,
            num_records=0,
            size=0,
            offset_of_max_timestamp=-1,
            duplicate=True,
        )

    def _maybe_roll(
        self, messages_size: int, max_timestamp: int, max_offset: int, now_ms: int
    ) -> LogSegment:
        segment = self.segments[-1]
        if segment.should_roll(
            messages_size,
            max_timestamp,
            max_offset,
            now_ms,
            self.config.segment_bytes,
            self.config.roll_ms,
            self.config.max_index_size,
        ):
            return self.roll(now_ms)
        return segment

    def roll(self, now_ms: int | None = None) -> LogSegment:
        """Start a new active segment at the log end offset (no-op if the active one is empty).

        As Kafka, a producer snapshot is written at the new segment's base offset, so a
        rebuild can start there, and the rolled segment is flushed off the loop with its
        indexes and that snapshot, moving the recovery point to the new base offset (Kafka's
        scheduled ``flushUptoOffsetExclusive``): a restart after a crash then rereads only
        the active segment. Logs written by their dir's writer are fsynced there anyway.
        """
        active = self.segments[-1]
        if active.size == 0:
            return active
        new_base = self._next_offset
        active.on_become_inactive()  # trimmed before the next segment exists, as Kafka
        segment = LogSegment(self.dir, new_base, self._index_interval(),
                             now_ms=self.clock.wall_ms() if now_ms is None else now_ms,
                             preallocate=self._init_file_size())
        segment.roll_jitter_ms = self.config.random_segment_jitter(self.jitter_rng)
        with self._lock:
            self.segments.append(segment)
            self._bases.append(new_base)
        if self.writes_on_writer and self.writer.pending:  # type: ignore[union-attr]
            self._release_after = new_base  # writes for it still queued: on_written frees it
        else:
            self._release_inactive()
        producer_state = self.producer_state
        producer_state.map_end_offset = new_base
        path = producer_state.take_snapshot(sync=False, recovery_point=self.recovery_point)
        if path is not None:
            with self._lock:
                self._unsynced_snapshots.append(path)
        logger.info(
            "rolled segment", topic=self.topic, partition=self.partition, base_offset=new_base
        )
        writer = self.writer
        if writer is not None and not self.writes_on_writer:
            writer.flush_later(self, new_base)
        return segment

    # -- read -----------------------------------------------------------------------------------
    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_batch: bool = False,
    ) -> bytes | memoryview:
        """Whole batches from the one holding ``fetch_offset`` (Kafka's LocalLog.read).

        ``max_offset`` is an exclusive bound (the high watermark); ``max_bytes`` caps the
        result except that ``min_one_batch`` returns the first batch whole (KIP-74). Data
        comes from a single segment, like Kafka. Raises OffsetOutOfRangeError outside
        [log_start_offset, log_end_offset].
        """
        end = self._next_offset
        if fetch_offset < self.log_start_offset or fetch_offset > end:
            raise OffsetOutOfRangeError(
                f"offset {fetch_offset} is out of range for {self.topic}-{self.partition}: "
                f"[{self.log_start_offset}, {end}]"
            )
        if fetch_offset == end:
            return b""
        if max_offset is not None:
            if fetch_offset >= max_offset:
                return b""
            if max_offset >= end:
                max_offset = None
        segments = self.segments
        i = max(bisect_right(self._bases, fetch_offset) - 1, 0)
        try:
            while i < len(segments):
                data = segments[i].read(fetch_offset, max_bytes, max_offset, min_one_batch)
                if data is not None:
                    return data
                i += 1
        except OSError as e:
            if self._closed:
                raise  # a read after close is a bug here, not a fault of the disk
            raise self._dir_failed("reading", e) from e
        return b""

    # -- ListOffsets ------------------------------------------------------------------------------
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with timestamp >= ``timestamp``.

        Kafka's searchOffsetInLocalLog: the first segment whose largest timestamp reaches the
        target, then its time index, then headers, then the records of one batch.
        """
        try:
            for segment in list(self.segments):
                if segment.largest_timestamp() >= timestamp:
                    found = segment.find_offset_by_timestamp(timestamp, self.log_start_offset)
                    if found is not None:
                        return found
        except OSError as e:
            if self._closed:
                raise  # a read after close is a bug here, not a fault of the disk
            raise self._dir_failed("searching by timestamp", e) from e
        return None

    def max_timestamp_offset(self) -> tuple[int, int]:
        """``(offset, timestamp)`` of the record with the largest timestamp (ListOffsets -3).

        ``(-1, -1)`` for a log without timestamps (empty), as Kafka's response carries then.
        """
        best: LogSegment | None = None
        for segment in self.segments:
            if best is None or segment.max_timestamp_so_far > best.max_timestamp_so_far:
                best = segment
        if best is None or best.max_timestamp_so_far < 0:
            return -1, -1
        try:
            found = best.find_max_timestamp_offset()
        except OSError as e:
            if self._closed:
                raise  # a read after close is a bug here, not a fault of the disk
            raise self._dir_failed("searching the max timestamp of", e) from e
        return found if found is not None else (-1, -1)

    # -- leader epochs (Kafka's UnifiedLog over its LeaderEpochFileCache) ----------------------
    def _load_leader_epochs(self) -> None:
        """Kafka's LogLoader for the epoch cache: the checkpoint cut to the recovered log end,
        the epochs of the batches past the recovery point (or of every batch when the
        checkpoint holds none for a log that has data: a log written before the cache), cut
        to the log start. A checkpoint that is not Kafka's format fails the load, as it takes
        Kafka's log dir offline."""
        try:
            cache = LeaderEpochFileCache.load(self.dir)
        except LeaderEpochCheckpointError as e:
            raise StartupError(
                f"{e}: partition {self.topic}-{self.partition} cannot be loaded; move the file "
                "away and the broker rebuilds it from the log's batches") from None
        cache.truncate_from_end(self._next_offset)
        if len(cache) == 0:
            rebuild_from = self.log_start_offset
        else:
            rebuild_from = self.recovery_point
        if rebuild_from < self._next_offset:
            self._assign_epochs_of_batches(cache, rebuild_from)
        cache.truncate_from_start(self.log_start_offset)
        self.leader_epoch_cache = cache

    def _assign_epochs_of_batches(self, cache: LeaderEpochFileCache, from_offset: int) -> None:
        """Assign each batch's epoch from the one holding ``from_offset`` on, where it is newer
        than the latest (Kafka's recovery rule); batch headers only."""
        i = max(bisect_right(self._bases, from_offset) - 1, 0)
        for k, seg in enumerate(self.segments[i:]):
            position = seg.offset_index.lookup(from_offset)[1] if k == 0 else 0
            try:
                for _pos, header in seg.iter_batches(position):
                    epoch = header.partition_leader_epoch
                    if (epoch > cache.latest_epoch and epoch >= 0
                            and header.last_offset >= from_offset):
                        cache.assign(epoch, header.base_offset)
            except CorruptRecordError:
                return  # nothing valid follows a corrupt batch (recovery cut it already)

    @property
    def latest_epoch(self) -> int | None:
        """The epoch of the latest entry of the epoch cache (Kafka's latestEpoch)."""
        if not self._opened and (self._epoch_hint is not None or self._closed):
            return self._epoch_hint
        entry = self.leader_epoch_cache.latest_entry()
        return None if entry is None else entry.epoch

    def maybe_assign_epoch_start_offset(self, leader_epoch: int, start_offset: int) -> None:
        """Record that ``leader_epoch`` starts at ``start_offset`` (Kafka's
        maybeAssignEpochStartOffset: a replica becoming leader assigns its log end offset).
        A deferred log leading in the epoch it was shut down in stays closed: the assignment
        would change nothing (that epoch is its latest entry, starting at or below the end)."""
        if not self._opened and leader_epoch == self._epoch_hint:
            return
        self.leader_epoch_cache.assign(leader_epoch, start_offset)

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int] | None:
        """``(epoch, end offset)`` for OffsetForLeaderEpoch (Kafka's endOffsetForEpoch); None
        when the cache has no answer (UNDEFINED_EPOCH_OFFSET)."""
        epoch, offset = self.leader_epoch_cache.end_offset_for(leader_epoch, self._next_offset)
        return None if offset < 0 else (epoch, offset)

    def epoch_for_offset(self, offset: int) -> int | None:
        """The leader epoch of the batch holding ``offset``, from the cache (the epochs the
        batches carry), None below its first entry."""
        return self.leader_epoch_cache.epoch_for_offset(offset)

    def earliest_epoch_entry(self) -> EpochEntry | None:
        return self.leader_epoch_cache.earliest_entry()

    # -- retention --------------------------------------------------------------------------------
    def delete_old_segments(self, now_ms: int, high_watermark: int | None = None) -> int:
        """Apply retention.bytes then retention.ms, deleting whole segments; returns count.

        Kafka's rules: only a prefix of segments goes, never past ``high_watermark``
        (default: the log end offset); an expired non-empty active segment is deleted too,
        after rolling a fresh empty one, and the log start offset moves to the first
        remaining segment. Nothing happens on an offline dir.
        """
        if self.offline:
            return 0
        try:
            self.delete_due_segments(now_ms)
            return self._delete_old_segments(now_ms, high_watermark)
        except OSError as e:
            raise self._dir_failed("deleting old segments of", e) from e

    def _delete_old_segments(self, now_ms: int, high_watermark: int | None) -> int:
        hw = self._next_offset if high_watermark is None else high_watermark
        deleted = 0
        if self.config.delete:
            deleted += self._delete_retention_breached(now_ms, hw)
        start = self.log_start_offset

        def below_log_start(seg: LogSegment) -> bool:
            i = self._bases.index(seg.base_offset)
            upper = self._next_offset if i == len(self._bases) - 1 else self._bases[i + 1]
            return upper <= start

        deleted += self._delete_prefix(below_log_start, hw, now_ms, "log start offset breach")
        return deleted

    def _delete_retention_breached(self, now_ms: int, hw: int) -> int:
        deleted = 0
        retention_bytes = self.config.retention_bytes
        if retention_bytes >= 0:
            size = self.size_in_bytes
            if size >= retention_bytes:
                diff = size - retention_bytes

                def breached_size(seg: LogSegment) -> bool:
                    nonlocal diff
                    if diff - seg.size >= 0:
                        diff -= seg.size
                        return True
                    return False

                deleted += self._delete_prefix(breached_size, hw, now_ms, "retention.bytes")
        retention_ms = self.config.retention_ms
        if retention_ms >= 0:

            def breached_time(seg: LogSegment) -> bool:
                return now_ms - seg.largest_timestamp() > retention_ms

            deleted += self._delete_prefix(breached_time, hw, now_ms, "retention.ms")
        return deleted

    def _delete_prefix(
        self, predicate: Callable[[LogSegment], bool], hw: int, now_ms: int, reason: str
    ) -> int:
        segments = list(self.segments)
        deletable: list[LogSegment] = []
        for i, seg in enumerate(segments):
            is_last = i == len(segments) - 1
            upper_bound = self._next_offset if is_last else segments[i + 1].base_offset
            if is_last and seg.size == 0:
                break
            if not (hw >= upper_bound and predicate(seg)):
                break
            deletable.append(seg)
        if not deletable:
            return 0
        self._drain_writes()
        if len(deletable) == len(self.segments):
            self.roll(now_ms)
        new_start = self.segments[len(deletable)].base_offset
        with self._lock:
            self.log_start_offset = max(self.log_start_offset, new_start)
            if self.recovery_point < self.log_start_offset:
                self.recovery_point = self.log_start_offset
            del self.segments[: len(deletable)]
            del self._bases[: len(deletable)]
        self._delete_segment_files(deletable, now_ms)
        self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
        # Kafka deletes the snapshots of deleted segments; producers whose last batch went
        # with them are forgotten (see ProducerStateManager.on_log_start_offset_incremented).
        self.producer_state.on_log_start_offset_incremented(self.log_start_offset)
        for seg in deletable:
            logger.info(
                "deleted segment",
                topic=self.topic,
                partition=self.partition,
                base_offset=seg.base_offset,
                reason=reason,
                log_start_offset=self.log_start_offset,
            )
        return len(deletable)

    def _delete_segment_files(self, segments: list[LogSegment], now_ms: int) -> None:
        """Kafka's asyncDeleteSegment: with file.delete.delay.ms, the segments' files are
        renamed ``.deleted`` now and removed once the delay has passed, so a reader still
        holding one keeps reading it (its open descriptors survive the rename, and one
        borrowed later opens the new name); a restart removes leftovers. Without a delay they
        go at once."""
        if self.config.file_delete_delay_ms > 0:
            with self._lock:
                for seg in segments:
                    seg.change_file_suffix(DELETED_FILE_SUFFIX)
        self._delete_later(segments, now_ms)

    def _delete_later(self, segments: list[LogSegment], now_ms: int) -> None:
        """Segments out of the log (renamed ``.deleted`` when there is a delay): removed after
        file.delete.delay.ms, the one path of retention and the cleaner's swap."""
        delay = self.config.file_delete_delay_ms
        with self._lock:
            for seg in segments:
                if delay > 0:
                    self._deleted_segments.append((now_ms + delay, seg))
                else:
                    seg.delete()
        listener = self.on_segments_deleted
        if delay > 0 and segments and listener is not None:
            listener(now_ms)

    @property
    def pending_deletes(self) -> int:
        """Segments renamed ``.deleted`` whose files wait for file.delete.delay.ms."""
        return len(self._deleted_segments)

    def delete_due_segments(self, now_ms: int) -> int:
        """Remove the files of the ``.deleted`` segments whose delay has passed by ``now_ms``;
        returns how many."""
        with self._lock:
            due = [seg for at, seg in self._deleted_segments if at <= now_ms]
            if not due:
                return 0
            self._deleted_segments = [(at, seg) for at, seg in self._deleted_segments
                                      if at > now_ms]
        try:
            for seg in due:
                seg.delete()
        except OSError as e:
            raise self._dir_failed("deleting old segment files of", e) from e
        return len(due)

    def _close_deleted_segments(self, remove: bool) -> None:
        """At close nobody reads them any more: their descriptors are closed and, when
        ``remove``, their files removed (else the next load removes ``.deleted`` files)."""
        deleted, self._deleted_segments = self._deleted_segments, []
        for _at, seg in deleted:
            if remove:
                try:
                    seg.delete()
                    continue
                except OSError:
                    pass
            seg.close_quietly()

    def maybe_increment_log_start_offset(self, new_start: int, reason: str) -> bool:
        """Move the log start offset up to ``new_start`` (Kafka's maybeIncrementLogStartOffset).

        DeleteRecords calls it; offsets below are refused to readers at once, and the segments
        wholly below it go with the next retention pass (whatever the cleanup policy). The
        caller checks ``new_start`` against the high watermark. Returns whether it moved.
        """
        if self.offline:
            raise self._offline_error()
        if new_start <= self.log_start_offset:
            return False
        if new_start > self._next_offset:
            raise OffsetOutOfRangeError(
                f"log start offset {new_start} is past the log end offset {self._next_offset} "
                f"of {self.topic}-{self.partition}")
        with self._lock:
            self.log_start_offset = new_start
            if self.recovery_point < new_start:
                self.recovery_point = new_start
        self.producer_state.on_log_start_offset_incremented(new_start)
        self.leader_epoch_cache.truncate_from_start(new_start)
        logger.info("log start offset incremented", topic=self.topic, partition=self.partition,
                    log_start_offset=new_start, reason=reason)
        return True

    # -- durability ---------------------------------------------------------------------
    def flush(self) -> None:
        """fsync everything appended so far and advance ``recovery_point`` to it.

        Safe to call from a worker thread while the event loop appends: the end offset is
        read first, then the segments from the recovery point on are snapshotted and their
        fds duplicated under ``_lock``; the fsyncs run without holding it. A failed fsync
        takes the dir offline (KafkaStorageError) and is never retried: after one, the kernel
        may have dropped the dirty pages, so a second could succeed without them. The
        recovery point then stays where the last good flush put it.
        """
        target = self._next_offset
        self._drain_writes()
        self._flush_to(target)

    def flush_rolled(self, offset: int) -> None:
        """On the dir writer's flusher thread, after a roll started a segment at ``offset``:
        fsync the segments below it (data, indexes) and the roll's producer snapshot, then
        move the recovery point to ``offset`` (Kafka's ``flushUptoOffsetExclusive``). The
        active segment is left to the flush policy, and ``last_flush_ms`` to full flushes."""
        self._flush_to(offset, rolled=True)

    def _flush_to(self, target: int, own_fds: bool = False, rolled: bool = False) -> None:
        """fsync what is appended, and written, below ``target``; ``rolled``: only the
        segments wholly below it (``target`` is a segment's base offset)."""
        if not self._opened:
            return  # nothing was appended: the clean shutdown made all of it durable
        with self._flush_lock:
            if self.log_dir in self._offline_dirs:
                raise self._offline_error()
            epochs = self.leader_epoch_cache
            # Nothing new below ``target``: an epoch entry no batch was written in yet waits
            # for the flush that moves the recovery point past it (or the close), so a
            # broker flushing thousands of idle partitions fsyncs nothing for them.
            if target <= self.recovery_point and not self._unsynced_snapshots:
                return
            fds: list[tuple[int, bool]] = []
            segments: list[LogSegment] = []
            try:
                with self._lock:
                    if self._closed:
                        return
                    # a truncation since the target was taken: only what is left below it
                    target = min(target, self._next_offset)
                    truncations = self._truncations
                    recovery_point = self.recovery_point
                    start = max(bisect_right(self._bases, recovery_point) - 1, 0)
                    stop = len(self._bases)
                    if rolled:  # the rolled segments not yet covered: none once a flush was
                        stop = bisect_left(self._bases, target) if target > recovery_point \
                            else start
                    active = self.segments[-1]
                    for seg in self.segments[start:stop]:
                        if seg.closed:
                            continue
                        segments.append(seg)
                        # Only the active segment's own fd outlives this lock for sure (a
                        # rolled one's is closed once the writer is past it).
                        fds.extend(seg.sync_fds(own_fds and seg is active))
                    snapshots, self._unsynced_snapshots = self._unsynced_snapshots, []
                # A segment from the recovery point on may be a file made since the last
                # flush: its directory entry is made durable too (as Kafka's LocalLog.flush).
                new_files = any(seg.base_offset >= recovery_point for seg in segments)
                # Before the recovery point moves: the checkpoint covers what it passes.
                epochs.write_if_dirty()
                for fd, _close in fds:
                    disk.fsync(fd)
                for seg in segments:
                    seg.flush_indexes()
                if snapshots:
                    _fsync_files(snapshots)
                if new_files:
                    disk.fsync_dir(self.dir)
            except OSError as e:
                if self._closed_meanwhile(e):
                    return  # closed or deleted under the flush: nothing left to make durable
                raise self._dir_failed("flushing", e) from e
            finally:
                for fd, close in fds:
                    if close:
                        os.close(fd)
            with self._lock:
                if target > self.recovery_point and truncations == self._truncations:
                    self.recovery_point = target
                if not rolled:
                    self.last_flush_ms = system_wall_ms()

    def _closed_meanwhile(self, error: OSError) -> bool:
        """Whether ``error`` came from files the loop closed or removed during a flush
        (the log closed, or deleted with its directory), not from the disk."""
        with self._lock:
            return self._closed and isinstance(error, FileNotFoundError)

    def close(self, *, sync: bool = True) -> None:
        """Flush and close every segment (Kafka's close fsyncs too).

        Without ``sync`` everything is written but nothing fsynced and the recovery point
        stays: the LogManager's shutdown then syncs each dir's file system once and calls
        ``closed_durable`` (thousands of logs, one sync instead of several fsyncs each).

        On an offline dir nothing is written: the files are closed as they are and recovery
        checks them after the restart. A disk error while closing takes the dir offline and
        raises KafkaStorageError, with the files closed all the same.
        """
        if self._closed:
            return
        if self.offline or not self._opened:
            # never opened: as the last clean shutdown left it (snapshot at the end included)
            self._drain_writes()
            self._close_files()
            return
        try:
            if sync:
                self.flush()
            else:
                self._drain_writes()
            # Kafka's close: a snapshot at the log end offset, so the next start scans nothing.
            self.producer_state.map_end_offset = self._next_offset
            try:
                if not sync and self._next_offset > self.log_start_offset:
                    # (an empty log's entry has no batch: the next append assigns it again)
                    self.leader_epoch_cache.write_if_dirty(sync=False)
                self.producer_state.take_snapshot(sync=sync, recovery_point=self.recovery_point)
                with self._lock:
                    for seg in self.segments:
                        seg.close()
                    self._closed = True
                    self._close_deleted_segments(remove=True)
            except OSError as e:
                raise self._dir_failed("closing", e) from e
        finally:
            if not self._closed:
                self._close_files()

    def closed_durable(self) -> None:
        """After ``close(sync=False)``: the file system was synced since, so everything the
        log wrote is durable and its recovery point is its end (the checkpoint says so next)."""
        self._unsynced_snapshots = []
        self.recovery_point = self._next_offset

    def _close_files(self) -> None:
        """Close every segment's files without writing to them."""
        with self._lock:
            for seg in self._segs:
                seg.close_quietly()
            self._closed = True
            self._close_deleted_segments(remove=False)

    def delete(self) -> None:
        """Close without flushing and remove the whole partition directory."""
        self._drain_writes()
        with self._lock:
            for seg in self._segs:
                seg.close_quietly()
            self._closed = True
            self._close_deleted_segments(remove=False)
            self._segs = []
            self._base_list = []
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def closed(self) -> bool:
        return self._closed

    def producer_snapshot_offsets(self) -> list[int]:
        """Offsets of the producer snapshot files on disk (tests, tools)."""
        return list(self.producer_state.snapshots)

    def update_config(self, config: LogConfig) -> None:
        """Apply new settings (IncrementalAlterConfigs); they take effect on the next append.

        Leaving flush.messages=1 drains the writer first: a later append written here must
        never land in the file (and be acknowledged) before earlier ones still queued. Any
        other change needs no drain, so re-applying a topic's settings (a topic created, a
        partition led) never holds the event loop while the writer works."""
        if self.config.flush_interval_messages == 1 and config.flush_interval_messages != 1:
            self._drain_writes()
        self.config = config
        self._validator = None  # rebuilt for the new config by the next append
        for seg in self._segs:  # a deferred log's segments get it when it opens
            seg.index_interval_bytes = config.index_interval_bytes


def _check_indexes(seg: LogSegment, full: bool) -> None:
    """The indexes' sanity checks: ``full`` reads them (the active segment's, read anyway);
    otherwise only their sizes are checked, without reading them."""
    if full:
        seg.offset_index.sanity_check(seg.size)
        seg.time_index.sanity_check()
        return
    for index in (seg.offset_index, seg.time_index):
        size = os.stat(index.path).st_size
        if size % index.entry_size:
            raise IndexCorruptError(
                f"index file {index.path} has size {size}, not a multiple of {index.entry_size}")


def _quietly(undo: Callable[[int], None], arg: int) -> None:
    """Best-effort undo after a failed write: the dir goes offline anyway."""
    try:
        undo(arg)
    except OSError:
        pass


def _next_offset_of_file(path: Path, base: int) -> int:
    """The offset after the last whole batch of a ``.log`` file (``base`` when it has none)."""
    fd = disk.open_file(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        data = disk.pread(fd, size, 0)
    finally:
        os.close(fd)
    next_offset = base
    try:
        for _pos, header in iter_batches(data):
            next_offset = header.next_offset
    except CorruptRecordError:
        pass  # cannot happen to a file fsynced whole; recovery judges its batches anyway
    return next_offset


def _fsync_files(paths: list[Path]) -> None:
    """fsync files written without it (and their directory); files deleted since are skipped."""
    synced = False
    for path in paths:
        try:
            fd = disk.open_file(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            disk.fsync(fd)
            synced = True
        finally:
            os.close(fd)
    if synced:
        disk.fsync_dir(paths[0].parent)
