"""LogSegment: one ``.log`` file of concatenated v2 batches, its two sparse indexes and its
transaction index.

Files are named by the segment's base offset, 20 digits zero-padded (Kafka's names):
``00000000000000000000.log``, ``.index``, ``.timeindex``, and ``.txnindex`` once an aborted
transaction's marker is written in the segment. The ``.log`` file holds batches
exactly as validated and offset-stamped on append, so its bytes are what Kafka writes.

All I/O is positional (``os.pread`` / ``os.pwrite`` on one fd): readers on the event loop and
an fsync in a flusher thread never share a file position. An append may leave its write to
the caller (``deferred``): the log dir's writer thread then writes the bytes, so ``size``
can run ahead of the file, and a read past what is written gets short bytes, which every
reader cuts to whole batches (clients never read past the high watermark, which waits for
the write). Only batch headers are ever parsed
on the append and read paths; records are decoded only for ListOffsets by timestamp.

Not thread-safe except ``sync_fds`` / ``flush_indexes`` / ``flush``; the owning Log
serialises everything else on the event loop. Only the active segment holds a descriptor
(see broker/log/handles.py).
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import structlog

from broker.log import disk
from broker.log.handles import HANDLES, is_fd_exhaustion
from broker.log.index import OffsetIndex, TimeIndex
from broker.log.txn_index import TXN_INDEX_FILE_SUFFIX, TransactionIndex
from broker.log.writer import Write
from protocol.record_batch import (
    HEADER_SIZE_UP_TO_MAGIC,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
)
from purgatory.clock import system_wall_ms

__all__ = [
    "LogSegment",
    "LOG_FILE_SUFFIX",
    "INDEX_FILE_SUFFIX",
    "TIME_INDEX_FILE_SUFFIX",
    "TXN_INDEX_FILE_SUFFIX",
    "segment_file_name",
    "HEADER_SCAN_CHUNK",
]

LOG_FILE_SUFFIX = ".log"
INDEX_FILE_SUFFIX = ".index"
TIME_INDEX_FILE_SUFFIX = ".timeindex"

#: bytes read at once while walking headers (a few index intervals).
HEADER_SCAN_CHUNK = 16 * 1024

_INT32 = struct.Struct(">i")

logger = structlog.get_logger("broker.log")


#: a lazily read field not read yet
_UNREAD = object()


def segment_file_name(base_offset: int, suffix: str) -> str:
    """Kafka's file name: base offset as 20 zero-padded digits plus the suffix."""
    return f"{base_offset:020d}{suffix}"


class LogSegment:
    """A segment: append batches, find a batch by offset or timestamp, recover, roll.

    ``max_timestamp_so_far`` / ``offset_of_max_timestamp_so_far`` mirror Kafka's
    maxTimestampAndOffsetSoFar (the offset is the last offset of the batch holding the max
    timestamp); ``rolling_based_timestamp`` is the max timestamp of the first batch, which
    time-based rolling measures from. Both are read from the files when first asked.

    File handles: a segment created for appends (``active=True``) holds its ``.log`` fd
    until ``release`` (once it is no longer appended to) or ``close``. Any other segment
    borrows one from the process's FileHandleCache when read, so a segment no one touches
    holds nothing; its indexes never hold one (broker/log/index.py).
    """

    __slots__ = (
        "dir", "base_offset", "index_interval_bytes", "file_suffix", "_fd", "_closed", "_size",
        "offset_index", "time_index", "txn_index", "_bytes_since_last_index_entry",
        "created_ms", "_max_ts", "_offset_of_max_ts", "_rolling_ts", "roll_jitter_ms",
        "_preallocated", "__weakref__",
    )

    def __init__(
        self,
        dir: Path,
        base_offset: int,
        index_interval_bytes: int,
        *,
        now_ms: int | None = None,
        file_suffix: str = "",
        active: bool = True,
        size: int | None = None,
        preallocate: int = 0,
        hold: bool = True,
    ) -> None:
        """``preallocate`` (Kafka's initFileSize under preallocate=true): a new file is made
        that long at once, its data starting at 0, and cut to its data by ``trim``.
        ``hold=False``: an active segment whose descriptor is opened by its first append (a
        new partition no one writes to holds none)."""
        self.dir = dir
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.file_suffix = file_suffix
        name = segment_file_name(base_offset, "")
        self._closed = False
        self._fd = -1
        if active:
            self._fd = disk.open_file(
                self.log_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if size is None:
                size = os.fstat(self._fd).st_size if active else os.stat(self.log_path).st_size
            self._size = size
            new_file = active and size == 0
            self._preallocated = new_file and preallocate > 0
            if self._preallocated:
                disk.ftruncate(self._fd, preallocate)  # zero-filled: Kafka's setLength
            self.offset_index = OffsetIndex(
                (dir, name + INDEX_FILE_SUFFIX + file_suffix), base_offset, create=new_file)
            self.time_index = TimeIndex(
                (dir, name + TIME_INDEX_FILE_SUFFIX + file_suffix), base_offset, create=new_file)
            self.txn_index = TransactionIndex(
                (dir, name + TXN_INDEX_FILE_SUFFIX + file_suffix), base_offset)
            if not hold and self._fd >= 0:
                fd, self._fd = self._fd, -1
                os.close(fd)
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
            raise
        self._bytes_since_last_index_entry = 0
        self.created_ms = system_wall_ms() if now_ms is None else now_ms
        self._max_ts: int | None = None  # None: read from the time index when asked
        self._offset_of_max_ts = base_offset
        self._rolling_ts: object = _UNREAD
        #: Kafka's rollJitterMs: drawn once per segment (segment.jitter.ms), taken off
        #: segment.ms so that the logs of many partitions do not all roll at once.
        self.roll_jitter_ms = 0

    # -- plain accessors -------------------------------------------------------------------------
    # Paths are built when asked, not held: a Path object per file was most of a partition's
    # memory.
    @property
    def log_path(self) -> Path:
        return self.dir / segment_file_name(self.base_offset, LOG_FILE_SUFFIX + self.file_suffix)

    @property
    def index_path(self) -> Path:
        return self.offset_index.path

    @property
    def time_index_path(self) -> Path:
        return self.time_index.path

    @property
    def txn_index_path(self) -> Path:
        return self.txn_index.path

    @property
    def size(self) -> int:
        """Bytes of data in the ``.log`` file (Kafka's segment.size): a preallocated file is
        longer, its tail zeros that nothing reads."""
        return self._size

    @property
    def preallocated(self) -> bool:
        """Whether the file was made longer than its data and not yet trimmed."""
        return self._preallocated

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def holds_fd(self) -> bool:
        """Whether the segment holds its own ``.log`` fd (it is, or was just, active)."""
        return self._fd >= 0

    def _load_max_timestamp(self) -> None:
        self._max_ts, self._offset_of_max_ts = self.time_index.last_entry()

    @property
    def max_timestamp_so_far(self) -> int:
        if self._max_ts is None:
            self._load_max_timestamp()
        return self._max_ts  # type: ignore[return-value]

    @max_timestamp_so_far.setter
    def max_timestamp_so_far(self, value: int) -> None:
        if self._max_ts is None:
            self._load_max_timestamp()
        self._max_ts = value

    @property
    def offset_of_max_timestamp_so_far(self) -> int:
        if self._max_ts is None:
            self._load_max_timestamp()
        return self._offset_of_max_ts

    @offset_of_max_timestamp_so_far.setter
    def offset_of_max_timestamp_so_far(self, value: int) -> None:
        if self._max_ts is None:
            self._load_max_timestamp()
        self._offset_of_max_ts = value

    @property
    def rolling_based_timestamp(self) -> int | None:
        ts = self._rolling_ts
        if ts is _UNREAD:
            ts = None
            if self._size >= RECORD_BATCH_OVERHEAD:
                first = BatchHeader(self._pread(RECORD_BATCH_OVERHEAD, 0))
                if first.magic == MAGIC_V2:
                    ts = first.max_timestamp
            self._rolling_ts = ts
        return ts  # type: ignore[return-value]

    @rolling_based_timestamp.setter
    def rolling_based_timestamp(self, value: int | None) -> None:
        self._rolling_ts = value

    def largest_timestamp(self) -> int:
        """Max timestamp so far, else the file's mtime: what time-based retention compares."""
        if self.max_timestamp_so_far >= 0:
            return self.max_timestamp_so_far
        return int(os.stat(self.log_path).st_mtime * 1000)

    def __repr__(self) -> str:
        return (
            f"LogSegment(base_offset={self.base_offset}, size={self._size}, "
            f"max_timestamp={self._max_ts})"
        )

    # -- I/O helpers ----------------------------------------------------------------------------
    def _io_fd(self) -> int:
        """The ``.log`` fd to use now: the segment's own, else one borrowed from the cache
        (valid until the next borrow: never kept)."""
        fd = self._fd
        if fd >= 0:
            return fd
        if self._closed:
            raise OSError(errno.EBADF, f"segment {self.log_path} is closed")
        return HANDLES.fd_of(self)

    def _pread(self, n: int, pos: int) -> bytes:
        return disk.pread(self._io_fd(), n, pos)

    def read_bytes(self, position: int, size: int) -> bytes:
        """Raw bytes of the ``.log`` file (tests and recovery)."""
        return self._pread(size, position)

    def iter_batches(
        self, start: int = 0, end: int | None = None, *, whole: bool = False, chunk: int = 0
    ) -> Iterator[tuple[int, BatchHeader]]:
        """Walk batches from ``start`` (a batch boundary) to ``end``: ``(position, header)``.

        With ``whole=False`` only headers are guaranteed to be in the header's buffer (cheap:
        reads ``chunk`` bytes at a time); with ``whole=True`` the entire batch is, so its CRC
        can be checked. Stops quietly at a batch running past ``end`` (a torn tail); raises
        CorruptRecordError for a length or magic no v2 batch can have. A header is only valid
        until the next iteration.
        """
        limit = self._size if end is None else end
        chunk = chunk or (1 << 20 if whole else HEADER_SCAN_CHUNK)
        pos = start
        buf = b""
        buf_pos = start
        while limit - pos >= LOG_OVERHEAD:
            rel = pos - buf_pos
            if rel + RECORD_BATCH_OVERHEAD > len(buf):
                buf = self._pread(min(chunk, limit - pos), pos)
                buf_pos = pos
                rel = 0
            avail = len(buf) - rel
            if avail < LOG_OVERHEAD:
                return  # the file is shorter than ``end`` (truncated under us)
            length = _INT32.unpack_from(buf, rel + LENGTH_OFFSET)[0]
            if length < MIN_BATCH_LENGTH:
                raise CorruptRecordError(
                    f"batch at position {pos} of {self.log_path} declares length {length}"
                )
            if avail >= HEADER_SIZE_UP_TO_MAGIC and buf[rel + MAGIC_OFFSET] != MAGIC_V2:
                raise CorruptRecordError(
                    f"batch at position {pos} of {self.log_path} has magic "
                    f"{buf[rel + MAGIC_OFFSET]}"
                )
            size = length + LOG_OVERHEAD
            if pos + size > limit:
                return
            if avail < RECORD_BATCH_OVERHEAD:
                return
            if whole and rel + size > len(buf):
                if size > chunk:
                    big = self._pread(size, pos)
                    if len(big) < size:
                        return
                    yield pos, BatchHeader(big, 0)
                    pos += size
                    continue
                buf = self._pread(min(chunk, limit - pos), pos)
                buf_pos = pos
                rel = 0
                if len(buf) < size:
                    return
            yield pos, BatchHeader(buf, rel)
            pos += size

    # -- append ---------------------------------------------------------------------------------
    def can_append_offset(self, offset: int) -> bool:
        """Whether ``offset`` fits the indexes' int32 relative offsets (else roll first)."""
        return self.offset_index.can_append_offset(offset)

    def append(
        self,
        largest_offset: int,
        largest_timestamp: int,
        offset_of_max_timestamp: int,
        records: bytes | bytearray | memoryview,
        deferred: list[Write] | None = None,
    ) -> None:
        """Write validated, offset-stamped batches at the end; add index entries if due.

        Buffered write only: durability comes from ``flush``, which also writes the index
        entries added here (they live in memory until then). All or nothing: if the write of
        the batches fails (ENOSPC, EIO), the file is cut back to where it was, the in-memory
        state is untouched and the OSError is raised, so a failed append never leaves part of
        a batch behind to be read or recovered.

        With ``deferred`` the batches' write is not made here but added to it as
        ``(fd, records, position)``, for the log dir's writer thread to write before anyone
        reads or acknowledges them; the size and indexes move at once, as if written.
        """
        n = len(records)
        if n == 0:
            return
        if not self.can_append_offset(largest_offset):
            raise ValueError(
                f"offset {largest_offset} overflows segment with base offset {self.base_offset}"
            )
        fd = self._fd if self._fd >= 0 else self.hold()
        physical_position = self._size
        if physical_position == 0:  # a segment's first batch: its index files exist from now
            self.offset_index.ensure_file()
            self.time_index.ensure_file()
        if deferred is None:
            view = memoryview(records)
            written = 0
            try:
                while written < n:
                    written += disk.pwrite(fd, view[written:], physical_position + written)
            except OSError:
                self._cut_back(physical_position)
                raise
        if largest_timestamp > self.max_timestamp_so_far:
            max_ts, max_ts_offset = largest_timestamp, offset_of_max_timestamp
        else:
            max_ts, max_ts_offset = self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far
        since_index = self._bytes_since_last_index_entry
        if since_index > self.index_interval_bytes:
            self.offset_index.append(largest_offset, physical_position)
            self.time_index.maybe_append(max_ts, max_ts_offset)
            since_index = 0
        if deferred is not None:
            deferred.append((fd, records, physical_position))
        if physical_position == 0:
            self.rolling_based_timestamp = largest_timestamp
        self._size = physical_position + n
        self._max_ts = max_ts
        self._offset_of_max_ts = max_ts_offset
        self._bytes_since_last_index_entry = since_index + n

    def hold(self) -> int:
        """Open the segment's own ``.log`` fd (to append to it) if it has none."""
        if self._fd < 0:
            if self._closed:
                raise OSError(errno.EBADF, f"segment {self.log_path} is closed")
            HANDLES.forget(self)
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            try:
                self._fd = disk.open_file(self.log_path, flags, 0o644)
            except OSError as e:
                if not is_fd_exhaustion(e) or not HANDLES.shrink():
                    raise
                self._fd = disk.open_file(self.log_path, flags, 0o644)
        return self._fd

    def release(self) -> None:
        """Give up the segment's own fd (it is no longer appended to, and no write queued
        for it is pending): from now on it borrows one from the cache when read."""
        fd = self._fd
        if fd >= 0:
            self._fd = -1
            os.close(fd)

    def _cut_back(self, position: int) -> None:
        """Undo a failed append: the ``.log`` file back to ``position``. Best effort: if the
        disk refuses even this, its dir goes offline anyway and recovery after the restart
        cuts the torn tail (or keeps a whole batch that was never acknowledged, as Kafka
        would)."""
        try:
            disk.ftruncate(self._io_fd(), position)
        except OSError as e:
            logger.warning("could not undo a failed append", segment=str(self.log_path),
                        position=position, error=str(e))

    # -- lookups --------------------------------------------------------------------------------
    def translate_offset(
        self, offset: int, starting_position: int = 0
    ) -> tuple[int, int, int] | None:
        """``(position, size, last_offset)`` of the first batch whose last offset >= offset.

        The offset index gives a start position; only headers are scanned from there
        (Kafka's translateOffset / searchForOffsetWithSize). None past the segment's end.
        """
        position = max(self.offset_index.lookup(offset)[1], starting_position)
        for pos, header in self.iter_batches(position):
            last = header.last_offset
            if last >= offset:
                return pos, header.size_in_bytes, last
        return None

    def read(
        self,
        start_offset: int,
        max_size: int,
        max_offset: int | None = None,
        min_one_batch: bool = False,
    ) -> bytes | memoryview | None:
        """Whole batches from the one holding ``start_offset``; None if past this segment.

        Stops before the first batch whose last offset reaches ``max_offset`` (exclusive
        bound) and within ``max_size`` bytes, except that ``min_one_batch`` returns the first
        batch whole whatever its size (KIP-74).
        """
        if max_size < 0:
            raise ValueError(f"invalid max size {max_size}")
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        position, first_size, first_last = found
        if max_offset is not None and first_last >= max_offset:
            return b""
        budget = max(max_size, first_size) if min_one_batch else max_size
        if budget < first_size:
            return b""
        segment_size = self._size
        end = min(segment_size, position + budget)
        data = self._pread(end - position, position)
        if end == segment_size and max_offset is None and len(data) == end - position:
            return data  # the segment ends on a batch boundary: nothing to cut
        return _cut_to_whole_batches(data, max_offset)

    def read_next_offset(self) -> int:
        """Offset after the last batch: scan headers from the last index entry to the end."""
        return self.scan_tail()[0]

    def scan_tail(self) -> tuple[int, int]:
        """``(next offset, end position of the last whole batch)``, from the last index entry.

        An end position short of ``size`` means a torn tail.
        """
        start = self.offset_index.entry(-1)[1] if self.offset_index.entries else 0
        next_offset = self.base_offset
        end = start
        for pos, header in self.iter_batches(start):
            next_offset = header.next_offset
            end = pos + header.size_in_bytes
        return next_offset, end

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int
    ) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record with timestamp >= target, at or after
        ``starting_offset``: ListOffsets by timestamp (Kafka's findOffsetByTimestamp).

        The time index narrows the scan to batches whose max timestamp could qualify; only
        the one batch that does is decoded, to find the exact record.
        """
        _ts, index_offset = self.time_index.lookup_before(timestamp)
        position = self.offset_index.lookup(max(index_offset, starting_offset))[1]
        for pos, header in self.iter_batches(position):
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                size = header.size_in_bytes
                batch = self._pread(size, pos)
                if len(batch) < size:
                    return None  # still being written: past the high watermark anyway
                found = _first_record_at_or_after(batch, timestamp, starting_offset)
                if found is not None:
                    return found
        return None

    def find_max_timestamp_offset(self) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first record carrying the segment's max timestamp."""
        max_ts = self.max_timestamp_so_far
        if max_ts < 0:
            return None
        position = self.offset_index.lookup(self.offset_of_max_timestamp_so_far)[1]
        for pos, header in self.iter_batches(position):
            if header.max_timestamp == max_ts:
                batch = self._pread(header.size_in_bytes, pos)
                found = _first_record_at_or_after(batch, max_ts, header.base_offset, exact=True)
                if found is not None:
                    return found
                return header.base_offset, max_ts
        return None

    # -- rolling --------------------------------------------------------------------------------
    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        """Kafka's timeWaitedForRoll: by record timestamps when known, else wall clock."""
        ts = self.rolling_based_timestamp
        if ts is not None and ts >= 0:
            return message_timestamp - ts
        return now_ms - self.created_ms

    def should_roll(
        self,
        messages_size: int,
        max_timestamp_in_messages: int,
        max_offset_in_messages: int,
        now_ms: int,
        segment_bytes: int,
        roll_ms: int,
        max_index_size: int = 1 << 31,
    ) -> bool:
        """Kafka's shouldRoll: full, old enough (segment.ms less this segment's jitter, and
        not empty), an index at its max entries (segment.index.bytes), or offsets would
        overflow."""
        size = self._size
        waited = self.time_waited_for_roll(now_ms, max_timestamp_in_messages)
        return (
            size > segment_bytes - messages_size
            or (size > 0 and waited > roll_ms - self.roll_jitter_ms)
            or self.indexes_full(max_index_size)
            or not self.can_append_offset(max_offset_in_messages)
        )

    def indexes_full(self, max_index_size: int) -> bool:
        """Kafka's offsetIndex.isFull || timeIndex.isFull: an index holds max_index_size
        bytes' worth of entries (rounded down to whole entries)."""
        return (len(self.offset_index) >= max_index_size // OffsetIndex.entry_size
                or len(self.time_index) >= max_index_size // TimeIndex.entry_size)

    def on_become_inactive(self) -> None:
        """Record the segment's final max timestamp in the time index and cut a preallocated
        file to its data, as Kafka does on roll."""
        self._append_final_time_index_entry()
        self.trim()

    def trim(self) -> None:
        """Kafka's FileRecords.trim: a preallocated file cut to the data written (bytes still
        queued for the dir's writer lie below ``size`` and are not cut)."""
        if self._preallocated and not self._closed:
            disk.ftruncate(self._io_fd(), self._size)
            self._preallocated = False

    def _append_final_time_index_entry(self) -> None:
        # Never read (``_max_ts`` None): the time index already ends with it.
        if self._max_ts is not None and self._max_ts >= 0 and not self._closed:
            self.time_index.maybe_append(self._max_ts, self._offset_of_max_ts)

    # -- recovery support -----------------------------------------------------------------------
    def truncate_to_position(self, position: int) -> int:
        """Cut the ``.log`` file at a batch boundary; returns bytes removed."""
        removed = self._size - position
        if removed > 0:
            disk.ftruncate(self._io_fd(), position)
            self._size = position
            self._preallocated = False
            self.offset_index.truncate_to_position(position)
        if self._size == 0:
            self.rolling_based_timestamp = None
        return max(removed, 0)

    def reset_state_after_recovery(
        self, max_timestamp: int, offset_of_max_timestamp: int, bytes_since_index: int
    ) -> None:
        self._max_ts = max_timestamp
        self._offset_of_max_ts = offset_of_max_timestamp
        self._bytes_since_last_index_entry = bytes_since_index
        self._rolling_ts = _UNREAD

    # -- durability and lifecycle ---------------------------------------------------------------
    def sync_fds(self, own: bool) -> list[tuple[int, bool]]:
        """Descriptors to fsync the ``.log`` file through, each with whether to close it
        after: the segment's own (``own``, for the writer's sync thread), a duplicate of it
        (it may be closed meanwhile), or, for a segment holding none, a fresh one by path
        (never a cached one, which the loop may close and reuse). Empty if the file is gone.
        Index entries are written and fsynced by ``flush_indexes``."""
        fd = self._fd
        if fd >= 0:
            return [(fd, False)] if own else [(os.dup(fd), True)]
        try:
            return [(disk.open_file(self.log_path, os.O_RDONLY | os.O_CLOEXEC), True)]
        except FileNotFoundError:
            return []  # deleted or renamed meanwhile: nothing of it left to make durable

    def flush_indexes(self) -> None:
        """Write and fsync the index entries not yet in the files (a no-op when none)."""
        if self._closed:
            return
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def dup_log_fd(self) -> int:
        """A private descriptor of the ``.log`` file: a cleaner thread reads through it."""
        if self._fd >= 0:
            return os.dup(self._fd)
        return disk.open_file(self.log_path, os.O_RDONLY | os.O_CLOEXEC)

    def flush(self) -> None:
        """fsync the log and the indexes (Kafka's LogSegment.flush)."""
        for fd, close in self.sync_fds(own=True):
            try:
                disk.fsync(fd)
            finally:
                if close:
                    os.close(fd)
        self.flush_indexes()

    def close(self) -> None:
        """Write the final time index entry and the pending index entries, then close the
        file (no fsync: see Log.close)."""
        if self._closed:
            return
        self._append_final_time_index_entry()
        try:
            self.trim()
            self.offset_index.close()
            self.time_index.close()
            self.txn_index.close()
        finally:
            self.close_quietly()

    def close_quietly(self) -> None:
        """Close without writing anything (used before deleting the files)."""
        self._closed = True
        fd = self._fd
        if fd >= 0:
            self._fd = -1
            os.close(fd)
        HANDLES.forget(self)

    def change_file_suffix(self, new_suffix: str) -> None:
        """Rename the segment's files from the current suffix to ``new_suffix`` while open
        (Kafka's changeFileSuffixes; the fds stay valid). The ``.log`` file goes last, so a
        ``.log`` with a suffix implies its indexes carry it too."""
        old_suffix = self.file_suffix
        indexes = (self.offset_index, self.time_index, self.txn_index)
        for index in indexes:
            target = _with_suffix(index.path, old_suffix, new_suffix)
            if index.path.exists():
                os.replace(index.path, target)
            index.path = target
        target = _with_suffix(self.log_path, old_suffix, new_suffix)
        os.replace(self.log_path, target)
        self.file_suffix = new_suffix

    def file_paths(self) -> list[Path]:
        """The segment's files under their current names (the ``.txnindex`` one may not exist)."""
        return [self.log_path, self.index_path, self.time_index_path, self.txn_index_path]

    def delete(self) -> None:
        """Close and remove the segment's files, the transaction index with them."""
        self.close_quietly()
        for path in (self.log_path, self.index_path, self.time_index_path, self.txn_index_path):
            path.unlink(missing_ok=True)


def _with_suffix(path: Path, old_suffix: str, new_suffix: str) -> Path:
    name = path.name
    if old_suffix:
        if not name.endswith(old_suffix):
            raise ValueError(f"{path} does not end with {old_suffix!r}")
        name = name[: -len(old_suffix)]
    return path.with_name(name + new_suffix)


def _cut_to_whole_batches(data: bytes, max_offset: int | None) -> bytes | memoryview:
    """The longest prefix of ``data`` made of whole batches whose last offset < max_offset."""
    n = len(data)
    p = 0
    while n - p >= RECORD_BATCH_OVERHEAD:
        size = _INT32.unpack_from(data, p + LENGTH_OFFSET)[0] + LOG_OVERHEAD
        if size < RECORD_BATCH_OVERHEAD or p + size > n:
            break
        if max_offset is not None:
            header = BatchHeader(data, p)
            if header.last_offset >= max_offset:
                break
        p += size
    if p == n:
        return data
    return memoryview(data)[:p]


def _first_record_at_or_after(
    batch: bytes, timestamp: int, starting_offset: int, *, exact: bool = False
) -> tuple[int, int] | None:
    """Decode one batch (decompressing if needed) to find a record by timestamp.

    Only ListOffsets comes here. Uses kafka-python's reader; if the codec library is
    missing, answers at batch granularity (first offset >= starting_offset, max timestamp).
    """
    header = BatchHeader(batch, 0)
    try:
        from kafka.record.default_records import DefaultRecordBatch

        for record in DefaultRecordBatch(batch):
            ts = record.timestamp
            if record.offset < starting_offset:
                continue
            if (ts == timestamp) if exact else (ts >= timestamp):
                return record.offset, ts
        return None
    except Exception:  # codec library missing or undecodable payload
        if header.max_timestamp == NO_TIMESTAMP:
            return None
        return max(header.base_offset, starting_offset), header.max_timestamp
