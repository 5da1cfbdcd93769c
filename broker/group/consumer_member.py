"""A member of a consumer group of the consumer protocol (Kafka's ConsumerGroupMember).

Immutable: every change is a new value, compared with the old one to see what changed.
Invariants: `member_epoch` is at most the group's assignment epoch; `assigned` and
`pending_revocation` are disjoint; `previous_assigned` is what it held at
`previous_member_epoch`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

#: Assigned partitions: topic id -> partition indexes.
Partitions = Mapping[uuid.UUID, frozenset[int]]

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class MemberState(Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass(frozen=True, slots=True)
class ConsumerGroupMember:
    """One member, immutable: every change is a new value, compared with the old one to see
    what changed (Kafka's ConsumerGroupMember and its Builder)."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    # What it was assigned at previous_member_epoch: a commit sent at that epoch for a
    # partition it has held since is still the owner's (see the coordinator's commit check).
    previous_assigned: Partitions = field(default_factory=dict)
    # A member speaking the classic protocol (JoinGroup/SyncGroup) inside a consumer group:
    # its session timeout and its protocols (name, subscription), as it joined.
    classic_session_timeout_ms: int | None = None
    classic_protocols: tuple[tuple[str, bytes], ...] | None = None

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic_protocols is not None

    def is_reconciled_to(self, epoch: int) -> bool:
        return self.state == MemberState.STABLE and self.member_epoch == epoch

    def with_epoch(self, epoch: int) -> ConsumerGroupMember:
        """Kafka's Builder.updateMemberEpoch: the previous epoch is kept for a lost answer."""
        return replace(self, previous_member_epoch=self.member_epoch, member_epoch=epoch,
                       previous_assigned=self.assigned)
