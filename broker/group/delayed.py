"""The coordinator's delayed operations, parked in the project's purgatory (never asyncio sleeps).

DelayedJoin: a rebalance waits until every known member has rejoined, or the rebalance timeout.
InitialDelayedJoin: the first rebalance of an empty group waits group.initial.rebalance.delay.ms,
again while new members keep arriving, up to the rebalance timeout, so a group starting with
several members rebalances once instead of once per member.
DelayedSync: after a join, members that send no SyncGroup within the rebalance timeout are
removed and the group rebalances.
DelayedHeartbeat: a member's session; a heartbeat satisfies it and a new one is scheduled, and
its expiry removes the member. A member awaiting its JoinGroup or SyncGroup answer cannot
heartbeat (its client waits on the broker), so it counts as alive then, as in Kafka; a new
member's first join is bounded by the coordinator's new-member join timeout instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from purgatory import DelayedOperation

if TYPE_CHECKING:
    from broker.group.classic_group import GroupMetadata, MemberMetadata
    from broker.group.coordinator import GroupCoordinator


class DelayedJoin(DelayedOperation):
    def __init__(self, coordinator: GroupCoordinator, group: GroupMetadata, timeout_ms: int
                 ) -> None:
        super().__init__(timeout_ms)
        self.coordinator = coordinator
        self.group = group

    def try_complete(self) -> bool:
        if self.group.all_members_joined():
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.coordinator.complete_join(self.group)

    def on_expiration(self) -> None:
        pass


class InitialDelayedJoin(DelayedJoin):
    def __init__(self, coordinator: GroupCoordinator, group: GroupMetadata, configured_ms: int,
                 delay_ms: int, remaining_ms: int) -> None:
        super().__init__(coordinator, group, delay_ms)
        self.configured_ms = configured_ms
        self.delay_ms = delay_ms
        self.remaining_ms = remaining_ms

    def try_complete(self) -> bool:
        return False  # only the delay ends it

    def on_complete(self) -> None:
        group = self.group
        if group.new_member_added and self.remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.configured_ms, self.remaining_ms)
            nxt = InitialDelayedJoin(self.coordinator, group, self.configured_ms, delay,
                                     max(self.remaining_ms - self.delay_ms, 0))
            self.coordinator.park_join(nxt)
        else:
            super().on_complete()


class DelayedHeartbeat(DelayedOperation):
    def __init__(self, coordinator: GroupCoordinator, group: GroupMetadata,
                 member: MemberMetadata, timeout_ms: int) -> None:
        super().__init__(timeout_ms)
        self.coordinator = coordinator
        self.group = group
        self.member = member

    def try_complete(self) -> bool:
        if self.member.has_satisfied_heartbeat() or self.group.members.get(
                self.member.member_id) is not self.member:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self.coordinator.expire_member(self.group, self.member)


class DelayedPendingMember(DelayedOperation):
    """A member id handed out with MEMBER_ID_REQUIRED must come back within the session."""

    def __init__(self, coordinator: GroupCoordinator, group: GroupMetadata, member_id: str,
                 timeout_ms: int) -> None:
        super().__init__(timeout_ms)
        self.coordinator = coordinator
        self.group = group
        self.member_id = member_id

    def try_complete(self) -> bool:
        if self.member_id not in self.group.pending_members:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self.coordinator.expire_pending(self.group, self.member_id)


class DelayedSync(DelayedOperation):
    """After a join, every member must send SyncGroup within the rebalance timeout."""

    def __init__(self, coordinator: GroupCoordinator, group: GroupMetadata, generation: int,
                 timeout_ms: int) -> None:
        super().__init__(timeout_ms)
        self.coordinator = coordinator
        self.group = group
        self.generation = generation

    def try_complete(self) -> bool:
        if not self.group.pending_sync or self.group.generation_id != self.generation:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        self.coordinator.expire_pending_sync(self.group, self.generation)
