"""OffsetMetadataManager: the groups' committed offsets (Kafka's OffsetMetadataManager).

It owns every operation on offsets, for classic and consumer groups alike: OffsetCommit,
TxnOffsetCommit, OffsetFetch, OffsetDelete, the deletion of a deleted group's offsets, the
transactions' markers and expiry (offsets.retention.minutes). The offsets themselves live in
each group's offset cache (offset_cache.py), found through the registry; the coordinators
keep membership and hand this manager what it needs of it as callbacks.

Transactional offset commits (KIP-98, KIP-447) are written at once as a transactional batch
but stay pending, by producer id, until the transaction coordinator has the transaction's
marker written to the group's partition and calls handle_txn_completion; only then do they
become the group's committed offsets (commit) or vanish (abort). Invariant: a producer is in
`open_groups_for_producer` exactly while some group holds offsets pending for it, or while
its append is on its way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import structlog

from broker.group.classic_group import GroupMetadata, GroupState
from broker.group.consumer_group import ConsumerGroup
from broker.group.offsets_store import offset_key, offset_value
from broker.replica.delayed_result import Completion, completed
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.coordinator.records import Record
    from broker.group.consumer_member import ConsumerGroupMember
    from broker.group.offset_cache import GroupOffsets, OffsetAndMetadata
    from broker.group.offsets_store import OffsetsStore
    from broker.group.registry import Group, GroupRegistry
    from purgatory import WallClock

logger = structlog.get_logger("broker.group")

S = GroupState
TopicPartition = tuple[str, int]
MAX_METADATA = 4096  # Kafka's offset.metadata.max.bytes


class OffsetMetadataManager:
    """Commits, fetches, deletes and expires the groups' offsets; completes transactional ones.

    ``keep_session``: a classic member's commit keeps its session; ``held``: whether a
    consumer-group member has held the partitions since its previous epoch; ``delete_group``:
    forget an Empty group left without offsets and return its metadata's tombstone, if any.
    """

    def __init__(self, registry: GroupRegistry, store: OffsetsStore, clock: WallClock,
                 retention_ms: int, partition_exists: Callable[[TopicPartition], bool],
                 keep_session: Callable[[GroupMetadata, str], None],
                 held: Callable[[ConsumerGroupMember, Iterable[TopicPartition]], bool],
                 delete_group: Callable[[Group], list[Record]]) -> None:
        self.groups = registry
        self.store = store
        self.clock = clock
        self.retention_ms = retention_ms
        self._partition_exists = partition_exists
        self._keep_session = keep_session
        self._held = held
        self._delete_group = delete_group
        # Kafka's openGroupsForProducer: the groups holding a producer's pending transactional
        # offsets, so a marker finds them without scanning every group.
        self.open_groups_for_producer: dict[int, set[str]] = {}

    def loaded(self) -> None:
        """The groups were read back from the log: index their pending transactional offsets."""
        self.open_groups_for_producer.clear()
        for group in self.groups.values():
            for producer_id in group.pending_txn_offset_commits:
                self.open_groups_for_producer.setdefault(producer_id, set()).add(group.group_id)

    # -- OffsetCommit ----------------------------------------------------------------------
    def commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], api_version: int = 8,
    ) -> Completion[dict[TopicPartition, ErrorCode]]:
        """OffsetCommit; ``generation_id`` is a member epoch for a consumer group (v9+)."""
        found = self.groups.get(group_id)
        group: GroupOffsets | None
        if isinstance(found, ConsumerGroup):
            error = _consumer_commit_error(found, member_id, generation_id,
                                           transactional=False, api_version=api_version,
                                           held=lambda m: self._held(m, offsets))
            group = found
        else:
            classic = found
            error = _check_commit(classic, member_id, instance_id, generation_id)
            if classic is None and error == ErrorCode.ILLEGAL_GENERATION and api_version >= 9:
                error = ErrorCode.GROUP_ID_NOT_FOUND  # Kafka's answer from v9, both protocols
            if error is None and classic is None:
                classic = GroupMetadata(group_id, clock=self.clock)
                self.groups.put(classic)
            elif error is None and classic is not None:
                self._keep_session(classic, member_id)
            group = classic
        if error is not None:
            return completed({tp: error for tp in offsets})
        assert group is not None
        results: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in offsets.items():
            if len(om.metadata.encode()) > MAX_METADATA:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            elif not self._partition_exists(tp):
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                accepted[tp] = om
        if not accepted:
            return completed(results)
        answer: Completion[dict[TopicPartition, ErrorCode]] = Completion()
        group.prepare_offset_commit(accepted)

        def stored(f: Completion[tuple[ErrorCode, int]]) -> None:
            code, batch_offset = f.result()
            if not group.is_dead():
                for tp, om in accepted.items():
                    if code == ErrorCode.NONE:
                        group.on_offset_commit_append(tp, om, batch_offset)
                    else:
                        group.fail_pending_offset_write(tp, om)
            if code != ErrorCode.NONE:
                code = _commit_error(code)
            answer.set_result({**results, **{tp: code for tp in accepted}})

        self.store.append(group_id, _commit_records(group_id, accepted)).add_done_callback(stored)
        return answer

    # -- TxnOffsetCommit and the transactions' markers ---------------------------------------
    def commit_transactional_offsets(
        self, group_id: str, producer_id: int, producer_epoch: int, member_id: str,
        group_instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> Completion[dict[TopicPartition, ErrorCode]]:
        """TxnOffsetCommit: the offsets go to the log now, as one transactional batch of the
        producer, and stay pending until the transaction's marker (Kafka's
        handleTxnCommitOffsets and storeOffsets with a producer id).

        A group that does not exist is created Empty, as Kafka does. Requests before v3 carry
        no member id nor generation (-1, ""), so only v3+ are checked against the group.
        Whether the offsets partition is in the producer's transaction is the caller's check.
        """
        results: dict[TopicPartition, ErrorCode] = {}
        known: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in offsets.items():
            if self._partition_exists(tp):
                known[tp] = om
            else:
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if not known:
            return completed(results)
        if not group_id:
            return completed({**results, **{tp: ErrorCode.INVALID_GROUP_ID for tp in known}})
        group: GroupOffsets
        found = self.groups.get(group_id)
        if isinstance(found, ConsumerGroup):
            group = found
            error = _consumer_commit_error(found, member_id, generation_id,
                                           transactional=True, api_version=-1,
                                           held=lambda m: self._held(m, known))
            if error == ErrorCode.STALE_MEMBER_EPOCH:
                error = ErrorCode.ILLEGAL_GENERATION  # what a producer understands
        else:
            classic = found
            if classic is None:
                classic = GroupMetadata(group_id, clock=self.clock)
                self.groups.put(classic)
            group = classic
            error = _validate_txn_offset_commit(classic, generation_id, member_id,
                                                group_instance_id)
        if error is not None:
            return completed({**results, **{tp: error for tp in known}})
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in known.items():
            if len(om.metadata.encode()) > MAX_METADATA:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[tp] = om
        if not accepted:
            return completed(results)
        self.open_groups_for_producer.setdefault(producer_id, set()).add(group_id)
        group.prepare_txn_offset_commit(producer_id, accepted)
        answer: Completion[dict[TopicPartition, ErrorCode]] = Completion()

        def stored(f: Completion[tuple[ErrorCode, int]]) -> None:
            code, batch_offset = f.result()
            if not group.is_dead():
                for tp, om in accepted.items():
                    if code == ErrorCode.NONE:
                        group.on_txn_offset_commit_append(producer_id, tp, om, batch_offset)
                    else:
                        group.fail_pending_txn_offset_commit(producer_id, tp)
                if code != ErrorCode.NONE and not group.has_pending_offset_commits_from_producer(
                        producer_id):
                    self._remove_producer_group(producer_id, group_id)
            if code != ErrorCode.NONE:
                logger.info("transactional offset commit failed", group=group_id,
                            producer_id=producer_id, error=code.name)
                code = offset_commit_error(code)
            answer.set_result({**results, **{tp: code for tp in accepted}})

        self.store.append(group_id, _commit_records(group_id, accepted), producer_id=producer_id,
                          producer_epoch=producer_epoch).add_done_callback(stored)
        return answer

    def handle_txn_completion(self, producer_id: int, offsets_partitions: Iterable[int],
                              commit: bool) -> None:
        """The transaction's marker is durable in these __consumer_offsets partitions: the
        producer's pending offsets of the groups there are committed or dropped (Kafka's
        GroupMetadataManager.handleTxnCompletion)."""
        partitions = set(offsets_partitions)
        groups = [g for g in self.open_groups_for_producer.get(producer_id, ())
                  if self.store.partition_for(g) in partitions]
        for group_id in groups:
            group = self.groups.get(group_id)
            if group is not None and not group.is_dead():
                changed = group.complete_pending_txn_offset_commit(producer_id, commit)
                logger.debug("transactional offsets completed", group=group_id,
                             producer_id=producer_id, commit=commit, committed=len(changed))
            self._remove_producer_group(producer_id, group_id)

    def _remove_producer_group(self, producer_id: int, group_id: str) -> None:
        groups = self.open_groups_for_producer.get(producer_id)
        if groups is not None:
            groups.discard(group_id)
            if not groups:
                del self.open_groups_for_producer[producer_id]

    # -- OffsetFetch -----------------------------------------------------------------------
    def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None,
                      require_stable: bool = False
                      ) -> dict[TopicPartition, OffsetAndMetadata | ErrorCode | None]:
        """Committed offsets (None where there is none; every committed partition when
        ``partitions`` is None). With ``require_stable`` (KIP-447) a partition with a commit
        still pending, transactional or not, answers UNSTABLE_OFFSET_COMMIT instead, so a
        consumer taking over does not start from an offset its predecessor's open
        transaction is about to replace (Kafka's getOffsets)."""
        group = self.groups.get(group_id)
        if group is None or group.is_dead():
            return {} if partitions is None else {tp: None for tp in partitions}
        wanted = list(group.offsets) if partitions is None else partitions
        found: dict[TopicPartition, OffsetAndMetadata | ErrorCode | None] = {}
        for tp in wanted:
            if require_stable and group.has_pending_offset_commits_for(tp):
                found[tp] = ErrorCode.UNSTABLE_OFFSET_COMMIT
            else:
                found[tp] = group.offsets.get(tp)
        return found

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int
                              ) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetFetch (OffsetFetch v9+): a member of a consumer
        group fetches at its current epoch; without member id and epoch (admin tools, classic
        members) the fetch is not checked."""
        group = self.groups.get_consumer(group_id)
        if group is None or (member_id is None and member_epoch < 0):
            return None
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return None

    # -- OffsetDelete, DeleteGroups --------------------------------------------------------
    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]
                       ) -> Completion[tuple[ErrorCode, dict[TopicPartition, ErrorCode]]]:
        group = self.groups.get(group_id)
        if group is None or group.is_dead():
            return completed((ErrorCode.GROUP_ID_NOT_FOUND, {}))
        if isinstance(group, ConsumerGroup):
            subscribed = group.subscribed_topics()
        else:
            subscribed = _classic_subscribed_topics(group)
        results = {tp: (ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in subscribed
                        else ErrorCode.NONE) for tp in partitions}
        removed = group.remove_offsets([tp for tp, e in results.items() if e == ErrorCode.NONE])
        records = _tombstones(group_id, removed)
        if isinstance(group, GroupMetadata):
            records += self._maybe_delete_group(group)
        if not records:
            return completed((ErrorCode.NONE, results))
        answer: Completion[tuple[ErrorCode, dict[TopicPartition, ErrorCode]]] = Completion()
        self.store.write(group_id, records).add_done_callback(
            lambda f: answer.set_result((ErrorCode.NONE, results)))
        return answer

    def delete_all_offsets(self, group: Group) -> list[Record]:
        """Kafka's deleteAllOffsets, for a group being deleted: its offsets, committed and
        pending, go; returns the committed ones' tombstones."""
        return _tombstones(group.group_id, group.remove_offsets(list(group.offsets)))

    def _maybe_delete_group(self, group: GroupMetadata) -> list[Record]:
        """Kafka's cleanupGroupMetadata: an Empty group with no offsets left, committed or
        pending, is dead and forgotten. Pending transactional offsets keep the group: their
        marker may still commit them."""
        if not group.is_(S.EMPTY) or group.has_offsets():
            return []
        return self._delete_group(group)

    # -- expiry ----------------------------------------------------------------------------
    def expire_offsets(self) -> int:
        """offsets.retention.minutes (Kafka's removeExpiredOffsets): committed offsets of
        groups Empty for that long, or of standalone groups by their commit time, are
        deleted; an offset with a plain commit on its way is kept. Pending transactional
        offsets never expire here: the transaction's marker decides them."""
        now = self.clock.wall_ms()
        removed = 0
        for group in self.groups.classic_groups():
            if group.is_(S.EMPTY):
                removed += self._expire_classic_group_offsets(group, now)
        for consumer_group in self.groups.consumer_groups():
            removed += self._expire_consumer_group_offsets(consumer_group, now)
        return removed

    def _expire_classic_group_offsets(self, group: GroupMetadata, now: int) -> int:
        """An Empty classic group's offsets expire together, counted from when it became
        Empty; a standalone group's (no protocol) each by its own commit time."""
        retention_ms = self.retention_ms
        if group.protocol_type is not None:
            expired = [tp for tp in group.offsets if tp not in group.pending_offset_commits
                       and now - group.state_timestamp >= retention_ms]
        else:
            expired = [tp for tp, om in group.offsets.items()
                       if tp not in group.pending_offset_commits
                       and now - om.commit_timestamp >= retention_ms]
        gid = group.group_id
        _forget(group, expired)
        records = _tombstones(gid, expired)
        records += self._maybe_delete_group(group)
        if not records:
            return 0
        self.store.write(gid, records)
        if expired:
            logger.info("offsets expired", group=gid, partitions=len(expired))
        return len(expired)

    def _expire_consumer_group_offsets(self, group: ConsumerGroup, now: int) -> int:
        """Kafka's cleanupExpiredOffsets for a consumer group: offsets of topics no member
        subscribes to expire by their commit time; an Empty group left without offsets is
        deleted."""
        gid = group.group_id
        subscribed = group.subscribed_topics()
        expired = [tp for tp, om in group.offsets.items()
                   if tp[0] not in subscribed and not group.has_pending_offset_commits_for(tp)
                   and now - om.commit_timestamp >= self.retention_ms]
        _forget(group, expired)
        records = _tombstones(gid, expired)
        if group.is_empty() and not group.has_offsets():
            records += self._delete_group(group)
            logger.info("empty consumer group without offsets removed", group=gid)
        if records:
            self.store.write(gid, records)
        if expired:
            logger.info("offsets expired", group=gid, partitions=len(expired))
        return len(expired)


def _forget(group: GroupOffsets, expired: list[TopicPartition]) -> None:
    """Drop expired committed offsets (their pending commits, if any, were excluded)."""
    for tp in expired:
        del group.offsets[tp]
        group.commit_record_offsets.pop(tp, None)


def _commit_records(group_id: str, offsets: dict[TopicPartition, OffsetAndMetadata]
                    ) -> list[Record]:
    return [(offset_key(group_id, t, p), offset_value(om)) for (t, p), om in offsets.items()]


def _tombstones(group_id: str, partitions: Iterable[TopicPartition]) -> list[Record]:
    return [(offset_key(group_id, t, p), None) for t, p in partitions]


# -- the commit checks ---------------------------------------------------------------------------

def _check_commit(group: GroupMetadata | None, member_id: str, instance_id: str | None,
                  generation_id: int) -> ErrorCode | None:
    """An OffsetCommit to a classic group (or to none): a standalone consumer commits with no
    generation to an Empty or absent group; a member at its generation, outside the wait for
    the assignment."""
    if generation_id < 0 and (group is None or group.is_(S.EMPTY)):
        return None  # a standalone consumer (assign + commit), no membership
    if group is None:
        return ErrorCode.ILLEGAL_GENERATION
    member = group.current_member(member_id, instance_id, generation_id)
    if isinstance(member, ErrorCode):
        return member
    if group.is_(S.COMPLETING_REBALANCE):
        return ErrorCode.REBALANCE_IN_PROGRESS
    return None


def _validate_txn_offset_commit(group: GroupMetadata, generation_id: int, member_id: str,
                                instance_id: str | None) -> ErrorCode | None:
    """Kafka's validateOffsetCommit for a transactional commit. One with no member nor
    generation (TxnOffsetCommit before v3) is accepted whatever the group's state."""
    if group.is_(S.DEAD):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if generation_id < 0 and group.is_(S.EMPTY):
        return None
    if generation_id >= 0 or member_id or instance_id is not None:
        error = _validate_current_member(group, member_id, instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
    return None


def _validate_current_member(group: GroupMetadata, member_id: str, instance_id: str | None
                             ) -> ErrorCode | None:
    """Kafka's validateCurrentMember: a static instance must map to this member id (an
    unknown instance is an unknown member), and the member must be in the group."""
    if instance_id is not None:
        current = group.static_members.get(instance_id)
        if current is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if current != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
    if member_id not in group.members:
        return ErrorCode.UNKNOWN_MEMBER_ID
    return None


def _consumer_commit_error(group: ConsumerGroup, member_id: str, member_epoch: int, *,
                           transactional: bool, api_version: int,
                           held: Callable[[ConsumerGroupMember], bool]) -> ErrorCode | None:
    """Kafka's ConsumerGroup.validateOffsetCommit: without an epoch only an Empty group takes
    commits (admin tools, assign() consumers); a member commits at its current epoch, with
    OffsetCommit v9+.

    A commit one epoch behind is taken when the member has held every partition it commits
    since that epoch, as Kafka 4.3 relaxed the check (KIP-1251): the client sent it before
    reading the heartbeat answer that moved it on, and librdkafka hands STALE_MEMBER_EPOCH to
    the application."""
    if member_epoch < 0 and group.is_empty():
        return None
    member = group.members.get(member_id)
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if member.uses_classic_protocol:
        # A classic member's generation is its member epoch.
        return None if member_epoch == member.member_epoch else ErrorCode.ILLEGAL_GENERATION
    if not transactional and api_version < 9:
        return ErrorCode.UNSUPPORTED_VERSION
    if member_epoch != member.member_epoch:
        if member_epoch == member.previous_member_epoch and held(member):
            return None
        return ErrorCode.STALE_MEMBER_EPOCH
    return None


def _classic_subscribed_topics(group: GroupMetadata) -> set[str]:
    """Topics of the members' consumer-protocol subscriptions (all, if unreadable)."""
    if group.is_(S.EMPTY) or group.protocol_type != "consumer" or not group.protocol_name:
        return set()
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

    topics: set[str] = set()
    for m in group.members.values():
        try:
            sub = ConsumerProtocolSubscription.decode(m.metadata_for(group.protocol_name))
            topics.update(sub.topics)
        except Exception:
            return {tp[0] for tp in group.offsets}
    return topics


# -- what a failed append means to the client ----------------------------------------------------

def _commit_error(append_error: ErrorCode) -> ErrorCode:
    """What a failed append to __consumer_offsets means to a committing client (Kafka's
    GroupMetadataManager): its coordinator moved or failed, or the commit was too large."""
    if append_error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if append_error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE,
                        ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return ErrorCode.COORDINATOR_NOT_AVAILABLE


def offset_commit_error(error: ErrorCode) -> ErrorCode:
    """Kafka's GroupMetadataManager.maybeConvertOffsetCommitError, for transactional offset
    commits: a failed append or verification as a producer understands it. Fencing and
    transaction-state errors (INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE ...) pass unchanged."""
    if error == ErrorCode.NETWORK_EXCEPTION:
        # Retriable, and without a needless coordinator lookup.
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    if error in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                 ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE,
                 ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return error
