"""The log cleaner: compaction of logs whose ``cleanup.policy`` has ``compact`` (Kafka's
LogCleaner, Cleaner, SkimpyOffsetMap and MemoryRecords.filterTo).

One clean of a log, on a cleaner thread:

1. On the event loop: pick the dirtiest log (``CleanerManager.grab_filthiest``) and take a
   snapshot of what the thread reads: its inactive segments below the first uncleanable
   offset, each with a dup'd ``.log`` fd (so a segment deleted or closed by the loop meanwhile
   stays readable), every transaction index entry and the last batch of each active producer.
2. Build the offset map of the dirty section ``[first dirty, first uncleanable)``: key ->
   offset of its latest record, skipping aborted transactional batches and control batches.
   A full map ends the section early; the rest is cleaned by later passes.
3. Recopy the log from its start to the end of the mapped section, in groups of segments that
   fit one segment (``segment.bytes``, Kafka's index size bound, and int32 relative offsets).
   Each group goes to a new segment written under ``.cleaned`` names, then fsynced. A batch
   whose records are all kept is copied byte for byte; others are rebuilt: same base offset,
   last offset delta, producer fields and codec (recompressed at its default level), fresh
   CRC. Records that are kept: those past the mapped section, and the latest of each key,
   tombstones only until their delete horizon. Batches follow Kafka's retention rules
   (RETAIN_EMPTY for an active producer's last batch and for the batch ending the cleanable
   section, DELETE for aborted data and expired markers, DELETE_EMPTY otherwise).
4. On the event loop: ``Log.replace_segments`` swaps the group in, crash-safely, unless the
   replaced segments are no longer the log's; the old ones, renamed ``.deleted``, are removed
   after file.delete.delay.ms, as retention's are.

Delete horizon (KIP-534): the first clean that keeps a tombstone, or an end-transaction marker
whose transaction has no data left, rebuilds its batch with attribute bit 0x40 and base
timestamp ``now + delete.retention.ms`` (record timestamps unchanged); a later clean after that
time removes the tombstones and the marker.

Only what needs it is decoded: a batch is walked record by record only if it is not aborted
data, not a control batch, and may lose a record or carry a tombstone; aborted batches and
expired markers are dropped from their headers, and everything is copied as stored bytes
unless a record goes.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, TypeVar

import kafka.codec as codecs
import structlog
from crc32c import crc32c

from broker.log import disk
from broker.log.cleaner_manager import CleanerManager, LogToClean
from broker.log.dir_failure import KafkaStorageError
from broker.log.log import CLEANED_FILE_SUFFIX
from broker.log.segment import LogSegment
from broker.log.txn_index import AbortedTxn
from broker.log.validator import compress
from protocol.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CRC_OFFSET,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    CorruptRecordError,
    InvalidRecordError,
    iter_batches,
    read_end_txn_marker,
    read_varint,
    write_varint,
)
from purgatory.clock import system_wall_ms

if TYPE_CHECKING:
    import asyncio

    from broker.config import BrokerConfig
    from broker.log.log import Log
    from broker.log.manager import LogManager

__all__ = [
    "CleanerConfig",
    "CleanerStats",
    "LogCleaner",
    "OffsetMap",
]

logger = structlog.get_logger("broker.log.cleaner")

TopicPartition = tuple[str, int]
T = TypeVar("T")

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20
#: KIP-534: the batch's base timestamp is its delete horizon.
DELETE_HORIZON_MASK = 0x40
#: Kafka's default segment.index.bytes: a cleaned group's indexes must fit it.
MAX_INDEX_SIZE = 10 * 1024 * 1024
_INT32_MAX = 2**31 - 1
_BACKOFF_POLL_S = 0.2


# -- configuration and stats -------------------------------------------------------------------
@dataclass(slots=True)
class CleanerConfig:
    """The ``log.cleaner.*`` broker keys (Kafka's CleanerConfig)."""

    threads: int = 1
    dedupe_buffer_size: int = 128 * 1024 * 1024
    io_buffer_size: int = 512 * 1024
    load_factor: float = 0.9
    max_io_bytes_per_second: float = float("inf")
    backoff_ms: int = 15_000
    enable: bool = True

    @classmethod
    def of(cls, config: BrokerConfig) -> CleanerConfig:
        return cls(
            threads=int(config["log.cleaner.threads"]),
            dedupe_buffer_size=int(config["log.cleaner.dedupe.buffer.size"]),
            io_buffer_size=int(config["log.cleaner.io.buffer.size"]),
            load_factor=float(config["log.cleaner.io.buffer.load.factor"]),
            max_io_bytes_per_second=float(config["log.cleaner.io.max.bytes.per.second"]),
            backoff_ms=int(config["log.cleaner.backoff.ms"]),
            enable=bool(config["log.cleaner.enable"]),
        )

    def map_memory_per_thread(self) -> int:
        return min(self.dedupe_buffer_size // max(self.threads, 1), _INT32_MAX)


@dataclass
class CleanerStats:
    """Cumulative figures since start, read by the metrics at scrape time (plain numbers)."""

    runs: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_removed: int = 0
    clean_seconds_total: float = 0.0
    last_clean_seconds: float = 0.0
    max_clean_seconds: float = 0.0
    uncleanable_partitions: set[TopicPartition] = field(default_factory=set)


@dataclass(slots=True)
class _RunStats:
    """One clean's figures (Kafka's CleanerStats)."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    map_bytes_read: int = 0
    map_records_read: int = 0
    invalid_records: int = 0
    map_utilization: float = 0.0


# -- the offset map --------------------------------------------------------------------------
def _md5(key: bytes) -> bytes:
    """A long key's MD5. hashlib (OpenSSL's digests, about 0.6 MB) is imported at the first
    long key a clean meets, not at start; then this name is the digest function itself."""
    global _md5
    import hashlib

    def md5(key: bytes) -> bytes:
        return hashlib.md5(key, usedforsecurity=False).digest()

    _md5 = md5
    return md5(key)


class OffsetMap:
    """Key -> offset of its latest record in the dirty section (Kafka's SkimpyOffsetMap).

    ``log.cleaner.dedupe.buffer.size`` bounds what the map really costs here. Kafka's entry
    is 24 bytes in one flat buffer (a 16-byte MD5 and an 8-byte offset); a CPython dict entry
    with its key bytes and offset int costs about 136 bytes (measured with tracemalloc: 85 for
    an entry whose key object is shared, plus the key's own bytes object, at most 16 bytes of
    key). So ``slots = memory // 136`` and at most ``slots * load_factor`` entries: a buffer
    maps about a sixth of the keys Kafka's would, and a log with more keys than that is
    cleaned in several passes. Keys shorter than 16 bytes are stored as they are, longer ones
    as their MD5 (lengths differ, so the two never collide); like Kafka, two long keys with
    the same MD5 would count as one.
    """

    ENTRY_BYTES = 136

    def __init__(self, memory: int, load_factor: float) -> None:
        self.slots = max(memory // self.ENTRY_BYTES, 0)
        self.max_entries = int(self.slots * load_factor)
        if self.max_entries < 1:
            raise ValueError(
                "the offset map is too small to hold a single key: raise "
                "log.cleaner.dedupe.buffer.size or lower log.cleaner.threads")
        self._map: dict[bytes, int] = {}
        self.latest_offset = -1

    @staticmethod
    def _digest(key: bytes) -> bytes:
        return key if len(key) < 16 else _md5(key)

    def put(self, key: bytes, offset: int) -> bool:
        """Map ``key`` to ``offset``; False (nothing stored) when full and ``key`` is new."""
        d = self._digest(key)
        m = self._map
        if len(m) >= self.max_entries and d not in m:
            return False
        m[d] = offset
        return True

    def get(self, key: bytes) -> int:
        """The mapped offset, -1 when the key is not mapped."""
        return self._map.get(self._digest(key), -1)

    def update_latest_offset(self, offset: int) -> None:
        if offset > self.latest_offset:
            self.latest_offset = offset

    def clear(self) -> None:
        self._map.clear()
        self.latest_offset = -1

    def __len__(self) -> int:
        return len(self._map)

    @property
    def utilization(self) -> float:
        return len(self._map) / self.slots if self.slots else 0.0


class _Throttler:
    """Caps the cleaner threads' combined I/O rate (Kafka's Throttler, shared by the threads)."""

    _CHECK_S = 0.1

    def __init__(self, max_bytes_per_second: float, stop: threading.Event) -> None:
        self.rate = max_bytes_per_second
        self._stop = stop
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._bytes = 0

    def maybe_throttle(self, n: int) -> None:
        if self.rate == float("inf") or self.rate <= 0:
            return
        with self._lock:
            self._bytes += n
            now = time.monotonic()
            elapsed = now - self._start
            if elapsed < self._CHECK_S:
                return
            sleep = self._bytes / self.rate - elapsed
            self._start = now
            self._bytes = 0
        if sleep > 0:
            self._stop.wait(sleep)


# -- records ------------------------------------------------------------------------------------
class _Aborted(Exception):
    """The clean must be dropped: its partition was paused or the cleaner is stopping."""


def _decompress(codec: int, data: bytes | memoryview) -> bytes:
    if codec == COMPRESSION_NONE:
        return bytes(data)
    if codec == COMPRESSION_GZIP:
        return codecs.gzip_decode(bytes(data))
    if codec == COMPRESSION_SNAPPY:
        return codecs.snappy_decode(bytes(data))
    if codec == COMPRESSION_LZ4:
        return codecs.lz4_decode(bytes(data))
    if codec == COMPRESSION_ZSTD:
        return codecs.zstd_decode(bytes(data))
    raise CorruptRecordError(f"unknown compression codec {codec}")


# (start, end, timestamp delta end, timestamp delta, offset delta, key or None, has value)
_Record = tuple[int, int, int, int, int, bytes | None, bool]


def _parse_records(payload: bytes, count: int) -> list[_Record]:
    """Walk ``count`` v2 records of an (uncompressed) records section."""
    out: list[_Record] = []
    pos = 0
    n = len(payload)
    try:
        for _ in range(count):
            length, body = read_varint(payload, pos)
            end = body + length
            if length < 0 or end > n:
                raise CorruptRecordError(f"record of length {length} runs past its batch")
            p = body + 1  # attributes
            ts_delta, ts_end = read_varint(payload, p)
            offset_delta, p = read_varint(payload, ts_end)
            key_len, p = read_varint(payload, p)
            if key_len >= 0:
                key: bytes | None = payload[p : p + key_len]
                p += key_len
            else:
                key = None
            value_len, p = read_varint(payload, p)
            out.append((pos, end, ts_end, ts_delta, offset_delta, key, value_len >= 0))
            pos = end
    except IndexError as e:
        raise CorruptRecordError("record batch ends inside a record") from e
    if pos != n:
        raise CorruptRecordError(f"{n - pos} bytes after the last of {count} records")
    return out


class _Batch:
    """One stored batch: header fields unpacked once, the bytes as read."""

    __slots__ = ("data", "pos", "size", "base_offset", "epoch", "attributes", "last_delta",
                 "base_ts", "max_ts", "producer_id", "producer_epoch", "base_sequence", "count")

    def __init__(self, data: bytes, pos: int) -> None:
        (self.base_offset, length, self.epoch, _magic, _crc, self.attributes, self.last_delta,
         self.base_ts, self.max_ts, self.producer_id, self.producer_epoch, self.base_sequence,
         self.count) = _HEADER.unpack_from(data, pos)
        self.data = data
        self.pos = pos
        self.size = length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_delta

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def codec(self) -> int:
        return self.attributes & _COMPRESSION_MASK

    @property
    def delete_horizon(self) -> int | None:
        return self.base_ts if self.attributes & DELETE_HORIZON_MASK else None

    def raw(self) -> memoryview:
        return memoryview(self.data)[self.pos : self.pos + self.size]

    def payload(self) -> bytes:
        start = self.pos + RECORD_BATCH_OVERHEAD
        return _decompress(self.codec, memoryview(self.data)[start : self.pos + self.size])

    def records(self) -> tuple[bytes, list[_Record]]:
        payload = self.payload()
        return payload, _parse_records(payload, self.count)

    def control_type(self) -> int | None:
        """The end-transaction marker's type, None for an empty (already cleaned) batch."""
        if self.count == 0:
            return None
        try:
            return read_end_txn_marker(self.data, self.pos)[0]
        except InvalidRecordError:
            return -1  # a control record that is not a marker: kept, as Kafka


def _iter_file_batches(fd: int, start: int, size: int, chunk: int) -> Iterator[_Batch]:
    """Whole batches of a ``.log`` file (read through ``fd``) from ``start`` to ``size``."""
    pos = start
    while size - pos >= LOG_OVERHEAD:
        want = min(chunk, size - pos)
        data = disk.pread(fd, want, pos)
        if len(data) < LOG_OVERHEAD:
            return
        length = _INT32.unpack_from(data, 8)[0]
        if length + LOG_OVERHEAD > len(data):
            if pos + length + LOG_OVERHEAD > size:
                raise CorruptRecordError(f"batch at position {pos} runs past the segment end")
            data = disk.pread(fd, length + LOG_OVERHEAD, pos)
        consumed = 0
        for p, _h in iter_batches(data):
            if data[p + 16] != MAGIC_V2:
                raise CorruptRecordError(f"batch at position {pos + p} is not magic v2")
            batch = _Batch(data, p)
            yield batch
            consumed = p + batch.size
        if consumed == 0:
            raise CorruptRecordError(f"no whole batch at position {pos}")
        pos += consumed


def _build_batch(b: _Batch, payload: bytes, records: list[_Record],
                 horizon: int | None) -> bytes:
    """``b`` with only ``records`` (of its ``payload``): same base offset, last offset delta,
    producer fields and codec; base timestamp = the delete horizon when there is one."""
    timestamp_base = b.base_ts
    new_base_ts = b.base_ts if horizon is None else horizon
    rewrite = new_base_ts != timestamp_base
    parts: list[bytes | memoryview] = []
    view = memoryview(payload)
    max_ts = -1
    for start, end, ts_end, ts_delta, _od, _key, _has_value in records:
        ts = timestamp_base + ts_delta
        if ts > max_ts:
            max_ts = ts
        if not rewrite:
            parts.append(view[start:end])
            continue
        _length, body = read_varint(payload, start)
        new_body = bytes(view[body : body + 1]) + write_varint(ts - new_base_ts) + bytes(
            view[ts_end:end])
        parts.append(write_varint(len(new_body)) + new_body)
    data = b"".join(parts)
    codec = b.codec
    if codec != COMPRESSION_NONE:
        data = compress(codec, data)
    if b.attributes & _TIMESTAMP_TYPE_MASK:
        max_ts = b.max_ts  # LogAppendTime: the batch's append time stands for every record
    attributes = b.attributes & ~DELETE_HORIZON_MASK
    if horizon is not None:
        attributes |= DELETE_HORIZON_MASK
    out = bytearray(RECORD_BATCH_OVERHEAD + len(data))
    _HEADER.pack_into(out, 0, b.base_offset, len(out) - LOG_OVERHEAD, b.epoch, MAGIC_V2, 0,
                      attributes, b.last_delta, new_base_ts, max_ts, b.producer_id,
                      b.producer_epoch, b.base_sequence, len(records))
    out[RECORD_BATCH_OVERHEAD:] = data
    _UINT32.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


def _empty_batch(b: _Batch) -> bytes:
    """Kafka's writeEmptyHeader: the batch's offsets, producer fields and max timestamp with
    no records, kept so the producer's last sequence (or epoch) survives."""
    attributes = b.attributes & (_TIMESTAMP_TYPE_MASK | _TRANSACTIONAL_MASK | _CONTROL_MASK)
    out = bytearray(RECORD_BATCH_OVERHEAD)
    _HEADER.pack_into(out, 0, b.base_offset, RECORD_BATCH_OVERHEAD - LOG_OVERHEAD, b.epoch,
                      MAGIC_V2, 0, attributes, b.last_delta, b.max_ts, b.max_ts, b.producer_id,
                      b.producer_epoch, b.base_sequence, 0)
    _UINT32.pack_into(out, CRC_OFFSET, crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
    return bytes(out)


# -- transactions ---------------------------------------------------------------------------
class _TxnMetadata:
    """Kafka's CleanedTransactionMetadata: which transactional batches are aborted, which
    markers may go, and the aborted transactions the cleaned segment's index keeps."""

    def __init__(self) -> None:
        self._ongoing_committed: set[int] = set()
        #: producer id -> [aborted txn, last offset of a batch of it seen or None]
        self._ongoing_aborted: dict[int, list[Any]] = {}
        self._heap: list[tuple[int, int, AbortedTxn]] = []
        self._added: set[AbortedTxn] = set()
        self._seq = 0
        self.cleaned_index: Callable[[AbortedTxn], None] | None = None

    def add_aborted(self, txns: list[AbortedTxn]) -> None:
        for txn in txns:
            if txn not in self._added:
                self._added.add(txn)
                self._seq += 1
                heappush(self._heap, (txn.first_offset, self._seq, txn))

    def _consume_up_to(self, offset: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= offset:
            txn = heappop(heap)[2]
            self._ongoing_aborted.setdefault(txn.producer_id, [txn, None])

    def on_control_batch(self, b: _Batch) -> bool:
        """Whether the marker may be discarded (its transaction has no data left here)."""
        self._consume_up_to(b.last_offset)
        control_type = b.control_type()
        if control_type is None:
            return True  # emptied by an earlier clean
        pid = b.producer_id
        if control_type == CONTROL_ABORT:
            meta = self._ongoing_aborted.pop(pid, None)
            if meta is not None and meta[1] is not None:
                if self.cleaned_index is not None:
                    self.cleaned_index(meta[0])
                return False
            return True
        if control_type == CONTROL_COMMIT:
            if pid in self._ongoing_committed:
                self._ongoing_committed.discard(pid)
                return False
            return True
        return False

    def on_batch(self, b: _Batch) -> bool:
        """Whether the data batch belongs to an aborted transaction."""
        self._consume_up_to(b.last_offset)
        if not b.is_transactional:
            return False
        meta = self._ongoing_aborted.get(b.producer_id)
        if meta is not None:
            meta[1] = b.last_offset
            return True
        self._ongoing_committed.add(b.producer_id)
        return False


# -- one clean --------------------------------------------------------------------------------
@dataclass(slots=True)
class _SegmentSnapshot:
    segment: LogSegment
    fd: int
    size: int
    next_offset: int  # the next segment's base offset
    offset_index_bytes: int
    time_index_bytes: int
    mtime: float


@dataclass(slots=True)
class _CleanTask:
    """What a thread needs of a log, taken on the event loop."""

    ltc: LogToClean
    log: Log
    segments: list[_SegmentSnapshot]
    aborted: list[AbortedTxn]
    last_records: dict[int, tuple[int | None, int]]
    delete_retention_ms: int
    segment_bytes: int
    index_interval_bytes: int
    #: on the loop, before the swap: the partition is neither paused nor gone
    still_ours: Callable[[], bool] = lambda: True

    def collect_aborted(self, start: int, end: int) -> list[AbortedTxn]:
        return [t for t in self.aborted if t.last_offset >= start and t.first_offset < end]

    def close(self) -> None:
        for s in self.segments:
            with contextlib.suppress(OSError):
                os.close(s.fd)
        self.segments = []


def take_snapshot(ltc: LogToClean) -> _CleanTask:
    """On the event loop: the segments below the first uncleanable offset and the log's
    transaction and producer facts a clean needs."""
    log = ltc.log
    taken = log.segments_for_cleaning(ltc.first_uncleanable_offset)
    segments = log.segments
    bases = {id(s): i for i, s in enumerate(segments)}
    snaps: list[_SegmentSnapshot] = []
    try:
        for seg, fd, size in taken:
            i = bases[id(seg)]
            snaps.append(_SegmentSnapshot(
                seg, fd, size, segments[i + 1].base_offset,
                seg.offset_index.size_in_bytes(), seg.time_index.size_in_bytes(),
                os.fstat(fd).st_mtime))
    except BaseException:
        for _seg, fd, _size in taken:
            os.close(fd)
        raise
    aborted = [t for s in segments for t in s.txn_index.entries]
    config = log.config
    return _CleanTask(ltc, log, snaps, aborted, log.last_records_of_active_producers(),
                      config.delete_retention_ms, config.segment_bytes,
                      config.index_interval_bytes)


class Cleaner:
    """One thread's cleaning machinery: its offset map and I/O buffer size.

    ``check_done(tp)`` raises to drop the clean; ``on_loop(fn)`` runs ``fn`` on the event
    loop and returns its result (the swap).
    """

    def __init__(self, thread_id: int, config: CleanerConfig, throttler: _Throttler,
                 check_done: Callable[[TopicPartition], None],
                 on_loop: Callable[[Callable[[], Any]], Any]) -> None:
        self.id = thread_id
        self.offset_map = OffsetMap(config.map_memory_per_thread(), config.load_factor)
        self.io_buffer_size = max(config.io_buffer_size // max(config.threads, 1) // 2, 4096)
        self.throttler = throttler
        self.check_done = check_done
        self.on_loop = on_loop

    def clean(self, task: _CleanTask, now_ms: int) -> tuple[int, _RunStats]:
        """Clean one log; returns (the next dirty offset, the figures)."""
        ltc = task.ltc
        stats = _RunStats()
        upper = ltc.first_uncleanable_offset
        self._build_offset_map(task, ltc.first_dirty_offset, upper, stats)
        end_offset = self.offset_map.latest_offset + 1
        if end_offset <= ltc.first_dirty_offset:
            raise RuntimeError(
                f"the offset map ({self.offset_map.max_entries} keys) cannot hold the first "
                f"batch of the dirty section at offset {ltc.first_dirty_offset}")
        txn = _TxnMetadata()
        for group in self._group_segments(task, end_offset, upper):
            self._clean_segments(task, group, now_ms, stats, txn, upper)
        stats.map_utilization = self.offset_map.utilization
        return end_offset, stats

    # -- the offset map ------------------------------------------------------------------------
    def _build_offset_map(self, task: _CleanTask, start: int, end: int, stats: _RunStats) -> None:
        omap = self.offset_map
        omap.clear()
        tp = task.ltc.tp
        dirty = [s for s in task.segments if s.next_offset > start and s.segment.base_offset < end]
        txn = _TxnMetadata()
        txn.add_aborted(task.collect_aborted(start, end))
        for snap in dirty:
            full = self._map_segment(tp, snap, start, txn, stats)
            if full:
                return
            omap.update_latest_offset(snap.next_offset - 1)

    def _map_segment(self, tp: TopicPartition, snap: _SegmentSnapshot, start: int,
                     txn: _TxnMetadata, stats: _RunStats) -> bool:
        omap = self.offset_map
        read_since_check = 0
        for b in _iter_file_batches(snap.fd, 0, snap.size, self.io_buffer_size):
            read_since_check += b.size
            if read_since_check >= self.io_buffer_size:
                self.check_done(tp)
                self.throttler.maybe_throttle(read_since_check)
                read_since_check = 0
            last = b.last_offset
            if last < start:
                continue
            stats.map_bytes_read += b.size
            if b.is_control:
                txn.on_control_batch(b)
                stats.map_records_read += 1
            elif txn.on_batch(b):
                stats.map_records_read += b.count  # aborted: not mapped
            else:
                _payload, records = b.records()
                base = b.base_offset
                for rec in records:
                    key = rec[5]
                    offset = base + rec[4]
                    if key is not None and offset >= start and not omap.put(key, offset):
                        return True
                    stats.map_records_read += 1
            omap.update_latest_offset(last)
        self.throttler.maybe_throttle(read_since_check)
        return False

    # -- grouping ----------------------------------------------------------------------------
    @staticmethod
    def _group_segments(task: _CleanTask, end_offset: int,
                        upper: int) -> list[list[_SegmentSnapshot]]:
        """Kafka's groupSegmentsBySize over the segments below ``end_offset``."""
        segs = [s for s in task.segments if s.segment.base_offset < end_offset]
        max_size = task.segment_bytes
        groups: list[list[_SegmentSnapshot]] = []
        i = 0
        while i < len(segs):
            group = [segs[i]]
            log_size = segs[i].size
            index_size = segs[i].offset_index_bytes
            time_index_size = segs[i].time_index_bytes
            i += 1
            while i < len(segs):
                s = segs[i]
                last = segs[i + 1].segment.base_offset - 1 if i + 1 < len(segs) else upper - 1
                if not (log_size + s.size <= max_size
                        and index_size + s.offset_index_bytes <= MAX_INDEX_SIZE
                        and time_index_size + s.time_index_bytes <= MAX_INDEX_SIZE
                        and (s.size == 0
                             or last - group[0].segment.base_offset <= _INT32_MAX)):
                    break
                group.append(s)
                log_size += s.size
                index_size += s.offset_index_bytes
                time_index_size += s.time_index_bytes
                i += 1
            groups.append(group)
        return groups

    # -- recopying ---------------------------------------------------------------------------
    def _clean_segments(self, task: _CleanTask, group: list[_SegmentSnapshot], now_ms: int,
                        stats: _RunStats, txn: _TxnMetadata, upper: int) -> None:
        log = task.log
        base = group[0].segment.base_offset
        for suffix in (".log", ".index", ".timeindex", ".txnindex"):
            (log.dir / f"{base:020d}{suffix}{CLEANED_FILE_SUFFIX}").unlink(missing_ok=True)
        cleaned = LogSegment(log.dir, base, task.index_interval_bytes,
                             file_suffix=CLEANED_FILE_SUFFIX)
        swapped = False
        keep_files = False  # a swap that failed half-way: the files are the load's to judge
        try:
            txn.cleaned_index = cleaned.txn_index.append
            for k, snap in enumerate(group):
                seg_end = group[k + 1].segment.base_offset if k + 1 < len(group) else (
                    snap.next_offset)
                txn.add_aborted(task.collect_aborted(snap.segment.base_offset, seg_end))
                self._clean_into(task, snap, cleaned, now_ms, stats, txn, upper)
            txn.cleaned_index = None
            cleaned.on_become_inactive()
            cleaned.flush()
            os.utime(cleaned.log_path, (group[-1].mtime, group[-1].mtime))
            self.check_done(task.ltc.tp)
            old = [s.segment for s in group]
            try:
                swapped = bool(self.on_loop(lambda: _swap(task, cleaned, old)))
            except _Aborted:
                raise  # the swap never ran
            except BaseException:
                keep_files = True
                raise
            if not swapped:
                raise _Aborted()  # the old segments now wait file.delete.delay.ms (the log's)
        finally:
            txn.cleaned_index = None
            if not swapped:
                cleaned.close_quietly()
            if not swapped and not keep_files:
                for path in cleaned.file_paths():
                    with contextlib.suppress(OSError):
                        path.unlink(missing_ok=True)

    def _clean_into(self, task: _CleanTask, snap: _SegmentSnapshot, dest: LogSegment,
                    now_ms: int, stats: _RunStats, txn: _TxnMetadata, upper: int) -> None:
        tp = task.ltc.tp
        omap = self.offset_map
        latest = omap.latest_offset
        last_records = task.last_records
        retention_ms = task.delete_retention_ms
        out = bytearray()
        out_last = -1
        out_max_ts = -1
        out_max_ts_offset = -1
        flush_at = max(task.index_interval_bytes, 1)
        read_since_check = 0
        for b in _iter_file_batches(snap.fd, 0, snap.size, self.io_buffer_size):
            read_since_check += b.size
            if read_since_check >= self.io_buffer_size:
                self.check_done(tp)
                self.throttler.maybe_throttle(read_since_check)
                read_since_check = 0
            stats.bytes_read += b.size
            stats.records_read += b.count
            kept = self._filter_batch(b, txn, last_records, latest, upper, now_ms, retention_ms,
                                      stats)
            if kept is None:
                continue
            data, count, max_ts = kept
            stats.records_written += count
            out += data
            out_last = b.last_offset
            if max_ts > out_max_ts:
                out_max_ts, out_max_ts_offset = max_ts, out_last
            if len(out) >= flush_at:
                dest.append(out_last, out_max_ts, out_max_ts_offset, out)
                stats.bytes_written += len(out)
                self.throttler.maybe_throttle(len(out))
                out = bytearray()
                out_max_ts = out_max_ts_offset = -1
        if out:
            dest.append(out_last, out_max_ts, out_max_ts_offset, out)
            stats.bytes_written += len(out)
            self.throttler.maybe_throttle(len(out))
        self.throttler.maybe_throttle(read_since_check)

    def _filter_batch(
        self, b: _Batch, txn: _TxnMetadata, last_records: dict[int, tuple[int | None, int]],
        latest: int, upper: int, now_ms: int, retention_ms: int, stats: _RunStats,
    ) -> tuple[bytes | memoryview, int, int] | None:
        """Kafka's checkBatchRetention + filterBatch for one batch: (bytes to write, records
        kept, max timestamp), None to drop it."""
        is_control = b.is_control
        last_offset = b.last_offset
        horizon = b.delete_horizon
        if is_control:
            can_discard = txn.on_control_batch(b)
            discard_records = can_discard and horizon is not None and horizon <= now_ms
        else:
            can_discard = txn.on_batch(b)
            discard_records = can_discard
        pid = b.producer_id
        retain_empty = False
        if pid >= 0:
            last = last_records.get(pid)
            if last is not None:
                last_data, epoch = last
                if last_data is not None:
                    retain_empty = last_offset == last_data
                else:
                    retain_empty = is_control and b.producer_epoch == epoch
        if not retain_empty and last_offset + 1 == upper:
            retain_empty = True  # the batch ending the cleanable section keeps its offsets
        if discard_records:
            return (_empty_batch(b), 0, b.max_ts) if retain_empty else None
        marker_for_empty_txn = can_discard and is_control
        if is_control:
            if horizon is None and marker_for_empty_txn:
                payload, records = b.records()
                return (_build_batch(b, payload, records, now_ms + retention_ms), b.count,
                        b.max_ts)
            return b.raw(), b.count, b.max_ts
        if b.base_offset > latest and horizon is not None:
            return b.raw(), b.count, b.max_ts  # past the map, tombstones already stamped
        payload, records = b.records()
        base = b.base_offset
        kept: list[_Record] = []
        tombstones = False
        omap = self.offset_map
        for rec in records:
            offset = base + rec[4]
            has_value = rec[6]
            if offset > latest:
                keep = True
            else:
                key = rec[5]
                if key is None:
                    stats.invalid_records += 1
                    keep = False
                else:
                    keep = offset >= omap.get(key) and (
                        has_value or horizon is None or now_ms < horizon)
            if keep:
                kept.append(rec)
                if not has_value:
                    tombstones = True
        if kept:
            set_horizon = tombstones and horizon is None
            if len(kept) == len(records) and not set_horizon:
                return b.raw(), len(kept), b.max_ts
            new_horizon = now_ms + retention_ms if set_horizon else horizon
            data = _build_batch(b, payload, kept, new_horizon)
            return data, len(kept), _HEADER.unpack_from(data, 0)[8]
        if retain_empty:
            return _empty_batch(b), 0, b.max_ts
        return None


def _swap(task: _CleanTask, cleaned: LogSegment, old: list[LogSegment]) -> bool:
    """On the event loop: swap unless the partition was paused or its log replaced."""
    return task.still_ours() and task.log.replace_segments(cleaned, old)


# -- the threads ------------------------------------------------------------------------------
class LogCleaner:
    """The cleaner threads of a LogManager (Kafka's LogCleaner).

    ``start(loop)`` starts ``threads`` daemon threads (none when disabled); each loops: grab
    the filthiest log on the event loop, clean it, back off ``backoff.ms`` when there was
    nothing to do. ``clean_once`` does one such pass on the calling thread (tests, tools).

    Its "now" (compaction lags, the delete horizon, the dirty ratios it reports) is the
    system's wall clock, not the broker's clock: the threads keep real time on purpose, so a
    manual clock never has to be read across threads; ``clean_once(now_ms)`` takes it given.
    """

    def __init__(self, config: CleanerConfig, log_manager: LogManager) -> None:
        self.config = config
        self.log_manager = log_manager
        self.manager = CleanerManager(log_manager)
        self._stats = CleanerStats()
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._throttler = _Throttler(config.max_io_bytes_per_second, self._stop)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[tuple[threading.Thread, threading.Event]] = []
        self._next_thread_id = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Start the threads; swaps and snapshots are then run on ``loop``."""
        self._loop = loop
        self._stop.clear()
        self._resize(self.config.threads if self.config.enable else 0)

    def _resize(self, count: int) -> None:
        live = [(t, stop) for t, stop in self._threads if t.is_alive() and not stop.is_set()]
        while len(live) > count:
            _t, stop = live.pop()
            stop.set()
        while len(live) < count:
            stop = threading.Event()
            tid = self._next_thread_id
            self._next_thread_id += 1
            t = threading.Thread(target=self._run, args=(tid, stop),
                                 name=f"log-cleaner-thread-{tid}", daemon=True)
            live.append((t, stop))
            self._threads.append((t, stop))
            t.start()
        self._threads = [(t, s) for t, s in self._threads if t.is_alive() or not s.is_set()]

    def shutdown(self) -> None:
        """Stop and join the threads (call before the logs close). A thread waiting on the
        event loop gives up, so this may run on the loop."""
        self._stop.set()
        for _t, stop in self._threads:
            stop.set()
        for t, _stop in self._threads:
            t.join(timeout=30)
            if t.is_alive():
                logger.warning("a cleaner thread did not stop in time", thread=t.name)
        self._threads = []
        with contextlib.suppress(Exception):
            self.manager.write_checkpoints()

    def reconfigure(self, config: CleanerConfig) -> None:
        """Apply new ``log.cleaner.*`` values at once: thread count, map memory and I/O
        buffer for the next clean of each thread, throttle rate."""
        self.config = config
        self._throttler.rate = config.max_io_bytes_per_second
        if self._loop is not None and not self._stop.is_set():
            self._resize(config.threads if config.enable else 0)

    @property
    def stats(self) -> CleanerStats:
        """A consistent copy of the cumulative figures (metrics read it at scrape time)."""
        with self._stats_lock:
            return replace(self._stats,
                           uncleanable_partitions=self.manager.uncleanable_snapshot())

    # -- partitions ----------------------------------------------------------------------------
    def abort_and_pause(self, tp: TopicPartition) -> None:
        """No clean of ``tp`` changes its log after this returns (on the loop) until
        ``resume``."""
        self.manager.abort_and_pause(tp)

    def resume(self, tp: TopicPartition) -> None:
        self.manager.resume(tp)

    def remove_partition(self, tp: TopicPartition) -> None:
        """The partition's log was deleted: forget its checkpoint and state."""
        self.manager.remove_partition(tp)

    def dirty_ratios(self) -> dict[TopicPartition, float]:
        """Each compacted log's dirty ratio (call on the event loop)."""
        return self.manager.dirty_ratios(system_wall_ms())

    # -- work ------------------------------------------------------------------------------------
    def _on_loop(self, fn: Callable[[], T], stop: threading.Event | None = None) -> T:
        loop = self._loop
        if loop is None:
            return fn()
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError as e:  # the loop is closed
            raise _Aborted() from e
        while True:
            try:
                return fut.result(timeout=_BACKOFF_POLL_S)
            except concurrent.futures.TimeoutError:
                if (self._stop.is_set() or (stop is not None and stop.is_set())) and (
                        fut.cancel()):
                    raise _Aborted() from None

    def _check_done(self, tp: TopicPartition, stop: threading.Event | None) -> None:
        if self._stop.is_set() or (stop is not None and stop.is_set()):
            raise _Aborted()
        if self.manager.is_aborted(tp):
            raise _Aborted()

    def clean_once(self, now_ms: int | None = None, *,
                   stop: threading.Event | None = None, thread_id: int = 0) -> bool:
        """Grab the filthiest log and clean it; False when none needed it. Without a loop
        (``start`` not called) everything runs on the calling thread."""
        config = self.config
        cleaner = Cleaner(thread_id, config, self._throttler,
                          lambda tp: self._check_done(tp, stop),
                          lambda fn: self._on_loop(fn, stop))

        def grab() -> _CleanTask | None:
            ltc = self.manager.grab_filthiest(system_wall_ms() if now_ms is None else now_ms)
            if ltc is None:
                return None
            log = ltc.log
            tp = ltc.tp
            try:
                task = take_snapshot(ltc)
            except BaseException:
                self.manager.done_cleaning(ltc.tp, None)
                raise
            task.still_ours = lambda: (not self._stop.is_set() and not self.manager.is_aborted(tp)
                                       and self.log_manager.logs.get(tp) is log)
            return task

        task = self._on_loop(grab, stop)
        if task is None:
            return False
        self._clean_log(cleaner, task, now_ms, stop)
        return True

    def _clean_log(self, cleaner: Cleaner, task: _CleanTask, now_ms: int | None,
                   stop: threading.Event | None) -> None:
        ltc = task.ltc
        tp = ltc.tp
        log = task.log
        end_offset: int | None = None
        started = time.monotonic()
        try:
            end_offset, run = cleaner.clean(task, system_wall_ms() if now_ms is None
                                            else now_ms)
        except _Aborted:
            logger.debug("clean dropped", topic=tp[0], partition=tp[1])
        except KafkaStorageError:
            pass  # the dir is offline already
        except OSError as e:
            if self._log_gone(tp, log):
                logger.debug("clean dropped: the log went away", topic=tp[0], partition=tp[1])
            else:
                self.log_manager.failure_channel.maybe_add_offline_log_dir(
                    log.log_dir, f"error while cleaning {tp[0]}-{tp[1]} in dir {log.log_dir}",
                    e)
        except Exception as e:
            if self._log_gone(tp, log):
                logger.debug("clean dropped: the log went away", topic=tp[0], partition=tp[1])
            else:
                logger.exception("cleaning failed", topic=tp[0], partition=tp[1])
                self.manager.mark_uncleanable(tp, repr(e))
        else:
            seconds = time.monotonic() - started
            self._record(tp, ltc, end_offset, run, seconds)
        finally:
            task.close()
            self.manager.done_cleaning(tp, end_offset)
            self.manager.write_checkpoints()

    def _log_gone(self, tp: TopicPartition, log: Log) -> bool:
        return self.log_manager.logs.get(tp) is not log or log.closed or self._stop.is_set()

    def _record(self, tp: TopicPartition, ltc: LogToClean, end_offset: int, run: _RunStats,
                seconds: float) -> None:
        removed = run.records_read - run.records_written
        with self._stats_lock:
            s = self._stats
            s.runs += 1
            s.bytes_read += run.bytes_read
            s.bytes_written += run.bytes_written
            s.records_read += run.records_read
            s.records_removed += removed
            s.clean_seconds_total += seconds
            s.last_clean_seconds = seconds
            s.max_clean_seconds = max(s.max_clean_seconds, seconds)
        logger.info("cleaned log", topic=tp[0], partition=tp[1],
                    dirty_section=[ltc.first_dirty_offset, end_offset],
                    bytes_read=run.bytes_read, bytes_written=run.bytes_written,
                    records_read=run.records_read, records_removed=removed,
                    map_utilization=round(run.map_utilization, 3),
                    seconds=round(seconds, 3))

    def _run(self, thread_id: int, stop: threading.Event) -> None:
        while not self._stop.is_set() and not stop.is_set():
            try:
                cleaned = self.clean_once(stop=stop, thread_id=thread_id)
            except _Aborted:
                cleaned = False
            except Exception:
                logger.exception("cleaner thread error")
                cleaned = False
            if not cleaned:
                stop.wait(self.config.backoff_ms / 1000)
