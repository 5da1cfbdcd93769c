"""The coordinator's delayed operations, parked in the project's purgatory (never asyncio sleeps).

DelayedJoin: a rebalance waits until every known member has rejoined, or the rebalance timeout.
InitialDelayedJoin: the first rebalance of an empty group waits group.initial.rebalance.delay.ms,
again while new members keep arriving, up to the rebalance timeout, so a group starting with
several members rebalances once instead of once per member.
A join completes on an event (the last member rejoining), so it is a delayed operation in the
join purgatory; the coordinator's plain deadlines (sessions, a pending member's join, the
SyncGroup deadline) are keyed deadlines on its timer (broker/coordinator/timer.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from purgatory import DelayedOperation

if TYPE_CHECKING:
    from broker.group.classic_group import GroupMetadata
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
