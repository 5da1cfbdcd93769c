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
* The entries are also kept in memory (a segment rarely holds many aborts), so ``collect``
  reads no file. The file is written through the disk seam, so a failing disk is reported as
  for every other file of the log.
"""

from __future__ import annotations

import os
import struct
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

log = structlog.get_logger("broker.log.txn_index")

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

    Opening reads the file whole. A torn last entry (a crash in the middle of its write) is
    cut off, as Kafka's reader never sees a partial entry; entries whose last offset is below
    the segment's base offset fail the sanity check.
    """

    def __init__(self, path: Path, start_offset: int) -> None:
        self.path = path
        self.start_offset = start_offset
        self._fd = -1
        self.entries: list[AbortedTxn] = []
        if path.exists():
            self._open()
            data = disk.pread(self._fd, os.fstat(self._fd).st_size, 0)
            whole = len(data) - len(data) % ABORTED_TXN_SIZE
            try:
                self.entries = [
                    AbortedTxn.from_bytes(data, p) for p in range(0, whole, ABORTED_TXN_SIZE)
                ]
            except TxnIndexCorruptError:
                self.close()
                raise
            if whole != len(data):
                log.warning(
                    "dropping a torn transaction index entry",
                    path=str(path),
                    size=len(data),
                    kept=whole,
                )
                disk.ftruncate(self._fd, whole)

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = disk.open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        return self._fd

    @property
    def last_offset(self) -> int | None:
        return self.entries[-1].last_offset if self.entries else None

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
        fd = self._open()
        position = self.size_in_bytes
        data = memoryview(txn.to_bytes())
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
        for i, txn in enumerate(self.entries):
            if txn.last_offset >= offset:
                if self._fd >= 0 or self.path.exists():
                    disk.ftruncate(self._open(), i * ABORTED_TXN_SIZE)
                del self.entries[i:]
                return

    def reset(self) -> None:
        """Remove every entry (recovery rebuilds the index from the segment's markers)."""
        if self._fd >= 0 or self.path.exists():
            disk.ftruncate(self._open(), 0)
        self.entries = []

    def sanity_check(self) -> None:
        """Kafka's sanityCheck: no entry may end below the segment's base offset."""
        for txn in self.entries:
            if txn.last_offset < self.start_offset:
                raise TxnIndexCorruptError(
                    f"last offset of aborted transaction {txn} in index {self.path} is less "
                    f"than start offset {self.start_offset}"
                )

    def dup_fd(self) -> int | None:
        """A private duplicate of the fd for an fsync that may outlive close(); None while
        the index has no file."""
        return os.dup(self._fd) if self._fd >= 0 else None

    def flush(self) -> None:
        if self._fd >= 0:
            disk.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def delete(self) -> None:
        """Close and remove the file (with its segment)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"TransactionIndex({self.path.name}, entries={len(self.entries)})"
