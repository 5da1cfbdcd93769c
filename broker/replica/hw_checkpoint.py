"""Kafka's high-watermark checkpoint: ``replication-offset-checkpoint`` in each log dir.

Kafka's ReplicaManager writes every hosted partition's high watermark there every
replica.high.watermark.checkpoint.interval.ms and at shutdown, in the offset checkpoint text
format (version 0, a count, ``topic partition offset`` lines; temp file, fsync, rename), and a
partition created at start takes its high watermark from it (0 when it has no entry), capped
to its log. Only a partition led with followers keeps that value: one without followers moves
its high watermark to its own end at once, so a single broker starts exactly as it always did.

Reading is lazy and once per dir (Kafka's LazyOffsetCheckpoints). A corrupt file is logged
once and read as empty: Kafka takes the log dir offline instead (its read failure goes to the
LogDirFailureChannel), but an absent entry is the conservative answer here (the partition
starts at its log start and waits for its followers), and the next write replaces the file.
A failed write takes the dir offline, as Kafka's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from broker.log.checkpoint import read_offset_checkpoint, write_offset_checkpoint
from broker.log.dir_failure import LogDirFailureChannel

logger = structlog.get_logger("broker.replica")

REPLICATION_OFFSET_CHECKPOINT_FILE = "replication-offset-checkpoint"

TopicPartition = tuple[str, int]
#: each log dir's partitions and their high watermarks, as taken on the loop.
HighWatermarks = dict[Path, dict[TopicPartition, int]]


class HighWatermarkCheckpoints:
    """The checkpoint files of a broker's log dirs: read once each, written whole. A partition
    that stops being served here while its log stays (another broker leads it) keeps its last
    high watermark in the next files, as Kafka keeps such a partition hosted."""

    def __init__(self, live_log_dirs: Callable[[], list[Path]],
                 failure_channel: LogDirFailureChannel) -> None:
        self._live_log_dirs = live_log_dirs
        self._failure_channel = failure_channel
        self._read: dict[Path, dict[TopicPartition, int]] = {}
        #: the high watermarks of partitions no longer served here whose logs stay.
        self._unserved: dict[Path, dict[TopicPartition, int]] = {}

    def fetch(self, log_dir: Path, tp: TopicPartition) -> int | None:
        """The high watermark checkpointed for ``tp`` in ``log_dir`` (or kept since it stopped
        being served), None without one; it is served from now on."""
        kept = self._unserved.get(log_dir, {}).pop(tp, None)
        if kept is not None:
            return kept
        offsets = self._read.get(log_dir)
        if offsets is None:
            offsets = self._read[log_dir] = self._read_dir(log_dir)
        return offsets.get(tp)

    def unserved(self, log_dir: Path, tp: TopicPartition, hw: int | None) -> None:
        """``tp`` stops being served here with high watermark ``hw``, its log kept; None: its
        log is deleted, it is forgotten."""
        if hw is None:
            self._unserved.get(log_dir, {}).pop(tp, None)
            self._read.get(log_dir, {}).pop(tp, None)
        else:
            self._unserved.setdefault(log_dir, {})[tp] = hw

    @staticmethod
    def _read_dir(log_dir: Path) -> dict[TopicPartition, int]:
        path = log_dir / REPLICATION_OFFSET_CHECKPOINT_FILE
        try:
            return read_offset_checkpoint(path)
        except (ValueError, OSError) as e:  # logged once: the dir is read once
            logger.warning("high watermark checkpoint unreadable: read as empty",
                           path=str(path), error=str(e))
            return {}

    def snapshot(self, high_watermarks: Iterable[tuple[Path, TopicPartition, int]]
                 ) -> HighWatermarks:
        """What to write (taken on the loop): every live dir, empty or not, so a dir whose
        partitions all went keeps no stale entries."""
        out: HighWatermarks = {d: dict(self._unserved.get(d, {}))
                               for d in self._live_log_dirs()}
        for log_dir, tp, hw in high_watermarks:
            if log_dir in out:
                out[log_dir][tp] = hw
        return out

    def write(self, high_watermarks: HighWatermarks) -> None:
        """Write each dir's file (blocking: fsyncs; run off the loop). A dir whose file can
        not be written goes offline; the others are still written."""
        for log_dir, offsets in high_watermarks.items():
            try:
                write_offset_checkpoint(log_dir / REPLICATION_OFFSET_CHECKPOINT_FILE, offsets)
            except OSError as e:
                self._failure_channel.maybe_add_offline_log_dir(
                    str(log_dir), f"error while writing the high watermark checkpoint in dir "
                                  f"{log_dir}", e)
