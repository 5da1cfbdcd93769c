"""Recovery after an unclean shutdown: keep the longest valid prefix, rebuild the indexes.

Kafka's LogSegment.recover and LogLoader.recoverLog, reduced to what a v2-only log needs:

* Every segment from the one holding the recovery point (the offset below which data was
  fsynced) to the end is re-read batch by batch; the one holding it only from the recovery
  point on (its state below comes from the indexes, flushed with the data, and a header walk
  of the batches after their last entries), so recovery rereads what was not flushed.
  A batch is kept only if it is whole, has a possible length and magic 2, its CRC matches,
  its offsets are in order (base offset at or after the previous batch's next offset, and
  not below the segment's base offset) and its last offset fits the segment's int32
  relative offsets.
* At the first batch that fails, the segment is truncated there (a torn or corrupt tail)
  and every later segment is deleted: nothing after a hole can be trusted.
* Indexes of recovered segments are rebuilt (past the recovery point) with the same
  spacing rule as the append path, and the segment's final max timestamp is written to the
  time index.
* The transaction index loses the entries of markers that did not survive; the entries of
  markers above the producer-state snapshot the load starts from are written again by the
  producer-state rebuild, which knows where each aborted transaction began (Kafka's
  LogSegment.recover rebuilds it from the producer state too).

Segments below the recovery point were fsynced with their indexes and are trusted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import NamedTuple

import structlog

from broker.log.segment import LogSegment
from protocol.record_batch import LOG_OVERHEAD, NO_TIMESTAMP, CorruptRecordError

__all__ = ["RecoveryStats", "STATS", "recover_segment", "recover_segments"]

logger = structlog.get_logger("broker.log.recovery")


@dataclass
class RecoveryStats:
    """What recovery reread in this process (segments and bytes validated): recovery after a
    crash must be proportional to what was not flushed, and tests assert it here."""

    segments: int = 0
    bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, size: int) -> None:
        with self._lock:
            self.segments += 1
            self.bytes += size

    def reset(self) -> None:
        with self._lock:
            self.segments = 0
            self.bytes = 0


#: the process's recovery counters (logs recover on several threads at once).
STATS = RecoveryStats()


class _Prefix(NamedTuple):
    """Where validation resumes in a segment whose start is trusted, and the state there."""

    position: int
    next_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    last_index_entry: int


def _trusted_prefix(segment: LogSegment, from_offset: int) -> _Prefix | None:
    """The state of ``segment`` below ``from_offset`` (a recovery point: fsynced, with the
    index entries of that flush), found from the indexes and a header-only walk of the few
    batches after their last entries; None when it can not be trusted or found (then the
    whole segment is validated)."""
    if from_offset <= segment.base_offset:
        return None
    try:
        segment.offset_index.truncate_to(from_offset)
        segment.time_index.truncate_to(from_offset)
        max_ts, max_ts_offset = segment.time_index.last_entry()
        entries = segment.offset_index.entries
        last_index_entry = segment.offset_index.entry(entries - 1)[1] if entries else 0
        start = min(segment.offset_index.lookup(max_ts_offset)[1], last_index_entry)
        if start >= segment.size:
            return None
        for pos, header in segment.iter_batches(start):
            base = header.base_offset
            if base >= from_offset:
                return _Prefix(pos, base, max_ts, max_ts_offset, last_index_entry) if (
                    base == from_offset) else None
            last = header.last_offset
            if last >= from_offset:
                return None  # the recovery point is not a batch boundary here
            if header.max_timestamp > max_ts:
                max_ts, max_ts_offset = header.max_timestamp, last
            if last + 1 == from_offset:  # the next header may be a preallocated tail's zeros
                end = pos + header.size_in_bytes
                return _Prefix(end, from_offset, max_ts, max_ts_offset, last_index_entry)
    except CorruptRecordError:
        return None
    return None  # the file ends below the recovery point


def recover_segment(segment: LogSegment, from_offset: int | None = None) -> int:
    """Validate ``segment`` from its start, or from ``from_offset`` (the log's recovery point,
    below which it was fsynced), truncate the invalid tail, rebuild its indexes past there.

    Returns the number of bytes truncated (0 when the whole file is valid). The rebuilt
    indexes are written to their files (not fsynced: the next flush does).
    """
    prefix = _trusted_prefix(segment, from_offset) if from_offset is not None else None
    if prefix is None:
        prefix = _Prefix(0, segment.base_offset, NO_TIMESTAMP, segment.base_offset, 0)
        segment.offset_index.reset()
        segment.time_index.reset()
    else:
        segment.offset_index.truncate_to_position(prefix.position)
    STATS.add(segment.size - prefix.position)
    valid_bytes = prefix.position
    last_index_entry = prefix.last_index_entry
    expected_offset = prefix.next_offset
    max_timestamp = prefix.max_timestamp
    offset_of_max_timestamp = prefix.offset_of_max_timestamp
    reason = ""
    try:
        for pos, header in segment.iter_batches(prefix.position, whole=True):
            base = header.base_offset
            delta = header.last_offset_delta
            if not header.is_valid():
                reason = f"CRC mismatch (stored {header.crc}, computed {header.compute_crc()})"
                break
            if base < expected_offset:
                reason = f"base offset {base} below expected {expected_offset}"
                break
            if delta < 0:
                reason = f"negative last offset delta {delta}"
                break
            last = base + delta
            if not segment.can_append_offset(last):
                reason = f"offset {last} overflows the segment's relative offsets"
                break
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
                offset_of_max_timestamp = last
            if pos - last_index_entry > segment.index_interval_bytes:
                segment.offset_index.append(last, pos)
                segment.time_index.maybe_append(max_timestamp, offset_of_max_timestamp)
                last_index_entry = pos
            expected_offset = last + 1
            valid_bytes = pos + header.size_in_bytes
    except CorruptRecordError as e:
        reason = str(e)
    if valid_bytes + LOG_OVERHEAD <= segment.size and segment.read_bytes(
            valid_bytes, LOG_OVERHEAD) == bytes(LOG_OVERHEAD):
        # Kafka's recovery stops here too (a batch size below any batch's): zeros no append
        # wrote, the tail of a preallocated file (or of a crash the file system zero-filled).
        reason = "an all-zero batch header (the unwritten tail of a preallocated file)"
    truncated = segment.truncate_to_position(valid_bytes)
    segment.txn_index.truncate_to(expected_offset)
    if truncated and not reason:
        reason = "torn batch at the end of the file"
    if truncated:
        logger.warning(
            "recovery truncated segment",
            segment=str(segment.log_path),
            truncated_bytes=truncated,
            position=valid_bytes,
            reason=reason,
        )
    segment.reset_state_after_recovery(
        max_timestamp, offset_of_max_timestamp, valid_bytes - last_index_entry
    )
    segment.on_become_inactive()  # the final (max timestamp, offset) entry, as Kafka
    segment.offset_index.write_pending()
    segment.time_index.write_pending()
    return truncated


def recover_segments(segments: list[LogSegment], recovery_point: int) -> list[LogSegment]:
    """Recover every segment from the one holding ``recovery_point``; returns survivors.

    After the first segment that had to be truncated, the later ones are deleted.
    """
    start = 0
    for i, seg in enumerate(segments):
        if seg.base_offset <= recovery_point:
            start = i
    kept = segments[:start]
    for i in range(start, len(segments)):
        seg = segments[i]
        logger.info(
            "recovering unflushed segment",
            segment=str(seg.log_path),
            recovery_point=recovery_point,
        )
        truncated = recover_segment(seg, recovery_point if i == start else None)
        kept.append(seg)
        if truncated > 0:
            for dead in segments[i + 1 :]:
                logger.warning("deleting segment after a corrupt one", segment=str(dead.log_path))
                dead.delete()
            break
    return kept
