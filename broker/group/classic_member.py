"""A member of a classic group (Kafka's ClassicGroupMember) and the JoinGroup answer it awaits.

A member is in at most one of two waits: its JoinGroup parked until the rebalance's join phase
ends (`awaiting_join`), or its SyncGroup until the leader's assignment is stored
(`awaiting_sync`); either keeps its session alive, except a new member's first join.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode


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
    awaiting_sync: Completion[tuple[ErrorCode, bytes]] | None = None
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
