"""Group and member state, Kafka's GroupMetadata / MemberMetadata without the locks.

State machine (Kafka's): Empty -> PreparingRebalance -> CompletingRebalance -> Stable, back to
PreparingRebalance when membership changes, and Dead when the group is deleted.

Offsets (Kafka's GroupMetadata offset cache): `offsets` holds what is committed, with the log
offset of the batch each came from in `commit_record_offsets`, so a transactional commit that
completes later than a plain commit of the same partition written after it does not overwrite
it (Kafka's CommitRecordMetadataAndOffset.olderThan). Commits on their way to the log are
pending: plain ones in `pending_offset_commits`, transactional ones by producer id in
`pending_txn_offset_commits` until the transaction's marker is written (KIP-98); both make an
OffsetFetch with require_stable answer UNSTABLE_OFFSET_COMMIT (KIP-447).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from broker.replica.delayed_result import Completion
from purgatory import WallClock


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


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


@dataclass(slots=True)
class JoinResult:
    """What a JoinGroup response carries; `members` is filled for the leader only."""

    error: int
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    member_id: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(eq=False)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    awaiting_join: Completion[JoinResult] | None = None
    awaiting_sync: Completion[tuple[int, bytes]] | None = None
    is_new: bool = True

    def has_satisfied_heartbeat(self) -> bool:
        """Kafka's rule: awaiting a JoinGroup or SyncGroup answer keeps a member alive, except
        a new member's first join, which its own join timeout bounds."""
        if self.is_new:
            return False
        return self.awaiting_join is not None or self.awaiting_sync is not None

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        raise KeyError(protocol)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass(eq=False, kw_only=True)
class GroupOffsets:
    """A group's offset cache (Kafka's GroupMetadata offset cache), the same for a classic and a
    consumer group: the group id is the offsets' key whatever protocol its members speak."""

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

@dataclass(eq=False)
class GroupMetadata(GroupOffsets):
    """A classic group (JoinGroup/SyncGroup)."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    pending_members: set[str] = field(default_factory=set)
    pending_sync: set[str] = field(default_factory=set)  # joined, SyncGroup not yet received
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    # A member joined while the first rebalance's initial delay ran: extend it once more.
    new_member_added: bool = False
    #: the coordinator's wall clock: when the state last changed (offset expiry counts from it)
    clock: WallClock = field(kw_only=True, repr=False)
    state_timestamp: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.state_timestamp = self.clock.wall_ms()

    def transition(self, state: GroupState) -> None:
        self.state = state
        self.state_timestamp = self.clock.wall_ms()

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    def is_dead(self) -> bool:
        return self.state == GroupState.DEAD

    def is_empty(self) -> bool:
        return self.state == GroupState.EMPTY

    @property
    def empty(self) -> bool:
        return not self.members and not self.pending_members

    def add(self, member: MemberMetadata) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id

    def rename(self, old_id: str, new_id: str) -> None:
        """A static member continues under a new member id, keeping its metadata."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)

    def remove(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        self.pending_members.discard(member_id)
        if member is not None and member.group_instance_id is not None:
            if self.static_members.get(member.group_instance_id) == member_id:
                del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """A joining member must share the protocol type and one protocol with everyone."""
        if not self.members:
            return bool(protocol_type) and bool(protocols)
        names = {name for name, _ in protocols}
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Each member votes for its most preferred candidate; most votes wins (Kafka)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def all_members_joined(self) -> bool:
        return not self.pending_members and all(
            m.awaiting_join is not None for m in self.members.values()
        )

    def max_rebalance_timeout(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
