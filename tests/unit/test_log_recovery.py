"""Recovery on crafted files: torn tails, bad CRCs, garbage, missing or broken indexes."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from broker.log import Log, LogConfig
from protocol.record_batch import COMPRESSION_GZIP, COMPRESSION_NONE, iter_batches

T0 = 1_700_000_000_000
CFG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def batch(n: int = 3, ts: int = T0, codec: int = COMPRESSION_NONE) -> bytearray:
    b = MemoryRecordsBuilder(2, codec, batch_size=1 << 24)
    for i in range(n):
        b.append(timestamp=ts + i, key=b"k%d" % i, value=b"value-%d-" % i * 20)
    b.close()
    return bytearray(b.buffer())


def offsets(log: Log) -> list[int]:
    out: list[int] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        records = MemoryRecords(bytes(log.read(offset, 1 << 20, None, True)))
        while records.has_next():
            out += [r.offset for r in records.next_batch()]
        offset = out[-1] + 1
    return out


def build_log(tmp_path: Path, n_batches: int, cfg: LogConfig = CFG) -> tuple[Path, list[int]]:
    """A log closed *without* a clean-shutdown step; returns its dir and batch positions
    in the last segment."""
    d = tmp_path / "t-0"
    log = Log(d, cfg, "t", 0)
    for i in range(n_batches):
        log.append(batch(2, T0 + i, [COMPRESSION_NONE, COMPRESSION_GZIP][i % 2]), T0)
    log.close()
    last = sorted(d.glob("*.log"))[-1]
    return d, [p for p, _h in iter_batches(last.read_bytes())]


def last_log_file(d: Path) -> Path:
    return sorted(d.glob("*.log"))[-1]


def reload(d: Path, cfg: LogConfig = CFG, recovery_point: int = 0) -> Log:
    return Log.load(d, cfg, "t", 0, clean_shutdown=False, recovery_point=recovery_point)


def test_valid_log_recovers_unchanged(tmp_path: Path) -> None:
    d, _ = build_log(tmp_path, 10)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    log = reload(d)
    assert log.log_end_offset == 20
    assert offsets(log) == list(range(20))
    after = {p.name: p.read_bytes() for p in d.iterdir()}
    assert after == before  # indexes rebuilt identically
    log.close()


@pytest.mark.parametrize("cut", [1, 11, 12, 30, 61, 62])
def test_torn_tail_is_truncated(tmp_path: Path, cut: int) -> None:
    d, positions = build_log(tmp_path, 6)
    f = last_log_file(d)
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - cut])
    log = reload(d)
    assert log.log_end_offset == 10
    assert offsets(log) == list(range(10))
    assert f.stat().st_size == positions[-1]
    log.append(batch(1), T0)
    assert offsets(log) == list(range(11))
    log.close()


def test_corrupt_crc_in_the_middle_of_last_segment(tmp_path: Path) -> None:
    d, positions = build_log(tmp_path, 8)
    f = last_log_file(d)
    data = bytearray(f.read_bytes())
    data[positions[3] + 70] ^= 0x55  # a payload byte of the 4th batch
    f.write_bytes(data)
    log = reload(d)
    assert log.log_end_offset == 6
    assert f.stat().st_size == positions[3]
    assert offsets(log) == list(range(6))
    log.close()


@pytest.mark.parametrize(
    "garbage",
    [b"\x00" * 100, b"\xff" * 7, b"garbage!" * 20, struct.pack(">qi", 99, 10) + b"\x00" * 50],
)
def test_garbage_after_valid_batches(tmp_path: Path, garbage: bytes) -> None:
    d, _ = build_log(tmp_path, 5)
    f = last_log_file(d)
    size = f.stat().st_size
    f.write_bytes(f.read_bytes() + garbage)
    log = reload(d)
    assert log.log_end_offset == 10
    assert f.stat().st_size == size
    log.close()


def test_offsets_going_backwards_are_corruption(tmp_path: Path) -> None:
    d, positions = build_log(tmp_path, 5)
    f = last_log_file(d)
    data = bytearray(f.read_bytes())
    struct.pack_into(">q", data, positions[2], 0)  # base offset not covered by the CRC
    f.write_bytes(data)
    log = reload(d)
    assert log.log_end_offset == 4
    log.close()


def test_corruption_deletes_later_segments(tmp_path: Path) -> None:
    d, _ = build_log(tmp_path, 60)
    files = sorted(d.glob("*.log"))
    assert len(files) >= 3
    first = files[0]
    data = bytearray(first.read_bytes())
    positions = [p for p, _h in iter_batches(bytes(data))]
    data[positions[2] + 65] ^= 1
    first.write_bytes(data)
    log = reload(d)
    assert log.num_segments == 1
    assert log.log_end_offset == 4
    assert sorted(d.glob("*.log")) == [first]
    log.close()


def test_segments_below_recovery_point_are_trusted(tmp_path: Path) -> None:
    d, _ = build_log(tmp_path, 60)
    files = sorted(d.glob("*.log"))
    first, last = files[0], files[-1]
    data = bytearray(first.read_bytes())
    data[100] ^= 1  # damage a flushed segment: recovery must not look at it
    first.write_bytes(data)
    last_base = int(last.name[:20])
    log = reload(d, recovery_point=last_base + 1)
    assert log.log_end_offset == 120
    assert first.stat().st_size == len(data)
    log.close()
    log = reload(d, recovery_point=0)  # from the start, the damage is found
    assert log.num_segments == 1 and log.log_end_offset < 120
    log.close()


@pytest.mark.parametrize("victim", [".index", ".timeindex"])
def test_missing_index_is_rebuilt_even_after_clean_shutdown(tmp_path: Path, victim: str) -> None:
    d, _ = build_log(tmp_path, 60)
    seg0 = d / f"{0:020d}{victim}"
    original = seg0.read_bytes()
    assert original
    seg0.unlink()
    log = Log.load(d, CFG, "t", 0, clean_shutdown=True)
    assert seg0.read_bytes() == original
    assert offsets(log) == list(range(120))
    log.close()


def test_broken_index_size_is_rebuilt(tmp_path: Path) -> None:
    d, _ = build_log(tmp_path, 60)
    idx = d / f"{0:020d}.index"
    original = idx.read_bytes()
    idx.write_bytes(original + b"\x01\x02\x03")
    log = Log.load(d, CFG, "t", 0, clean_shutdown=True)
    assert idx.read_bytes() == original
    log.close()


def test_clean_shutdown_skips_recovery(tmp_path: Path) -> None:
    d, positions = build_log(tmp_path, 6)
    f = last_log_file(d)
    data = bytearray(f.read_bytes())
    data[positions[2] + 70] ^= 0x55  # CRC now wrong, structure intact
    f.write_bytes(data)
    log = Log.load(d, CFG, "t", 0, clean_shutdown=True)
    assert log.log_end_offset == 12  # not re-validated: trusted, as Kafka does
    assert log.recovery_point == 12
    log.close()
    log = reload(d)
    assert log.log_end_offset == 4
    assert log.recovery_point == 0
    log.close()


def test_clean_load_with_torn_tail_still_recovers_tail(tmp_path: Path) -> None:
    d, positions = build_log(tmp_path, 4)
    f = last_log_file(d)
    f.write_bytes(f.read_bytes()[:-5])
    log = Log.load(d, CFG, "t", 0, clean_shutdown=True)
    assert log.log_end_offset == 6
    assert f.stat().st_size == positions[-1]
    log.append(batch(1), T0)
    assert offsets(log) == list(range(7))
    log.close()
