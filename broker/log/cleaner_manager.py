"""Which compacted log to clean next, and the cleaner's per-partition state (Kafka's
LogCleanerManager).

* ``cleaner-offset-checkpoint`` in each log dir (Kafka's name and text format, as the other
  checkpoints of manager.py): per partition, the first dirty offset, i.e. where the last clean
  stopped. Everything below it has been cleaned at least once.
* A log is a candidate when its cleanup policy has ``compact``; its dirty ratio is the bytes of
  the cleanable dirty section over the bytes of the clean plus cleanable sections. The dirtiest
  log whose ratio exceeds ``min.cleanable.dirty.ratio`` is cleaned first, or any log whose
  oldest dirty segment is older than ``max.compaction.lag.ms``.
* The cleanable section ends at the first uncleanable offset: the lowest of the active
  segment's base offset, the last stable offset (which is capped by the high watermark) and
  the base of the first dirty segment holding records younger than ``min.compaction.lag.ms``;
  then rounded down to a segment base.
* Per partition: in progress (one thread cleans it), paused (a count: deletion or anything
  else that must not race a swap), aborted (paused while in progress: the cleaning thread
  drops its work at its next check and the swap, which runs on the event loop, refuses).
  Unlike Kafka, ``abort_and_pause`` never waits for the cleaning thread: every change a clean
  makes to a log happens on the event loop after checking these flags, so once it returns on
  the loop, no swap can follow.
* Uncleanable partitions: a clean that failed for a reason other than the disk marks its
  partition, which is then skipped until its log goes away or the broker restarts.

Thread-safety: the state sets are guarded by ``_lock``; ``grab_filthiest`` and
``dirty_ratios`` read the logs and must run on the event loop; checkpoint files are written by
the cleaner threads (``write_checkpoints``), never on the loop.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from broker.log.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from broker.log.dir_failure import LogDirFailureChannel

if TYPE_CHECKING:
    from broker.log.log import Log
    from broker.log.manager import LogManager
    from broker.log.segment import LogSegment

__all__ = [
    "CLEANER_OFFSET_CHECKPOINT_FILE",
    "CleanerManager",
    "LogToClean",
    "cleanable_offsets",
    "max_compaction_delay",
]

logger = structlog.get_logger("broker.log.cleaner")

CLEANER_OFFSET_CHECKPOINT_FILE = "cleaner-offset-checkpoint"
LONG_MAX = 2**63 - 1

TopicPartition = tuple[str, int]


def _segments_between(log: Log, start: int, end: int) -> list[LogSegment]:
    """Kafka's logSegments(from, to): from the segment holding ``start`` (or the first) to the
    last one whose base offset is below ``end``."""
    if start >= end:
        return []
    segments = log.segments
    first = 0
    for i, seg in enumerate(segments):
        if seg.base_offset <= start:
            first = i
        else:
            break
    return [s for s in segments[first:] if s.base_offset < end]


def _non_active_from(log: Log, offset: int) -> list[LogSegment]:
    """Kafka's nonActiveLogSegmentsFrom: inactive segments from the one holding ``offset``."""
    return _segments_between(log, offset, log.active_segment.base_offset)


def cleanable_offsets(
    log: Log, last_clean_offset: int | None, now_ms: int
) -> tuple[int, int, bool]:
    """``(first dirty offset, first uncleanable offset, checkpoint must be rewritten)``.

    A checkpoint below the log start offset (retention or DeleteRecords moved past it) or
    beyond the log end offset (the log was cut) restarts from the log start offset.
    """
    start = log.log_start_offset
    checkpoint = start if last_clean_offset is None else last_clean_offset
    if checkpoint < start:
        if not log.config.delete:
            logger.warning("resetting the first dirty offset to the log start offset",
                           topic=log.topic, partition=log.partition, checkpoint=checkpoint,
                           log_start_offset=start)
        first_dirty, force = start, True
    elif checkpoint > log.log_end_offset:
        logger.warning("the cleaner checkpoint is past the log end offset: cleaning from the "
                       "log start offset", topic=log.topic, partition=log.partition,
                       checkpoint=checkpoint, log_end_offset=log.log_end_offset)
        first_dirty, force = start, True
    else:
        first_dirty, force = checkpoint, False
    bounds = [log.last_stable_offset, log.active_segment.base_offset]
    lag = max(log.config.min_compaction_lag_ms, 0)
    if lag > 0:
        for seg in _non_active_from(log, first_dirty):
            if seg.largest_timestamp() > now_ms - lag:
                bounds.append(seg.base_offset)
                break
    return first_dirty, max(first_dirty, min(bounds)), force


def max_compaction_delay(log: Log, first_dirty_offset: int, now_ms: int) -> int:
    """How long past ``max.compaction.lag.ms`` the oldest dirty inactive segment is (0: not
    due). A segment's age is its first batch's timestamp, as Kafka's."""
    lag = max(log.config.max_compaction_lag_ms, 0)
    if lag >= LONG_MAX:
        return 0
    stamps = [
        s.rolling_based_timestamp for s in _non_active_from(log, first_dirty_offset)
        if s.rolling_based_timestamp is not None and s.rolling_based_timestamp > 0
    ]
    if not stamps:
        return 0
    clean_until = now_ms - lag
    earliest = min(stamps)
    return clean_until - earliest if earliest < clean_until else 0


@dataclass(slots=True)
class LogToClean:
    """One compacted log's sections (Kafka's LogToClean): clean bytes below the first dirty
    offset, cleanable bytes from there to the first uncleanable segment base."""

    tp: TopicPartition
    log: Log
    first_dirty_offset: int
    #: the base offset of the segment holding the first uncleanable offset (or the active one)
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    need_compaction_now: bool = False

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        total = self.total_bytes
        return self.cleanable_bytes / total if total else 0.0

    @classmethod
    def of(cls, tp: TopicPartition, log: Log, first_dirty: int, uncleanable: int,
           need_compaction_now: bool = False) -> LogToClean:
        clean_bytes = sum(s.size for s in log.segments if s.base_offset < first_dirty)
        first_uncleanable_segments = _non_active_from(log, uncleanable)
        first_uncleanable = (first_uncleanable_segments[0] if first_uncleanable_segments
                             else log.active_segment).base_offset
        cleanable_bytes = sum(
            s.size for s in _segments_between(log, min(first_dirty, first_uncleanable),
                                              first_uncleanable))
        return cls(tp, log, first_dirty, first_uncleanable, clean_bytes, cleanable_bytes,
                   need_compaction_now)


class CleanerManager:
    """The cleaner's bookkeeping over a LogManager's logs (see the module docstring)."""

    def __init__(self, log_manager: LogManager) -> None:
        self.log_manager = log_manager
        self.failure_channel: LogDirFailureChannel = log_manager.failure_channel
        self._lock = threading.Lock()
        self._checkpoints: dict[Path, dict[TopicPartition, int]] = {}
        self._dirty_dirs: set[Path] = set()
        self._write_lock = threading.Lock()
        for log_dir in log_manager.log_dirs:
            path = log_dir / CLEANER_OFFSET_CHECKPOINT_FILE
            try:
                self._checkpoints[log_dir] = read_offset_checkpoint(path)
            except (OSError, ValueError) as e:
                logger.warning("ignoring an unreadable cleaner checkpoint", path=str(path),
                               error=str(e))
                self._checkpoints[log_dir] = {}
        self.in_progress: set[TopicPartition] = set()
        self.aborted: set[TopicPartition] = set()
        self.paused: dict[TopicPartition, int] = {}
        self.uncleanable: set[TopicPartition] = set()

    # -- checkpoints --------------------------------------------------------------------------
    def checkpoint_of(self, tp: TopicPartition) -> int | None:
        """The partition's checkpointed first dirty offset, None when it has none."""
        log_dir = self.log_manager.log_dir_of(tp)
        with self._lock:
            return None if log_dir is None else self._checkpoints.get(log_dir, {}).get(tp)

    def all_checkpoints(self) -> dict[TopicPartition, int]:
        with self._lock:
            out: dict[TopicPartition, int] = {}
            for offsets in self._checkpoints.values():
                out.update(offsets)
            return out

    def _set_checkpoint(self, tp: TopicPartition, offset: int | None) -> None:
        """Change one entry in memory (caller holds ``_lock``); the file follows in
        ``write_checkpoints``."""
        log_dir = self.log_manager.log_dir_of(tp)
        if log_dir is None:
            for d, offsets in self._checkpoints.items():
                if offsets.pop(tp, None) is not None:
                    self._dirty_dirs.add(d)
            return
        offsets = self._checkpoints.setdefault(log_dir, {})
        if offset is None:
            if offsets.pop(tp, None) is not None:
                self._dirty_dirs.add(log_dir)
        elif offsets.get(tp) != offset:
            offsets[tp] = offset
            self._dirty_dirs.add(log_dir)

    def remove_partition(self, tp: TopicPartition) -> None:
        """Forget a partition whose log is deleted: its checkpoint entry, pauses, flags."""
        with self._lock:
            for d, offsets in self._checkpoints.items():
                if offsets.pop(tp, None) is not None:
                    self._dirty_dirs.add(d)
            self.uncleanable.discard(tp)

    def write_checkpoints(self) -> None:
        """Write the checkpoint file of each dir whose entries changed (blocking: fsyncs; run
        off the event loop). A dir that fails to take it goes offline."""
        with self._write_lock:
            with self._lock:
                dirty = [(d, dict(self._checkpoints.get(d, {}))) for d in self._dirty_dirs]
                self._dirty_dirs.clear()
            for log_dir, offsets in dirty:
                if str(log_dir) in self.failure_channel.offline:
                    continue
                try:
                    write_offset_checkpoint(log_dir / CLEANER_OFFSET_CHECKPOINT_FILE, offsets)
                except OSError as e:
                    self.failure_channel.maybe_add_offline_log_dir(
                        str(log_dir), f"error while writing the cleaner checkpoint in {log_dir}",
                        e)

    # -- pause and abort (event loop) -------------------------------------------------------
    def abort_and_pause(self, tp: TopicPartition) -> None:
        """Stop any clean of ``tp`` and keep it from starting until ``resume``; pauses
        nest. A clean in progress is dropped at its next check; its swap, on the loop, is
        refused from now on."""
        with self._lock:
            self.paused[tp] = self.paused.get(tp, 0) + 1
            if tp in self.in_progress:
                self.aborted.add(tp)

    def resume(self, tp: TopicPartition) -> None:
        """Undo one ``abort_and_pause``."""
        with self._lock:
            count = self.paused.get(tp, 0) - 1
            if count > 0:
                self.paused[tp] = count
            else:
                self.paused.pop(tp, None)

    def is_aborted(self, tp: TopicPartition) -> bool:
        """Whether a clean of ``tp`` in progress must be dropped (paused meanwhile)."""
        return tp in self.aborted or tp in self.paused

    # -- selection (event loop) ---------------------------------------------------------------
    def _log_to_clean(self, tp: TopicPartition, log: Log, now_ms: int) -> LogToClean:
        last_clean = self.checkpoint_of(tp)
        first_dirty, uncleanable, force = cleanable_offsets(log, last_clean, now_ms)
        if force:
            with self._lock:
                self._set_checkpoint(tp, first_dirty)
        delay = max_compaction_delay(log, first_dirty, now_ms)
        return LogToClean.of(tp, log, first_dirty, uncleanable, delay > 0)

    def _candidates(self) -> list[tuple[TopicPartition, Log]]:
        with self._lock:
            busy = self.in_progress | self.uncleanable | set(self.paused)
        return [
            (tp, log) for tp, log in list(self.log_manager.logs.items())
            if log.config.compact and not log.closed and not log.offline and tp not in busy
        ]

    def grab_filthiest(self, now_ms: int) -> LogToClean | None:
        """The dirtiest cleanable log, marked in progress; None when none needs cleaning.
        Runs on the event loop (reads the logs)."""
        self.maintain_uncleanable()
        dirty: list[LogToClean] = []
        for tp, log in self._candidates():
            try:
                ltc = self._log_to_clean(tp, log, now_ms)
            except Exception as e:  # a log that cannot be judged is not cleaned
                self.mark_uncleanable(tp, f"failed to compute its cleanable offsets: {e!r}")
                continue
            if ltc.total_bytes > 0:
                dirty.append(ltc)
        cleanable = [
            c for c in dirty
            if (c.need_compaction_now and c.cleanable_bytes > 0)
            or c.cleanable_ratio > c.log.config.min_cleanable_dirty_ratio
        ]
        if not cleanable:
            return None
        filthiest = max(cleanable, key=lambda c: c.cleanable_ratio)
        with self._lock:
            self.in_progress.add(filthiest.tp)
        return filthiest

    def dirty_ratios(self, now_ms: int) -> dict[TopicPartition, float]:
        """Every compacted log's dirty ratio by its checkpoint (metrics; on the loop)."""
        out: dict[TopicPartition, float] = {}
        for tp, log in list(self.log_manager.logs.items()):
            if not log.config.compact or log.closed or log.offline:
                continue
            first_dirty, uncleanable, _ = cleanable_offsets(log, self.checkpoint_of(tp), now_ms)
            out[tp] = LogToClean.of(tp, log, first_dirty, uncleanable).cleanable_ratio
        return out

    # -- outcome (cleaner threads) ----------------------------------------------------------
    def done_cleaning(self, tp: TopicPartition, end_offset: int | None) -> None:
        """A clean of ``tp`` ended; ``end_offset`` (its next dirty offset) becomes the
        checkpoint when it completed and was not aborted meanwhile."""
        with self._lock:
            self.in_progress.discard(tp)
            aborted = tp in self.aborted
            self.aborted.discard(tp)
            if end_offset is not None and not aborted and tp in self.log_manager.logs:
                self._set_checkpoint(tp, end_offset)

    def mark_uncleanable(self, tp: TopicPartition, reason: str) -> None:
        """Skip ``tp`` from now on (logged once)."""
        with self._lock:
            if tp in self.uncleanable:
                return
            self.uncleanable.add(tp)
        logger.warning("partition marked uncleanable", topic=tp[0], partition=tp[1],
                       reason=reason)

    def maintain_uncleanable(self) -> None:
        """Forget uncleanable partitions whose log is gone (Kafka's
        maintainUncleanablePartitions); on the event loop."""
        logs = self.log_manager.logs
        with self._lock:
            self.uncleanable.intersection_update(list(logs))

    def uncleanable_snapshot(self) -> set[TopicPartition]:
        with self._lock:
            return set(self.uncleanable)
