"""Helpers shared by the conformance tests (the generic client helpers are in tests/support)."""

from __future__ import annotations

import struct
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.support.clients import segment_files

# RecordBatch v2 header up to the record count: base offset, length, leader epoch, magic, crc,
# attributes, last offset delta, first/max timestamp, producer id, producer epoch, base sequence.
_HEADER = struct.Struct(">qiiBIhiqqqhii")


@dataclass(frozen=True)
class ProducerBatch:
    """The idempotence fields of one stored batch."""

    base_offset: int
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int


def producer_batches(log_dir: Path, topic: str, partition: int) -> list[ProducerBatch]:
    out = []
    for seg in segment_files(log_dir, topic, partition):
        data = seg.read_bytes()
        pos = 0
        while pos + _HEADER.size <= len(data):
            (base, length, _le, _magic, _crc, _attrs, _lod, _fts, _mts, pid, epoch, seq,
             count) = _HEADER.unpack_from(data, pos)
            out.append(ProducerBatch(base, count, pid, epoch, seq))
            pos += 12 + length
    return out


def assert_idempotent_batches(log_dir: Path, topic: str, partition: int, records: int) -> None:
    """Every batch carries one producer id and epoch, and sequence numbers run 0.. without gap
    or repeat, in step with the offsets: what the broker stored is exactly one copy of each."""
    batches = producer_batches(log_dir, topic, partition)
    assert batches, f"{topic}-{partition}: no batches on disk"
    ids = {(b.producer_id, b.producer_epoch) for b in batches}
    assert len(ids) == 1 and next(iter(ids))[0] >= 0, f"{topic}-{partition}: producer ids {ids}"
    seq = 0
    for b in batches:
        assert b.base_sequence == seq, f"{topic}-{partition}: batch {b} expected sequence {seq}"
        assert b.base_offset == seq, f"{topic}-{partition}: batch {b} expected offset {seq}"
        seq += b.record_count
    assert seq == records, f"{topic}-{partition}: {seq} records stored, {records} produced"


class Ledger:
    """Thread-safe record of who consumed what: (member, partition, offset, value)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[tuple[str, int, int, bytes]] = []

    def add(self, member: str, partition: int, offset: int, value: bytes) -> None:
        with self._lock:
            self.rows.append((member, partition, offset, value))

    def snapshot(self) -> list[tuple[str, int, int, bytes]]:
        with self._lock:
            return list(self.rows)

    def positions(self) -> set[tuple[int, int]]:
        return {(p, o) for _m, p, o, _v in self.snapshot()}

    def wait_for(self, expected: Iterable[tuple[int, int]], timeout: float, what: str) -> None:
        want = set(expected)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if want <= self.positions():
                return
            time.sleep(0.05)
        missing = sorted(want - self.positions())
        raise AssertionError(f"{what}: {len(missing)} records never consumed, e.g. {missing[:10]}")


def assert_exactly_once(rows: list[tuple[str, int, int, bytes]],
                        expected: dict[tuple[int, int], bytes]) -> None:
    """Each expected (partition, offset) consumed once, with the value produced there."""
    seen = Counter((p, o) for _m, p, o, _v in rows)
    dups = sorted(k for k, n in seen.items() if n > 1)
    assert not dups, f"{len(dups)} records consumed more than once, e.g. " + ", ".join(
        f"{k} by {[m for m, p, o, _v in rows if (p, o) == k]}" for k in dups[:5])
    missing = sorted(set(expected) - set(seen))
    assert not missing, f"{len(missing)} records never consumed, e.g. {missing[:10]}"
    extra = sorted(set(seen) - set(expected))
    assert not extra, f"records consumed that were never produced: {extra[:10]}"
    for _m, p, o, v in rows:
        assert v == expected[(p, o)], f"({p}, {o}): value {v!r} != {expected[(p, o)]!r}"


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
