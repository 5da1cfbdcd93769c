"""Records of the coordinators' internal topics (`__consumer_offsets`, `__transaction_state`).

Shared by the group and transaction coordinators, which write and read these topics alike:
Kafka's String.hashCode that places a key on a partition, the fields of Kafka's key and value
layouts, one batch appended as the coordinator through the ReplicaManager (acks=-1), and a
partition's batches read back through its log when the state is loaded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from broker.log.log import AppendOrigin
from protocol.errors import ErrorCode
from protocol.record_batch import NO_SEQUENCE, BatchHeader, iter_batches

if TYPE_CHECKING:
    from broker.replica.delayed_result import Completion
    from broker.replica.partition import Partition
    from broker.replica.replica_manager import ReplicaManager

TopicPartition = tuple[str, int]
Record = tuple[bytes, bytes | None]


def java_string_hash(s: str) -> int:
    """Java's String.hashCode() (signed, over UTF-16 code units): how Kafka places a key."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


# -- the fields ------------------------------------------------------------------------------

def encode_string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def encode_nullable_string(s: str | None) -> bytes:
    return struct.pack(">h", -1) if s is None else encode_string(s)


def encode_bytes(b: bytes) -> bytes:
    return struct.pack(">i", len(b)) + b


class Reader:
    """Reads a key or value field by field, from the start."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def unpack(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def nstr(self) -> str | None:
        (n,) = self.unpack(">h")
        if n < 0:
            return None
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def str(self) -> str:
        return self.nstr() or ""

    def bytes(self) -> bytes:
        (n,) = self.unpack(">i")
        b = self.data[self.pos:self.pos + max(n, 0)]
        self.pos += max(n, 0)
        return bytes(b)

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def compact_str(self) -> str:
        n = self.uvarint() - 1
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def skip_tags(self) -> None:
        """The tagged fields of a flexible version, which this broker does not use."""
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


# -- the topic -------------------------------------------------------------------------------

def append_as_coordinator(
    replica_manager: ReplicaManager, tp: TopicPartition, records: Iterable[Record],
    timestamp_ms: int, timeout_ms: int, *, producer_id: int = -1, producer_epoch: int = -1,
) -> Completion[tuple[ErrorCode, int]]:
    """The records as one batch, acks=-1, as the coordinator (Kafka's AppendOrigin.COORDINATOR);
    completes with the error and the batch's base offset once committed (UNKNOWN_SERVER_ERROR
    if computing the append's answer failed). With a producer id the
    batch is transactional, with no sequence, so the transaction's marker decides it."""
    builder = DefaultRecordBatchBuilder(2, 0, producer_id >= 0, producer_id, producer_epoch,
                                        NO_SEQUENCE, 1 << 30)
    for i, (key, value) in enumerate(records):
        builder.append(i, timestamp_ms, key, value, [])
    appended = replica_manager.append_records(
        [(tp, bytes(builder.build()))], api_version=11, acks=-1, timeout_ms=timeout_ms,
        origin=AppendOrigin.COORDINATOR)
    return appended.then(lambda res: (res[tp].error, res[tp].base_offset)).exceptionally(
        (ErrorCode.UNKNOWN_SERVER_ERROR, -1))


def read_batches(partition: Partition, end: int) -> Iterator[tuple[bytes, int, BatchHeader]]:
    """Every batch holding offsets from the log start up to ``end``: (buffer, position, header)."""
    offset = partition.log_start_offset
    while offset < end:
        data = bytes(partition.log.read(offset, 1 << 20, end, True) or b"")
        if not data:
            return
        before = offset
        for pos, header in iter_batches(data):
            if header.last_offset >= offset:
                yield data, pos, header
            offset = max(offset, header.next_offset)
        if offset == before:
            return


def batch_records(data: bytes, pos: int, header: BatchHeader) -> Iterable[Any]:
    """The records of one batch that read_batches yielded, decoded by kafka-python."""
    return MemoryRecords(data[pos:pos + header.size_in_bytes]).next_batch() or ()


def read_records(partition: Partition, end: int
                 ) -> Iterator[tuple[bytes | None, bytes | None]]:
    """(key, value) of every record from the log start up to ``end``."""
    start = partition.log_start_offset
    for data, pos, header in read_batches(partition, end):
        for rec in batch_records(data, pos, header):
            if rec.offset >= start:
                yield (bytes(rec.key) if rec.key is not None else None,
                       bytes(rec.value) if rec.value is not None else None)
