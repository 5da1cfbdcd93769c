"""Group metadata and committed offsets in the internal topic `__consumer_offsets`.

Records use Kafka's own key/value layouts (GroupCoordinatorRecordSerde): an OffsetCommitKey
(version 1) with an OffsetCommitValue (version 3), a GroupMetadataKey (version 2) with a
GroupMetadataValue (version 3), and a null value as the tombstone. They go through the normal
log, so a commit is acknowledged only once the partition's high watermark covers it, and the
coordinator rebuilds its state by reading the topic at start.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

import structlog
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from broker.group.metadata import GroupMetadata, GroupState, MemberMetadata, OffsetAndMetadata
from broker.wallclock import now_ms
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.partition import Partition
    from broker.replica_manager import ProduceResults, ReplicaManager
    from broker.topic_admin import TopicAdmin

log = structlog.get_logger("broker.group")

TOPIC = "__consumer_offsets"
OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
COMMIT_TIMEOUT_MS = 5000  # Kafka's offsets.commit.timeout.ms

Record = tuple[bytes, bytes | None]


def java_string_hash(s: str) -> int:
    """String.hashCode() over UTF-16 code units, as Kafka uses to place a group."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h


# -- encoding ---------------------------------------------------------------------------------

def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _nstr(s: str | None) -> bytes:
    return struct.pack(">h", -1) if s is None else _str(s)


def _bytes(b: bytes) -> bytes:
    return struct.pack(">i", len(b)) + b


def offset_key(group: str, topic: str, partition: int) -> bytes:
    return struct.pack(">h", OFFSET_COMMIT_KEY_VERSION) + _str(group) + _str(topic) + struct.pack(
        ">i", partition)


def offset_value(o: OffsetAndMetadata) -> bytes:
    return (struct.pack(">hqi", OFFSET_COMMIT_VALUE_VERSION, o.offset, o.leader_epoch)
            + _str(o.metadata) + struct.pack(">q", o.commit_timestamp))


def group_key(group: str) -> bytes:
    return struct.pack(">h", GROUP_METADATA_KEY_VERSION) + _str(group)


def group_value(g: GroupMetadata) -> bytes:
    parts = [
        struct.pack(">h", GROUP_METADATA_VALUE_VERSION), _str(g.protocol_type or ""),
        struct.pack(">i", g.generation_id), _nstr(g.protocol_name), _nstr(g.leader_id),
        struct.pack(">q", g.state_timestamp), struct.pack(">i", len(g.members)),
    ]
    for m in g.members.values():
        subscription = m.metadata_for(g.protocol_name) if g.protocol_name else b""
        parts += [
            _str(m.member_id), _nstr(m.group_instance_id), _str(m.client_id), _str(m.client_host),
            struct.pack(">ii", m.rebalance_timeout_ms, m.session_timeout_ms),
            _bytes(subscription), _bytes(m.assignment),
        ]
    return b"".join(parts)


# -- decoding ---------------------------------------------------------------------------------

class _Reader:
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


def apply_record(groups: dict[str, GroupMetadata], key: bytes, value: bytes | None) -> None:
    """Replay one record of the topic onto the in-memory state (later records win)."""
    r = _Reader(key)
    (version,) = r.unpack(">h")
    if version in (0, 1):
        group_id, topic = r.str(), r.str()
        (partition,) = r.unpack(">i")
        group = groups.setdefault(group_id, GroupMetadata(group_id))
        if value is None:
            group.offsets.pop((topic, partition), None)
            return
        v = _Reader(value)
        (vv,) = v.unpack(">h")
        (offset,) = v.unpack(">q")
        epoch = v.unpack(">i")[0] if vv >= 3 else -1
        metadata = v.str()
        (ts,) = v.unpack(">q")
        group.offsets[(topic, partition)] = OffsetAndMetadata(offset, epoch, metadata, ts)
    elif version == 2:
        group_id = r.str()
        if value is None:
            groups.pop(group_id, None)
            return
        group = groups.setdefault(group_id, GroupMetadata(group_id))
        _load_group_value(group, value)


def _load_group_value(group: GroupMetadata, value: bytes) -> None:
    v = _Reader(value)
    (version,) = v.unpack(">h")
    group.protocol_type = v.str() or None
    (group.generation_id,) = v.unpack(">i")
    group.protocol_name = v.nstr()
    leader = v.nstr()
    if version >= 2:
        (group.state_timestamp,) = v.unpack(">q")
    (count,) = v.unpack(">i")
    group.members.clear()
    group.static_members.clear()
    group.leader_id = None
    for _ in range(count):
        member_id = v.str()
        instance = v.nstr() if version >= 3 else None
        client_id, host = v.str(), v.str()
        (rebalance,) = v.unpack(">i") if version >= 1 else (-1,)
        (session,) = v.unpack(">i")
        subscription, assignment = v.bytes(), v.bytes()
        protocols = [(group.protocol_name, subscription)] if group.protocol_name else []
        group.add(MemberMetadata(member_id, instance, client_id, host, rebalance, session,
                                 group.protocol_type or "", protocols, assignment, is_new=False))
    group.leader_id = leader if leader in group.members else next(iter(group.members), None)
    group.new_member_added = False
    group.state = GroupState.STABLE if group.members else GroupState.EMPTY


# -- the store --------------------------------------------------------------------------------

class OffsetsStore:
    """Reads and appends `__consumer_offsets` through the ReplicaManager, like any producer."""

    def __init__(self, replica_manager: ReplicaManager, topics: TopicAdmin, num_partitions: int
                 ) -> None:
        self.replica_manager = replica_manager
        self.topics = topics
        self.num_partitions = num_partitions

    def partition_for(self, group_id: str) -> int:
        return (java_string_hash(group_id) & 0x7FFFFFFF) % self.num_partitions

    def ensure_topic(self) -> None:
        info = self.topics.metadata.topics.get(TOPIC)
        if info is None:
            self.topics.create_topic(TOPIC, self.num_partitions,
                                     {"cleanup.policy": "compact", "segment.bytes": "104857600"})
        else:
            self.num_partitions = info.partitions

    def load(self) -> dict[str, GroupMetadata]:
        groups: dict[str, GroupMetadata] = {}
        records = 0
        for index in range(self.num_partitions):
            partition = self.replica_manager.partitions[(TOPIC, index)]
            for key, value in _read_all(partition):
                if key is not None:
                    apply_record(groups, key, value)
                    records += 1
        groups = {g: m for g, m in groups.items() if m.members or m.offsets or m.protocol_type}
        if records:
            log.info("group metadata loaded", records=records, groups=len(groups))
        return groups

    def write(self, group_id: str, records: list[Record]) -> asyncio.Future[ErrorCode]:
        """Append the records to the group's partition; resolves once they are committed."""
        fut: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
        tp = (TOPIC, self.partition_for(group_id))
        builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
        now = now_ms()
        for i, (key, value) in enumerate(records):
            builder.append(i, now, key, value, [])
        appended = self.replica_manager.append_records(
            [(tp, bytes(builder.build()))], api_version=11, acks=-1, timeout_ms=COMMIT_TIMEOUT_MS)
        if isinstance(appended, dict):
            fut.set_result(appended[tp].error)
            return fut

        def done(f: asyncio.Future[ProduceResults]) -> None:
            if fut.done():
                return
            if f.exception() is not None:
                fut.set_result(ErrorCode.UNKNOWN_SERVER_ERROR)
            else:
                fut.set_result(f.result()[tp].error)

        asyncio.ensure_future(appended).add_done_callback(done)
        return fut


def _read_all(partition: Partition) -> Iterator[tuple[bytes | None, bytes | None]]:
    offset = partition.log_start_offset
    end = partition.high_watermark
    while offset < end:
        data = partition.log.read(offset, 1 << 20, end, True)
        if not data:
            return
        records = MemoryRecords(bytes(data))
        while (batch := records.next_batch()) is not None:
            for rec in batch:
                if rec.offset >= offset:
                    yield (bytes(rec.key) if rec.key is not None else None,
                           bytes(rec.value) if rec.value is not None else None)
                    offset = rec.offset + 1
            offset = max(offset, batch.next_offset)
