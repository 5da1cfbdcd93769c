"""Recovery after an unclean shutdown: keep the longest valid prefix, rebuild the indexes.

Kafka's LogSegment.recover and LogLoader.recoverLog, reduced to what a v2-only log needs:

* Every segment from the one holding the recovery point (the offset below which data was
  fsynced) to the end is re-read batch by batch. A batch is kept only if it is whole, has a
  possible length and magic 2, its CRC matches, its offsets are in order (base offset at or
  after the previous batch's next offset, and not below the segment's base offset) and its
  last offset fits the segment's int32 relative offsets.
* At the first batch that fails, the segment is truncated there (a torn or corrupt tail)
  and every later segment is deleted: nothing after a hole can be trusted.
* Indexes of recovered segments are rebuilt from scratch with the same spacing rule as the
  append path, and the segment's final max timestamp is written to the time index.
* The transaction index loses the entries of markers that did not survive; the entries of
  markers above the producer-state snapshot the load starts from are written again by the
  producer-state rebuild, which knows where each aborted transaction began (Kafka's
  LogSegment.recover rebuilds it from the producer state too).

Segments below the recovery point were fsynced with their indexes and are trusted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import structlog

from broker.log.segment import LogSegment
from protocol.record_batch import NO_TIMESTAMP, CorruptRecordError

__all__ = ["RecoveryStats", "STATS", "recover_segment", "recover_segments"]

log = structlog.get_logger("broker.log.recovery")


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


def recover_segment(segment: LogSegment) -> int:
    """Validate ``segment`` from its start, truncate the invalid tail, rebuild its indexes.

    Returns the number of bytes truncated (0 when the whole file is valid). The rebuilt
    indexes are written to their files (not fsynced: the next flush does).
    """
    STATS.add(segment.size)
    segment.offset_index.reset()
    segment.time_index.reset()
    valid_bytes = 0
    last_index_entry = 0
    expected_offset = segment.base_offset
    max_timestamp = NO_TIMESTAMP
    offset_of_max_timestamp = segment.base_offset
    reason = ""
    try:
        for pos, header in segment.iter_batches(0, whole=True):
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
    truncated = segment.truncate_to_position(valid_bytes)
    segment.txn_index.truncate_to(expected_offset)
    if truncated and not reason:
        reason = "torn batch at the end of the file"
    if truncated:
        log.warning(
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
        log.info(
            "recovering unflushed segment",
            segment=str(seg.log_path),
            recovery_point=recovery_point,
        )
        truncated = recover_segment(seg)
        kept.append(seg)
        if truncated > 0:
            for dead in segments[i + 1 :]:
                log.warning("deleting segment after a corrupt one", segment=str(dead.log_path))
                dead.delete()
            break
    return kept
