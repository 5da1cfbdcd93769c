"""The transaction index: one ``<base>.txnindex`` file per segment (Kafka's TransactionIndex).

Each entry is an aborted transaction whose ABORT marker was written in the segment, in
Kafka's on-disk layout (AbortedTxn, version 0, 34 bytes, big-endian)::

    version int16 (0) | producer id int64 | first offset int64 | last offset int64
    | last stable offset int64

A read_committed fetch asks which aborted transactions overlap the range it returns
(``collect``); the answer goes into the fetch response so the consumer can drop their records.

Invariants:

* Entries are ordered by last offset (the marker's offset), strictly increasing: markers are
  appended in offset order.
* Like Kafka, the file is created only when the first entry is written; a segment without
  aborted transactions has no ``.txnindex`` file.
* The entries are also kept in memory once read (a segment rarely holds many aborts), so
  ``collect`` reads no file; no descriptor is held between writes. The file is written
  through the disk seam, so a failing disk is reported as for every other file of the log.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import structlog

from broker.log import disk

__all__ = [
    "TXN_INDEX_FILE_SUFFIX",
    "ABORTED_TXN_SIZE",
    "AbortedTxn",
    "TransactionIndex",
    "TxnIndexSearchResult",
    "TxnIndexCorruptError",
]

logger = structlog.get_logger("broker.log.txn_index")

TXN_INDEX_FILE_SUFFIX = ".txnindex"
_CURRENT_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
#: Kafka's AbortedTxn.TOTAL_SIZE.
ABORTED_TXN_SIZE = _ENTRY.size


class TxnIndexCorruptError(Exception):
    """A transaction index that fails its sanity check (Kafka's CorruptIndexException)."""


class AbortedTxn(NamedTuple):
    """An aborted transaction: the producer, its first and last (marker) offset, and the last
    stable offset when the marker was written (where a fetch can stop looking further)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def to_bytes(self) -> bytes:
        return _ENTRY.pack(
            _CURRENT_VERSION,
            self.producer_id,
            self.first_offset,
            self.last_offset,
            self.last_stable_offset,
        )

    @classmethod
    def from_bytes(cls, buf: bytes | bytearray | memoryview, pos: int = 0) -> AbortedTxn:
        version, pid, first, last, lso = _ENTRY.unpack_from(buf, pos)
        if version > _CURRENT_VERSION:
            raise TxnIndexCorruptError(
                f"unexpected aborted transaction version {version}, current version is "
                f"{_CURRENT_VERSION}"
            )
        return cls(pid, first, last, lso)


class TxnIndexSearchResult(NamedTuple):
    """Kafka's TxnIndexSearchResult: ``complete`` means no later segment can add more."""

    aborted: list[AbortedTxn]
    complete: bool


class TransactionIndex:
    """The aborted transactions whose markers are in one segment.

    The file is read whole when the entries are first needed (``entries``), and holds no
    descriptor: each append opens, writes and closes it (aborts are rare) and ``flush``
    fsyncs it only if something was written since. A torn last entry (a crash in the middle
    of its write) is cut off, as Kafka's reader never sees a partial entry; entries whose
    last offset is below the segment's base offset fail the sanity check.
    """

    __slots__ = ("_dir", "_name", "start_offset", "_entries", "_unsynced")

    def __init__(self, path: Path | tuple[Path, str], start_offset: int) -> None:
        """``path`` or ``(dir, file name)``, as the other indexes."""
        self._dir, self._name = path if isinstance(path, tuple) else (path.parent, path.name)
        self.start_offset = start_offset
        self._entries: list[AbortedTxn] | None = None  # None: not read yet
        self._unsynced = False

    @property
    def path(self) -> Path:
        return self._dir / self._name

    @path.setter
    def path(self, path: Path) -> None:
        self._dir, self._name = path.parent, path.name

    @property
    def entries(self) -> list[AbortedTxn]:
        entries = self._entries
        if entries is None:
            entries = self._entries = self._read()
        return entries

    @entries.setter
    def entries(self, value: list[AbortedTxn]) -> None:
        self._entries = value

    def _read(self) -> list[AbortedTxn]:
        try:
            fd = disk.open_file(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return []
        try:
            data = disk.pread(fd, os.fstat(fd).st_size, 0)
            whole = len(data) - len(data) % ABORTED_TXN_SIZE
            entries = [AbortedTxn.from_bytes(data, p) for p in range(0, whole, ABORTED_TXN_SIZE)]
            if whole != len(data):
                logger.warning(
                    "dropping a torn transaction index entry",
                    path=str(self.path),
                    size=len(data),
                    kept=whole,
                )
                disk.ftruncate(fd, whole)
        finally:
            os.close(fd)
        return entries

    def _with_file(self, action: Callable[[int], object]) -> None:
        fd = disk.open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            action(fd)
        finally:
            os.close(fd)
        self._unsynced = True

    @property
    def last_offset(self) -> int | None:
        entries = self.entries
        return entries[-1].last_offset if entries else None

    @property
    def size_in_bytes(self) -> int:
        return len(self.entries) * ABORTED_TXN_SIZE

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry at the end; its last offset must be above the previous one's."""
        last = self.last_offset
        if last is not None and last >= txn.last_offset:
            raise ValueError(
                f"the last offset of appended transactions must increase sequentially, but "
                f"{txn.last_offset} is not greater than current last offset {last} of index "
                f"{self.path}"
            )
        position = self.size_in_bytes
        data = memoryview(txn.to_bytes())

        def write(fd: int) -> None:
            written = 0
            try:
                while written < len(data):
                    written += disk.pwrite(fd, data[written:], position + written)
            except OSError:
                try:
                    disk.ftruncate(fd, position)
                except OSError:
                    pass  # the dir goes offline anyway; loading drops a torn entry
                raise

        self._with_file(write)
        self.entries.append(txn)

    def collect(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Aborted transactions overlapping [fetch_offset, upper_bound_offset): Kafka's
        collectAbortedTxns. Complete once an entry's last stable offset reaches the bound: no
        transaction aborted later can have begun below it."""
        out: list[AbortedTxn] = []
        for txn in self.entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                out.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return TxnIndexSearchResult(out, True)
        return TxnIndexSearchResult(out, False)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or above ``offset`` (Kafka's truncateTo)."""
        entries = self.entries
        for i, txn in enumerate(entries):
            if txn.last_offset >= offset:
                if self.path.exists():
                    self._with_file(lambda fd, n=i: disk.ftruncate(fd, n * ABORTED_TXN_SIZE))
                del entries[i:]
                return

    def reset(self) -> None:
        """Remove every entry (recovery rebuilds the index from the segment's markers)."""
        if self.path.exists():
            self._with_file(lambda fd: disk.ftruncate(fd, 0))
        self._entries = []

    def sanity_check(self) -> None:
        """Kafka's sanityCheck: no entry may end below the segment's base offset."""
        for txn in self.entries:
            if txn.last_offset < self.start_offset:
                raise TxnIndexCorruptError(
                    f"last offset of aborted transaction {txn} in index {self.path} is less "
                    f"than start offset {self.start_offset}"
                )

    def flush(self) -> None:
        """fsync what was written since the last flush (nothing to do when nothing was)."""
        if not self._unsynced:
            return
        try:
            fd = disk.open_file(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._unsynced = False
            return
        try:
            disk.fsync(fd)
        finally:
            os.close(fd)
        self._unsynced = False

    def close(self) -> None:
        """Nothing to close: the index holds no descriptor."""

    def delete(self) -> None:
        """Remove the file (with its segment)."""
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"TransactionIndex({self.path.name}, entries={len(self.entries)})"
