"""Producer state of one partition: what each idempotent or transactional producer last wrote
(Kafka's ProducerStateManager, ProducerStateEntry, BatchMetadata, ProducerAppendInfo, TxnMetadata
and CompletedTxn).

Invariants:

* ``producers`` maps a producer id to its epoch, coordinator epoch, the first offset of its
  open transaction (-1 when none) and the metadata of its last ``NUM_BATCHES_TO_RETAIN`` (5)
  batches in this partition, oldest first. An entry may hold no batch: an end-transaction
  marker alone (a marker with a bumped epoch drops the older epoch's batches, as Kafka).
* ``ongoing_txns`` maps the first offset of each open transaction to its producer id, in
  offset order (transactions open in offset order on append and in a rebuild scan; a snapshot
  load sorts them). Its first key is Kafka's first undecided offset.
* ``unreplicated_txns`` maps the first offset of each transaction whose marker is appended but
  not yet under the high watermark to the marker's offset (Kafka's unreplicatedTxns): until
  the marker is committed, the transaction stays unstable. With ``ongoing_txns`` it gives the
  first unstable offset.
* ``map_end_offset`` is the log offset the state reflects: every batch below it has been
  applied, none at or above it. The Log keeps it equal to its log end offset.
* A snapshot file ``<offset>.snapshot`` holds the state at exactly ``offset`` (its name). It is
  written to a temporary file and renamed, and carries a CRC, so a reader sees a whole file or
  rejects it.
* Only batch headers are read: producer id, epoch, base sequence, last offset delta, offsets,
  max timestamp and attributes. Records are never decoded, here or in the rebuild scan, except
  the one record of an end-transaction marker.

The checks are Kafka's (ProducerAppendInfo.checkProducerEpoch / checkSequence and
ProducerStateEntry.findDuplicateBatch) for appends from clients: a batch matching one of the
last five of the same epoch is a duplicate; an older epoch is fenced; a new epoch starts at
sequence 0; otherwise the first sequence must follow the last one (wrapping after Int32.MAX);
a producer unknown to the partition may start anywhere. Transactions add Kafka's rules: a
non-transactional batch while the producer's transaction is open is INVALID_TXN_STATE; a
marker from an older producer epoch is INVALID_PRODUCER_EPOCH and one from an older coordinator
epoch TRANSACTION_COORDINATOR_FENCED. Batches the group coordinator writes (sequence -1) skip
the sequence checks but not the epoch check (AppendOrigin.COORDINATOR).
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
from broker.log.txn_index import AbortedTxn
from protocol.errors import ErrorCode, KafkaError
from protocol.record_batch import CONTROL_ABORT, InvalidRecordError, read_end_txn_marker

if TYPE_CHECKING:
    from broker.log.segment import LogSegment
    from protocol.record_batch import BatchHeader

__all__ = [
    "NUM_BATCHES_TO_RETAIN",
    "SNAPSHOT_FILE_SUFFIX",
    "BatchMetadata",
    "CompletedTxn",
    "ProducerStateEntry",
    "ProducerStateManager",
    "InvalidProducerEpochError",
    "OutOfOrderSequenceError",
    "InvalidTxnStateError",
    "TransactionCoordinatorFencedError",
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
#   per producer, version 2: id int64 | epoch int16 | last timestamp int64
#     | coordinator epoch int32 | current txn first offset int64 (-1: none)
#     | last offset int64 | batch count int8 (0 to 5)
#   per producer, version 1 (still read): id int64 | epoch int16 | last timestamp int64
#     | batch count int8 (1 to 5)
#     per batch: first seq int32 | last seq int32 | first offset int64 | last offset int64
#                | max timestamp int64
# Version 2 adds what Kafka's snapshot carries for transactions (CoordinatorEpoch,
# CurrentTxnFirstOffset) and the offset of the producer's last write, which a marker-only
# entry has no batch to give.
_MAGIC = b"MBPS"
_VERSION = 2
_PREFIX = struct.Struct(">4shI")
_HEAD = struct.Struct(">qi")
_ENTRY_V1 = struct.Struct(">qhqb")
_ENTRY = struct.Struct(">qhqiqqb")
_BATCH = struct.Struct(">iiqqq")
NO_SEQUENCE = -1


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


class InvalidTxnStateError(KafkaError):
    """A non-transactional write while the producer's transaction is open (INVALID_TXN_STATE),
    as Kafka's ProducerAppendInfo.appendDataBatch refuses it."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_TXN_STATE, message)


class TransactionCoordinatorFencedError(KafkaError):
    """A marker from an older coordinator epoch than the producer's last marker
    (TRANSACTION_COORDINATOR_FENCED): a zombie coordinator."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.TRANSACTION_COORDINATOR_FENCED, message)


class CompletedTxn(NamedTuple):
    """A transaction ended by a marker at ``last_offset`` (Kafka's CompletedTxn)."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


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
    """A producer's epochs, open transaction and last batches in this partition, oldest first.

    ``current_txn_first_offset`` is -1 when no transaction is open and ``coordinator_epoch``
    -1 until the first marker (Kafka's defaults); ``last_offset`` is the offset of the
    producer's last batch or marker here, which retention compares to the log start offset.
    """

    __slots__ = (
        "producer_id",
        "producer_epoch",
        "batches",
        "last_timestamp",
        "coordinator_epoch",
        "current_txn_first_offset",
        "last_offset",
    )

    def __init__(
        self,
        producer_id: int,
        producer_epoch: int,
        *,
        coordinator_epoch: int = -1,
        current_txn_first_offset: int = -1,
    ) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=NUM_BATCHES_TO_RETAIN)
        self.last_timestamp = -1
        self.coordinator_epoch = coordinator_epoch
        self.current_txn_first_offset = current_txn_first_offset
        self.last_offset = -1

    @property
    def last_seq(self) -> int:
        """The last sequence written, -1 (Kafka's NO_SEQUENCE) when no batch is retained."""
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def _maybe_update_epoch(self, producer_epoch: int) -> None:
        """Kafka's maybeUpdateProducerEpoch: a different epoch drops the old one's batches."""
        if producer_epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = producer_epoch

    def add_batch(self, producer_epoch: int, batch: BatchMetadata) -> None:
        """Kafka's addBatch: a different epoch drops the old epoch's batches first."""
        self._maybe_update_epoch(producer_epoch)
        self.batches.append(batch)  # maxlen drops the oldest
        self.last_timestamp = batch.timestamp
        self.last_offset = batch.last_offset

    def end_txn(self, producer_epoch: int, coordinator_epoch: int, offset: int, ts: int) -> None:
        """Kafka's update after an end-transaction marker: no transaction open any more."""
        self._maybe_update_epoch(producer_epoch)
        self.coordinator_epoch = coordinator_epoch
        self.current_txn_first_offset = -1
        self.last_timestamp = ts
        self.last_offset = offset

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with exactly this sequence range (caller checked the epoch)."""
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(id={self.producer_id}, epoch={self.producer_epoch}, "
            f"coordinator_epoch={self.coordinator_epoch}, "
            f"current_txn_first_offset={self.current_txn_first_offset}, "
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
        #: first offset of each open transaction -> producer id, in offset order.
        self.ongoing_txns: dict[int, int] = {}
        #: first offset of each decided transaction -> its marker's offset, until the high
        #: watermark passes the marker.
        self.unreplicated_txns: dict[int, int] = {}
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
        *,
        transactional: bool = False,
        client: bool = True,
    ) -> BatchMetadata | None:
        """Judge a data batch before it is appended: its original metadata if it is a
        duplicate, None if it may be appended; raises with Kafka's error code otherwise.

        ``pending`` is ``(epoch, last_seq)`` of an earlier batch of the same producer in the
        same append (Kafka's updatedEntry), which the next batch must follow. ``client=False``
        (a coordinator's append) checks only the epoch and the transaction state, as Kafka's
        maybeValidateDataBatch does for AppendOrigin.COORDINATOR.
        """
        entry = self.producers.get(producer_id)
        if not client:
            if entry is not None:
                self._check_epoch(producer_id, epoch, entry.producer_epoch)
                self._check_txn_state(entry, producer_id, transactional)
            return None
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
        self._check_epoch(producer_id, epoch, current_epoch)
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
        if entry is not None:
            self._check_txn_state(entry, producer_id, transactional)
        return None

    def _check_epoch(self, producer_id: int, epoch: int, current_epoch: int) -> None:
        """Kafka's checkProducerEpoch (INVALID_PRODUCER_EPOCH), for data and markers."""
        if epoch < current_epoch:
            raise InvalidProducerEpochError(
                f"epoch of producer {producer_id} in {self._name()} is {epoch}, which is "
                f"smaller than the last seen epoch {current_epoch}"
            )

    def _check_txn_state(
        self, entry: ProducerStateEntry, producer_id: int, transactional: bool
    ) -> None:
        if entry.current_txn_first_offset >= 0 and not transactional:
            raise InvalidTxnStateError(
                f"expected transactional write from producer {producer_id} in {self._name()}: "
                f"its transaction is open since offset {entry.current_txn_first_offset}"
            )

    def check_end_txn_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Judge an end-transaction marker before it is appended (Kafka's appendEndTxnMarker
        checks): an older producer epoch is INVALID_PRODUCER_EPOCH, an older coordinator epoch
        TRANSACTION_COORDINATOR_FENCED. A marker without an open transaction is accepted."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        self._check_epoch(producer_id, epoch, entry.producer_epoch)
        if entry.coordinator_epoch > coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"invalid coordinator epoch for producer {producer_id} in {self._name()}: "
                f"{coordinator_epoch} (zombie), {entry.coordinator_epoch} (current)"
            )

    def completed_txn(
        self, producer_id: int, marker_offset: int, aborted: bool
    ) -> CompletedTxn | None:
        """The transaction a marker at ``marker_offset`` completes, None when the producer has
        none open (Kafka's appendEndTxnMarker returns no CompletedTxn then)."""
        entry = self.producers.get(producer_id)
        if entry is None or entry.current_txn_first_offset < 0:
            return None
        return CompletedTxn(producer_id, entry.current_txn_first_offset, marker_offset, aborted)

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """Kafka's lastStableOffset(completedTxn), recorded with an aborted transaction: the
        first offset of the earliest other open transaction, else the offset after the
        marker. Called before ``complete_txn``."""
        for first_offset, producer_id in self.ongoing_txns.items():
            if producer_id != completed.producer_id:
                return first_offset
        return completed.last_offset + 1

    def update_end_txn_marker(
        self,
        producer_id: int,
        epoch: int,
        coordinator_epoch: int,
        offset: int,
        timestamp: int,
    ) -> CompletedTxn | None:
        """Apply an appended marker (unchecked, also used by the rebuild scan): the producer's
        epoch and coordinator epoch move to the marker's and its transaction, if one was
        open, leaves ``ongoing_txns``. Returns that transaction."""
        entry = self.producers.get(producer_id)
        completed = None
        if entry is None:
            entry = self.producers[producer_id] = ProducerStateEntry(producer_id, epoch)
        elif entry.current_txn_first_offset >= 0:
            first = entry.current_txn_first_offset
            completed = CompletedTxn(producer_id, first, offset, False)
            self.ongoing_txns.pop(first, None)
            self.unreplicated_txns[first] = offset
            if len(self.unreplicated_txns) > 1 and first < next(iter(self.unreplicated_txns)):
                self.unreplicated_txns = dict(sorted(self.unreplicated_txns.items()))
        entry.end_txn(epoch, coordinator_epoch, offset, timestamp)
        return completed

    @property
    def first_undecided_offset(self) -> int | None:
        """First offset of the earliest open transaction (Kafka's firstUndecidedOffset)."""
        for first_offset in self.ongoing_txns:
            return first_offset
        return None

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest transaction that is open or whose marker is not yet
        under the high watermark (Kafka's firstUnstableOffset)."""
        undecided = self.first_undecided_offset
        for first_offset in self.unreplicated_txns:
            return first_offset if undecided is None else min(first_offset, undecided)
        return undecided

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Markers now under the high watermark make their transactions stable (Kafka's
        removeUnreplicatedTransactions)."""
        txns = self.unreplicated_txns
        while txns:
            first_offset, marker_offset = next(iter(txns.items()))
            if marker_offset >= high_watermark:
                return
            del txns[first_offset]

    def active_producers(self) -> list[ProducerStateEntry]:
        """Every producer the partition knows (DescribeProducers' activeProducers)."""
        return list(self.producers.values())

    def update(
        self, producer_id: int, epoch: int, batch: BatchMetadata, transactional: bool = False
    ) -> None:
        """Record an appended batch (also used, unchecked, when rebuilding from the log); a
        transactional batch opens the producer's transaction at its first offset unless one
        is open (Kafka's appendDataBatch)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerStateEntry(producer_id, epoch)
        entry.add_batch(epoch, batch)
        if transactional and entry.current_txn_first_offset < 0:
            entry.current_txn_first_offset = batch.first_offset
            self.ongoing_txns[batch.first_offset] = producer_id

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
        become unknown, so their next batch is accepted with any sequence. A producer with an
        open transaction is kept whatever its offsets: its marker is still to come.
        """
        gone = [
            pid
            for pid, e in self.producers.items()
            if e.last_offset < log_start_offset and e.current_txn_first_offset < 0
        ]
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

    def _list_snapshots(self, listed: Iterable[str] | None = None) -> list[int]:
        out: list[int] = []
        for name in os.listdir(self.dir) if listed is None else listed:
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
        listed: Iterable[str] | None = None,
    ) -> Path | None:
        """Rebuild the state at ``log_end_offset``: the newest readable snapshot at or below
        ``load_limit``, then the batch headers from there to the end of the log.

        After a clean shutdown ``load_limit`` is the log end offset, where the last snapshot
        was written: nothing is scanned. After a crash it is the recovery point, below which
        the data (and hence any snapshot of it) was fsynced. Snapshots outside
        [log start, log end] describe data that is gone and are deleted.

        The scan applies transactional batches and markers exactly as appends do, and rebuilds
        the transaction index from where it starts: each segment's entries for markers at or
        above the scan's start are cut and written again (Kafka's LogSegment.recover rebuilds
        it from the producer state the same way), so a crash leaves neither a missing abort
        nor one of a marker that did not survive. ``listed``: the dir's file names, when the
        caller just listed it (else it is listed here).

        After a scan, a snapshot is written at the log end offset, as Kafka does, but not
        fsynced: its path is returned and the owning Log fsyncs it (file and directory) with
        its next flush, before that flush moves the recovery point. Many logs recovered at
        once thus cost no fsync each. It can never claim more than the log holds: a crash
        restart considers only snapshots at or below the checkpointed recovery point, which
        passes this one only after the fsync; a clean start comes after a clean shutdown,
        which fsyncs it; and a snapshot above the log end offset (data a machine crash lost)
        is deleted by the next load, a torn one fails its CRC and is deleted too.
        """
        self.producers.clear()
        self.ongoing_txns.clear()
        self.unreplicated_txns.clear()
        self.scanned_batches = 0
        self.snapshots = self._list_snapshots(listed)
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
                if entry.last_offset >= log_start_offset or entry.current_txn_first_offset >= 0:
                    self._load_entry(entry)
            start = offset
            loaded_snapshot = True
            break
        self.loaded_from = start
        if start < log_end_offset:
            for i, seg in enumerate(segments):
                next_base = segments[i + 1].base_offset if i + 1 < len(segments) else None
                if next_base is None or next_base > start:
                    seg.txn_index.truncate_to(start)
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
            return self.take_snapshot(sync=False, recovery_point=recovery_point)
        self.retain_snapshots(recovery_point)
        return None

    def _load_entry(self, entry: ProducerStateEntry) -> None:
        """Kafka's loadProducerEntry: the producer, and its open transaction if any."""
        self.producers[entry.producer_id] = entry
        if entry.current_txn_first_offset >= 0:
            self.ongoing_txns[entry.current_txn_first_offset] = entry.producer_id
            if len(self.ongoing_txns) > 1:
                self.ongoing_txns = dict(sorted(self.ongoing_txns.items()))

    def _scan(self, segments: list[LogSegment], start: int, end: int) -> int:
        """Apply every producer batch and marker in [start, end) from the segments' headers
        (and the one record of each marker); aborted transactions go into the index of the
        segment holding their marker."""
        count = 0
        for seg, pos, h in _iter_producer_batches(segments, start, end):
            count += 1
            pid = h.producer_id
            if pid < 0:
                continue
            base_offset = h.base_offset
            if h.is_control:
                if h.record_count == 0:
                    continue  # the cleaner emptied it: its transaction is gone (as Kafka)
                self._scan_marker(seg, pos, h.size_in_bytes, pid, h.producer_epoch,
                                  base_offset, h.max_timestamp)
                continue
            base_seq = h.base_sequence
            delta = h.last_offset_delta
            last_seq = NO_SEQUENCE if base_seq < 0 else increment_sequence(base_seq, delta)
            self.update(
                pid,
                h.producer_epoch,
                BatchMetadata(base_seq, last_seq, base_offset, base_offset + delta,
                              h.max_timestamp),
                h.is_transactional,
            )
        return count

    def _scan_marker(
        self, seg: LogSegment, pos: int, size: int, pid: int, epoch: int, offset: int, ts: int
    ) -> None:
        try:
            control_type, coordinator_epoch = read_end_txn_marker(seg.read_bytes(pos, size), 0)
        except InvalidRecordError as e:
            # Kafka skips control records that are not transaction markers the same way.
            logger.warning("skipping a control batch that is not an end-transaction marker",
                           topic=self.topic, partition=self.partition, offset=offset,
                           reason=str(e))
            return
        completed = self.completed_txn(pid, offset, control_type == CONTROL_ABORT)
        if completed is not None and completed.is_aborted:
            lso = self.last_stable_offset(completed)
            seg.txn_index.append(
                AbortedTxn(pid, completed.first_offset, completed.last_offset, lso)
            )
        self.update_end_txn_marker(pid, epoch, coordinator_epoch, offset, ts)

    def _name(self) -> str:
        return f"{self.topic}-{self.partition}"


def _iter_producer_batches(
    segments: list[LogSegment], start: int, end: int
) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
    """``(segment, position, header)`` of each batch ending at or after ``start`` and starting
    below ``end``; the header is valid until the next iteration."""
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
            yield seg, _pos, h


def write_snapshot(
    path: Path, offset: int, entries: Iterable[ProducerStateEntry], *, sync: bool
) -> None:
    """Write a snapshot atomically: temp file (fsynced if ``sync``), rename, directory fsync."""
    parts = [b""]
    count = 0
    for e in entries:
        count += 1
        parts.append(
            _ENTRY.pack(
                e.producer_id,
                e.producer_epoch,
                e.last_timestamp,
                e.coordinator_epoch,
                e.current_txn_first_offset,
                e.last_offset,
                len(e.batches),
            )
        )
        for b in e.batches:
            parts.append(_BATCH.pack(*b))
    parts[0] = _HEAD.pack(offset, count)
    body = b"".join(parts)
    atomic_write(path, _PREFIX.pack(_MAGIC, _VERSION, crc32c(body)) + body, sync=sync)


def read_snapshot(path: Path, expected_offset: int | None = None) -> list[ProducerStateEntry]:
    """Parse a snapshot file (version 2, or 1 as written before transactions);
    CorruptSnapshotError if it is not whole and ours."""
    data = path.read_bytes()
    if len(data) < _PREFIX.size + _HEAD.size:
        raise CorruptSnapshotError(f"{path} is {len(data)} bytes, too short for a snapshot")
    magic, version, crc = _PREFIX.unpack_from(data, 0)
    if magic != _MAGIC or version not in (1, _VERSION):
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
            if version == 1:
                pid, epoch, last_ts, n = _ENTRY_V1.unpack_from(body, pos)
                pos += _ENTRY_V1.size
                coordinator_epoch, txn_first, last_offset, least = -1, -1, -1, 1
            else:
                pid, epoch, last_ts, coordinator_epoch, txn_first, last_offset, n = (
                    _ENTRY.unpack_from(body, pos)
                )
                pos += _ENTRY.size
                least = 0
            if not least <= n <= NUM_BATCHES_TO_RETAIN:
                raise CorruptSnapshotError(f"{path}: producer {pid} has {n} batches")
            entry = ProducerStateEntry(
                pid, epoch, coordinator_epoch=coordinator_epoch, current_txn_first_offset=txn_first
            )
            for _ in range(n):
                entry.batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            entry.last_timestamp = last_ts
            entry.last_offset = entry.batches[-1].last_offset if version == 1 else last_offset
            entries.append(entry)
    except struct.error as e:
        raise CorruptSnapshotError(f"{path} is truncated: {e}") from None
    if pos != len(body):
        raise CorruptSnapshotError(f"{path} has {len(body) - pos} trailing bytes")
    return entries
