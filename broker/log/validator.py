"""LogValidator: what a Kafka leader judges per record on a client append, and recompression.

``protocol.record_batch.validate_produce_records`` has already checked the batch header
(magic, CRC, base offset 0, count == lastOffsetDelta + 1, no control batch ...). This adds
the rest of Kafka's LogValidator for v2 batches, reading records only when its rules need
them:

* a compacted topic (``cleanup.policy`` contains ``compact``): every record needs a key;
* ``compression.type`` names a codec other than the batch's: the batch is rebuilt with it,
  producer id, epoch, base sequence, timestamps, keys, values and headers kept;
* CreateTime bounds (``message.timestamp.before.max.ms`` / ``.after.max.ms``) the header can
  not settle: it carries the largest timestamp, not the smallest.

Everything else is settled from the header: a batch the producer marked LogAppendTime (all
its records carry its max timestamp), and the after-bound against the max timestamp. So the
common case (codec kept, no compaction, unbounded timestamps) costs one header read.

A refused record makes the whole batch fail, with every refused record listed (Kafka's
RecordValidationException): INVALID_TIMESTAMP when any timestamp was refused, else
INVALID_RECORD. Nothing in a batch is changed before the batch is known to pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import kafka.codec as codecs
from kafka.errors import CorruptRecordError as KafkaPythonCorruptRecord
from kafka.errors import UnsupportedCodecError
from kafka.record.default_records import (
    DefaultRecord,
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
)

from protocol.errors import ErrorCode, KafkaError
from protocol.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    CREATE_TIME,
    MAGIC_V2,
    NO_TIMESTAMP,
    BatchHeader,
    InvalidRecordError,
    RecordsInfo,
    validate_produce_records,
)

if TYPE_CHECKING:
    from broker.log.config import LogConfig

__all__ = [
    "TOPIC_CODECS",
    "COMPRESSION_LEVELS",
    "LONG_MAX",
    "LogValidator",
    "codec_available",
    "compress",
    "compression_level_problem",
    "is_compacted",
]

LONG_MAX = 2**63 - 1
_TIMESTAMP_TYPE_MASK = 0x08
_MAX_BATCH = 2**31 - 1

#: ``compression.type`` values (Kafka's BrokerCompressionType) and the codec each stores;
#: None for ``producer``: keep the producer's codec.
TOPIC_CODECS: dict[str, int | None] = {
    "uncompressed": COMPRESSION_NONE,
    "zstd": COMPRESSION_ZSTD,
    "lz4": COMPRESSION_LZ4,
    "snappy": COMPRESSION_SNAPPY,
    "gzip": COMPRESSION_GZIP,
    "producer": None,
}

#: KIP-390 level keys: codec, (min, max), default. Kafka's defaults: gzip -1 (zlib's own
#: default, also the only value outside 1..9), lz4 9 (lz4-java's fast compressor), zstd 3.
COMPRESSION_LEVELS: dict[str, tuple[int, tuple[int, int], int]] = {
    "compression.gzip.level": (COMPRESSION_GZIP, (1, 9), -1),
    "compression.lz4.level": (COMPRESSION_LZ4, (1, 17), 9),
    "compression.zstd.level": (COMPRESSION_ZSTD, (-131072, 22), 3),
}
_DEFAULT_LEVEL = {codec: default for codec, _, default in COMPRESSION_LEVELS.values()}
_AVAILABLE = {
    "gzip": codecs.has_gzip,
    "snappy": codecs.has_snappy,
    "lz4": codecs.has_lz4,
    "zstd": codecs.has_zstd,
}

# (error code, message) of one refused record.
RecordProblem = tuple[ErrorCode, str]


def compression_level_problem(key: str, level: int) -> str | None:
    """Why ``level`` is not a valid value of the KIP-390 ``key``, or None when it is."""
    _codec, (low, high), default = COMPRESSION_LEVELS[key]
    if low <= level <= high or level == default:
        return None
    extra = f" or {default}" if not low <= default <= high else ""
    return f"{key} must be between {low} and {high}{extra}, got {level}"


def codec_available(compression_type: str) -> bool:
    """Whether the codec library behind a ``compression.type`` value is installed."""
    check = _AVAILABLE.get(compression_type)
    return check is None or check()


def is_compacted(cleanup_policy: str) -> bool:
    """``cleanup.policy`` is a list; ``compact`` anywhere in it makes keys mandatory."""
    return "compact" in (p.strip().lower() for p in cleanup_policy.split(","))


def compress(codec: int, data: bytes, level: int | None = None) -> bytes:
    """Compress a v2 batch's records section with kafka-python's codecs at a KIP-390 level.

    lz4 at Kafka's default level 9 uses the fast compressor, as lz4-java's does; any other
    level is liblz4's high-compression level (which stops at 12).
    """
    if level is None:
        level = _DEFAULT_LEVEL.get(codec)
    if codec == COMPRESSION_GZIP:
        return codecs.gzip_encode(data, compresslevel=level)
    if codec == COMPRESSION_SNAPPY:
        return codecs.snappy_encode(data)
    if codec == COMPRESSION_LZ4:
        if level == _DEFAULT_LEVEL[COMPRESSION_LZ4]:
            return codecs.lz4_encode(data)
        return codecs.lz4_encode(data, compression_level=level)
    if codec == COMPRESSION_ZSTD:
        if codecs.zstd is None:
            raise UnsupportedCodecError("Libraries for zstd compression codec not found")
        return codecs.zstd.ZstdCompressor(level=level).compress(data)
    raise ValueError(f"no codec {codec}")


class _TopicCodecBuilder(DefaultRecordBatchBuilder):
    """kafka-python's v2 batch builder, compressing with the topic's codec and level always.

    kafka-python sends a batch uncompressed when compressing does not shrink it; a broker
    recompressing for ``compression.type`` stores that codec whatever the ratio, as Kafka does.
    """

    __slots__ = ("_level",)

    def __init__(self, codec: int, level: int | None, header: BatchHeader) -> None:
        super().__init__(
            MAGIC_V2, codec, header.is_transactional, header.producer_id,
            header.producer_epoch, header.base_sequence, _MAX_BATCH,
        )
        self._level = level

    def _maybe_compress(self) -> bool:
        if self._compression_type == COMPRESSION_NONE:
            return False
        self._assert_has_codec(self._compression_type)
        size = self.HEADER_STRUCT.size
        self._buffer[size:] = compress(self._compression_type, bytes(self._buffer[size:]),
                                       self._level)
        return True


class LogValidator:
    """One log's validation rules, taken from its LogConfig (rebuilt when the config changes)."""

    __slots__ = ("topic_partition", "target", "levels", "compact", "create_time", "before",
                 "after", "max_message_bytes")

    def __init__(self, config: LogConfig, topic_partition: str = "") -> None:
        self.topic_partition = topic_partition
        self.target = TOPIC_CODECS[config.compression_type]
        self.levels = {
            COMPRESSION_GZIP: config.compression_gzip_level,
            COMPRESSION_LZ4: config.compression_lz4_level,
            COMPRESSION_ZSTD: config.compression_zstd_level,
        }
        self.compact = is_compacted(config.cleanup_policy)
        self.create_time = config.message_timestamp_type == "CreateTime"
        # None: unbounded. Long.MAX_VALUE can never be exceeded, so it is skipped as Kafka's
        # comparison would; LogAppendTime topics ignore both bounds.
        self.before = _bound(config.message_timestamp_before_max_ms, self.create_time)
        self.after = _bound(config.message_timestamp_after_max_ms, self.create_time)
        self.max_message_bytes = config.max_message_bytes

    # -- the append path ---------------------------------------------------------------------
    def validate(
        self, records: bytearray | memoryview, info: RecordsInfo, now_ms: int
    ) -> tuple[bytearray | memoryview, RecordsInfo]:
        """Judge the validated batches of one append; returns the records to store and their info.

        The records come back as given (possibly with a corrected header: timestamp type and
        max timestamp, CRC recomputed) or, when recompressed, as a new buffer. Raises KafkaError
        with ``record_errors`` when Kafka would refuse records, RecordTooLargeError when a
        rebuilt batch exceeds ``max.message.bytes``.
        """
        rebuilt: dict[int, bytearray] = {}
        corrected = False
        for pos in info.positions:
            outcome = self._validate_batch(BatchHeader(records, pos), now_ms)
            if isinstance(outcome, bytearray):
                rebuilt[pos] = outcome
            corrected |= outcome is True
        if rebuilt:
            return self._splice(records, info, rebuilt)
        if corrected:
            _refresh_max_timestamp(records, info)
        return records, info

    def _validate_batch(self, header: BatchHeader, now_ms: int) -> bytearray | bool:
        """One batch: a rebuilt copy, True when its header was corrected in place, else False."""
        fields = header.fields()
        attributes, max_ts = fields[5], fields[8]
        lat = bool(attributes & _TIMESTAMP_TYPE_MASK)
        codec = attributes & 0x07
        rebuild = self.target is not None and self.target != codec
        if rebuild or self.compact or self._timestamps_need_records(lat, max_ts, now_ms):
            return self._validate_records(header, codec, rebuild, now_ms)
        if lat:
            self._check_log_append_time_batch(header, max_ts, now_ms)
            return True
        return False

    def _timestamps_need_records(self, lat: bool, max_ts: int, now_ms: int) -> bool:
        """Whether each record's timestamp must be read: for the CreateTime bounds, or to find
        the max timestamp of a header that has none."""
        if not self.create_time or lat:
            return False  # no bounds, or every record carries the header's max timestamp
        if max_ts < 0:
            return True  # an old client's "no max timestamp" (sarama 1.22): Kafka finds it
        if self.before is not None:
            return True  # the header has no minimum timestamp
        return self.after is not None and max_ts - now_ms > self.after

    def _check_log_append_time_batch(self, header: BatchHeader, max_ts: int, now_ms: int) -> None:
        """A batch the producer marked LogAppendTime: each record's timestamp is ``max_ts``.

        Kafka judges it as such a record, then stores the batch as CreateTime with that max
        timestamp on a CreateTime topic (a LogAppendTime topic stamps it anyway).
        """
        problem = self._timestamp_problem(max_ts, True, 0, now_ms)
        if problem is not None:
            problems = [
                (i, self._timestamp_problem(max_ts, True, i, now_ms) or problem)
                for i in range(header.record_count)
            ]
            raise self._refusal(problems)
        if self.create_time:
            header.set_max_timestamp(CREATE_TIME, max_ts)

    # -- records -----------------------------------------------------------------------------
    def _validate_records(
        self, header: BatchHeader, codec: int, rebuild: bool, now_ms: int
    ) -> bytearray | bool:
        """Walk the records: refuse, rebuild, or keep the batch with its true max timestamp."""
        records = _read_records(header, self.topic_partition)
        lat = header.timestamp_type == 1
        problems = [
            (i, p) for i, r in enumerate(records)
            if (p := self._record_problem(r, lat, now_ms)) is not None
        ]
        if problems:
            raise self._refusal(problems)
        # Kafka's compressed path (a codec on either side) rebuilds a batch whose inner offsets
        # are not 0..n-1; the uncompressed path keeps the records as they are.
        compressed_path = codec != COMPRESSION_NONE or self.target not in (None, COMPRESSION_NONE)
        consecutive = all(r.offset == header.base_offset + i for i, r in enumerate(records))
        if rebuild or (compressed_path and not consecutive):
            return self._rebuild(header, records, codec)
        if self.create_time:
            max_ts = max((r.timestamp for r in records), default=NO_TIMESTAMP)
            header.set_max_timestamp(CREATE_TIME, max(max_ts, NO_TIMESTAMP))
        return True

    def _record_problem(
        self, record: DefaultRecord, lat: bool, now_ms: int
    ) -> RecordProblem | None:
        """Kafka's validateRecord for v2: the key first, then the timestamp."""
        if self.compact and record.key is None:
            return ErrorCode.INVALID_RECORD, (
                f"compacted topic {self.topic_partition} cannot accept a record without a key"
            )
        return self._timestamp_problem(record.timestamp, lat, record.offset, now_ms)

    def _timestamp_problem(
        self, ts: int, lat: bool, offset: int, now_ms: int
    ) -> RecordProblem | None:
        if self.create_time and ts != NO_TIMESTAMP:
            diff = now_ms - ts
            if (self.before is not None and diff > self.before) or (
                self.after is not None and -diff > self.after
            ):
                low = "-inf" if self.before is None else now_ms - self.before
                high = "+inf" if self.after is None else now_ms + self.after
                return ErrorCode.INVALID_TIMESTAMP, (
                    f"timestamp {ts} of the record at offset {offset} is out of range: it must "
                    f"be within [{low}, {high}]"
                )
        elif lat:
            return ErrorCode.INVALID_TIMESTAMP, (
                "invalid timestamp type LogAppendTime in a produced record: producers must "
                "not set it"
            )
        return None

    def _refusal(self, problems: list[tuple[int, RecordProblem]]) -> KafkaError:
        """Kafka's processRecordErrors: any refused timestamp makes it INVALID_TIMESTAMP."""
        record_errors: list[tuple[int, str | None]] = [(i, msg) for i, (_c, msg) in problems]
        if any(code == ErrorCode.INVALID_TIMESTAMP for _i, (code, _m) in problems):
            return KafkaError(
                ErrorCode.INVALID_TIMESTAMP,
                "one or more records were rejected for an invalid timestamp",
                record_errors,
            )
        shown = ", ".join(f"(batchIndex={i}, message='{m}')" for i, m in record_errors[:3])
        return KafkaError(
            ErrorCode.INVALID_RECORD,
            f"one or more records were rejected: {len(record_errors)} record errors in "
            f"total, the first three at most: [{shown}]",
            record_errors,
        )

    # -- recompression -------------------------------------------------------------------------
    def _rebuild(
        self, header: BatchHeader, records: Sequence[DefaultRecord], codec: int
    ) -> bytearray:
        """A new v2 batch of the same records with consecutive offset deltas from 0.

        The target is the topic's codec and level, or, on a ``producer`` topic, the batch's own
        codec at its default level (Kafka's targetCompression). Base offset, leader epoch and
        LogAppendTime are stamped later by ``assign_offsets``, as for any batch.
        """
        target = codec if self.target is None else self.target
        level = self.levels.get(target) if self.target is not None else None
        builder = _TopicCodecBuilder(target, level, header)
        for i, r in enumerate(records):
            builder.append(i, r.timestamp, r.key, r.value, r.headers)
        return builder.build()

    def _splice(
        self, records: bytearray | memoryview, info: RecordsInfo, rebuilt: dict[int, bytearray]
    ) -> tuple[bytearray, RecordsInfo]:
        """Put rebuilt batches in place of the originals and re-check sizes (Kafka re-checks
        ``max.message.bytes`` when sizes may have changed)."""
        view = memoryview(records)
        out = bytearray()
        for pos in info.positions:
            new = rebuilt.get(pos)
            end = pos + BatchHeader(view, pos).size_in_bytes
            out += new if new is not None else view[pos:end]
        new_info = validate_produce_records(
            out, self.max_message_bytes, single_batch=info.num_batches == 1
        )
        return out, new_info


def _bound(value: int, create_time: bool) -> int | None:
    return value if create_time and value < LONG_MAX else None


def _read_records(header: BatchHeader, topic_partition: str) -> list[DefaultRecord]:
    """Every record of one batch, decompressed and decoded by kafka-python.

    A declared count that does not match the records, or a record that does not parse, is
    Kafka's InvalidRecordException (INVALID_RECORD). A payload that does not decompress is a
    KafkaException on a Kafka leader, answered UNKNOWN_SERVER_ERROR.
    """
    view = memoryview(header.buf)[header.pos : header.pos + header.size_in_bytes]
    batch = DefaultRecordBatch(view)
    try:
        it = iter(batch)
    except Exception as exc:  # each codec library raises its own exception types
        raise KafkaError(
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"failed to decompress the record batch for {topic_partition}: {exc!r}",
        ) from exc
    try:
        return list(it)
    except KafkaPythonCorruptRecord as exc:
        raise InvalidRecordError(
            f"invalid records in the batch for {topic_partition} "
            f"(declared count {header.record_count}): {exc}"
        ) from exc


def _refresh_max_timestamp(records: bytearray | memoryview, info: RecordsInfo) -> None:
    """Recompute RecordsInfo's max timestamp after headers were corrected in place."""
    max_ts, delta, seen = NO_TIMESTAMP, -1, 0
    for pos in info.positions:
        header = BatchHeader(records, pos)
        seen += header.record_count
        if header.max_timestamp > max_ts:
            max_ts, delta = header.max_timestamp, seen - 1
    info.max_timestamp = max_ts
    info.offset_delta_of_max_timestamp = delta
