"""A classic group (Kafka's ClassicGroup, GroupMetadata before it), without the locks.

State machine (Kafka's): Empty -> PreparingRebalance -> CompletingRebalance -> Stable, back to
PreparingRebalance when membership changes, and Dead when the group is deleted. Invariants:
`leader_id` is a member (or None when there are none); `static_members` maps each static
member's instance id to its current member id; `pending_sync` is a subset of the members.
Its committed offsets are not here: the OffsetMetadataManager holds them by group id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from broker.group.classic_member import MemberMetadata
from protocol.errors import ErrorCode
from purgatory import WallClock


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(eq=False)
class GroupMetadata:
    """A classic group (JoinGroup/SyncGroup); the invariants are the module's."""

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

    def static_member(self, instance_id: str) -> MemberMetadata | None:
        member_id = self.static_members.get(instance_id)
        return None if member_id is None else self.members.get(member_id)

    def remove_pending_member(self, member_id: str) -> bool:
        """Forget a member id handed out with MEMBER_ID_REQUIRED; whether it was one."""
        return _take(self.pending_members, member_id)

    def sync_received(self, member_id: str) -> bool:
        """The member's SyncGroup of this generation arrived; whether it was awaited."""
        return _take(self.pending_sync, member_id)

    def current_member(self, member_id: str, instance_id: str | None, generation_id: int
                       ) -> MemberMetadata | ErrorCode:
        """The member a SyncGroup, Heartbeat or OffsetCommit speaks for, or why it is not one:
        the group is gone, the static instance is another member's, the member is unknown,
        or it is of another generation."""
        if self.state == GroupState.DEAD:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if instance_id is not None and self.static_members.get(instance_id) != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
        member = self.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
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


def _take(ids: set[str], member_id: str) -> bool:
    """Remove ``member_id`` from ``ids`` in one lookup; whether it was there."""
    try:
        ids.remove(member_id)
    except KeyError:
        return False
    return True
