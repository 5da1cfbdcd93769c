"""Atomic small-file replacement, for every file the broker rewrites whole.

Checkpoints, snapshots, topic metadata and producer-id blocks are written to a temp file,
optionally fsynced, renamed over the old one, and the directory fsynced, so a crash leaves
either the old version or the new one, never a torn mix.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace `path` with `data`; without `sync` the caller sees to durability later."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
