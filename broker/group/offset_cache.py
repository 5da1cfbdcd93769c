"""A group's offset cache (Kafka's GroupMetadata offset cache), the same for both protocols.

`offsets` holds what is committed, with the log offset of the batch each came from in
`commit_record_offsets`, so a transactional commit that completes later than a plain commit of
the same partition written after it does not overwrite it (Kafka's
CommitRecordMetadataAndOffset.olderThan). Commits on their way to the log are pending: plain
ones in `pending_offset_commits`, transactional ones by producer id in
`pending_txn_offset_commits` until the transaction's marker is written (KIP-98); both make an
OffsetFetch with require_stable answer UNSTABLE_OFFSET_COMMIT (KIP-447). The operations on
offsets (commit, fetch, delete, markers, expiry) are the OffsetMetadataManager's (offsets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


@dataclass(slots=True)
class PendingTxnOffset:
    """A transactional offset commit awaiting its transaction's marker. ``batch_offset`` is
    the log offset of its batch in __consumer_offsets, None until the append is acknowledged."""

    offset_and_metadata: OffsetAndMetadata
    batch_offset: int | None = None


@dataclass(eq=False, kw_only=True)
class GroupOffsets:
    """A group's offset cache (Kafka's GroupMetadata offset cache), the same for a classic and a
    consumer group: the group id is the offsets' key whatever protocol its members speak.
    Invariants: a committed offset never gives way to one from an earlier batch; a pending
    transactional commit's batch offset is None until its append is acknowledged."""

    offsets: dict[tuple[str, int], OffsetAndMetadata] = field(default_factory=dict)
    # Log offset of the batch holding each committed offset (-1: unknown, older than any).
    commit_record_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    pending_offset_commits: dict[tuple[str, int], OffsetAndMetadata] = field(
        default_factory=dict)
    pending_txn_offset_commits: dict[int, dict[tuple[str, int], PendingTxnOffset]] = field(
        default_factory=dict)

    def take_offsets(self, other: GroupOffsets) -> None:
        """Adopt another group object's offsets: the group changed protocol (an empty group
        may), its committed offsets stay."""
        self.offsets = other.offsets
        self.commit_record_offsets = other.commit_record_offsets
        self.pending_offset_commits = other.pending_offset_commits
        self.pending_txn_offset_commits = other.pending_txn_offset_commits

    def put_offset(self, tp: tuple[str, int], om: OffsetAndMetadata, batch_offset: int) -> None:
        self.offsets[tp] = om
        self.commit_record_offsets[tp] = batch_offset

    def _older_than(self, tp: tuple[str, int], batch_offset: int) -> bool:
        """No committed offset for ``tp``, or one from a batch before ``batch_offset``."""
        return tp not in self.offsets or self.commit_record_offsets.get(tp, -1) < batch_offset

    def prepare_offset_commit(self, offsets: dict[tuple[str, int], OffsetAndMetadata]) -> None:
        self.pending_offset_commits.update(offsets)

    def on_offset_commit_append(self, tp: tuple[str, int], om: OffsetAndMetadata,
                                batch_offset: int) -> None:
        """A plain commit is in the log: it wins unless a later record already did, and a
        commit removed meanwhile (OffsetDelete, the topic deleted) stays removed."""
        if tp in self.pending_offset_commits and self._older_than(tp, batch_offset):
            self.put_offset(tp, om, batch_offset)
        if self.pending_offset_commits.get(tp) == om:
            del self.pending_offset_commits[tp]

    def fail_pending_offset_write(self, tp: tuple[str, int], om: OffsetAndMetadata) -> None:
        if self.pending_offset_commits.get(tp) == om:
            del self.pending_offset_commits[tp]

    def prepare_txn_offset_commit(self, producer_id: int,
                                  offsets: dict[tuple[str, int], OffsetAndMetadata]) -> None:
        pending = self.pending_txn_offset_commits.setdefault(producer_id, {})
        for tp, om in offsets.items():
            pending[tp] = PendingTxnOffset(om)

    def on_txn_offset_commit_append(self, producer_id: int, tp: tuple[str, int],
                                    om: OffsetAndMetadata, batch_offset: int) -> None:
        pending = self.pending_txn_offset_commits.get(producer_id, {}).get(tp)
        if pending is not None and pending.offset_and_metadata == om:
            pending.batch_offset = batch_offset

    def fail_pending_txn_offset_commit(self, producer_id: int, tp: tuple[str, int]) -> None:
        """The commit's record never reached the log: the client is told and retries."""
        pending = self.pending_txn_offset_commits.get(producer_id)
        if pending is None:
            return
        pending.pop(tp, None)
        if not pending:
            del self.pending_txn_offset_commits[producer_id]

    def complete_pending_txn_offset_commit(self, producer_id: int, commit: bool
                                           ) -> list[tuple[str, int]]:
        """The transaction's marker is written: on commit its offsets become committed, except
        where a record later in the log already committed that partition; on abort they are
        dropped. Returns the partitions whose committed offset changed."""
        pending = self.pending_txn_offset_commits.pop(producer_id, None)
        if not commit or pending is None:
            return []
        changed = []
        for tp, p in pending.items():
            if p.batch_offset is None:
                continue  # never appended: its failure was answered to the producer
            if self._older_than(tp, p.batch_offset):
                self.put_offset(tp, p.offset_and_metadata, p.batch_offset)
                changed.append(tp)
        return changed

    def has_pending_offset_commits_from_producer(self, producer_id: int) -> bool:
        return producer_id in self.pending_txn_offset_commits

    def has_pending_offset_commits_for(self, tp: tuple[str, int]) -> bool:
        return tp in self.pending_offset_commits or any(
            tp in pending for pending in self.pending_txn_offset_commits.values())

    def has_offsets(self) -> bool:
        """Kafka's hasOffsets: an Empty group without any is dead at the next cleanup; pending
        transactional offsets keep it, since their marker may still commit them."""
        return bool(self.offsets or self.pending_offset_commits
                    or self.pending_txn_offset_commits)

    def remove_offsets(self, partitions: list[tuple[str, int]]
                       ) -> dict[tuple[str, int], OffsetAndMetadata]:
        """Drop the partitions' committed and pending offsets (OffsetDelete, DeleteGroups);
        returns the committed ones removed, which need tombstones."""
        removed = {}
        for tp in partitions:
            self.pending_offset_commits.pop(tp, None)
            for pending in self.pending_txn_offset_commits.values():
                pending.pop(tp, None)
            om = self.offsets.pop(tp, None)
            self.commit_record_offsets.pop(tp, None)
            if om is not None:
                removed[tp] = om
        return removed
