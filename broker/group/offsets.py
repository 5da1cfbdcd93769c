"""OffsetMetadataManager: the groups' committed offsets (Kafka's OffsetMetadataManager).

It owns the offsets and every operation on them, for classic and consumer groups alike:
OffsetCommit, TxnOffsetCommit, OffsetFetch, OffsetDelete, the deletion of a deleted group's
offsets, the transactions' markers, expiry (offsets.retention.minutes) and whether a group has
offsets at all. As in Kafka 4 the offsets live in this manager's own maps, keyed by group id
(offset_cache.py), apart from the group objects of the registry: a group changing protocol
keeps them and a group object carries none. The coordinators keep membership and hand this
manager what it needs of it as callbacks; the loader replays `__consumer_offsets` into it.

Transactional offset commits (KIP-98, KIP-447) are written at once as a transactional batch
but stay pending, by producer id, until the transaction coordinator has the transaction's
marker written to the group's partition and calls handle_txn_completion; only then do they
become the group's committed offsets (commit) or vanish (abort). Invariants: a producer is in
`open_transactions_by_group[g]` from its first transactional commit to g until the marker
(or the failure of its only append), even if OffsetDelete removed its pending offsets
meanwhile (Kafka's openTransactionsByGroup); a committed offset never gives way to one from an
earlier batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import structlog

from broker.group.classic_group import GroupMetadata, GroupState
from broker.group.consumer_group import ConsumerGroup
from broker.group.offset_cache import LoggedOffset, Offsets
from broker.group.offsets_store import offset_key, offset_value
from broker.replica.delayed_result import Completion, completed
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.coordinator.records import Record
    from broker.group.consumer_member import ConsumerGroupMember
    from broker.group.offset_cache import OffsetAndMetadata
    from broker.group.offsets_store import OffsetsStore
    from broker.group.registry import Group, GroupRegistry
    from purgatory import WallClock

logger = structlog.get_logger("broker.group")

S = GroupState
TopicPartition = tuple[str, int]
MAX_METADATA = 4096  # Kafka's offset.metadata.max.bytes


class OffsetMetadataManager:
    """Holds, commits, fetches, deletes and expires the groups' offsets; completes
    transactional ones.

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
        # What is committed, with the log offset of each offset's batch.
        self.offsets: Offsets[LoggedOffset] = Offsets()
        # Plain commits on their way to the log.
        self.pending_offset_commits: Offsets[OffsetAndMetadata] = Offsets()
        # Producer id -> its transactional commits awaiting the transaction's marker.
        self.pending_transactional_offsets: dict[int, Offsets[LoggedOffset]] = {}
        # Group id -> the producers with an open transaction that committed offsets to it.
        self.open_transactions_by_group: dict[str, set[int]] = {}

    def clear(self) -> None:
        """Forget every offset: the coordinator is about to load the log again."""
        self.offsets = Offsets()
        self.pending_offset_commits = Offsets()
        self.pending_transactional_offsets.clear()
        self.open_transactions_by_group.clear()

    def unload_group(self, group_id: str) -> None:
        """The group's partition is led elsewhere now (Kafka's removeGroupsForPartition): its
        offsets, commits on their way and open transactions leave this broker with it."""
        self.offsets.remove_group(group_id)
        self.pending_offset_commits.remove_group(group_id)
        for producer_id in self.open_transactions_by_group.pop(group_id, ()):
            pending = self.pending_transactional_offsets.get(producer_id)
            if pending is not None:
                pending.remove_group(group_id)
                if not pending:
                    del self.pending_transactional_offsets[producer_id]

    # -- what the group has ----------------------------------------------------------------
    def has_offsets(self, group_id: str) -> bool:
        """Kafka's hasOffsets: an Empty group without any is dead at the next cleanup; a
        commit on its way or an open transaction keeps it, since the transaction's marker may
        still commit its offsets."""
        return (self.offsets.has_group(group_id)
                or self.pending_offset_commits.has_group(group_id)
                or group_id in self.open_transactions_by_group)

    def committed(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (the metrics read them)."""
        return {tp: e.offset_and_metadata for tp, e in self.offsets.items(group_id)}

    def committed_topics(self, group_id: str) -> set[str]:
        return self.offsets.topics(group_id)

    def has_pending_offset_commits_for(self, group_id: str, tp: TopicPartition) -> bool:
        """A plain or transactional commit of the partition is still undecided (KIP-447)."""
        if self.pending_offset_commits.get(group_id, tp) is not None:
            return True
        return any(self._pending_txn(producer_id, group_id, tp) is not None
                   for producer_id in self.open_transactions_by_group.get(group_id, ()))

    def _pending_txn(self, producer_id: int, group_id: str, tp: TopicPartition
                     ) -> LoggedOffset | None:
        pending = self.pending_transactional_offsets.get(producer_id)
        return pending.get(group_id, tp) if pending is not None else None

    def _older_than(self, group_id: str, tp: TopicPartition, batch_offset: int) -> bool:
        """No committed offset for the partition, or one from a batch before
        ``batch_offset``."""
        current = self.offsets.get(group_id, tp)
        return current is None or (
            -1 if current.batch_offset is None else current.batch_offset) < batch_offset

    def _put_committed(self, group_id: str, tp: TopicPartition, om: OffsetAndMetadata,
                       batch_offset: int) -> None:
        self.offsets.put(group_id, tp, LoggedOffset(om, batch_offset))

    # -- replaying __consumer_offsets ------------------------------------------------------
    def replay_offset_commit(self, group_id: str, tp: TopicPartition,
                             om: OffsetAndMetadata | None, batch_offset: int,
                             producer_id: int | None) -> None:
        """One offset record read back (Kafka's OffsetMetadataManager.replay): a plain one is
        committed (a tombstone removes the committed offset), a transactional one pending for
        its producer (a tombstone removes that pending offset) until the producer's marker."""
        if producer_id is None:
            if om is None:
                self.offsets.remove(group_id, tp)
            else:
                self._put_committed(group_id, tp, om, batch_offset)
            return
        if om is None:
            self._remove_pending_txn(producer_id, group_id, tp)
            self._close_if_nothing_pending(producer_id, group_id)
        else:
            self._put_pending_txn(producer_id, group_id, tp, LoggedOffset(om, batch_offset))

    def replay_end_txn_marker(self, producer_id: int, partition: int, commit: bool
                              ) -> list[str]:
        """The producer's control batch read back in a partition of __consumer_offsets: its
        pending offsets of the groups there are committed (unless a record later in the log
        already committed the partition) or dropped. Returns those groups' ids."""
        return self._complete_txn(producer_id, {partition}, commit)

    # -- OffsetCommit ----------------------------------------------------------------------
    def commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], api_version: int = 8,
    ) -> Completion[dict[TopicPartition, ErrorCode]]:
        """OffsetCommit; ``generation_id`` is a member epoch for a consumer group (v9+)."""
        found = self.groups.get(group_id)
        if isinstance(found, ConsumerGroup):
            error = _consumer_commit_error(found, member_id, generation_id,
                                           transactional=False, api_version=api_version,
                                           held=lambda m: self._held(m, offsets))
        else:
            error = _check_commit(found, member_id, instance_id, generation_id)
            if found is None and error == ErrorCode.ILLEGAL_GENERATION and api_version >= 9:
                error = ErrorCode.GROUP_ID_NOT_FOUND  # Kafka's answer from v9, both protocols
            if error is None and found is None:
                self.groups.put(GroupMetadata(group_id, clock=self.clock))  # a simple group
            elif error is None and found is not None:
                self._keep_session(found, member_id)
        if error is not None:
            return completed({tp: error for tp in offsets})
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
        for tp, om in accepted.items():
            self.pending_offset_commits.put(group_id, tp, om)

        def stored(f: Completion[tuple[ErrorCode, int]]) -> None:
            code, batch_offset = f.result()
            for tp, om in accepted.items():
                if code == ErrorCode.NONE:
                    self._on_offset_commit_append(group_id, tp, om, batch_offset)
                elif self.pending_offset_commits.get(group_id, tp) == om:
                    self.pending_offset_commits.remove(group_id, tp)
            if code != ErrorCode.NONE:
                code = _commit_error(code)
            answer.set_result({**results, **{tp: code for tp in accepted}})

        self.store.append(group_id, _commit_records(group_id, accepted)).add_done_callback(stored)
        return answer

    def _on_offset_commit_append(self, group_id: str, tp: TopicPartition,
                                 om: OffsetAndMetadata, batch_offset: int) -> None:
        """A plain commit is in the log: it wins unless a later record already did, and a
        commit removed meanwhile (OffsetDelete, the group deleted) stays removed."""
        pending = self.pending_offset_commits.get(group_id, tp)
        if pending is not None and self._older_than(group_id, tp, batch_offset):
            self._put_committed(group_id, tp, om, batch_offset)
        if pending == om:
            self.pending_offset_commits.remove(group_id, tp)

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
        found = self.groups.get(group_id)
        if isinstance(found, ConsumerGroup):
            error = _consumer_commit_error(found, member_id, generation_id,
                                           transactional=True, api_version=-1,
                                           held=lambda m: self._held(m, known))
            if error == ErrorCode.STALE_MEMBER_EPOCH:
                error = ErrorCode.ILLEGAL_GENERATION  # what a producer understands
        else:
            if found is None:
                found = GroupMetadata(group_id, clock=self.clock)
                self.groups.put(found)
            error = _validate_txn_offset_commit(found, generation_id, member_id,
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
        for tp, om in accepted.items():
            self._put_pending_txn(producer_id, group_id, tp, LoggedOffset(om))
        answer: Completion[dict[TopicPartition, ErrorCode]] = Completion()

        def stored(f: Completion[tuple[ErrorCode, int]]) -> None:
            code, batch_offset = f.result()
            for tp, om in accepted.items():
                pending = self._pending_txn(producer_id, group_id, tp)
                if code != ErrorCode.NONE:
                    # The record never reached the log: the client is told and retries.
                    self._remove_pending_txn(producer_id, group_id, tp)
                elif pending is not None and pending.offset_and_metadata == om:
                    pending.batch_offset = batch_offset
            if code != ErrorCode.NONE:
                self._close_if_nothing_pending(producer_id, group_id)
                logger.info("transactional offset commit failed", group=group_id,
                            producer_id=producer_id, error=code.name)
                code = offset_commit_error(code)
            answer.set_result({**results, **{tp: code for tp in accepted}})

        self.store.append(group_id, _commit_records(group_id, accepted), producer_id=producer_id,
                          producer_epoch=producer_epoch).add_done_callback(stored)
        return answer

    def _put_pending_txn(self, producer_id: int, group_id: str, tp: TopicPartition,
                         pending: LoggedOffset) -> None:
        self.pending_transactional_offsets.setdefault(producer_id, Offsets()).put(
            group_id, tp, pending)
        self.open_transactions_by_group.setdefault(group_id, set()).add(producer_id)

    def _remove_pending_txn(self, producer_id: int, group_id: str, tp: TopicPartition) -> None:
        """Drop one pending offset; the transaction stays open for the group (its marker
        closes it)."""
        pending = self.pending_transactional_offsets.get(producer_id)
        if pending is not None:
            pending.remove(group_id, tp)
            if not pending:
                del self.pending_transactional_offsets[producer_id]

    def _close_if_nothing_pending(self, producer_id: int, group_id: str) -> None:
        """A failed append left the producer nothing pending for the group: it no longer
        holds the group open."""
        pending = self.pending_transactional_offsets.get(producer_id)
        if pending is None or not pending.has_group(group_id):
            self._close_txn(producer_id, group_id)

    def _close_txn(self, producer_id: int, group_id: str) -> None:
        producers = self.open_transactions_by_group.get(group_id)
        if producers is not None:
            producers.discard(producer_id)
            if not producers:
                del self.open_transactions_by_group[group_id]

    def handle_txn_completion(self, producer_id: int, offsets_partitions: Iterable[int],
                              commit: bool) -> None:
        """The transaction's marker is durable in these __consumer_offsets partitions: the
        producer's pending offsets of the groups there are committed or dropped (Kafka's
        GroupMetadataManager.handleTxnCompletion)."""
        self._complete_txn(producer_id, set(offsets_partitions), commit)

    def _complete_txn(self, producer_id: int, partitions: set[int], commit: bool
                      ) -> list[str]:
        """On commit the producer's pending offsets of the groups in ``partitions`` become
        committed, except where a record later in the log already committed that partition;
        on abort they are dropped. Only the groups with an open transaction are looked at."""
        group_ids = [g for g, producers in self.open_transactions_by_group.items()
                     if producer_id in producers and self.store.partition_for(g) in partitions]
        pending = self.pending_transactional_offsets.get(producer_id)
        for group_id in group_ids:
            decided = pending.remove_group(group_id) if pending is not None else {}
            changed = 0
            for tp, p in decided.items():
                if commit and p.batch_offset is not None and self._older_than(
                        group_id, tp, p.batch_offset):
                    # (None: never appended; its failure was answered to the producer.)
                    self._put_committed(group_id, tp, p.offset_and_metadata, p.batch_offset)
                    changed += 1
            self._close_txn(producer_id, group_id)
            logger.debug("transactional offsets completed", group=group_id,
                         producer_id=producer_id, commit=commit, committed=changed)
        if pending is not None and not pending:
            del self.pending_transactional_offsets[producer_id]
        return group_ids

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
        wanted = self.offsets.partitions(group_id) if partitions is None else partitions
        found: dict[TopicPartition, OffsetAndMetadata | ErrorCode | None] = {}
        for tp in wanted:
            if require_stable and self.has_pending_offset_commits_for(group_id, tp):
                found[tp] = ErrorCode.UNSTABLE_OFFSET_COMMIT
            else:
                committed = self.offsets.get(group_id, tp)
                found[tp] = committed.offset_and_metadata if committed is not None else None
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
            subscribed = _classic_subscribed_topics(group, self.committed_topics(group_id))
        results = {tp: (ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in subscribed
                        else ErrorCode.NONE) for tp in partitions}
        removed = self._remove_offsets(
            group_id, [tp for tp, e in results.items() if e == ErrorCode.NONE])
        records = _tombstones(group_id, removed)
        if isinstance(group, GroupMetadata):
            records += self._maybe_delete_group(group)
        if not records:
            return completed((ErrorCode.NONE, results))
        answer: Completion[tuple[ErrorCode, dict[TopicPartition, ErrorCode]]] = Completion()
        self.store.write(group_id, records).add_done_callback(
            lambda f: answer.set_result((ErrorCode.NONE, results)))
        return answer

    def _remove_offsets(self, group_id: str, partitions: Iterable[TopicPartition]
                        ) -> list[TopicPartition]:
        """Drop the partitions' committed and pending offsets (OffsetDelete); returns those
        that were committed, which need tombstones. Open transactions stay open."""
        removed = []
        for tp in partitions:
            self.pending_offset_commits.remove(group_id, tp)
            for producer_id in list(self.open_transactions_by_group.get(group_id, ())):
                self._remove_pending_txn(producer_id, group_id, tp)
            if self.offsets.remove(group_id, tp) is not None:
                removed.append(tp)
        return removed

    def delete_all_offsets(self, group: Group) -> list[Record]:
        """Kafka's deleteAllOffsets, for a group being deleted: its offsets, committed and
        pending, go, and its open transactions with them; returns the committed ones'
        tombstones."""
        group_id = group.group_id
        self.pending_offset_commits.remove_group(group_id)
        for producer_id in self.open_transactions_by_group.pop(group_id, set()):
            pending = self.pending_transactional_offsets.get(producer_id)
            if pending is not None:
                pending.remove_group(group_id)
                if not pending:
                    del self.pending_transactional_offsets[producer_id]
        return _tombstones(group_id, self.offsets.remove_group(group_id))

    def _maybe_delete_group(self, group: GroupMetadata) -> list[Record]:
        """Kafka's cleanupGroupMetadata: an Empty group with no offsets left, committed or
        pending, is dead and forgotten. Pending transactional offsets keep the group: their
        marker may still commit them."""
        if not group.is_(S.EMPTY) or self.has_offsets(group.group_id):
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
        gid = group.group_id
        retention_ms = self.retention_ms
        expired = [tp for tp, e in self.offsets.items(gid)
                   if self.pending_offset_commits.get(gid, tp) is None
                   and now - (group.state_timestamp if group.protocol_type is not None
                              else e.offset_and_metadata.commit_timestamp) >= retention_ms]
        self._forget(gid, expired)
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
        expired = [tp for tp, e in self.offsets.items(gid)
                   if tp[0] not in subscribed
                   and not self.has_pending_offset_commits_for(gid, tp)
                   and now - e.offset_and_metadata.commit_timestamp >= self.retention_ms]
        self._forget(gid, expired)
        records = _tombstones(gid, expired)
        if group.is_empty() and not self.has_offsets(gid):
            records += self._delete_group(group)
            logger.info("empty consumer group without offsets removed", group=gid)
        if records:
            self.store.write(gid, records)
        if expired:
            logger.info("offsets expired", group=gid, partitions=len(expired))
        return len(expired)

    def _forget(self, group_id: str, expired: list[TopicPartition]) -> None:
        """Drop expired committed offsets (their pending commits, if any, were excluded)."""
        for tp in expired:
            self.offsets.remove(group_id, tp)


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


def _classic_subscribed_topics(group: GroupMetadata, committed_topics: set[str]) -> set[str]:
    """Topics of the members' consumer-protocol subscriptions (all those with committed
    offsets, if unreadable)."""
    if group.is_(S.EMPTY) or group.protocol_type != "consumer" or not group.protocol_name:
        return set()
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

    topics: set[str] = set()
    for m in group.members.values():
        try:
            sub = ConsumerProtocolSubscription.decode(m.metadata_for(group.protocol_name))
            topics.update(sub.topics)
        except Exception:
            return committed_topics
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
