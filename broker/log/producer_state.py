"""Producer state of one partition: what each idempotent producer last wrote (Kafka's
ProducerStateManager, ProducerStateEntry, BatchMetadata and ProducerAppendInfo, without
transactions).

Invariants:

* ``producers`` maps a producer id to its epoch and the metadata of its last
  ``NUM_BATCHES_TO_RETAIN`` (5) batches in this partition, oldest first. An entry always holds
  at least one batch; a producer with none is simply absent ("unknown").
* ``map_end_offset`` is the log offset the state reflects: every batch below it has been
  applied, none at or above it. The Log keeps it equal to its log end offset.
* A snapshot file ``<offset>.snapshot`` holds the state at exactly ``offset`` (its name). It is
  written to a temporary file and renamed, and carries a CRC, so a reader sees a whole file or
  rejects it.
* Only batch headers are read: producer id, epoch, base sequence, last offset delta, offsets and
  max timestamp. Records are never decoded, here or in the rebuild scan.

The checks are Kafka's (ProducerAppendInfo.checkProducerEpoch / checkSequence and
ProducerStateEntry.findDuplicateBatch) for appends from clients: a batch matching one of the
last five of the same epoch is a duplicate; an older epoch is fenced; a new epoch starts at
sequence 0; otherwise the first sequence must follow the last one (wrapping after Int32.MAX);
a producer unknown to the partition may start anywhere.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import structlog
from crc32c import crc32c

from broker.log.disk import atomic_write
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.log.segment import LogSegment

__all__ = [
    "NUM_BATCHES_TO_RETAIN",
    "SNAPSHOT_FILE_SUFFIX",
    "BatchMetadata",
    "ProducerStateEntry",
    "ProducerStateManager",
    "InvalidProducerEpochError",
    "OutOfOrderSequenceError",
    "CorruptSnapshotError",
    "increment_sequence",
    "in_sequence",
    "snapshot_file_name",
    "read_snapshot",
    "write_snapshot",
]

logger = structlog.get_logger("broker.log.producer_state")

NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = 2**31 - 1
SNAPSHOT_FILE_SUFFIX = ".snapshot"

# Snapshot file layout (big-endian), ours rather than Kafka's ProducerSnapshot: it keeps all five
# batches per producer so duplicates of any in-flight batch are still found after a restart.
#   magic "MBPS" | version int16 | crc32c uint32 (of everything after it)
#   offset int64 | producer count int32
#   per producer: id int64 | epoch int16 | last timestamp int64 | batch count int8
#     per batch: first seq int32 | last seq int32 | first offset int64 | last offset int64
#                | max timestamp int64
_MAGIC = b"MBPS"
_VERSION = 1
_PREFIX = struct.Struct(">4shI")
_HEAD = struct.Struct(">qi")
_ENTRY = struct.Struct(">qhqb")
_BATCH = struct.Struct(">iiqqq")


def snapshot_file_name(offset: int) -> str:
    """Kafka's name: the offset the snapshot reflects, 20 digits, plus ``.snapshot``."""
    return f"{offset:020d}{SNAPSHOT_FILE_SUFFIX}"


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap to 0 after Int32.MAX."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Kafka's ProducerAppendInfo.inSequence: ``next`` follows ``last``, with the wrap."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


class InvalidProducerEpochError(KafkaError):
    """A batch from an older epoch than the partition has seen (INVALID_PRODUCER_EPOCH)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_PRODUCER_EPOCH, message)


class OutOfOrderSequenceError(KafkaError):
    """A gap, or a new epoch not starting at 0 (OUT_OF_ORDER_SEQUENCE_NUMBER)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, message)


class CorruptSnapshotError(Exception):
    """A snapshot file that is short, of another format, or fails its CRC."""


class BatchMetadata(NamedTuple):
    """One appended batch of a producer: its sequence range, offsets and max timestamp."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


class ProducerStateEntry:
    """A producer's epoch and its last batches in this partition, oldest first."""

    __slots__ = ("producer_id", "producer_epoch", "batches", "last_timestamp")

    def __init__(self, producer_id: int, producer_epoch: int) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=NUM_BATCHES_TO_RETAIN)
        self.last_timestamp = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq

    @property
    def last_offset(self) -> int:
        """The last offset the producer wrote here: retention compares it to the log start."""
        return self.batches[-1].last_offset

    def add_batch(self, producer_epoch: int, batch: BatchMetadata) -> None:
        """Kafka's addBatch: a different epoch drops the old epoch's batches first."""
        if producer_epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = producer_epoch
        self.batches.append(batch)  # maxlen drops the oldest
        self.last_timestamp = batch.timestamp

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with exactly this sequence range (caller checked the epoch)."""
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(id={self.producer_id}, epoch={self.producer_epoch}, "
            f"batches={list(self.batches)})"
        )


class ProducerStateManager:
    """Producer state of one partition directory, and its snapshot files.

    Runs on the event loop. Snapshots written without fsync (at roll) are fsynced by the
    owning Log's next flush.
    """

    def __init__(self, dir: Path, topic: str = "", partition: int = -1) -> None:
        self.dir = Path(dir)
        self.topic = topic
        self.partition = partition
        self.producers: dict[int, ProducerStateEntry] = {}
        self.map_end_offset = 0
        self.last_snap_offset = 0
        self.snapshots: list[int] = []  # offsets of the snapshot files on disk, ascending
        #: batch headers read by the last ``load`` (0 after a clean shutdown with a snapshot).
        self.scanned_batches = 0
        #: offset the last ``load`` started from (the snapshot's, or the log start offset).
        self.loaded_from = 0

    # -- the append path --------------------------------------------------------------------
    def check(
        self,
        producer_id: int,
        epoch: int,
        first_seq: int,
        last_seq: int,
        pending: tuple[int, int] | None = None,
    ) -> BatchMetadata | None:
        """Judge a client batch before it is appended: its original metadata if it is a
        duplicate, None if it may be appended; raises with Kafka's error code otherwise.

        ``pending`` is ``(epoch, last_seq)`` of an earlier batch of the same producer in the
        same append (Kafka's updatedEntry), which the next batch must follow.
        """
        entry = self.producers.get(producer_id)
        if entry is not None and entry.producer_epoch == epoch:
            duplicate = entry.find_duplicate(first_seq, last_seq)
            if duplicate is not None:
                return duplicate
        if pending is not None:
            current_epoch, current_last_seq = pending
        elif entry is not None:
            current_epoch, current_last_seq = entry.producer_epoch, entry.last_seq
        else:
            return None  # unknown producer: any epoch, any sequence
        if epoch < current_epoch:
            raise InvalidProducerEpochError(
                f"epoch of producer {producer_id} in {self._name()} is {epoch}, which is "
                f"smaller than the last seen epoch {current_epoch}"
            )
        if epoch != current_epoch:
            if first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"invalid sequence number for new epoch of producer {producer_id} in "
                    f"{self._name()}: {epoch} (request epoch), {first_seq} (seq. number), "
                    f"{current_epoch} (current producer epoch)"
                )
        elif entry is not None and not in_sequence(current_last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"out of order sequence number for producer {producer_id} in {self._name()}: "
                f"{first_seq} (incoming seq. number), {current_last_seq} (current end "
                "sequence number)"
            )
        return None

    def update(self, producer_id: int, epoch: int, batch: BatchMetadata) -> None:
        """Record an appended batch (also used, unchecked, when rebuilding from the log)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerStateEntry(producer_id, epoch)
        entry.add_batch(epoch, batch)

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    @property
    def producer_id_count(self) -> int:
        return len(self.producers)

    # -- retention ------------------------------------------------------------------------------
    def on_log_start_offset_incremented(self, log_start_offset: int) -> int:
        """Forget producers whose last batch is now below the log start offset, and snapshots
        below it; returns how many producers were removed.

        This is Kafka's rule up to 2.3 (ProducerStateManager.truncateHead). Kafka 2.4+ (KIP-360)
        keeps such producers until ``producer.id.expiration.ms`` instead; here they simply
        become unknown, so their next batch is accepted with any sequence.
        """
        gone = [pid for pid, e in self.producers.items() if e.last_offset < log_start_offset]
        for pid in gone:
            del self.producers[pid]
        if self.map_end_offset < log_start_offset:
            self.map_end_offset = log_start_offset
        for offset in [s for s in self.snapshots if s < log_start_offset]:
            self._delete_snapshot(offset)
        self.last_snap_offset = self.snapshots[-1] if self.snapshots else log_start_offset
        if gone:
            logger.info(
                "removed producers below the log start offset",
                topic=self.topic,
                partition=self.partition,
                producers=len(gone),
                log_start_offset=log_start_offset,
            )
        return len(gone)

    # -- snapshots ------------------------------------------------------------------------------
    def take_snapshot(self, *, sync: bool, recovery_point: int) -> Path | None:
        """Write the state at ``map_end_offset`` unless a snapshot there exists already.

        Without ``sync`` the caller sees to the fsync. Old snapshots are then pruned (see
        ``retain_snapshots``). Returns the file written, if any.
        """
        offset = self.map_end_offset
        if offset <= self.last_snap_offset:
            return None
        path = self.dir / snapshot_file_name(offset)
        write_snapshot(path, offset, self.producers.values(), sync=sync)
        if offset not in self.snapshots:
            insort(self.snapshots, offset)
        self.last_snap_offset = offset
        self.retain_snapshots(recovery_point)
        return path

    def retain_snapshots(self, recovery_point: int) -> None:
        """Keep the last two snapshots and every one a crash recovery may start from.

        A restart after a crash loads the newest snapshot at or below the recovery point, so
        that one and all later ones stay; older ones go (Kafka's minSnapshotsOffsetToRetain).
        While no snapshot is at or below the recovery point, all are kept: each may become the
        one to load once the recovery point passes it.
        """
        snaps = self.snapshots
        if len(snaps) <= 2:
            return
        i = bisect_right(snaps, recovery_point)
        if i == 0:
            return
        limit = min(snaps[i - 1], snaps[-2])
        for offset in [s for s in snaps if s < limit]:
            self._delete_snapshot(offset)

    def _delete_snapshot(self, offset: int) -> None:
        try:
            self.snapshots.remove(offset)
        except ValueError:
            pass
        (self.dir / snapshot_file_name(offset)).unlink(missing_ok=True)

    def _list_snapshots(self) -> list[int]:
        out: list[int] = []
        for entry in os.scandir(self.dir):
            name = entry.name
            if name.endswith(SNAPSHOT_FILE_SUFFIX) and len(name) == 20 + len(SNAPSHOT_FILE_SUFFIX):
                stem = name[:20]
                if stem.isdigit():
                    out.append(int(stem))
        out.sort()
        return out

    # -- loading (Kafka's rebuildProducerState) -------------------------------------------------
    def load(
        self,
        segments: list[LogSegment],
        log_start_offset: int,
        log_end_offset: int,
        load_limit: int,
        *,
        recovery_point: int,
    ) -> None:
        """Rebuild the state at ``log_end_offset``: the newest readable snapshot at or below
        ``load_limit``, then the batch headers from there to the end of the log.

        After a clean shutdown ``load_limit`` is the log end offset, where the last snapshot
        was written: nothing is scanned. After a crash it is the recovery point, below which
        the data (and hence any snapshot of it) was fsynced. Snapshots outside
        [log start, log end] describe data that is gone and are deleted.
        """
        self.producers.clear()
        self.scanned_batches = 0
        self.snapshots = self._list_snapshots()
        for offset in [s for s in self.snapshots if s > log_end_offset or s < log_start_offset]:
            self._delete_snapshot(offset)
        start = log_start_offset
        loaded_snapshot = False
        for offset in reversed([s for s in self.snapshots if s <= load_limit]):
            path = self.dir / snapshot_file_name(offset)
            try:
                entries = read_snapshot(path, offset)
            except (CorruptSnapshotError, OSError) as e:
                logger.warning(
                    "deleting unreadable producer snapshot", path=str(path), reason=str(e)
                )
                self._delete_snapshot(offset)
                continue
            for entry in entries:
                if entry.last_offset >= log_start_offset:
                    self.producers[entry.producer_id] = entry
            start = offset
            loaded_snapshot = True
            break
        self.loaded_from = start
        if start < log_end_offset:
            self.scanned_batches = self._scan(segments, start, log_end_offset)
            logger.info(
                "rebuilt producer state from the log",
                topic=self.topic,
                partition=self.partition,
                from_offset=start,
                to_offset=log_end_offset,
                from_snapshot=loaded_snapshot,
                batches=self.scanned_batches,
                producers=len(self.producers),
            )
        self.map_end_offset = log_end_offset
        self.last_snap_offset = self.snapshots[-1] if self.snapshots else log_start_offset
        if self.scanned_batches:
            # What was just scanned need not be scanned again (Kafka snapshots here too).
            self.take_snapshot(sync=True, recovery_point=recovery_point)
        else:
            self.retain_snapshots(recovery_point)

    def _scan(self, segments: list[LogSegment], start: int, end: int) -> int:
        """Apply every producer batch in [start, end) from the segments' headers."""
        count = 0
        for base_offset, last_offset, pid, epoch, base_seq, delta, max_ts in _iter_producer_batches(
            segments, start, end
        ):
            count += 1
            if pid < 0:
                continue
            self.update(
                pid,
                epoch,
                BatchMetadata(
                    base_seq, increment_sequence(base_seq, delta), base_offset, last_offset, max_ts
                ),
            )
        return count

    def _name(self) -> str:
        return f"{self.topic}-{self.partition}"


def _iter_producer_batches(
    segments: list[LogSegment], start: int, end: int
) -> Iterator[tuple[int, int, int, int, int, int, int]]:
    """``(base offset, last offset, producer id, epoch, base sequence, last offset delta,
    max timestamp)`` of each batch ending at or after ``start`` and starting below ``end``."""
    for i, seg in enumerate(segments):
        next_base = segments[i + 1].base_offset if i + 1 < len(segments) else None
        if next_base is not None and next_base <= start:
            continue
        if seg.base_offset >= end:
            break
        found = seg.translate_offset(start) if start > seg.base_offset else (0, 0, 0)
        if found is None:
            continue
        for _pos, h in seg.iter_batches(found[0]):
            base = h.base_offset
            if base >= end:
                return
            last = base + h.last_offset_delta
            if last < start:
                continue
            yield (
                base,
                last,
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.last_offset_delta,
                h.max_timestamp,
            )


def write_snapshot(
    path: Path, offset: int, entries: Iterable[ProducerStateEntry], *, sync: bool
) -> None:
    """Write a snapshot atomically: temp file (fsynced if ``sync``), rename, directory fsync."""
    parts = [b""]
    count = 0
    for e in entries:
        if not e.batches:
            continue
        count += 1
        parts.append(_ENTRY.pack(e.producer_id, e.producer_epoch, e.last_timestamp, len(e.batches)))
        for b in e.batches:
            parts.append(_BATCH.pack(*b))
    parts[0] = _HEAD.pack(offset, count)
    body = b"".join(parts)
    atomic_write(path, _PREFIX.pack(_MAGIC, _VERSION, crc32c(body)) + body, sync=sync)


def read_snapshot(path: Path, expected_offset: int | None = None) -> list[ProducerStateEntry]:
    """Parse a snapshot file; CorruptSnapshotError if it is not whole and ours."""
    data = path.read_bytes()
    if len(data) < _PREFIX.size + _HEAD.size:
        raise CorruptSnapshotError(f"{path} is {len(data)} bytes, too short for a snapshot")
    magic, version, crc = _PREFIX.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION:
        raise CorruptSnapshotError(f"{path} has an unknown format ({magic!r}, version {version})")
    body = memoryview(data)[_PREFIX.size :]
    if crc32c(body) != crc:
        raise CorruptSnapshotError(f"{path} fails its CRC")
    offset, count = _HEAD.unpack_from(body, 0)
    if expected_offset is not None and offset != expected_offset:
        raise CorruptSnapshotError(f"{path} holds the state at {offset}, not {expected_offset}")
    pos = _HEAD.size
    entries: list[ProducerStateEntry] = []
    try:
        for _ in range(count):
            pid, epoch, last_ts, n = _ENTRY.unpack_from(body, pos)
            pos += _ENTRY.size
            if not 0 < n <= NUM_BATCHES_TO_RETAIN:
                raise CorruptSnapshotError(f"{path}: producer {pid} has {n} batches")
            entry = ProducerStateEntry(pid, epoch)
            for _ in range(n):
                entry.batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            entry.last_timestamp = last_ts
            entries.append(entry)
    except struct.error as e:
        raise CorruptSnapshotError(f"{path} is truncated: {e}") from None
    if pos != len(body):
        raise CorruptSnapshotError(f"{path} has {len(body) - pos} trailing bytes")
    return entries
