"""The log's file I/O: every open, read, write, fsync and truncation of a log dir's files.

Segments, indexes, producer snapshots, checkpoints and the clean-shutdown marker call these
names (and so do the topic metadata and producer-id blocks, through ``atomic_write``, the one
way the broker replaces a small file whole), looked up on this module at each call, never
bound at import. They are the ``os`` functions themselves, so the hot path costs exactly what
``os.pwrite`` costs; and a test can replace one
(``monkeypatch.setattr(disk, "pwrite", failing)``) to make the disk fail with ENOSPC or EIO
exactly where a real disk would, under the real Log, LogManager and ReplicaManager.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

__all__ = ["open_file", "pread", "pwrite", "pwritev", "write", "fsync", "ftruncate",
           "atomic_write", "fsync_dir", "sync_file_system"]

open_file = os.open
pread = os.pread
pwrite = os.pwrite
pwritev = os.pwritev
write = os.write
fsync = os.fsync
ftruncate = os.ftruncate


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` (temp file, rename): a crash leaves the old or the new
    version. Without ``sync`` the caller sees to durability later. A failure leaves at most a
    ``.tmp`` file, which loading removes."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[write(fd, view):]
        if sync:
            fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = open_file(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def _libc_syncfs() -> object | None:
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


_SYNCFS = _libc_syncfs()


def sync_file_system(path: Path) -> None:
    """Make everything written to the file system holding ``path`` durable at once (Linux's
    syncfs, else sync): one call where thousands of files would each need an fsync, as at a
    clean shutdown. Waits for the writes, as fsync does; an error is an OSError."""
    syncfs = _SYNCFS
    if syncfs is None:
        os.sync()
        return
    fd = open_file(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if syncfs(fd) != 0:  # type: ignore[operator]
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)
