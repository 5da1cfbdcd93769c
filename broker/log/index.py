"""Kafka's sparse segment indexes: ``.index`` (offset -> position) and ``.timeindex``.

On disk, byte for byte as Kafka writes them (big-endian, no header):

* ``.index``: 8-byte entries ``int32 relative offset, int32 position``. One entry is added
  after every ``log.index.interval.bytes`` of appended batches; the offset is the *last*
  offset of the appended batch and the position is where that batch starts.
* ``.timeindex``: 12-byte entries ``int64 timestamp, int32 relative offset``: the largest
  timestamp seen so far in the segment and the last offset of the batch that carried it.
  Timestamps and offsets never decrease; an entry is only added when the timestamp grows.

Kafka preallocates and mmaps the files, loading them lazily; here the entries live in compact
in-memory arrays (``array``) searched with ``bisect``, read from the file when first needed
(a segment no one reads never loads its indexes), and new entries reach the file at the next
flush (fsynced) or close, so an index holds no file descriptor and files are always exactly
``entries * entry_size`` bytes.

Invariant: the file holds a prefix of the in-memory entries (all of them once flushed or
closed); recovery rebuilds the indexes of every segment past the recovery point anyway.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

import structlog

from broker.log import disk

__all__ = ["OffsetIndex", "TimeIndex", "IndexCorruptError"]

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_INT32_MAX = 2**31 - 1
_NO_TIMESTAMP = -1

logger = structlog.get_logger("broker.log")


class IndexCorruptError(Exception):
    """An index file that fails its sanity check; the segment's indexes must be rebuilt."""


#: Guards the entries written to index files against a flush on another thread.
_FILE_LOCK = threading.Lock()


class _IndexFile:
    """The file side shared by both indexes. No descriptor is held: the entries are read
    from the file on first use (Kafka's lazy index), kept in memory, and the ones not yet in
    the file are written there by ``flush`` (fsynced) or ``close``."""

    __slots__ = ("_dir", "_name", "base_offset", "_persisted", "_loaded", "_exists")
    entry_size: int

    def __init__(self, path: Path | tuple[Path, str], base_offset: int, *,
                 create: bool = False) -> None:
        """``path`` or ``(dir, file name)``: a segment passes its dir, so its indexes share
        one Path object instead of holding one each (a partition's memory is mostly paths).
        ``create``: the index of a new segment, empty; its file is created by the segment's
        first append (``ensure_file``: Kafka's lazy index creates it on first use there), so
        a new partition costs one file, its ``.log``, until it is written."""
        self._dir, self._name = path if isinstance(path, tuple) else (path.parent, path.name)
        self.base_offset = base_offset
        #: entries known to be in the file (the rest are written by flush or close)
        self._persisted = 0
        self._loaded = False
        self._exists = not create
        if create:
            self._load_entries(b"")
            self._loaded = True

    def ensure_file(self) -> None:
        """Create the (empty) file of a new index if it does not exist yet."""
        if not self._exists:
            os.close(disk.open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
            self._exists = True

    @property
    def path(self) -> Path:
        return self._dir / self._name

    @path.setter
    def path(self, path: Path) -> None:
        self._dir, self._name = path.parent, path.name

    def _ensure_loaded(self, strict: bool = False) -> None:
        """Read the entries from the file if not yet done. A file of a broken size raises
        when ``strict`` (a sanity check); otherwise, found by a lazy read, the index starts
        over empty (it is only a hint: lookups then scan from the segment's start)."""
        if self._loaded:
            return
        try:
            data = self._read_all()
        except IndexCorruptError:
            if strict:
                raise
            logger.warning("index of a broken size dropped", path=str(self.path))
            data = b""
            with _FILE_LOCK, contextlib.suppress(OSError):
                os.truncate(self.path, 0)
        self._load_entries(data)
        self._persisted = len(data) // self.entry_size
        self._loaded = True

    @property
    def loaded(self) -> bool:
        """Whether the entries were read (tests: a segment no one read loads nothing)."""
        return self._loaded

    def _load_entries(self, data: bytes) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _pack(self, start: int, end: int) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    def _read_all(self) -> bytes:
        try:
            fd = disk.open_file(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return b""
        try:
            size = os.fstat(fd).st_size
            data = disk.pread(fd, size, 0) if size else b""
        finally:
            os.close(fd)
        whole = len(data) - len(data) % self.entry_size
        if whole != len(data):
            raise IndexCorruptError(
                f"index file {self.path} has size {len(data)}, not a multiple of {self.entry_size}"
            )
        return data

    def _write_pending(self, sync: bool, ensure_file: bool = False) -> None:
        """Write the entries not yet in the file (and fsync them when ``sync``); with
        ``ensure_file`` the file is created even when there is nothing to write. The fsync
        runs after the lock is released: the lock is the process's, and the loop takes it too
        (reading an index, closing a segment)."""
        with _FILE_LOCK:
            if not self._loaded:
                return
            end = len(self)
            start = self._persisted
            if start >= end and (self._exists or not ensure_file):
                return
            payload = self._pack(start, end)
            fd = disk.open_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(payload)
                pos = start * self.entry_size
                while view:
                    n = disk.pwrite(fd, view, pos)
                    view = view[n:]
                    pos += n
            except BaseException:
                os.close(fd)
                raise
            self._exists = True
            self._persisted = end
        try:
            if sync:
                disk.fsync(fd)
        finally:
            os.close(fd)

    def _truncate_entries(self, entries: int) -> None:
        """Cut the file to ``entries`` (the in-memory entries are already cut)."""
        with _FILE_LOCK:
            if self._persisted <= entries or not self._exists:
                return
            fd = disk.open_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                disk.ftruncate(fd, entries * self.entry_size)
            finally:
                os.close(fd)
            self._persisted = entries

    def relative_offset(self, offset: int) -> int:
        rel = offset - self.base_offset
        if rel < 0 or rel > _INT32_MAX:
            raise ValueError(
                f"offset {offset} can not be stored relative to base offset {self.base_offset}"
            )
        return rel

    def can_append_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    @property
    def dirty(self) -> bool:
        """Whether entries wait to be written to the file."""
        return self._loaded and self._persisted < len(self)

    def flush(self) -> None:
        """Write and fsync the entries not yet in the file (nothing to do otherwise)."""
        self._write_pending(sync=True)

    def close(self) -> None:
        """Write what is pending (no fsync: see Log.close); the index holds no descriptor.
        The index of a segment never appended to stays without a file, as it was made."""
        self._write_pending(sync=False)

    def write_pending(self) -> None:
        """Write what is pending without fsync (a rebuilt index, at once)."""
        self._write_pending(sync=False, ensure_file=True)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)

    def size_in_bytes(self) -> int:
        return len(self) * self.entry_size

    def truncate_to_entries(self, entries: int) -> None:
        """Keep the first ``entries`` entries, in memory and in the file."""
        self._truncate_entries_to(entries)

    def _truncate_entries_to(self, keep: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __len__(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError


class OffsetIndex(_IndexFile):
    """Sparse map from offset to the file position of the batch holding it.

    ``lookup(offset)`` gives the greatest entry with offset <= target; the reader then scans
    batch headers forward from that position (Kafka's OffsetIndex + searchForOffsetWithSize).
    """

    __slots__ = ("_rel_offsets", "_positions")
    entry_size = 8

    def _load_entries(self, data: bytes) -> None:
        flat = array("i")
        if data:
            flat.frombytes(data)
            if sys.byteorder == "little":
                flat.byteswap()
        self._rel_offsets = flat[0::2]
        self._positions = flat[1::2]

    def _pack(self, start: int, end: int) -> bytes:
        rel, pos = self._rel_offsets, self._positions
        return b"".join(_OFFSET_ENTRY.pack(rel[i], pos[i]) for i in range(start, end))

    def __len__(self) -> int:
        self._ensure_loaded()
        return min(len(self._rel_offsets), len(self._positions))

    @property
    def entries(self) -> int:
        return len(self)

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or the base offset when empty (as Kafka)."""
        self._ensure_loaded()
        if not self._rel_offsets:
            return self.base_offset
        return self.base_offset + self._rel_offsets[-1]

    def entry(self, n: int) -> tuple[int, int]:
        self._ensure_loaded()
        return self.base_offset + self._rel_offsets[n], self._positions[n]

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """(offset, position) of the greatest entry with offset <= target, else (base, 0)."""
        self._ensure_loaded()
        slot = bisect_right(self._rel_offsets, target_offset - self.base_offset) - 1
        if slot < 0:
            return self.base_offset, 0
        return self.base_offset + self._rel_offsets[slot], self._positions[slot]

    def append(self, offset: int, position: int) -> None:
        """Add an entry (to the file at the next flush or close); offsets must strictly grow
        (Kafka's InvalidOffsetException)."""
        self._ensure_loaded()
        rel = self.relative_offset(offset)
        if self._rel_offsets and rel <= self._rel_offsets[-1]:
            raise ValueError(
                f"index entry offset {offset} is not larger than the last one {self.last_offset}"
            )
        self._rel_offsets.append(rel)
        self._positions.append(position)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose offset is >= ``offset``."""
        self._ensure_loaded()
        keep = bisect_left(self._rel_offsets, offset - self.base_offset)
        self._truncate_entries_to(keep)

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or past ``position`` (after the log is cut there)."""
        self._ensure_loaded()
        keep = bisect_left(self._positions, position)
        self._truncate_entries_to(keep)

    def _truncate_entries_to(self, keep: int) -> None:
        self._ensure_loaded()
        if keep < len(self._rel_offsets):
            del self._rel_offsets[keep:]
            del self._positions[keep:]
        self._truncate_entries(keep)

    def reset(self) -> None:
        self._truncate_entries_to(0)

    def sanity_check(self, log_size: int) -> None:
        """Kafka's cheap checks, plus positions that must lie inside the log file."""
        self._ensure_loaded(strict=True)
        if not self._rel_offsets:
            return
        if self._rel_offsets[0] < 0 or self._positions[0] < 0:
            raise IndexCorruptError(f"corrupt index {self.path}: negative first entry")
        if self._rel_offsets[-1] < self._rel_offsets[0]:
            raise IndexCorruptError(f"corrupt index {self.path}: last offset below the first")
        if self._positions[-1] >= log_size and log_size >= 0:
            raise IndexCorruptError(
                f"corrupt index {self.path}: position {self._positions[-1]} beyond log size "
                f"{log_size}"
            )


class TimeIndex(_IndexFile):
    """Sparse map from timestamp to offset, used by ListOffsets and time-based retention."""

    __slots__ = ("_timestamps", "_rel_offsets")
    entry_size = 12

    def _load_entries(self, data: bytes) -> None:
        self._timestamps = array("q")
        self._rel_offsets = array("i")
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            self._timestamps.append(ts)
            self._rel_offsets.append(rel)

    def _pack(self, start: int, end: int) -> bytes:
        ts, rel = self._timestamps, self._rel_offsets
        return b"".join(_TIME_ENTRY.pack(ts[i], rel[i]) for i in range(start, end))

    def __len__(self) -> int:
        self._ensure_loaded()
        return min(len(self._timestamps), len(self._rel_offsets))

    @property
    def entries(self) -> int:
        return len(self)

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base offset) when empty (as Kafka)."""
        self._ensure_loaded()
        if not self._timestamps:
            return _NO_TIMESTAMP, self.base_offset
        return self._timestamps[-1], self.base_offset + self._rel_offsets[-1]

    def entry(self, n: int) -> tuple[int, int]:
        self._ensure_loaded()
        return self._timestamps[n], self.base_offset + self._rel_offsets[n]

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """Greatest entry with timestamp <= target, else (-1, base offset): Kafka's lookup."""
        self._ensure_loaded()
        slot = bisect_right(self._timestamps, target_timestamp) - 1
        if slot < 0:
            return _NO_TIMESTAMP, self.base_offset
        return self._timestamps[slot], self.base_offset + self._rel_offsets[slot]

    def lookup_before(self, target_timestamp: int) -> tuple[int, int]:
        """Greatest entry with timestamp < target, else (-1, base offset).

        Every batch up to that entry's offset holds only timestamps below the target, so a
        search for the first timestamp >= target may start there without missing ties.
        """
        self._ensure_loaded()
        slot = bisect_left(self._timestamps, target_timestamp) - 1
        if slot < 0:
            return _NO_TIMESTAMP, self.base_offset
        return self._timestamps[slot], self.base_offset + self._rel_offsets[slot]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) only if the timestamp grows; offsets may not go back."""
        self._ensure_loaded()
        rel = self.relative_offset(offset)
        if self._timestamps:
            if rel < self._rel_offsets[-1]:
                raise ValueError(
                    f"time index offset {offset} is below the last one "
                    f"{self.base_offset + self._rel_offsets[-1]}"
                )
            if timestamp < self._timestamps[-1]:
                raise ValueError(
                    f"time index timestamp {timestamp} is below the last one {self._timestamps[-1]}"
                )
            if timestamp == self._timestamps[-1]:
                return
        elif timestamp <= _NO_TIMESTAMP:
            return
        self._timestamps.append(timestamp)
        self._rel_offsets.append(rel)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose offset is >= ``offset``."""
        self._ensure_loaded()
        self._truncate_entries_to(bisect_left(self._rel_offsets, offset - self.base_offset))

    def _truncate_entries_to(self, keep: int) -> None:
        self._ensure_loaded()
        if keep < len(self._timestamps):
            del self._timestamps[keep:]
            del self._rel_offsets[keep:]
        self._truncate_entries(keep)

    def reset(self) -> None:
        self._truncate_entries_to(0)

    def sanity_check(self) -> None:
        self._ensure_loaded(strict=True)
        if not self._timestamps:
            return
        if self._rel_offsets[0] < 0:
            raise IndexCorruptError(f"corrupt time index {self.path}: negative offset")
        if self._timestamps[-1] < self._timestamps[0]:
            raise IndexCorruptError(
                f"corrupt time index {self.path}: last timestamp below the first"
            )
        if self._rel_offsets[-1] < self._rel_offsets[0]:
            raise IndexCorruptError(f"corrupt time index {self.path}: last offset below first")
