"""Kafka's sparse segment indexes: ``.index`` (offset -> position) and ``.timeindex``.

On disk, byte for byte as Kafka writes them (big-endian, no header):

* ``.index``: 8-byte entries ``int32 relative offset, int32 position``. One entry is added
  after every ``log.index.interval.bytes`` of appended batches; the offset is the *last*
  offset of the appended batch and the position is where that batch starts.
* ``.timeindex``: 12-byte entries ``int64 timestamp, int32 relative offset``: the largest
  timestamp seen so far in the segment and the last offset of the batch that carried it.
  Timestamps and offsets never decrease; an entry is only added when the timestamp grows.

Kafka preallocates and mmaps the files; here the entries live in compact in-memory arrays
(``array``) searched with ``bisect`` and each new entry is written straight to the file, so
files are always exactly ``entries * entry_size`` bytes and need no trimming.

Invariant: the in-memory arrays and the file hold the same entries, in order.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from broker.log import disk

__all__ = ["OffsetIndex", "TimeIndex", "IndexCorruptError"]

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_INT32_MAX = 2**31 - 1
_NO_TIMESTAMP = -1


class IndexCorruptError(Exception):
    """An index file that fails its sanity check; the segment's indexes must be rebuilt."""


def _open_fd(path: Path) -> int:
    return disk.open_file(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


class _IndexFile:
    """The file side shared by both indexes: one fd, positional writes, fsync, truncation."""

    entry_size: int

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._fd = _open_fd(path)

    def _read_all(self) -> bytes:
        size = os.fstat(self._fd).st_size
        data = disk.pread(self._fd, size, 0) if size else b""
        whole = len(data) - len(data) % self.entry_size
        if whole != len(data):
            raise IndexCorruptError(
                f"index file {self.path} has size {len(data)}, not a multiple of {self.entry_size}"
            )
        return data

    def _write_entry(self, entry_no: int, payload: bytes) -> None:
        disk.pwrite(self._fd, payload, entry_no * self.entry_size)

    def _truncate_entries(self, entries: int) -> None:
        disk.ftruncate(self._fd, entries * self.entry_size)

    def relative_offset(self, offset: int) -> int:
        rel = offset - self.base_offset
        if rel < 0 or rel > _INT32_MAX:
            raise ValueError(
                f"offset {offset} can not be stored relative to base offset {self.base_offset}"
            )
        return rel

    def can_append_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= _INT32_MAX

    def dup_fd(self) -> int:
        """A private duplicate of the fd so a flusher thread can fsync after close()."""
        return os.dup(self._fd)

    def flush(self) -> None:
        disk.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

    def size_in_bytes(self) -> int:
        return len(self) * self.entry_size

    def truncate_to_entries(self, entries: int) -> None:
        """Keep the first ``entries`` entries, in memory and in the file: undoes a failed append,
        whose file may hold a torn entry the arrays never saw."""
        self._truncate_entries_to(entries)
        self._truncate_entries(entries)

    def _truncate_entries_to(self, keep: int) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def __len__(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError


class OffsetIndex(_IndexFile):
    """Sparse map from offset to the file position of the batch holding it.

    ``lookup(offset)`` gives the greatest entry with offset <= target; the reader then scans
    batch headers forward from that position (Kafka's OffsetIndex + searchForOffsetWithSize).
    """

    entry_size = 8

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        self._rel_offsets = array("i")
        self._positions = array("i")
        data = self._read_all()
        if data:
            flat = array("i")
            flat.frombytes(data)
            if sys.byteorder == "little":
                flat.byteswap()
            self._rel_offsets = flat[0::2]
            self._positions = flat[1::2]

    def __len__(self) -> int:
        return len(self._rel_offsets)

    @property
    def entries(self) -> int:
        return len(self._rel_offsets)

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or the base offset when empty (as Kafka)."""
        if not self._rel_offsets:
            return self.base_offset
        return self.base_offset + self._rel_offsets[-1]

    def entry(self, n: int) -> tuple[int, int]:
        return self.base_offset + self._rel_offsets[n], self._positions[n]

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """(offset, position) of the greatest entry with offset <= target, else (base, 0)."""
        slot = bisect_right(self._rel_offsets, target_offset - self.base_offset) - 1
        if slot < 0:
            return self.base_offset, 0
        return self.base_offset + self._rel_offsets[slot], self._positions[slot]

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets must strictly grow (Kafka's InvalidOffsetException)."""
        rel = self.relative_offset(offset)
        if self._rel_offsets and rel <= self._rel_offsets[-1]:
            raise ValueError(
                f"index entry offset {offset} is not larger than the last one {self.last_offset}"
            )
        self._write_entry(len(self._rel_offsets), _OFFSET_ENTRY.pack(rel, position))
        self._rel_offsets.append(rel)
        self._positions.append(position)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose offset is >= ``offset``."""
        keep = bisect_left(self._rel_offsets, offset - self.base_offset)
        self._truncate_entries_to(keep)

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or past ``position`` (after the log is cut there)."""
        keep = bisect_left(self._positions, position)
        self._truncate_entries_to(keep)

    def _truncate_entries_to(self, keep: int) -> None:
        if keep < len(self._rel_offsets):
            del self._rel_offsets[keep:]
            del self._positions[keep:]
            self._truncate_entries(keep)

    def reset(self) -> None:
        self._truncate_entries_to(0)

    def sanity_check(self, log_size: int) -> None:
        """Kafka's cheap checks, plus positions that must lie inside the log file."""
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

    entry_size = 12

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        self._timestamps = array("q")
        self._rel_offsets = array("i")
        data = self._read_all()
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            self._timestamps.append(ts)
            self._rel_offsets.append(rel)

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def entries(self) -> int:
        return len(self._timestamps)

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base offset) when empty (as Kafka)."""
        if not self._timestamps:
            return _NO_TIMESTAMP, self.base_offset
        return self._timestamps[-1], self.base_offset + self._rel_offsets[-1]

    def entry(self, n: int) -> tuple[int, int]:
        return self._timestamps[n], self.base_offset + self._rel_offsets[n]

    def lookup(self, target_timestamp: int) -> tuple[int, int]:
        """Greatest entry with timestamp <= target, else (-1, base offset): Kafka's lookup."""
        slot = bisect_right(self._timestamps, target_timestamp) - 1
        if slot < 0:
            return _NO_TIMESTAMP, self.base_offset
        return self._timestamps[slot], self.base_offset + self._rel_offsets[slot]

    def lookup_before(self, target_timestamp: int) -> tuple[int, int]:
        """Greatest entry with timestamp < target, else (-1, base offset).

        Every batch up to that entry's offset holds only timestamps below the target, so a
        search for the first timestamp >= target may start there without missing ties.
        """
        slot = bisect_left(self._timestamps, target_timestamp) - 1
        if slot < 0:
            return _NO_TIMESTAMP, self.base_offset
        return self._timestamps[slot], self.base_offset + self._rel_offsets[slot]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) only if the timestamp grows; offsets may not go back."""
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
        self._write_entry(len(self._timestamps), _TIME_ENTRY.pack(timestamp, rel))
        self._timestamps.append(timestamp)
        self._rel_offsets.append(rel)

    def truncate_to(self, offset: int) -> None:
        """Drop every entry whose offset is >= ``offset``."""
        self._truncate_entries_to(bisect_left(self._rel_offsets, offset - self.base_offset))

    def _truncate_entries_to(self, keep: int) -> None:
        if keep < len(self._timestamps):
            del self._timestamps[keep:]
            del self._rel_offsets[keep:]
            self._truncate_entries(keep)

    def reset(self) -> None:
        self._truncate_entries_to(0)

    def sanity_check(self) -> None:
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
