"""LeaderEpochFileCache: which leader epoch wrote which offsets of one partition's log.

Kafka's leader epoch cache, one per log: an ordered list of ``(epoch, start offset)`` entries,
the start offset being the first offset written under that epoch. Followers and consumers ask
the leader (OffsetForLeaderEpoch) where an epoch ended, to find what to truncate after a
leader change; ListOffsets answers the epoch of the offset it found.

Invariants:

* Entries grow strictly in both epoch and start offset. A new entry that breaks that removes
  the entries it conflicts with from the end first (Kafka's maybeTruncateNonMonotonicEntries).
* Every start offset lies in ``[log start offset, log end offset]``: the log truncates the
  cache from the start when its start offset moves and from the end when its end moves back.
* On disk in ``<partition dir>/leader-epoch-checkpoint``, Kafka's text format (a version line
  ``0``, a count line, one ``epoch start-offset`` line per entry), replaced atomically (temp
  file, fsync, rename, fsync of the dir). Unlike Kafka, which writes it on every new epoch,
  a change is written by the log's next flush (``write_if_dirty``), before the flush moves
  the recovery point: the file always covers every entry whose data is below the recovery
  point, and recovery rebuilds the rest from the batches past it (as Kafka does anyway), so
  a partition created with its first epoch costs no fsync on the event loop. An epoch no
  batch was written under yet may be lost in a crash; the leader assigns it again when it
  becomes leader after the restart.
* Mutations run on one thread at a time (the event loop, or the thread loading the log); the
  flush thread only takes a copy under ``_lock``.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import NamedTuple

import structlog

from broker.log import disk

__all__ = [
    "LEADER_EPOCH_CHECKPOINT_FILE",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCheckpointError",
    "LeaderEpochFileCache",
    "read_leader_epoch_checkpoint",
    "write_leader_epoch_checkpoint",
]

logger = structlog.get_logger("broker.log.leader_epoch_cache")

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
#: Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET (OffsetForLeaderEpoch's "no answer").
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

_CHECKPOINT_VERSION = 0


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


class LeaderEpochCheckpointError(ValueError):
    """A checkpoint that is not Kafka's format (Kafka's CheckpointReadBuffer IOException)."""


def read_leader_epoch_checkpoint(path: Path) -> list[EpochEntry]:
    """Parse the checkpoint as Kafka's CheckpointReadBuffer does: a missing or empty file, or
    one with a version line and nothing after it, reads as no entries; a wrong version, a
    malformed line or a count that does not match the lines raises
    LeaderEpochCheckpointError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except UnicodeDecodeError as e:
        raise LeaderEpochCheckpointError(f"malformed checkpoint file {path}: {e}") from None
    lines = text.splitlines()
    if not lines:
        return []
    version = _int_line(lines[0], path)
    if version != _CHECKPOINT_VERSION:
        raise LeaderEpochCheckpointError(
            f"unrecognised version {version}, expected {_CHECKPOINT_VERSION}, in checkpoint "
            f"file {path}")
    if len(lines) < 2:
        return []
    expected = _int_line(lines[1], path)
    entries: list[EpochEntry] = []
    for line in lines[2:]:
        parts = line.split()
        if len(parts) != 2:
            raise LeaderEpochCheckpointError(f"malformed line in checkpoint file {path}: {line!r}")
        entries.append(EpochEntry(_int_line(parts[0], path), _int_line(parts[1], path)))
    if len(entries) != expected:
        raise LeaderEpochCheckpointError(
            f"expected {expected} entries in checkpoint file {path}, found {len(entries)}")
    return entries


def _int_line(text: str, path: Path) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise LeaderEpochCheckpointError(
            f"malformed line in checkpoint file {path}: {text!r}") from None


def write_leader_epoch_checkpoint(path: Path, entries: list[EpochEntry], *,
                                  sync: bool = True) -> None:
    """Replace the checkpoint atomically (temp file, rename), durably with ``sync`` (fsync of
    the file before the rename and of the dir after), else the caller syncs later."""
    lines = [str(_CHECKPOINT_VERSION), str(len(entries))]
    lines += [f"{e.epoch} {e.start_offset}" for e in entries]
    disk.atomic_write(path, ("\n".join(lines) + "\n").encode("utf-8"), sync=sync)


class LeaderEpochFileCache:
    """One log's epochs (Kafka's LeaderEpochFileCache); ``path`` is its checkpoint file."""

    __slots__ = ("path", "_epochs", "_offsets", "_lock", "dirty", "latest_epoch")

    def __init__(self, path: Path, entries: list[EpochEntry] | None = None) -> None:
        self.path = path
        self._epochs: list[int] = []
        self._offsets: list[int] = []
        self._lock = threading.Lock()
        #: changed since the checkpoint was last written.
        self.dirty = False
        #: the latest epoch, UNDEFINED_EPOCH while there is none: read on every append.
        self.latest_epoch = UNDEFINED_EPOCH
        for entry in entries or ():
            self.assign(entry.epoch, entry.start_offset)
        self.dirty = False

    @classmethod
    def load(cls, dir: Path) -> LeaderEpochFileCache:
        """The cache of the log in ``dir``, from its checkpoint (LeaderEpochCheckpointError
        when the file is not Kafka's format)."""
        path = dir / LEADER_EPOCH_CHECKPOINT_FILE
        return cls(path, read_leader_epoch_checkpoint(path))

    # -- reads ----------------------------------------------------------------------------------
    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return [EpochEntry(e, o) for e, o in zip(self._epochs, self._offsets, strict=True)]

    def __len__(self) -> int:
        return len(self._epochs)

    def latest_entry(self) -> EpochEntry | None:
        return EpochEntry(self._epochs[-1], self._offsets[-1]) if self._epochs else None

    def earliest_entry(self) -> EpochEntry | None:
        return EpochEntry(self._epochs[0], self._offsets[0]) if self._epochs else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end offset)`` of ``requested_epoch`` (Kafka's endOffsetFor): the largest
        known epoch at or below it, and the start offset of the first epoch above it, or the
        log end offset for the latest epoch. UNDEFINED for UNDEFINED_EPOCH and for an epoch
        above every known one (an empty cache too); below the earliest epoch, the requested
        epoch with the earliest entry's start offset (the data before it is gone)."""
        epochs = self._epochs
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if epochs and epochs[-1] == requested_epoch:
            return requested_epoch, log_end_offset
        higher = bisect_right(epochs, requested_epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._offsets[0]
        return epochs[higher - 1], self._offsets[higher]

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote ``offset`` (Kafka's epochForOffset): the last entry starting
        at or below it; None below the earliest entry."""
        i = bisect_right(self._offsets, offset)
        return self._epochs[i - 1] if i else None

    # -- changes --------------------------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` unless it is already the latest
        epoch from no later offset (Kafka's assign); entries it contradicts go first. Whether
        the cache changed. ValueError for a negative epoch or offset."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        epochs, offsets = self._epochs, self._offsets
        if epochs and epochs[-1] == epoch and offsets[-1] <= start_offset:
            return False
        with self._lock:
            removed = []
            while epochs and (epochs[-1] >= epoch or offsets[-1] >= start_offset):
                removed.append(EpochEntry(epochs.pop(), offsets.pop()))
            epochs.append(epoch)
            offsets.append(start_offset)
            self.latest_epoch = epoch
            self.dirty = True
        if len(removed) > 1 or (removed and removed[0].start_offset != start_offset):
            logger.warning("new leader epoch entry truncated conflicting entries",
                           path=str(self.path), entry=(epoch, start_offset),
                           removed=[tuple(e) for e in removed])
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Remove the entries starting at or after ``end_offset`` (the log was truncated to
        it; Kafka's truncateFromEnd). Whether any went."""
        offsets = self._offsets
        if end_offset < 0 or not offsets or offsets[-1] < end_offset:
            return False
        with self._lock:
            keep = bisect_left(offsets, end_offset)
            del self._epochs[keep:]
            del offsets[keep:]
            self.latest_epoch = self._epochs[-1] if self._epochs else UNDEFINED_EPOCH
            self.dirty = True
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at ``start_offset`` (Kafka's truncateFromStart): the entries
        starting at or below it go, and the last of them comes back starting exactly there.
        Whether anything changed."""
        offsets = self._offsets
        if not offsets or offsets[0] > start_offset:
            return False
        with self._lock:
            last = bisect_right(offsets, start_offset) - 1
            if last == 0 and offsets[0] == start_offset:
                return False
            del self._epochs[:last]
            del offsets[:last]
            offsets[0] = start_offset
            self.dirty = True
        return True

    def clear(self) -> None:
        with self._lock:
            self._epochs.clear()
            self._offsets.clear()
            self.latest_epoch = UNDEFINED_EPOCH
            self.dirty = True

    # -- persistence ----------------------------------------------------------------------------
    def write_if_dirty(self, *, sync: bool = True) -> bool:
        """Write the checkpoint if anything changed since it was last written (any thread);
        an OSError leaves it dirty and is the caller's to report, unless the partition dir is
        gone (a log deleted under a flush: Kafka's writeIfDirExists). Whether it wrote."""
        if not self.dirty:
            return False
        with self._lock:
            entries = [EpochEntry(e, o) for e, o in zip(self._epochs, self._offsets, strict=True)]
            self.dirty = False
        try:
            write_leader_epoch_checkpoint(self.path, entries, sync=sync)
        except FileNotFoundError:
            if self.path.parent.exists():
                self.dirty = True
                raise
            logger.info("leader epoch checkpoint not written: the partition dir is gone",
                        path=str(self.path))
            return False
        except BaseException:
            self.dirty = True
            raise
        return True
