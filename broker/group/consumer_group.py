"""A consumer group of the consumer protocol (KIP-848): its members, epochs and assignments.

The server owns the assignment. Three epochs move it forward:
- the group epoch, bumped whenever what the assignment depends on changes (a member joins,
  leaves or changes its subscription; a subscribed topic appears, disappears or grows);
- the assignment epoch, the group epoch the target assignment was last computed for;
- each member's epoch, which reaches the assignment epoch once the member has reconciled.

Reconciliation (Kafka's CurrentAssignmentBuilder, ``reconcile`` below) moves a member towards
its target one heartbeat at a time: it first revokes what it must give up and stays in its
epoch until its heartbeat no longer reports those partitions (UNREVOKED_PARTITIONS); only then
does it move to the new epoch and receive its new partitions, and only the ones no other
member still holds (UNRELEASED_PARTITIONS until they are released). ``partition_epochs`` says
who holds what: a partition held by a member, assigned or pending revocation, maps to that
member's epoch, so no partition is ever given to two members at once.

Assignments are keyed by topic id, as on the wire: a topic deleted and created again under
the same name is another topic.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from enum import Enum

from broker.group.consumer_member import ConsumerGroupMember, MemberState, Partitions
from purgatory import WallClock


class ConsumerGroupState(Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(eq=False, kw_only=True)
class ConsumerGroup:
    """A consumer group (Kafka's ConsumerGroup). Invariants: `partition_epochs` maps exactly
    the partitions some member holds (assigned or pending revocation) to that member's epoch;
    `static_members` maps each static member's instance id to its member id; the state
    follows from the members and the epochs (update_state)."""

    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerGroupMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target_assignment: dict[str, Partitions] = field(default_factory=dict)
    partition_epochs: dict[tuple[uuid.UUID, int], int] = field(default_factory=dict)
    # Topic name -> (topic id, partition count) of every subscribed topic that exists (Kafka's
    # subscription metadata); a change bumps the group epoch.
    subscription_metadata: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)
    # Topics each member's regex resolved to at its last heartbeat.
    resolved_regex: dict[str, frozenset[str]] = field(default_factory=dict)
    state: ConsumerGroupState = ConsumerGroupState.EMPTY
    #: the coordinator's wall clock: when the state last changed
    clock: WallClock = field(repr=False)
    state_timestamp: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.state_timestamp = self.clock.wall_ms()

    # -- members -------------------------------------------------------------------------
    def static_member(self, instance_id: str) -> ConsumerGroupMember | None:
        member_id = self.static_members.get(instance_id)
        return None if member_id is None else self.members.get(member_id)

    def update_member(self, member: ConsumerGroupMember) -> None:
        """Add or replace a member, keeping the partition epochs and the state in step."""
        old = self.members.get(member.member_id)
        if old is not None:
            self._release(old)
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        self._hold(member)
        self.update_state()

    def remove_member(self, member_id: str) -> ConsumerGroupMember | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        self._release(member)
        if member.instance_id is not None and self.static_members.get(
                member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        self.target_assignment.pop(member_id, None)
        self.resolved_regex.pop(member_id, None)
        self.update_state()
        return member

    def _hold(self, member: ConsumerGroupMember) -> None:
        for parts in (member.assigned, member.pending_revocation):
            for topic_id, indexes in parts.items():
                for p in indexes:
                    self.partition_epochs[(topic_id, p)] = member.member_epoch

    def _release(self, member: ConsumerGroupMember) -> None:
        for parts in (member.assigned, member.pending_revocation):
            for topic_id, indexes in parts.items():
                for p in indexes:
                    self.partition_epochs.pop((topic_id, p), None)

    def current_partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        return self.partition_epochs.get((topic_id, partition), -1)

    # -- state -----------------------------------------------------------------------------
    def update_state(self) -> None:
        """Kafka's maybeUpdateGroupState."""
        if self.state == ConsumerGroupState.DEAD:
            return
        if not self.members:
            new = ConsumerGroupState.EMPTY
        elif self.group_epoch > self.assignment_epoch:
            new = ConsumerGroupState.ASSIGNING
        elif any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            new = ConsumerGroupState.RECONCILING
        else:
            new = ConsumerGroupState.STABLE
        if new != self.state:
            self.state = new
            self.state_timestamp = self.clock.wall_ms()

    def is_(self, *states: ConsumerGroupState) -> bool:
        return self.state in states

    def is_dead(self) -> bool:
        return self.state == ConsumerGroupState.DEAD

    def is_empty(self) -> bool:
        return not self.members

    def is_subscribed_to(self, topic: str) -> bool:
        return topic in self.subscribed_topics()

    def subscribed_topics(self, exclude: str | None = None) -> set[str]:
        """Every topic name some member subscribes to, by name or through its regex."""
        topics: set[str] = set()
        for member_id, m in self.members.items():
            if member_id != exclude:
                topics.update(m.subscribed_topic_names)
                topics.update(self.resolved_regex.get(member_id, ()))
        return topics

    def member_topics(self, member: ConsumerGroupMember) -> frozenset[str]:
        return frozenset(member.subscribed_topic_names) | self.resolved_regex.get(
            member.member_id, frozenset())

    def supports_classic_protocols(self, protocol_type: str, names: set[str]) -> bool:
        """Kafka's supportsClassicProtocols: a classic member joins a consumer group only with
        the consumer protocol type and a protocol every classic member already there has."""
        if not names:
            return False
        if not self.members:
            return True
        classic = [m for m in self.members.values() if m.classic_protocols is not None]
        if protocol_type != "consumer":
            return False
        return any(all(name in {n for n, _ in m.classic_protocols or ()} for m in classic)
                   for name in names)

    def waiting_on_unreleased_partition(self, member: ConsumerGroupMember) -> bool:
        """Some partition of the member's target is still held by another member."""
        for topic_id, parts in self.target_assignment.get(member.member_id, {}).items():
            held = member.assigned.get(topic_id, frozenset())
            if any(p not in held and self.current_partition_epoch(topic_id, p) != -1
                   for p in parts):
                return True
        return False

    def preferred_assignor(self, default: str) -> str:
        """The server assignor most members ask for (Kafka's preferredServerAssignor)."""
        counts: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor is not None:
                counts[m.server_assignor] = counts.get(m.server_assignor, 0) + 1
        if not counts:
            return default
        return max(sorted(counts), key=lambda name: counts[name])


# -- reconciliation (Kafka's CurrentAssignmentBuilder) -----------------------------------------

def owns_any(owned: Iterable[tuple[uuid.UUID | None, Iterable[int]]] | None,
             partitions: Partitions) -> bool:
    """Does the member still report any of ``partitions``? Unknown (None) counts as yes."""
    if owned is None:
        return True
    for topic_id, indexes in owned:
        held = partitions.get(topic_id) if topic_id is not None else None
        if held and any(p in held for p in indexes):
            return True
    return False


def reconcile(member: ConsumerGroupMember, target_epoch: int, target: Partitions,
              partition_epoch: Callable[[uuid.UUID, int], int],
              owned: list[tuple[uuid.UUID | None, list[int]]] | None) -> ConsumerGroupMember:
    """The member's next step towards ``target`` (of ``target_epoch``), given the partitions
    its heartbeat reports as owned (None when the heartbeat did not say)."""
    if member.state == MemberState.STABLE:
        if member.member_epoch == target_epoch:
            return member
        return _next_assignment(member, member.member_epoch, target_epoch, target,
                                partition_epoch, owned)
    if member.state == MemberState.UNREVOKED_PARTITIONS:
        if owns_any(owned, member.pending_revocation):
            return member
        return _next_assignment(member, member.member_epoch + 1, target_epoch, target,
                                partition_epoch, owned)
    return _next_assignment(member, member.member_epoch, target_epoch, target, partition_epoch,
                            owned)


def _next_assignment(member: ConsumerGroupMember, member_epoch: int, target_epoch: int,
                     target: Partitions, partition_epoch: Callable[[uuid.UUID, int], int],
                     owned: list[tuple[uuid.UUID | None, list[int]]] | None
                     ) -> ConsumerGroupMember:
    unreleased = False
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    to_assign: dict[uuid.UUID, frozenset[int]] = {}
    for topic_id in set(target) | set(member.assigned):
        wanted = target.get(topic_id, frozenset())
        current = member.assigned.get(topic_id, frozenset())
        kept = current & wanted
        gone = current - kept
        new = wanted - kept
        free = frozenset(p for p in new if partition_epoch(topic_id, p) == -1)
        unreleased = unreleased or free != new
        if kept:
            assigned[topic_id] = kept
        if gone:
            revoking[topic_id] = gone
        if free:
            to_assign[topic_id] = free
    if revoking and owns_any(owned, revoking):
        # Give up first: stay in this epoch until the heartbeat stops reporting them.
        return replace(member.with_epoch(member_epoch), state=MemberState.UNREVOKED_PARTITIONS,
                       assigned=assigned, pending_revocation=revoking)
    for topic_id, parts in to_assign.items():
        assigned[topic_id] = assigned.get(topic_id, frozenset()) | parts
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return replace(member.with_epoch(target_epoch), state=state, assigned=assigned,
                   pending_revocation={})


def compile_regex(pattern: str) -> re.Pattern[str]:
    """A SubscribedTopicRegex (Kafka uses RE2J; Python's syntax is close for the usual
    patterns). re.error for a bad one."""
    return re.compile(pattern)
