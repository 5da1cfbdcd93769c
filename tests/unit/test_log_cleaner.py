"""The log cleaner on crafted segments: keys, tombstones and their delete horizon, compressed
batches, producer batches, transactions, grouping, the offset map bound, checkpoints, and a
clean that loses the race against retention or a pause.

Batches are built by kafka-python as producers send them and read back with kafka-python's
reader (which checks the CRC), so the cleaned bytes are what a consumer would get. Cleans run
on the test's thread through ``LogCleaner.clean_once(now_ms)`` (no event loop: the swap runs
inline), with explicit times.
"""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
from collections.abc import Collection
from pathlib import Path

import kafka.codec as codecs
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker.log.checkpoint import read_offset_checkpoint
from broker.log.cleaner import (
    DELETE_HORIZON_MASK,
    CleanerConfig,
    LogCleaner,
    OffsetMap,
)
from broker.log.cleaner_manager import CLEANER_OFFSET_CHECKPOINT_FILE
from broker.log.config import LogConfig
from broker.log.log import Log
from broker.log.manager import LogManager
from broker.log.segment import LogSegment
from protocol.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    BatchHeader,
    iter_batches,
)

T0 = 1_700_000_000_000
DAY = 24 * 60 * 60 * 1000

Rec = tuple[bytes | None, bytes | None]

def cleaner_threads(besides: Collection[threading.Thread] = ()) -> list[threading.Thread]:
    """The log-cleaner threads alive, except ``besides`` (those of brokers other tests in this
    process started, e.g. an embedded cluster's crashed broker)."""
    return [t for t in threading.enumerate()
            if t.name.startswith("log-cleaner") and t.is_alive() and t not in besides]



def batch(recs: list[Rec], *, codec: int = COMPRESSION_NONE, pid: int = -1, epoch: int = -1,
          seq: int = -1, transactional: bool = False, ts: int = T0) -> bytearray:
    b = DefaultRecordBatchBuilder(2, codec, transactional, pid, epoch, seq, 1 << 20)
    for i, (k, v) in enumerate(recs):
        b.append(i, timestamp=ts + i, key=k, value=v, headers=[])
    return bytearray(b.build())


def kv(key: str, value: str | None) -> Rec:
    return key.encode(), None if value is None else value.encode()


def compact_config(**changes: object) -> LogConfig:
    base: dict[str, object] = dict(cleanup_policy="compact", segment_bytes=1024 * 1024,
                                   min_cleanable_dirty_ratio=0.01)
    base.update(changes)
    return LogConfig(**base)  # type: ignore[arg-type]


class Env:
    """A LogManager in a tmp dir with one compacted log and a cleaner without threads."""

    def __init__(self, tmp_path: Path, config: LogConfig | None = None,
                 cleaner_config: CleanerConfig | None = None) -> None:
        self.dir = tmp_path / "logs"
        self.config = config or compact_config()
        self.lm = LogManager([self.dir], self.config)
        self.lm.load()
        self.log = self.lm.create_log("t", 0, self.config)
        self.cleaner = LogCleaner(cleaner_config or CleanerConfig(), self.lm)

    def append(self, recs: list[Rec], roll: bool = False, **kw: object) -> None:
        self.log.append(batch(recs, **kw), T0)  # type: ignore[arg-type]
        if roll:
            self.log.roll(T0)

    def clean(self, now_ms: int = T0 + 1000) -> bool:
        return self.cleaner.clean_once(now_ms)

    def close(self) -> None:
        self.lm.shutdown()


@pytest.fixture
def env(tmp_path: Path) -> Env:
    e = Env(tmp_path)
    yield e  # type: ignore[misc]
    e.close()


def raw_batches(log: Log) -> list[bytes]:
    out: list[bytes] = []
    for seg in log.segments:
        data = seg.read_bytes(0, seg.size)
        for pos, h in iter_batches(data):
            out.append(bytes(data[pos : pos + h.size_in_bytes]))
    return out


def records(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record in offset order, each batch's CRC checked."""
    out = []
    for raw in raw_batches(log):
        b = DefaultRecordBatch(raw)
        assert b.validate_crc(), BatchHeader(raw)
        out += [(r.offset, r.key, r.value) for r in b]
    offsets = [o for o, _k, _v in out]
    assert offsets == sorted(set(offsets)), "offsets must strictly increase"
    return out


Recs = list[tuple[int, bytes | None, bytes | None]]


def latest(recs: Recs) -> dict[bytes | None, tuple[int, bytes | None]]:
    out: dict[bytes | None, tuple[int, bytes | None]] = {}
    for o, k, v in recs:
        out[k] = (o, v)
    return out


# -- keys ----------------------------------------------------------------------------------------
def test_keeps_the_latest_record_of_each_key_with_its_offset(env: Env) -> None:
    for r in range(12):
        env.append([kv(f"k{r % 3}", f"v{r}")], roll=r % 4 == 3)
    env.append([kv("k0", "active")])  # the active segment: never cleaned
    before = records(env.log)
    assert env.clean()
    after = records(env.log)
    assert after == [(9, b"k0", b"v9"), (10, b"k1", b"v10"), (11, b"k2", b"v11"),
                     (12, b"k0", b"active")]
    assert latest(after) == latest(before)
    assert env.log.log_end_offset == 13
    assert env.cleaner.stats.runs == 1
    assert env.cleaner.stats.records_removed == 9
    # appends and reads go on after the swap
    env.append([kv("k1", "after")])
    assert env.log.read(9, 1 << 20)
    assert records(env.log)[-1] == (13, b"k1", b"after")


def test_batches_whose_records_all_stay_are_copied_byte_for_byte(env: Env) -> None:
    env.append([kv("a", "1"), kv("b", "1")])
    env.append([kv("c", "1"), kv("a", "2")])
    env.append([kv("d", "1")], roll=True)
    env.append([kv("x", "1")])
    first, second, third = raw_batches(env.log)[:3]
    assert env.clean()
    out = raw_batches(env.log)
    assert out[1] == second and out[2] == third  # untouched: same bytes
    assert out[0] != first  # lost "a"@0: rebuilt
    rebuilt = BatchHeader(out[0])
    assert rebuilt.is_valid() and rebuilt.base_offset == 0 and rebuilt.last_offset_delta == 1
    assert rebuilt.record_count == 1
    assert [(r.offset, r.key) for r in DefaultRecordBatch(out[0])] == [(1, b"b")]


def test_records_without_a_key_are_dropped(env: Env) -> None:
    # written while the topic was not compacted, then cleanup.policy became compact
    env.log.update_config(compact_config(cleanup_policy="delete"))
    env.append([(None, b"nokey"), kv("a", "1")], roll=True)
    env.append([kv("z", "1")])
    env.log.update_config(env.config)
    assert env.clean()
    assert [(o, k) for o, k, _v in records(env.log)] == [(1, b"a"), (2, b"z")]


def test_never_cleans_the_active_segment_nor_past_the_high_watermark(env: Env) -> None:
    for r in range(4):
        env.append([kv("k", f"v{r}")], roll=True)
    env.append([kv("k", "active")])
    env.log.on_high_watermark_updated(2)  # offsets 2.. not yet replicated/durable
    assert env.clean()
    assert [o for o, _k, _v in records(env.log)] == [1, 2, 3, 4]
    # offset 1 stays: the batch ending the cleanable section keeps its offsets
    env.log.on_high_watermark_updated(env.log.log_end_offset)
    assert env.clean()
    assert [o for o, _k, _v in records(env.log)] == [3, 4]


# -- tombstones and the delete horizon ------------------------------------------------------------
def test_tombstone_kept_with_a_delete_horizon_then_removed_after_it(tmp_path: Path) -> None:
    e = Env(tmp_path, compact_config(delete_retention_ms=DAY))
    try:
        e.append([kv("a", "1"), kv("b", "1")], roll=True)
        e.append([kv("a", None)], roll=True)
        e.append([kv("z", "1")])
        now = T0 + 5000
        assert e.clean(now)
        assert records(e.log) == [(1, b"b", b"1"), (2, b"a", None), (3, b"z", b"1")]
        stamped = [BatchHeader(r) for r in raw_batches(e.log) if BatchHeader(r).base_offset == 2]
        h = stamped[0]
        assert h.attributes & DELETE_HORIZON_MASK
        assert h.base_timestamp == now + DAY
        # record timestamps are unchanged by the new base timestamp
        ts = [r.timestamp for r in DefaultRecordBatch(raw_batches(e.log)[1])]
        assert ts == [T0]
        # before the horizon, a clean (with new dirty data) keeps it
        e.log.roll(T0)
        e.append([kv("y", "1")])
        assert e.clean(now + DAY - 1)
        assert (2, b"a", None) in records(e.log)
        # at the horizon it goes
        e.log.roll(T0)
        e.append([kv("x", "1")])
        assert e.clean(now + DAY)
        assert (2, b"a", None) not in records(e.log)
        assert [k for _o, k, _v in records(e.log)] == [b"b", b"z", b"y", b"x"]
    finally:
        e.close()


def test_a_tombstone_removes_the_older_values_of_its_key(env: Env) -> None:
    env.append([kv("a", "1")])
    env.append([kv("a", "2")])
    env.append([kv("a", None)], roll=True)
    env.append([kv("b", "1")])
    assert env.clean()
    assert records(env.log) == [(2, b"a", None), (3, b"b", b"1")]


# -- compression -----------------------------------------------------------------------------
CODECS = [
    pytest.param(COMPRESSION_GZIP, id="gzip"),
    pytest.param(COMPRESSION_SNAPPY, id="snappy",
                 marks=pytest.mark.skipif(not codecs.has_snappy(), reason="no snappy")),
    pytest.param(COMPRESSION_LZ4, id="lz4",
                 marks=pytest.mark.skipif(not codecs.has_lz4(), reason="no lz4")),
    pytest.param(COMPRESSION_ZSTD, id="zstd",
                 marks=pytest.mark.skipif(not codecs.has_zstd(), reason="no zstd")),
]


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_batches_are_filtered_and_recompressed_with_their_codec(
    env: Env, codec: int
) -> None:
    env.append([kv(f"k{i}", "old" * 20) for i in range(10)], codec=codec)
    env.append([kv(f"k{i}", "new" * 20) for i in range(0, 10, 2)], codec=codec)
    env.append([kv("u", "1")], codec=codec, roll=True)
    env.append([kv("active", "1")])
    untouched = raw_batches(env.log)[1]
    assert env.clean()
    out = raw_batches(env.log)
    first = BatchHeader(out[0])
    assert first.compression_type == codec and first.is_valid()
    assert first.base_offset == 0 and first.last_offset_delta == 9 and first.record_count == 5
    assert [(r.offset, r.key) for r in DefaultRecordBatch(out[0])] == [
        (i, f"k{i}".encode()) for i in range(1, 10, 2)]
    assert out[1] == untouched
    assert {k: v for _o, k, v in records(env.log)}[b"k3"] == b"old" * 20


# -- producers ----------------------------------------------------------------------------------
def test_an_active_producers_last_batch_is_kept_empty_with_its_sequence(tmp_path: Path) -> None:
    e = Env(tmp_path)
    try:
        e.append([kv("a", "1"), kv("b", "1")], pid=7, epoch=0, seq=0)
        e.append([kv("a", "2"), kv("b", "2")], roll=True)  # supersedes the producer's batch
        e.append([kv("z", "1")])
        assert e.clean()
        kept = [BatchHeader(r) for r in raw_batches(e.log)]
        empty = kept[0]
        assert (empty.base_offset, empty.last_offset_delta, empty.record_count) == (0, 1, 0)
        assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (7, 0, 0)
        assert empty.is_valid()
        assert [o for o, _k, _v in records(e.log)] == [2, 3, 4]
        # the producer state survives a reload that rebuilds it from the cleaned log
        e.lm.shutdown()
        for snap in (e.dir / "t-0").glob("*.snapshot"):
            snap.unlink()
        log = Log.load(e.dir / "t-0", e.config, "t", 0, clean_shutdown=False)
        entry = log.producer_state.last_entry(7)
        assert entry is not None and entry.last_seq == 1
        log.close()
        e.lm = LogManager([e.dir], e.config)
        e.lm.load()
    finally:
        e.close()


def test_a_producer_no_longer_known_loses_its_superseded_batches(env: Env) -> None:
    env.append([kv("a", "1")], pid=7, epoch=0, seq=0)
    env.append([kv("a", "2")], pid=7, epoch=0, seq=1)
    env.append([kv("a", "3")], roll=True)
    env.append([kv("z", "1")])
    assert env.clean()
    heads = [BatchHeader(r) for r in raw_batches(env.log)]
    # offset 0 goes; offset 1 is the producer's last batch: kept, empty
    assert [(h.base_offset, h.record_count) for h in heads] == [(1, 0), (2, 1), (3, 1)]


# -- transactions -------------------------------------------------------------------------------
def test_aborted_data_goes_and_its_marker_follows_after_the_horizon(tmp_path: Path) -> None:
    e = Env(tmp_path, compact_config(delete_retention_ms=DAY))
    try:
        e.append([kv("a", "committed")], pid=1, epoch=0, seq=0, transactional=True)
        e.append([kv("b", "aborted")], pid=2, epoch=0, seq=0, transactional=True)
        e.log.append_end_txn_marker(1, 0, 0, True, T0)  # offset 2
        e.log.append_end_txn_marker(2, 0, 0, False, T0)  # offset 3
        e.append([kv("c", "1")], pid=3, epoch=0, seq=0, roll=True)
        e.append([kv("z", "1")], roll=True)
        e.append([kv("y", "1")])
        e.log.on_high_watermark_updated(e.log.log_end_offset)  # the markers are replicated
        assert e.log.collect_aborted_transactions(0, 10)
        now = T0 + 1000
        assert e.clean(now)
        keys = [k for _o, k, _v in records(e.log)]
        assert b"b" not in keys and b"a" in keys
        heads = {BatchHeader(r).base_offset: BatchHeader(r) for r in raw_batches(e.log)}
        # producer 2 is still active: its aborted batch stays, empty; its marker, the last
        # record of the producer, stays too (RETAIN_EMPTY keeps it as is)
        assert heads[1].record_count == 0
        assert heads[3].is_control
        # the commit marker stays while its transaction has data
        assert heads[2].is_control and heads[2].record_count == 1
        # no aborted data remains: the cleaned segment's transaction index keeps the abort
        assert [t.producer_id for t in e.log.collect_aborted_transactions(0, 10)] == [2]
    finally:
        e.close()


def test_markers_of_transactions_without_data_get_a_horizon_then_go(tmp_path: Path) -> None:
    e = Env(tmp_path, compact_config(delete_retention_ms=DAY))

    def dirty_again() -> None:
        e.log.roll(T0)
        e.append([kv("w", "1")])
        e.log.on_high_watermark_updated(e.log.log_end_offset)

    def heads() -> dict[int, BatchHeader]:
        return {BatchHeader(r).base_offset: BatchHeader(r) for r in raw_batches(e.log)}

    try:
        # producer 5's aborted transaction, then producer 5 moves on (a new epoch and batch)
        e.append([kv("b", "aborted")], pid=5, epoch=0, seq=0, transactional=True)
        e.log.append_end_txn_marker(5, 0, 0, False, T0)  # offset 1
        e.append([kv("c", "1")], pid=5, epoch=1, seq=0, roll=True)  # offset 2
        e.append([kv("z", "1")], roll=True)
        e.append([kv("active", "1")])
        e.log.on_high_watermark_updated(e.log.log_end_offset)
        now = T0 + 1000
        assert e.clean(now)
        # the aborted data goes (not the producer's last batch any more); its marker stays
        # this time, as the clean that removed the data saw it, with its index entry
        assert 0 not in heads()
        assert not heads()[1].attributes & DELETE_HORIZON_MASK
        assert [t.producer_id for t in e.log.collect_aborted_transactions(0, 100)] == [5]
        dirty_again()
        assert e.clean(now)
        # now the transaction has no data: the marker gets its delete horizon, no index entry
        marker = heads()[1]
        assert marker.is_control and marker.attributes & DELETE_HORIZON_MASK
        assert marker.base_timestamp == now + DAY and marker.is_valid()
        assert e.log.collect_aborted_transactions(0, 100) == []
        dirty_again()
        assert e.clean(now + DAY - 1)
        assert 1 in heads()
        dirty_again()
        assert e.clean(now + DAY)
        assert 1 not in heads()
        assert [k for _o, k, _v in records(e.log)][:3] == [b"c", b"z", b"active"]
    finally:
        e.close()


def test_an_open_transaction_bounds_the_cleanable_section(env: Env) -> None:
    env.append([kv("a", "1")], roll=True)
    env.append([kv("a", "2")], pid=9, epoch=0, seq=0, transactional=True, roll=True)
    env.append([kv("a", "3")], roll=True)
    env.append([kv("z", "1")])
    assert env.log.last_stable_offset == 1
    assert env.clean()
    assert [o for o, _k, _v in records(env.log)] == [0, 1, 2, 3]  # 0 ends the section: kept
    env.log.append_end_txn_marker(9, 0, 0, False, T0)
    env.log.roll(T0)
    env.append([kv("q", "1")])
    assert env.log.last_stable_offset == 1  # decided, but the marker is not replicated yet
    env.log.on_high_watermark_updated(env.log.log_end_offset)
    assert env.clean()
    assert [(o, v) for o, k, v in records(env.log) if k == b"a"] == [(2, b"3")]


# -- grouping, map bound, checkpoints ----------------------------------------------------------
def test_small_segments_are_merged_into_one_cleaned_segment(tmp_path: Path) -> None:
    e = Env(tmp_path, compact_config(segment_bytes=400))
    try:
        for r in range(12):
            e.append([kv(f"k{r}", "v")], roll=True)  # distinct keys: nothing removed
        e.append([kv("active", "v")])
        assert e.log.num_segments == 13
        before = records(e.log)
        assert e.clean()
        assert records(e.log) == before
        assert e.log.num_segments < 13
        assert all(s.size <= 400 for s in e.log.segments)
        # reads by offset work through the merged segments' rebuilt indexes
        for o, k, _v in before:
            data = e.log.read(o, 1 << 20)
            assert BatchHeader(data).base_offset <= o
            first = bytes(data[: BatchHeader(data).size_in_bytes])
            assert k in [r.key for r in DefaultRecordBatch(first)]
    finally:
        e.close()


def test_a_full_offset_map_cleans_in_several_passes(tmp_path: Path) -> None:
    # 8 slots, load factor 0.5: 4 keys per pass
    e = Env(tmp_path, cleaner_config=CleanerConfig(dedupe_buffer_size=OffsetMap.ENTRY_BYTES * 8,
                                                   load_factor=0.5))
    try:
        for r in range(3):
            for i in range(8):
                e.append([kv(f"k{i}", f"v{r}")])
            e.log.roll(T0)
        e.append([kv("active", "1")])
        passes = 0
        while e.clean():
            passes += 1
            assert passes < 20
        assert passes >= 2
        after = records(e.log)
        assert [(k, v) for _o, k, v in after] == [(f"k{i}".encode(), b"v2") for i in range(8)] + [
            (b"active", b"1")]
    finally:
        e.close()


def test_offset_map_counts_slots_of_its_entry_cost(tmp_path: Path) -> None:
    m = OffsetMap(OffsetMap.ENTRY_BYTES * 100, 0.9)
    assert m.slots == 100 and m.max_entries == 90
    assert m.put(b"short", 1) and m.get(b"short") == 1
    long_key = b"x" * 100
    assert m.put(long_key, 2) and m.get(long_key) == 2 and m.get(b"y" * 100) == -1
    with pytest.raises(ValueError):
        OffsetMap(OffsetMap.ENTRY_BYTES, 0.5)


@pytest.mark.parametrize("key_len", [4, 15, 16, 200])
def test_a_full_offset_map_stays_within_its_memory(key_len: int) -> None:
    """log.cleaner.dedupe.buffer.size bounds the real memory: a map filled to the brim with
    fresh key objects (as a clean decodes them) costs no more than its buffer."""
    budget = 1 << 20
    tracemalloc.start()
    try:
        m = OffsetMap(budget, 1.0)
        before = tracemalloc.get_traced_memory()[0]
        i = 0
        while m.put(b"%0*d" % (key_len, i), 1 << 40 | i):
            i += 1
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert i == m.max_entries
    assert used <= budget, f"{used} bytes for a {budget}-byte buffer"


def test_checkpoint_records_the_next_dirty_offset_in_kafkas_format(env: Env) -> None:
    for r in range(6):
        env.append([kv("k", f"v{r}")], roll=r % 2 == 1)
    env.append([kv("k", "active")])
    assert env.clean()
    path = env.dir / CLEANER_OFFSET_CHECKPOINT_FILE
    assert path.read_text() == "0\n1\nt 0 6\n"
    assert read_offset_checkpoint(path) == {("t", 0): 6}
    assert not env.clean()  # nothing dirty below the active segment
    # a new cleaner (a restart) starts from the checkpoint
    again = LogCleaner(CleanerConfig(), env.lm)
    assert again.manager.checkpoint_of(("t", 0)) == 6
    assert again.dirty_ratios() == {("t", 0): 0.0}


def test_delete_log_drops_its_checkpoint(env: Env) -> None:
    env.lm.cleaner = env.cleaner
    for r in range(4):
        env.append([kv("k", f"v{r}")], roll=True)
    env.append([kv("k", "x")])
    assert env.clean()
    env.lm.delete_log(("t", 0))
    env.cleaner.manager.write_checkpoints()
    assert read_offset_checkpoint(env.dir / CLEANER_OFFSET_CHECKPOINT_FILE) == {}
    env.lm.cleaner = None
    env.log = env.lm.create_log("t", 0, env.config)


# -- races with the event loop ------------------------------------------------------------------
class _RacingCleaner(LogCleaner):
    """Runs ``before_swap`` on the loop's behalf just before the first swap, as if the loop
    had done it while the thread was cleaning."""

    def __init__(self, *args: object, before_swap: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.before_swap = before_swap
        self.calls = 0

    def _on_loop(self, fn, stop=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == 2:
            self.before_swap()  # type: ignore[operator]
        return fn()


def _dirty_log(e: Env) -> None:
    for r in range(6):
        e.append([kv("k", f"v{r}")], roll=r % 2 == 1)
    e.append([kv("k", "active")])


def test_a_swap_after_retention_took_the_segments_changes_nothing(tmp_path: Path) -> None:
    e = Env(tmp_path, compact_config(cleanup_policy="compact,delete", retention_ms=1))
    try:
        _dirty_log(e)
        log = e.log
        c = _RacingCleaner(CleanerConfig(), e.lm,
                           before_swap=lambda: log.delete_old_segments(T0 + 10**9))
        assert c.clean_once(T0 + 1000)
        assert c.stats.runs == 0  # dropped
        assert not list((e.dir / "t-0").glob("*.cleaned"))
        assert not list((e.dir / "t-0").glob("*.swap"))
        assert records(log) == []  # retention took everything, nothing came back
        assert log.log_start_offset == 7
        assert c.manager.checkpoint_of(("t", 0)) is None
    finally:
        e.close()


def test_a_pause_during_the_clean_drops_it(env: Env) -> None:
    _dirty_log(env)
    before = records(env.log)
    c = _RacingCleaner(CleanerConfig(), env.lm,
                       before_swap=lambda: c.abort_and_pause(("t", 0)))
    assert c.clean_once(T0 + 1000)
    assert records(env.log) == before
    assert not list((env.dir / "t-0").glob("*.cleaned"))
    assert not c.clean_once(T0 + 1000)  # paused: not picked
    c.resume(("t", 0))
    assert c.clean_once(T0 + 1000)
    assert len(records(env.log)) < len(before)


def test_a_corrupt_batch_marks_the_partition_uncleanable(env: Env) -> None:
    _dirty_log(env)
    seg = env.log.segments[0]
    # a record count that does not match the records: the parser refuses it
    data = bytearray(seg.read_bytes(0, seg.size))
    data[57:61] = (5).to_bytes(4, "big")
    with seg.log_path.open("r+b") as f:  # an inactive segment holds no descriptor
        f.write(bytes(data))
    assert env.clean()
    assert ("t", 0) in env.cleaner.stats.uncleanable_partitions
    assert not env.clean()  # skipped from now on


# -- selection ------------------------------------------------------------------------------------
def test_dirtiest_log_first_and_ratio_threshold(tmp_path: Path) -> None:
    cfg = compact_config(min_cleanable_dirty_ratio=0.5)
    lm = LogManager([tmp_path / "logs"], cfg)
    lm.load()
    try:
        a = lm.create_log("a", 0, cfg)
        b = lm.create_log("b", 0, cfg)
        for r in range(4):
            a.append(batch([kv("k", f"v{r}")]), T0)
            b.append(batch([kv("k", f"v{r}")]), T0)
            b.roll(T0)
        a.roll(T0)
        a.append(batch([kv("k", "x")]), T0)
        b.append(batch([kv("k", "x")]), T0)
        c = LogCleaner(CleanerConfig(), lm)
        ratios = c.dirty_ratios()
        assert ratios[("a", 0)] == 1.0 and ratios[("b", 0)] == 1.0
        ltc = c.manager.grab_filthiest(T0)
        assert ltc is not None
        c.manager.done_cleaning(ltc.tp, None)
        assert c.clean_once(T0) and c.clean_once(T0)
        assert not c.clean_once(T0)  # both clean now: ratio 0 < 0.5
    finally:
        lm.shutdown()


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path: Path) -> None:
    e = Env(tmp_path, compact_config(min_compaction_lag_ms=60_000))
    try:
        e.append([kv("k", "old")], ts=T0, roll=True)
        e.append([kv("k", "young")], ts=T0 + 100_000, roll=True)
        e.append([kv("k", "active")], ts=T0 + 100_000)
        # at T0 + 120 s only the first segment is older than the lag
        assert e.clean(T0 + 120_000)
        assert [v for _o, _k, v in records(e.log)] == [b"old", b"young", b"active"]
        assert e.clean(T0 + 200_000)
        assert [v for _o, _k, v in records(e.log)] == [b"young", b"active"]
    finally:
        e.close()


def test_max_compaction_lag_forces_a_clean_below_the_ratio(tmp_path: Path) -> None:
    e = Env(tmp_path, compact_config(min_cleanable_dirty_ratio=0.99,
                                     max_compaction_lag_ms=60_000))
    try:
        for r in range(3):
            e.append([kv(f"u{r}", "v")], ts=T0)
        e.log.roll(T0)
        e.append([kv("k", "v")], ts=T0, roll=True)
        e.append([kv("k", "w")], ts=T0)
        # the first clean cleans everything once; then a dirty segment is added
        assert e.clean(T0)
        e.log.roll(T0)
        e.append([kv("k", "z")], ts=T0)
        ratio = e.cleaner.dirty_ratios()[("t", 0)]
        assert 0 < ratio < 0.99
        assert not e.clean(T0 + 1000)  # not due yet
        assert [v for _o, k, v in records(e.log) if k == b"k"] == [b"v", b"w", b"z"]
        assert e.clean(T0 + 61_000)  # due: cleaned whatever the ratio
        assert [v for _o, k, v in records(e.log) if k == b"k"] == [b"w", b"z"]
    finally:
        e.close()


# -- threads ------------------------------------------------------------------------------------
async def test_threads_clean_and_swap_on_the_event_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compact_config()
    lm = LogManager([tmp_path / "logs"], cfg)
    lm.load()
    log = lm.create_log("t", 0, cfg)
    for r in range(8):
        log.append(batch([kv(f"k{r % 2}", f"v{r}")]), T0)
        if r % 2:
            log.roll(T0)
    log.append(batch([kv("k0", "active")]), T0)
    swap_threads: list[str] = []
    original = Log.replace_segments

    def spy(self: Log, cleaned: LogSegment, old: list[LogSegment],
            now_ms: int | None = None) -> bool:
        swap_threads.append(threading.current_thread().name)
        return original(self, cleaned, old, now_ms)

    monkeypatch.setattr(Log, "replace_segments", spy)  # Log is slotted: patched on the class
    others = set(cleaner_threads())
    cleaner = lm.start_cleaner(CleanerConfig(threads=2, backoff_ms=10),
                               asyncio.get_running_loop())
    try:
        for _ in range(200):
            if cleaner.stats.runs:
                break
            await asyncio.sleep(0.01)
        assert cleaner.stats.runs == 1
        assert swap_threads and all(n == threading.main_thread().name for n in swap_threads)
        assert [(o, v) for o, _k, v in records(log)] == [(6, b"v6"), (7, b"v7"), (8, b"active")]
    finally:
        lm.shutdown()
    assert cleaner_threads(others) == []


def test_a_disk_error_during_the_swap_takes_the_dir_offline_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from broker.log import disk

    e = Env(tmp_path)
    _dirty_log(e)
    latest_before = latest(records(e.log))
    real_fsync_dir = disk.fsync_dir
    calls = 0

    def failing(path: Path) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # the old segments were just renamed .deleted
            raise OSError(errno.EIO, "injected")
        real_fsync_dir(path)

    monkeypatch.setattr(disk, "fsync_dir", failing)
    assert e.clean()
    monkeypatch.setattr(disk, "fsync_dir", real_fsync_dir)
    assert e.log.offline and e.cleaner.stats.runs == 0
    assert ("t", 0) not in e.cleaner.stats.uncleanable_partitions
    e.close()
    log = Log.load(e.dir / "t-0", e.config, "t", 0, clean_shutdown=False)
    try:
        got = records(log)
        assert latest(got) == latest_before
        assert [o for o, _k, _v in got] == [5, 6]  # the swap was completed at load
        assert not [p for p in (e.dir / "t-0").iterdir()
                    if p.name.endswith((".cleaned", ".swap", ".deleted"))]
    finally:
        log.close()


def test_cleaner_config_from_the_broker_keys(tmp_path: Path) -> None:
    from broker.config import BrokerConfig

    cfg = CleanerConfig.of(BrokerConfig.from_dict({
        "log.dirs": str(tmp_path), "log.cleaner.threads": "3",
        "log.cleaner.dedupe.buffer.size": "3000000", "log.cleaner.backoff.ms": "50",
        "log.cleaner.io.max.bytes.per.second": "1000.5", "log.cleaner.enable": "false"}))
    assert (cfg.threads, cfg.dedupe_buffer_size, cfg.backoff_ms, cfg.enable) == (
        3, 3_000_000, 50, False)
    assert cfg.max_io_bytes_per_second == 1000.5 and cfg.load_factor == 0.9
    assert cfg.io_buffer_size == 512 * 1024
    assert cfg.map_memory_per_thread() == 1_000_000


async def test_a_disabled_cleaner_starts_no_thread(tmp_path: Path) -> None:
    lm = LogManager([tmp_path / "logs"], compact_config())
    lm.load()
    try:
        before = {t.name for t in threading.enumerate()}
        others = set(cleaner_threads())
        cleaner = lm.start_cleaner(CleanerConfig(enable=False), asyncio.get_running_loop())
        assert lm.cleaner is cleaner
        assert {t.name for t in threading.enumerate()} == before
        cleaner.reconfigure(CleanerConfig(enable=True, threads=2, backoff_ms=10))
        assert len(cleaner_threads(others)) == 2
        cleaner.reconfigure(CleanerConfig(enable=True, threads=1, backoff_ms=10))
        for _ in range(100):
            if len(cleaner_threads(others)) == 1:
                break
            await asyncio.sleep(0.02)
        assert len(cleaner_threads(others)) == 1
    finally:
        lm.shutdown()
    assert cleaner_threads(others) == []


# -- swapped-out segments: file.delete.delay.ms --------------------------------------------------
def _deleted(log: Log) -> list[str]:
    return sorted(p.name for p in log.dir.iterdir() if p.name.endswith(".deleted"))


def _two_dirty_segments(tmp_path: Path, delete_delay_ms: int) -> Env:
    """Two inactive segments of two keys, then the active one."""
    e = Env(tmp_path, compact_config(file_delete_delay_ms=delete_delay_ms))
    for r in range(8):
        e.append([kv(f"k{r % 2}", f"v{r}")], roll=r % 4 == 3)
    e.append([kv("k0", "active")])
    return e


def test_swapped_out_segments_wait_file_delete_delay_and_stay_readable(tmp_path: Path) -> None:
    e = _two_dirty_segments(tmp_path, 5000)
    try:
        held = e.log.segments[0]  # a reader holding the old segment across the swap
        before = held.read(0, 1 << 20)
        assert before
        scheduled: list[int] = []
        e.log.on_segments_deleted = scheduled.append
        assert e.clean()
        assert held not in e.log.segments and held.log_path.name.endswith(".log.deleted")
        assert e.log.pending_deletes == 2 and len(_deleted(e.log)) >= 4  # .log and indexes
        assert scheduled and e.log.delete_due_segments(scheduled[0] + 4999) == 0
        assert held.read(0, 1 << 20) == before  # the old bytes, renamed but not gone
        assert e.log.delete_due_segments(scheduled[0] + 5000) == 2
        assert _deleted(e.log) == [] and e.log.pending_deletes == 0
        assert [v for _o, _k, v in records(e.log)] == [b"v6", b"v7", b"active"]
    finally:
        e.close()


def test_without_a_delay_swapped_out_segments_go_at_once(tmp_path: Path) -> None:
    e = _two_dirty_segments(tmp_path, 0)
    try:
        assert e.clean()
        assert e.log.pending_deletes == 0 and _deleted(e.log) == []
        names = sorted(p.name for p in e.log.dir.glob("*.log"))
        assert len(names) == e.log.num_segments
    finally:
        e.close()
