"""OffsetIndex and TimeIndex: Kafka's file format, lookups, truncation, crafted files."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from broker.log.index import IndexCorruptError, OffsetIndex, TimeIndex

BASE = 1000


def test_offset_index_lookup_and_file_format(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000001000.index"
    idx = OffsetIndex(path, BASE)
    assert idx.lookup(BASE + 5) == (BASE, 0)  # empty: (base offset, position 0)
    entries = [(BASE + 10, 4100), (BASE + 20, 8300), (BASE + 35, 12500)]
    for off, pos in entries:
        idx.append(off, pos)
    assert idx.dirty  # entries reach the file at the next flush (or close)
    idx.flush()
    assert not idx.dirty
    assert path.read_bytes() == b"".join(struct.pack(">ii", o - BASE, p) for o, p in entries)
    assert idx.lookup(BASE) == (BASE, 0)
    assert idx.lookup(BASE + 9) == (BASE, 0)
    assert idx.lookup(BASE + 10) == (BASE + 10, 4100)
    assert idx.lookup(BASE + 19) == (BASE + 10, 4100)
    assert idx.lookup(BASE + 20) == (BASE + 20, 8300)
    assert idx.lookup(BASE + 10**6) == (BASE + 35, 12500)
    assert idx.last_offset == BASE + 35 and idx.entries == 3
    idx.close()


def test_offset_index_rejects_non_increasing_and_overflow(tmp_path: Path) -> None:
    idx = OffsetIndex(tmp_path / "x.index", BASE)
    idx.append(BASE + 5, 10)
    with pytest.raises(ValueError):
        idx.append(BASE + 5, 20)
    with pytest.raises(ValueError):
        idx.append(BASE - 1, 20)
    with pytest.raises(ValueError):
        idx.append(BASE + 2**31, 20)
    assert idx.can_append_offset(BASE + 2**31 - 1)
    assert not idx.can_append_offset(BASE + 2**31)
    idx.close()


def test_offset_index_crafted_file_binary_search(tmp_path: Path) -> None:
    path = tmp_path / "crafted.index"
    # 10_000 entries: relative offset 3*i, position 4096*i
    path.write_bytes(b"".join(struct.pack(">ii", 3 * i, 4096 * i) for i in range(10_000)))
    idx = OffsetIndex(path, 0)
    assert idx.entries == 10_000
    assert idx.lookup(0) == (0, 0)
    assert idx.lookup(1) == (0, 0)
    assert idx.lookup(3 * 5000 + 2) == (3 * 5000, 4096 * 5000)
    assert idx.lookup(3 * 9999 + 100) == (3 * 9999, 4096 * 9999)
    idx.sanity_check(4096 * 10_000)
    with pytest.raises(IndexCorruptError):
        idx.sanity_check(4096 * 9999)  # last position past the log's end
    idx.close()


def test_offset_index_truncation(tmp_path: Path) -> None:
    path = tmp_path / "t.index"
    idx = OffsetIndex(path, 0)
    for i in range(1, 6):
        idx.append(10 * i, 100 * i)
    idx.flush()
    idx.truncate_to(30)  # drops entries with offset >= 30
    assert [idx.entry(i) for i in range(idx.entries)] == [(10, 100), (20, 200)]
    assert path.stat().st_size == 16
    idx.append(25, 250)
    idx.flush()
    idx.truncate_to_position(200)
    assert idx.entries == 1 and path.stat().st_size == 8
    idx.reset()
    assert idx.entries == 0 and path.stat().st_size == 0
    idx.close()
    assert OffsetIndex(path, 0).entries == 0


def test_offset_index_reopen_and_corrupt_size(tmp_path: Path) -> None:
    path = tmp_path / "r.index"
    idx = OffsetIndex(path, 7)
    idx.append(9, 100)
    idx.append(12, 300)
    idx.close()
    again = OffsetIndex(path, 7)
    assert again.lookup(13) == (12, 300)
    again.close()
    with path.open("ab") as f:
        f.write(b"\x00\x01\x02")
    with pytest.raises(IndexCorruptError):  # read lazily: the sanity check finds it
        OffsetIndex(path, 7).sanity_check(10**6)
    # Read by a lookup, the index is dropped (it is only a hint) and its file cut to empty.
    lazy = OffsetIndex(path, 7)
    assert lazy.lookup(13) == (7, 0) and path.stat().st_size == 0


def test_time_index_append_rules_and_lookup(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000001000.timeindex"
    ti = TimeIndex(path, BASE)
    assert ti.last_entry() == (-1, BASE)
    assert ti.lookup(5) == (-1, BASE)
    ti.maybe_append(-1, BASE)  # no timestamp: nothing
    ti.maybe_append(100, BASE + 2)
    ti.maybe_append(100, BASE + 4)  # same timestamp: skipped
    ti.maybe_append(250, BASE + 9)
    ti.maybe_append(400, BASE + 9)  # same offset, bigger timestamp: allowed
    with pytest.raises(ValueError):
        ti.maybe_append(500, BASE + 8)  # offset going back
    with pytest.raises(ValueError):
        ti.maybe_append(50, BASE + 20)  # timestamp going back
    ti.flush()
    assert path.read_bytes() == b"".join(
        struct.pack(">qi", ts, rel) for ts, rel in [(100, 2), (250, 9), (400, 9)]
    )
    assert ti.lookup(99) == (-1, BASE)
    assert ti.lookup(100) == (100, BASE + 2)
    assert ti.lookup(249) == (100, BASE + 2)
    assert ti.lookup(10**12) == (400, BASE + 9)
    assert ti.lookup_before(100) == (-1, BASE)
    assert ti.lookup_before(101) == (100, BASE + 2)
    assert ti.lookup_before(250) == (100, BASE + 2)
    assert ti.last_entry() == (400, BASE + 9)
    ti.truncate_to(BASE + 9)
    assert ti.entries == 1 and path.stat().st_size == 12
    ti.close()
    assert TimeIndex(path, BASE).last_entry() == (100, BASE + 2)


def test_time_index_crafted_file(tmp_path: Path) -> None:
    path = tmp_path / "c.timeindex"
    path.write_bytes(b"".join(struct.pack(">qi", 1_000 + 10 * i, 2 * i) for i in range(5000)))
    ti = TimeIndex(path, 500)
    assert ti.lookup(1_000 + 10 * 2500 + 5) == (1_000 + 10 * 2500, 500 + 5000)
    ti.sanity_check()
    ti.close()
    path.write_bytes(path.read_bytes() + b"\x00" * 5)
    with pytest.raises(IndexCorruptError):
        TimeIndex(path, 500).sanity_check()
