"""RecordBatch v2 (magic 2): a zero-copy view of the 61-byte header, CRC32C, offset assignment.

No I/O. The produce path only ever looks at batch headers: records are never decoded and
compressed payloads (gzip, snappy, lz4, zstd) are never decompressed, so the cost of a produce
is one CRC pass per batch plus a few ``struct`` reads and writes. The one exception is an
end-transaction marker (a control batch of one uncompressed record), whose record is built
and read here.

Header layout (Kafka's DefaultRecordBatch), big-endian, offsets from the batch start::

     0 baseOffset int64          8 batchLength int32 (bytes after this field)
    12 partitionLeaderEpoch int32  16 magic int8      17 crc uint32 (CRC-32C)
    21 attributes int16         23 lastOffsetDelta int32  27 baseTimestamp int64
    35 maxTimestamp int64       43 producerId int64   51 producerEpoch int16
    53 baseSequence int32       57 recordCount int32  61 records...

The CRC covers attributes to the end of the batch, so base offset and partition leader epoch
can be rewritten in place without recomputing it; the timestamp type and max timestamp can not.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from crc32c import crc32c

from protocol.errors import ErrorCode, KafkaError

__all__ = [
    "BASE_OFFSET_OFFSET",
    "LENGTH_OFFSET",
    "PARTITION_LEADER_EPOCH_OFFSET",
    "MAGIC_OFFSET",
    "CRC_OFFSET",
    "ATTRIBUTES_OFFSET",
    "LAST_OFFSET_DELTA_OFFSET",
    "BASE_TIMESTAMP_OFFSET",
    "MAX_TIMESTAMP_OFFSET",
    "PRODUCER_ID_OFFSET",
    "PRODUCER_EPOCH_OFFSET",
    "BASE_SEQUENCE_OFFSET",
    "RECORDS_COUNT_OFFSET",
    "RECORD_BATCH_OVERHEAD",
    "LOG_OVERHEAD",
    "HEADER_SIZE_UP_TO_MAGIC",
    "MIN_BATCH_LENGTH",
    "MAGIC_V2",
    "NO_TIMESTAMP",
    "NO_PARTITION_LEADER_EPOCH",
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "COMPRESSION_NONE",
    "COMPRESSION_GZIP",
    "COMPRESSION_SNAPPY",
    "COMPRESSION_LZ4",
    "COMPRESSION_ZSTD",
    "RecordBatchError",
    "CorruptRecordError",
    "InvalidRecordError",
    "RecordTooLargeError",
    "UnsupportedCompressionTypeError",
    "BatchHeader",
    "RecordsInfo",
    "iter_batches",
    "validate_produce_records",
    "check_produce_request_version",
    "assign_offsets",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "NO_SEQUENCE",
    "NO_PRODUCER_ID",
    "NO_PRODUCER_EPOCH",
    "TRANSACTIONAL_MASK",
    "CONTROL_MASK",
    "build_end_txn_marker",
    "read_end_txn_marker",
    "read_varint",
    "write_varint",
]

# Field offsets inside a batch (Kafka's DefaultRecordBatch constants).
BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
RECORD_BATCH_OVERHEAD = 61
#: base offset + batch length: the bytes that precede what batchLength counts.
LOG_OVERHEAD = 12
#: enough bytes to read the magic byte, which says how to read the rest.
HEADER_SIZE_UP_TO_MAGIC = 17
#: the smallest batchLength a v2 batch can declare (a header with no records).
MIN_BATCH_LENGTH = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD

MAGIC_V2 = 2
NO_TIMESTAMP = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_PRODUCER_ID = -1
CREATE_TIME = 0
LOG_APPEND_TIME = 1

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4

NO_PRODUCER_EPOCH = -1
#: Kafka's RecordBatch.NO_SEQUENCE: the base sequence of control batches and of the group
#: coordinator's transactional offset commits.
NO_SEQUENCE = -1

#: Kafka's ControlRecordType ids of the end-transaction markers (the control record key type).
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20
TRANSACTIONAL_MASK = _TRANSACTIONAL_MASK
CONTROL_MASK = _CONTROL_MASK

_HEADER = struct.Struct(">qiibIhiqqqhii")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
_INT8 = struct.Struct(">b")
# batchLength, partitionLeaderEpoch, magic: the first fields needed to walk a buffer.
_LEN_EPOCH_MAGIC = struct.Struct(">iib")

Buffer = bytes | bytearray | memoryview


class RecordBatchError(KafkaError):
    """A produce or stored batch Kafka would refuse; ``error_code`` is Kafka's error code.

    A KafkaError, so handlers that map KafkaError to a partition error need nothing more.
    """

    error_code: ErrorCode = ErrorCode.CORRUPT_MESSAGE

    def __init__(self, message: str, error_code: int | None = None) -> None:
        code = type(self).error_code if error_code is None else ErrorCode(error_code)
        super().__init__(code, message)


class CorruptRecordError(RecordBatchError):
    """Bad CRC, impossible length or truncated batch: Kafka's CorruptRecordException."""

    error_code = ErrorCode.CORRUPT_MESSAGE


class InvalidRecordError(RecordBatchError):
    """Well-formed bytes Kafka still refuses (magic < 2, bad counts...): InvalidRecordException."""

    error_code = ErrorCode.INVALID_RECORD


class RecordTooLargeError(RecordBatchError):
    """A batch bigger than ``message.max.bytes``: RecordTooLargeException (MESSAGE_TOO_LARGE)."""

    error_code = ErrorCode.MESSAGE_TOO_LARGE


class UnsupportedCompressionTypeError(RecordBatchError):
    """ZStandard in a produce request older than v7: UnsupportedCompressionTypeException."""

    error_code = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


class BatchHeader:
    """A view of one v2 batch header inside ``buf`` at ``pos``; reads and writes go to ``buf``.

    Nothing is copied or decoded up front: each property is one ``struct.unpack_from``. Writers
    (``set_*``) need a writable buffer (bytearray or a writable memoryview).
    """

    __slots__ = ("buf", "pos")

    def __init__(self, buf: Buffer, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    # -- fields, in wire order ---------------------------------------------------------------
    @property
    def base_offset(self) -> int:
        return _INT64.unpack_from(self.buf, self.pos)[0]

    @property
    def batch_length(self) -> int:
        return _INT32.unpack_from(self.buf, self.pos + LENGTH_OFFSET)[0]

    @property
    def partition_leader_epoch(self) -> int:
        return _INT32.unpack_from(self.buf, self.pos + PARTITION_LEADER_EPOCH_OFFSET)[0]

    @property
    def magic(self) -> int:
        return _INT8.unpack_from(self.buf, self.pos + MAGIC_OFFSET)[0]

    @property
    def crc(self) -> int:
        return _UINT32.unpack_from(self.buf, self.pos + CRC_OFFSET)[0]

    @property
    def attributes(self) -> int:
        return _INT16.unpack_from(self.buf, self.pos + ATTRIBUTES_OFFSET)[0]

    @property
    def last_offset_delta(self) -> int:
        return _INT32.unpack_from(self.buf, self.pos + LAST_OFFSET_DELTA_OFFSET)[0]

    @property
    def base_timestamp(self) -> int:
        """Kafka's firstTimestamp: the base the record timestamp deltas are added to."""
        return _INT64.unpack_from(self.buf, self.pos + BASE_TIMESTAMP_OFFSET)[0]

    @property
    def max_timestamp(self) -> int:
        return _INT64.unpack_from(self.buf, self.pos + MAX_TIMESTAMP_OFFSET)[0]

    @property
    def producer_id(self) -> int:
        return _INT64.unpack_from(self.buf, self.pos + PRODUCER_ID_OFFSET)[0]

    @property
    def producer_epoch(self) -> int:
        return _INT16.unpack_from(self.buf, self.pos + PRODUCER_EPOCH_OFFSET)[0]

    @property
    def base_sequence(self) -> int:
        return _INT32.unpack_from(self.buf, self.pos + BASE_SEQUENCE_OFFSET)[0]

    @property
    def record_count(self) -> int:
        return _INT32.unpack_from(self.buf, self.pos + RECORDS_COUNT_OFFSET)[0]

    # -- derived -------------------------------------------------------------------------------
    @property
    def compression_type(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & _COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 CreateTime, 1 LogAppendTime (attributes bit 3)."""
        return 1 if self.attributes & _TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    def fields(self) -> tuple[int, ...]:
        """All 13 header fields in wire order with one unpack (for logging and tests)."""
        return _HEADER.unpack_from(self.buf, self.pos)

    # -- CRC -------------------------------------------------------------------------------------
    def compute_crc(self) -> int:
        """CRC-32C from attributes to the end of the batch, as Kafka computes it."""
        start = self.pos + ATTRIBUTES_OFFSET
        end = self.pos + self.size_in_bytes
        return crc32c(memoryview(self.buf)[start:end])

    def is_valid(self) -> bool:
        """Kafka's isValid(): long enough to hold a header, whole in ``buf``, CRC matches."""
        if self.batch_length < MIN_BATCH_LENGTH:
            return False
        if self.pos + self.size_in_bytes > len(self.buf):
            return False
        return self.crc == self.compute_crc()

    # -- in-place writers --------------------------------------------------------------------------
    def set_base_offset(self, offset: int) -> None:
        """Assign the batch's offsets; the CRC does not cover this field."""
        _INT64.pack_into(self.buf, self.pos, offset)

    def set_last_offset(self, offset: int) -> None:
        """Kafka's setLastOffset: the base offset that makes ``last_offset == offset``."""
        _INT64.pack_into(self.buf, self.pos, offset - self.last_offset_delta)

    def set_partition_leader_epoch(self, epoch: int) -> None:
        """Stamp the leader epoch, as the leader does on append; not covered by the CRC."""
        _INT32.pack_into(self.buf, self.pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)

    def set_max_timestamp(self, timestamp_type: int, max_timestamp: int) -> None:
        """Kafka's setMaxTimestamp: set type bit and max timestamp, then recompute the CRC.

        Like Kafka, nothing is written (and no CRC computed) when both already match.
        """
        attributes = self.attributes
        if self.timestamp_type == timestamp_type and self.max_timestamp == max_timestamp:
            return
        if timestamp_type == LOG_APPEND_TIME:
            attributes |= _TIMESTAMP_TYPE_MASK
        else:
            attributes &= ~_TIMESTAMP_TYPE_MASK
        _INT16.pack_into(self.buf, self.pos + ATTRIBUTES_OFFSET, attributes)
        _INT64.pack_into(self.buf, self.pos + MAX_TIMESTAMP_OFFSET, max_timestamp)
        _UINT32.pack_into(self.buf, self.pos + CRC_OFFSET, self.compute_crc())

    def set_log_append_time(self, ts_ms: int) -> None:
        """Mark the batch LogAppendTime with ``ts_ms`` as its max timestamp (CRC recomputed).

        Readers then report ``ts_ms`` for every record of the batch, whatever the producer set.
        """
        self.set_max_timestamp(LOG_APPEND_TIME, ts_ms)

    def __repr__(self) -> str:
        return (
            f"BatchHeader(pos={self.pos}, offsets=[{self.base_offset}, {self.last_offset}], "
            f"length={self.batch_length}, magic={self.magic}, count={self.record_count}, "
            f"compression={self.compression_type}, timestamp_type={self.timestamp_type}, "
            f"max_timestamp={self.max_timestamp}, crc={self.crc})"
        )


def iter_batches(
    buf: Buffer, pos: int = 0, end: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, BatchHeader)`` for each whole batch in ``buf[pos:end]``.

    Stops quietly at a partial trailing batch (a fetch response or a torn log tail may end
    with one); raises CorruptRecordError when a declared length can not be a v2 batch. The
    CRC is not checked here: callers that need it call ``is_valid()``.
    """
    limit = len(buf) if end is None else end
    unpack = _LEN_EPOCH_MAGIC.unpack_from
    while limit - pos >= LOG_OVERHEAD:
        length = _INT32.unpack_from(buf, pos + LENGTH_OFFSET)[0]
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"record batch at position {pos} declares length {length}, below the "
                f"minimum of {MIN_BATCH_LENGTH} for magic v2"
            )
        if limit - pos >= HEADER_SIZE_UP_TO_MAGIC:
            magic = unpack(buf, pos + LENGTH_OFFSET)[2]
            if magic != MAGIC_V2:
                raise CorruptRecordError(
                    f"record batch at position {pos} has magic {magic}; only magic v2 is stored"
                )
        size = length + LOG_OVERHEAD
        if limit - pos < size:
            return
        yield pos, BatchHeader(buf, pos)
        pos += size


@dataclass(slots=True)
class RecordsInfo:
    """What validation learned from the headers; all ``assign_offsets`` and the log need.

    ``offset_delta_of_max_timestamp`` is the last offset (relative to the first offset to be
    assigned) of the first batch that carries ``max_timestamp``: Kafka's
    shallowOffsetOfMaxTimestamp before offsets are known.
    """

    num_batches: int
    num_records: int
    size_in_bytes: int
    max_timestamp: int
    offset_delta_of_max_timestamp: int
    #: sum of (last_offset_delta + 1): offsets the records will take (== num_records).
    offset_count: int
    compression_type: int
    positions: list[int]


def validate_produce_records(
    buf: Buffer,
    max_batch_bytes: int | None = None,
    *,
    single_batch: bool = True,
    client: bool = True,
) -> RecordsInfo:
    """Check a produce request's records the way a Kafka leader does, headers and CRC only.

    Follows ProduceRequest.validateRecords, UnifiedLog.analyzeAndValidateRecords and
    LogValidator.validateBatch for client appends: at least one batch, magic 2, exactly one
    batch per partition (Kafka: "Compressed outer record has more than one batch"; pass
    ``single_batch=False`` to accept several), base offset 0, size within ``max_batch_bytes``,
    CRC, ``record_count >= 1 == last_offset_delta + 1``, no control batches, a sequence for
    an idempotent producer, and no trailing bytes. Record-level rules (timestamp bounds,
    compacted-topic keys, the topic's codec) are the log's: they need the topic's configs.

    ``client=False`` is an append from a coordinator (Kafka's AppendOrigin.COORDINATOR): like
    Kafka's LogValidator.validateBatch it may write control batches and batches of a producer
    id without a sequence.
    """
    view = memoryview(buf)
    total = len(view)
    if total == 0:
        raise InvalidRecordError("produce request has no record batch for the partition")
    positions: list[int] = []
    num_records = 0
    max_timestamp = NO_TIMESTAMP
    delta_of_max_ts = -1
    compression = COMPRESSION_NONE
    pos = 0
    while pos < total:
        remaining = total - pos
        if remaining < HEADER_SIZE_UP_TO_MAGIC:
            raise CorruptRecordError(
                f"{remaining} trailing bytes at position {pos} are not a whole record batch"
            )
        length, _epoch, magic = _LEN_EPOCH_MAGIC.unpack_from(view, pos + LENGTH_OFFSET)
        if magic != MAGIC_V2:
            # ProduceRequest.validateRecords (v3+): InvalidRecordException -> INVALID_RECORD.
            raise InvalidRecordError(
                f"produce requests (v3+) may only contain record batches with magic 2, got {magic}"
            )
        if positions and single_batch:
            raise InvalidRecordError(
                "produce requests may contain exactly one record batch per partition"
            )
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"record batch length {length} is below the minimum of {MIN_BATCH_LENGTH}"
            )
        size = length + LOG_OVERHEAD
        if size > remaining:
            raise CorruptRecordError(
                f"record batch at position {pos} declares {size} bytes, only {remaining} present"
            )
        (
            base_offset,
            _length,
            _epoch,
            _magic,
            crc,
            attributes,
            last_offset_delta,
            _base_ts,
            batch_max_ts,
            producer_id,
            _producer_epoch,
            base_sequence,
            count,
        ) = _HEADER.unpack_from(view, pos)
        if base_offset != 0:
            raise InvalidRecordError(
                f"the base offset of a produced record batch must be 0, got {base_offset}"
            )
        if max_batch_bytes is not None and size > max_batch_bytes:
            raise RecordTooLargeError(
                f"record batch of {size} bytes exceeds the maximum of {max_batch_bytes} "
                "(message.max.bytes)"
            )
        computed = crc32c(view[pos + ATTRIBUTES_OFFSET : pos + size])
        if computed != crc:
            raise CorruptRecordError(
                f"record batch is corrupt (stored crc = {crc}, computed crc = {computed})"
            )
        if last_offset_delta < 0:
            raise InvalidRecordError(
                f"record batch has an invalid offset range: last offset delta {last_offset_delta}"
            )
        if count <= 0:
            raise InvalidRecordError(f"invalid reported count for record batch: {count}")
        if last_offset_delta + 1 != count:
            raise InvalidRecordError(
                f"inconsistent batch offset range [0, {last_offset_delta}] and count of "
                f"records {count}"
            )
        if client and attributes & _CONTROL_MASK:
            raise InvalidRecordError("clients are not allowed to write control records")
        if client and producer_id > NO_PRODUCER_ID and base_sequence < 0:
            raise InvalidRecordError(
                f"invalid sequence number {base_sequence} in record batch with producerId "
                f"{producer_id}"
            )
        positions.append(pos)
        num_records += count
        if batch_max_ts > max_timestamp:
            max_timestamp = batch_max_ts
            delta_of_max_ts = num_records - 1
        if attributes & _COMPRESSION_MASK:
            compression = attributes & _COMPRESSION_MASK
        pos += size
    return RecordsInfo(
        num_batches=len(positions),
        num_records=num_records,
        size_in_bytes=total,
        max_timestamp=max_timestamp,
        offset_delta_of_max_timestamp=delta_of_max_ts,
        offset_count=num_records,
        compression_type=compression,
        positions=positions,
    )


def check_produce_request_version(buf: Buffer, api_version: int) -> None:
    """Request-level rule of ProduceRequest.validateRecords that needs the API version.

    ZStandard needs produce v7+ (UNSUPPORTED_COMPRESSION_TYPE). Header bytes only; call it
    before ``Log.append`` when the handler knows the request version.
    """
    if api_version >= 7:
        return
    view = memoryview(buf)
    pos = 0
    while len(view) - pos >= RECORD_BATCH_OVERHEAD:
        length, _epoch, magic = _LEN_EPOCH_MAGIC.unpack_from(view, pos + LENGTH_OFFSET)
        if magic != MAGIC_V2 or length < MIN_BATCH_LENGTH:
            return  # validate_produce_records reports these with the right code
        attributes = _INT16.unpack_from(view, pos + ATTRIBUTES_OFFSET)[0]
        if attributes & _COMPRESSION_MASK == COMPRESSION_ZSTD:
            raise UnsupportedCompressionTypeError(
                f"produce requests with version {api_version} are not allowed to use "
                "ZStandard compression"
            )
        pos += length + LOG_OVERHEAD


def assign_offsets(
    buf: bytearray | memoryview,
    first_offset: int,
    log_append_time_ms: int | None = None,
    *,
    partition_leader_epoch: int | None = None,
    info: RecordsInfo | None = None,
) -> int:
    """Give the validated batches in ``buf`` consecutive offsets from ``first_offset``.

    Rewrites each base offset in place (the CRC is untouched), stamps the partition leader
    epoch when given, and with ``log_append_time_ms`` marks batches LogAppendTime (CRC
    recomputed, as Kafka does). ``info`` (from ``validate_produce_records``) saves a header
    walk. Returns the last assigned offset.
    """
    positions = info.positions if info is not None else [p for p, _ in iter_batches(buf)]
    next_offset = first_offset
    for pos in positions:
        header = BatchHeader(buf, pos)
        header.set_base_offset(next_offset)
        if partition_leader_epoch is not None:
            header.set_partition_leader_epoch(partition_leader_epoch)
        if log_append_time_ms is not None:
            header.set_log_append_time(log_append_time_ms)
        next_offset += header.last_offset_delta + 1
    return next_offset - 1



# -- end-transaction markers (Kafka's EndTransactionMarker, ControlRecordType) ------------------
#: control record key: version int16 (0) | type int16; marker value: version int16 (0) |
#: coordinator epoch int32. Both are Kafka's version-0 layouts.
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


def write_varint(value: int) -> bytes:
    """Zig-zag varint (Kafka's ByteUtils.writeVarint / writeVarlong)."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    """``(value, next position)`` of the zig-zag varint at ``pos``; one byte is the common
    case (record attributes, small deltas and lengths), so it returns first."""
    if pos >= len(buf):
        raise CorruptRecordError("record ends inside a varint")
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    shift = 0
    raw = 0
    while True:
        if pos >= len(buf):
            raise CorruptRecordError("record ends inside a varint")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptRecordError("record has a varint longer than 10 bytes")
    return (raw >> 1) ^ -(raw & 1), pos


def build_end_txn_marker(
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    commit: bool,
    timestamp_ms: int,
) -> bytearray:
    """One control batch holding a COMMIT or ABORT marker, as Kafka's
    MemoryRecords.withEndTransactionMarker builds it: attributes transactional | control,
    uncompressed, CreateTime, base sequence -1, base offset 0 (the log assigns it), one record
    whose key is the control type and whose value carries the coordinator epoch."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    body = (
        b"\x00"  # record attributes
        + write_varint(0)  # timestamp delta
        + write_varint(0)  # offset delta
        + write_varint(len(key))
        + key
        + write_varint(len(value))
        + value
        + write_varint(0)  # no headers
    )
    record = write_varint(len(body)) + body
    size = RECORD_BATCH_OVERHEAD + len(record)
    buf = bytearray(size)
    _HEADER.pack_into(
        buf,
        0,
        0,  # base offset
        size - LOG_OVERHEAD,
        NO_PARTITION_LEADER_EPOCH,
        MAGIC_V2,
        0,  # crc, below
        _TRANSACTIONAL_MASK | _CONTROL_MASK,
        0,  # last offset delta
        timestamp_ms,
        timestamp_ms,
        producer_id,
        producer_epoch,
        NO_SEQUENCE,
        1,
    )
    buf[RECORD_BATCH_OVERHEAD:] = record
    _UINT32.pack_into(buf, CRC_OFFSET, crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return buf


def read_end_txn_marker(buf: Buffer, pos: int = 0) -> tuple[int, int]:
    """``(control type, coordinator epoch)`` of the end-transaction marker batch at ``pos``.

    Decodes only the batch's first record (control batches are never compressed). Raises
    InvalidRecordError for a control record that is not a COMMIT or ABORT marker or whose
    key or value is too short, as Kafka's EndTransactionMarker.deserialize does.
    """
    header = BatchHeader(buf, pos)
    if not header.is_control:
        raise InvalidRecordError(f"batch at position {pos} is not a control batch")
    if header.compression_type != COMPRESSION_NONE:
        raise InvalidRecordError("control batches must not be compressed")
    if header.record_count < 1:
        raise InvalidRecordError("control batch holds no record")
    p = pos + RECORD_BATCH_OVERHEAD
    end = pos + header.size_in_bytes
    _length, p = read_varint(buf, p)
    p += 1  # record attributes
    _ts_delta, p = read_varint(buf, p)
    _offset_delta, p = read_varint(buf, p)
    key_len, p = read_varint(buf, p)
    if key_len < _CONTROL_KEY.size or p + key_len > end:
        raise InvalidRecordError(
            f"invalid control record key size {key_len}, must have at least {_CONTROL_KEY.size}"
        )
    key_version, control_type = _CONTROL_KEY.unpack_from(buf, p)
    if key_version < 0:
        raise InvalidRecordError(f"invalid version found for control record: {key_version}")
    p += key_len
    if control_type not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise InvalidRecordError(
            f"invalid control record type for end transaction marker: {control_type}"
        )
    value_len, p = read_varint(buf, p)
    if value_len < _MARKER_VALUE.size or p + value_len > end:
        raise InvalidRecordError(
            f"invalid value size found for end transaction marker: {value_len}, must have "
            f"at least {_MARKER_VALUE.size}"
        )
    value_version, coordinator_epoch = _MARKER_VALUE.unpack_from(buf, p)
    if value_version < 0:
        raise InvalidRecordError(
            f"invalid version found for end transaction marker: {value_version}"
        )
    return control_type, coordinator_epoch
