"""Kafka's offset checkpoint files (recovery points, log start offsets, the cleaner's
offsets): a version line, a count line, then ``topic partition offset`` per line."""

from __future__ import annotations

from pathlib import Path

from broker.log import disk

TopicPartition = tuple[str, int]

_CHECKPOINT_VERSION = 0


def read_offset_checkpoint(path: Path) -> dict[TopicPartition, int]:
    """Parse Kafka's offset checkpoint text format; a missing file reads as empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    lines = text.splitlines()
    if len(lines) < 2:
        raise ValueError(f"malformed checkpoint {path}: too short")
    version = int(lines[0].strip())
    if version != _CHECKPOINT_VERSION:
        raise ValueError(f"unrecognised version {version} in checkpoint {path}")
    expected = int(lines[1].strip())
    out: dict[TopicPartition, int] = {}
    for line in lines[2:]:
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3:
            raise ValueError(f"malformed line {line!r} in checkpoint {path}")
        out[(parts[0], int(parts[1]))] = int(parts[2])
    if len(out) != expected:
        raise ValueError(f"checkpoint {path} announces {expected} entries, holds {len(out)}")
    return out


def write_offset_checkpoint(path: Path, offsets: dict[TopicPartition, int]) -> None:
    """Write atomically: temp file, fsync, rename, fsync the directory."""
    lines = [str(_CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())]
    disk.atomic_write(path, ("\n".join(lines) + "\n").encode("utf-8"))
