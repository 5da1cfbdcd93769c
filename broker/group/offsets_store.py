"""Group metadata and committed offsets in the internal topic `__consumer_offsets`.

Records use Kafka's own key/value layouts (GroupCoordinatorRecordSerde): an OffsetCommitKey
(version 1) with an OffsetCommitValue (version 3), a GroupMetadataKey (version 2) with a
GroupMetadataValue (version 3), a ConsumerGroupMetadataKey (version 3) with a
ConsumerGroupMetadataValue (version 0: the group epoch) for a group of the consumer protocol,
and a null value as the tombstone. They go through the normal
log, so a commit is acknowledged only once the partition's high watermark covers it, and the
coordinator rebuilds its state by reading the topic at start. A transactional offset commit is
one transactional batch with the producer's id and epoch; the transaction's marker (a control
batch) in the same partition later decides it, at run time and when loading alike.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import structlog

from broker.coordinator.records import (
    Reader,
    Record,
    append_as_coordinator,
    batch_records,
    encode_bytes,
    encode_nullable_string,
    encode_string,
    java_string_hash,
    read_batches,
)
from broker.group.classic_group import GroupMetadata, GroupState
from broker.group.classic_member import MemberMetadata
from broker.group.consumer_group import ConsumerGroup
from broker.group.offset_cache import OffsetAndMetadata
from protocol.errors import ErrorCode
from protocol.record_batch import CONTROL_COMMIT, InvalidRecordError, read_end_txn_marker
from purgatory import WallClock

if TYPE_CHECKING:
    from broker.group.offsets import OffsetMetadataManager
    from broker.group.registry import GroupRegistry
    from broker.metadata.topic_admin import TopicAdmin
    from broker.replica.delayed_result import Completion
    from broker.replica.replica_manager import ReplicaManager

logger = structlog.get_logger("broker.group")

TOPIC = "__consumer_offsets"
OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
CONSUMER_GROUP_METADATA_KEY_VERSION = 3
CONSUMER_GROUP_METADATA_VALUE_VERSION = 0
COMMIT_TIMEOUT_MS = 5000  # Kafka's offsets.commit.timeout.ms

# -- encoding ---------------------------------------------------------------------------------

def offset_key(group: str, topic: str, partition: int) -> bytes:
    return (struct.pack(">h", OFFSET_COMMIT_KEY_VERSION) + encode_string(group)
            + encode_string(topic) + struct.pack(">i", partition))


def offset_value(o: OffsetAndMetadata) -> bytes:
    return (struct.pack(">hqi", OFFSET_COMMIT_VALUE_VERSION, o.offset, o.leader_epoch)
            + encode_string(o.metadata) + struct.pack(">q", o.commit_timestamp))


def group_key(group: str) -> bytes:
    return struct.pack(">h", GROUP_METADATA_KEY_VERSION) + encode_string(group)


def group_value(g: GroupMetadata) -> bytes:
    parts = [
        struct.pack(">h", GROUP_METADATA_VALUE_VERSION), encode_string(g.protocol_type or ""),
        struct.pack(">i", g.generation_id), encode_nullable_string(g.protocol_name),
        encode_nullable_string(g.leader_id),
        struct.pack(">q", g.state_timestamp), struct.pack(">i", len(g.members)),
    ]
    for m in g.members.values():
        subscription = m.metadata_for(g.protocol_name) if g.protocol_name else b""
        parts += [
            encode_string(m.member_id), encode_nullable_string(m.group_instance_id),
            encode_string(m.client_id), encode_string(m.client_host),
            struct.pack(">ii", m.rebalance_timeout_ms, m.session_timeout_ms),
            encode_bytes(subscription), encode_bytes(m.assignment),
        ]
    return b"".join(parts)


def consumer_group_key(group: str) -> bytes:
    return struct.pack(">h", CONSUMER_GROUP_METADATA_KEY_VERSION) + encode_string(group)


def consumer_group_value(epoch: int) -> bytes:
    """A flexible version: the epoch, then no tagged fields."""
    return struct.pack(">hib", CONSUMER_GROUP_METADATA_VALUE_VERSION, epoch, 0)


# -- decoding ---------------------------------------------------------------------------------

def _read_offset_value(value: bytes) -> OffsetAndMetadata:
    v = Reader(value)
    (vv,) = v.unpack(">h")
    (offset,) = v.unpack(">q")
    epoch = v.unpack(">i")[0] if vv >= 3 else -1
    metadata = v.str()
    (ts,) = v.unpack(">q")
    return OffsetAndMetadata(offset, epoch, metadata, ts)


class PartitionLoader:
    """Kafka's doLoadGroupsAndOffsets for one partition of the topic, batch by batch: each
    record is replayed at once, group records into the registry (the latest record of a group
    id winning), offset records and the transactions' markers into the offsets manager.

    Offsets of transactional batches are pending by producer id until that producer's
    control batch: a COMMIT makes them committed unless a record later in the log already
    committed the partition, anything else drops them. What is still pending at the end
    belongs to a transaction the transaction coordinator will complete. A group with offsets
    but no group record is an Empty classic group without a protocol (Kafka's simple group);
    it goes when its last offset does. A consumer group comes back Empty at its group epoch:
    its members are not stored, so they rejoin.
    """

    def __init__(self, clock: WallClock, partition: int, groups: GroupRegistry,
                 offsets: OffsetMetadataManager) -> None:
        self.clock = clock  # the groups' wall clock
        self.partition = partition
        self.groups = groups
        self.offsets = offsets
        self.records = 0

    def control_batch(self, producer_id: int, control_type: int | None) -> None:
        decided = self.offsets.replay_end_txn_marker(producer_id, self.partition,
                                                     control_type == CONTROL_COMMIT)
        for group_id in decided:
            self._settle(group_id)

    def data_record(self, key: bytes, value: bytes | None, batch_offset: int,
                    producer_id: int | None) -> None:
        """One record; ``producer_id`` is set for records of a transactional batch."""
        self.records += 1
        r = Reader(key)
        (version,) = r.unpack(">h")
        if version in (0, 1):
            group_id, topic = r.str(), r.str()
            (partition,) = r.unpack(">i")
            om = _read_offset_value(value) if value is not None else None
            self.offsets.replay_offset_commit(group_id, (topic, partition), om, batch_offset,
                                              producer_id)
        elif version == 2:
            group_id = r.str()
            self.groups.remove(group_id)
            if value is not None:
                group = GroupMetadata(group_id, clock=self.clock)
                _load_group_value(group, value)
                if group.members or group.protocol_type:
                    self.groups.put(group)
        elif version == CONSUMER_GROUP_METADATA_KEY_VERSION:
            group_id = r.str()
            self.groups.remove(group_id)
            if value is not None:
                epoch = struct.unpack_from(">i", value, 2)[0]
                self.groups.put(ConsumerGroup(group_id=group_id, group_epoch=epoch,
                                              assignment_epoch=epoch, clock=self.clock))
        else:
            logger.warning("unknown key version in __consumer_offsets, ignored", version=version)
            return
        self._settle(group_id)

    def _settle(self, group_id: str) -> None:
        """A group id with offsets and no group is a simple group; a simple group whose
        offsets are all gone is no group."""
        group = self.groups.get(group_id)
        has_offsets = self.offsets.has_offsets(group_id)
        if group is None and has_offsets:
            self.groups.put(GroupMetadata(group_id, clock=self.clock))
        elif (not has_offsets and isinstance(group, GroupMetadata) and not group.members
              and group.protocol_type is None):
            self.groups.remove(group_id)


def _load_group_value(group: GroupMetadata, value: bytes) -> None:
    v = Reader(value)
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

    def __init__(self, replica_manager: ReplicaManager, topics: TopicAdmin, num_partitions: int,
                 clock: WallClock) -> None:
        """``clock``: the broker's wall clock (commit batches' timestamps, loaded groups)."""
        self.clock = clock
        self.replica_manager = replica_manager
        self.topics = topics
        self.num_partitions = num_partitions
        #: False in cluster mode: the topic is the cluster's, created through its controller.
        self.auto_create = True

    def partition_for(self, group_id: str) -> int:
        # The hash with its sign bit masked, not Kafka's Utils.abs: changing it moves groups.
        return (java_string_hash(group_id) & 0x7FFFFFFF) % self.num_partitions

    def ensure_topic(self) -> None:
        """Create the topic when a group first needs it (FindCoordinator, or a write), as Kafka
        creates it, so a fresh broker lists no internal topic."""
        if not self.auto_create:
            return
        info = self.topics.metadata.topics.get(TOPIC)
        if info is None:
            segment_bytes = str(self.topics.config["offsets.topic.segment.bytes"])
            self.topics.create_topic(TOPIC, self.num_partitions,
                                     {"cleanup.policy": "compact", "segment.bytes": segment_bytes})
        else:
            self.num_partitions = info.partitions

    def load(self, groups: GroupRegistry, offsets: OffsetMetadataManager) -> None:
        """Every group stored in the topic into ``groups``, every offset into ``offsets``."""
        info = self.topics.metadata.topics.get(TOPIC)
        if info is None:  # no group was ever stored
            return
        self.num_partitions = info.partitions
        records = 0
        for index in range(self.num_partitions):
            records += self.load_partition(index, groups, offsets)
        if records:
            pending = sum(map(len, offsets.open_transactions_by_group.values()))
            logger.info("group metadata loaded", records=records, groups=len(groups.values()),
                        pending_transactions=pending)

    def load_partition(self, index: int, groups: GroupRegistry,
                       offsets: OffsetMetadataManager) -> int:
        """The groups stored in one partition (up to its high watermark) into ``groups``, its
        offsets into ``offsets``; the count of records read (none when the partition is not
        here)."""
        loader = PartitionLoader(self.clock, index, groups, offsets)
        partition = self.replica_manager.partitions.get((TOPIC, index))
        if partition is not None:
            for data, pos, header in read_batches(partition, partition.high_watermark):
                if header.is_control:
                    try:
                        control_type: int | None = read_end_txn_marker(data, pos)[0]
                    except InvalidRecordError:
                        control_type = None  # Kafka's UNKNOWN control type: not a commit
                    loader.control_batch(header.producer_id, control_type)
                    continue
                producer_id = header.producer_id if header.is_transactional else None
                first: int | None = None
                for rec in batch_records(data, pos, header):
                    if rec.key is None:
                        continue
                    first = rec.offset if first is None else first
                    loader.data_record(bytes(rec.key),
                                       bytes(rec.value) if rec.value is not None else None,
                                       first, producer_id)
        return loader.records

    def write(self, group_id: str, records: list[Record]) -> Completion[ErrorCode]:
        """Append the records to the group's partition; completes once they are committed."""
        return self.append(group_id, records).then(_error)

    def append(self, group_id: str, records: list[Record], *, producer_id: int = -1,
               producer_epoch: int = -1) -> Completion[tuple[ErrorCode, int]]:
        """The records as one batch to the group's partition; with a producer id, a
        transactional one (Kafka's transactional offset commit). Completes with the error and the
        batch's base offset once committed."""
        self.ensure_topic()
        return append_as_coordinator(
            self.replica_manager, (TOPIC, self.partition_for(group_id)), records,
            self.clock.wall_ms(), COMMIT_TIMEOUT_MS, producer_id=producer_id,
            producer_epoch=producer_epoch)


def _error(outcome: tuple[ErrorCode, int]) -> ErrorCode:
    return outcome[0]
