"""The transaction log: `__transaction_state`, Kafka's layouts, written through the ReplicaManager.

One record per transition, keyed by transactional id (TransactionLogKey version 0: the id) with
a TransactionLogValue version 0 (producer id, epoch, timeout, state, the partitions, last update
and start timestamps), or a null value (a tombstone) when an id expires. The topic is compacted,
so the latest record of an id is its state: loading replays the partitions in offset order and
keeps the last value of each id. Appends use acks=-1, so a transition is applied (and the client
answered) only once the high watermark covers its record, as in Kafka's appendTransactionToLog.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from broker.coordinator.records import (
    Reader,
    append_as_coordinator,
    encode_string,
    java_string_hash,
    read_records,
)
from broker.txn.transaction_metadata import TransactionMetadata, TransactionState, TxnTransit
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.metadata.topic_admin import TopicAdmin
    from broker.replica.delayed_result import Completion
    from broker.replica.replica_manager import ReplicaManager

logger = structlog.get_logger("broker.txn")

TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0  # the highest non-flexible one, what Kafka writes below transaction.version 2
TopicPartition = tuple[str, int]


def partition_for(transactional_id: str, num_partitions: int) -> int:
    """Kafka's Utils.abs(hashCode) % partitions: the absolute value, and 0 for MIN_VALUE (not
    the hash with its sign bit masked, which places a negative hash elsewhere)."""
    h = java_string_hash(transactional_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


# -- the codec -------------------------------------------------------------------------------------

def key_bytes(transactional_id: str) -> bytes:
    return struct.pack(">h", KEY_VERSION) + encode_string(transactional_id)


def value_bytes(t: TxnTransit) -> bytes:
    """TransactionLogValue v0; an Empty transaction has a null partition list, as in Kafka."""
    parts = [struct.pack(">hqhib", VALUE_VERSION, t.producer_id, t.producer_epoch,
                         t.txn_timeout_ms, int(t.state))]
    if t.state == TransactionState.EMPTY:
        if t.topic_partitions:
            raise ValueError("an Empty transaction has no partitions")
        parts.append(struct.pack(">i", -1))
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, index in sorted(t.topic_partitions):
            by_topic.setdefault(topic, []).append(index)
        parts.append(struct.pack(">i", len(by_topic)))
        for topic, indexes in by_topic.items():
            parts += [encode_string(topic),
                      struct.pack(f">i{len(indexes)}i", len(indexes), *indexes)]
    parts.append(struct.pack(">qq", t.txn_last_update_timestamp, t.txn_start_timestamp))
    return b"".join(parts)


def read_key(data: bytes) -> str | None:
    """The transactional id, or None for a key version this broker does not know."""
    r = Reader(data)
    (version,) = r.unpack(">h")
    return r.str() if version == KEY_VERSION else None


def read_value(transactional_id: str, data: bytes | None) -> TransactionMetadata | None:
    """The state a value records (None for a tombstone). Version 1 (flexible, written by Kafka
    under transaction.version 2) is read too; its tagged fields are skipped."""
    if data is None:
        return None
    r = Reader(data)
    (version,) = r.unpack(">h")
    if version not in (0, 1):
        raise ValueError(f"unknown TransactionLogValue version {version}")
    flexible = version == 1
    producer_id, epoch, timeout, status = r.unpack(">qhib")
    partitions: set[TopicPartition] = set()
    count = r.uvarint() - 1 if flexible else r.unpack(">i")[0]
    for _ in range(max(count, 0)):
        topic = r.compact_str() if flexible else r.str()
        n = r.uvarint() - 1 if flexible else r.unpack(">i")[0]
        partitions.update((topic, p) for p in r.unpack(f">{n}i"))
        if flexible:
            r.skip_tags()
    last_update, start = r.unpack(">qq")
    state = TransactionState(status)
    return TransactionMetadata(
        transactional_id, producer_id, epoch, timeout, state, last_update,
        topic_partitions=set() if state == TransactionState.EMPTY else partitions,
        txn_start_timestamp=start)


# -- the topic ---------------------------------------------------------------------------------

class TransactionStateLog:
    """Creates, loads and appends `__transaction_state` through the ReplicaManager."""

    def __init__(self, replica_manager: ReplicaManager, topics: TopicAdmin, num_partitions: int,
                 segment_bytes: int, wall_ms: Callable[[], int]) -> None:
        self.replica_manager = replica_manager
        self.topics = topics
        self.num_partitions = num_partitions
        self.segment_bytes = segment_bytes
        self._wall_ms = wall_ms

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.num_partitions)

    @property
    def exists(self) -> bool:
        return TOPIC in self.topics.metadata.topics

    def use_existing(self) -> bool:
        """At start: an existing topic keeps its partition count (ids must not move)."""
        info = self.topics.metadata.topics.get(TOPIC)
        if info is not None:
            self.num_partitions = info.partitions
        return info is not None

    def ensure_topic(self) -> None:
        """Created on first need, as Kafka's auto topic creation does for a transactional
        FindCoordinator, with Kafka's transactionTopicConfigs: compacted, uncompressed, its own
        segment size."""
        if not self.use_existing():
            self.topics.create_topic(TOPIC, self.num_partitions, {
                "cleanup.policy": "compact", "compression.type": "uncompressed",
                "segment.bytes": str(self.segment_bytes)})

    def coordinator_epoch(self, transactional_id: str) -> int:
        """The leader epoch of the id's partition: what markers carry as the coordinator epoch."""
        p = self.replica_manager.partitions.get((TOPIC, self.partition_for(transactional_id)))
        return p.leader_epoch if p is not None else 0

    def load(self) -> dict[str, TransactionMetadata]:
        """Every partition replayed: the latest record of an id wins, a tombstone removes it."""
        loaded: dict[str, TransactionMetadata] = {}
        records = 0
        for index in range(self.num_partitions):
            records += self._replay(index, loaded)
        if records:
            logger.info("transaction metadata loaded", records=records, transactions=len(loaded))
        return loaded

    def load_partition(self, index: int) -> dict[str, TransactionMetadata]:
        """One partition replayed (nothing when it is not here)."""
        loaded: dict[str, TransactionMetadata] = {}
        self._replay(index, loaded)
        return loaded

    def _replay(self, index: int, loaded: dict[str, TransactionMetadata]) -> int:
        """The partition's records into ``loaded``, in offset order; the count read."""
        partition = self.replica_manager.partitions.get((TOPIC, index))
        if partition is None:
            return 0
        records = 0
        for key, value in read_records(partition, partition.log_end_offset):
            if key is None:
                continue
            tid = read_key(key)
            if tid is None:
                logger.warning("unknown transaction log key version", partition=index)
                continue
            records += 1
            md = read_value(tid, value)
            if md is None:
                loaded.pop(tid, None)
            else:
                loaded[tid] = md
        return records

    def append(self, transactional_id: str, value: bytes | None, timeout_ms: int
               ) -> Completion[tuple[ErrorCode, int]]:
        """One record (a value or a tombstone); completes with the append's error (and the
        record's offset) once committed."""
        return append_as_coordinator(
            self.replica_manager, (TOPIC, self.partition_for(transactional_id)),
            [(key_bytes(transactional_id), value)], self._wall_ms(), timeout_ms)
