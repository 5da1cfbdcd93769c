"""The leader's view of its followers and of the partition's ISR (Kafka's Replica,
ReplicaState and PartitionState), and the one seam through which an ISR change is committed.

A follower's state moves only with its Fetch requests: the offset it fetches from is its log
end offset, and ``last_caught_up_time_ms`` is the latest time at which it had everything the
leader had (Kafka's rule: a fetch at the leader's end catches it up now; a fetch at the end the
leader had at the previous fetch catches it up as of that fetch).

The ISR is committed by the cluster (``IsrWriter``): a proposed change is pending until the
writer answers, and while it is pending the high watermark counts the "maximal" ISR (the
committed one plus a replica being added, KIP-497), so it never moves on a set the cluster may
still refuse. A shrink is never applied before it is committed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.replica.delayed_result import Completion

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class ReplicaState:
    """One follower of a partition this broker leads, as its fetches told the leader."""

    broker_id: int
    log_end_offset: int = -1
    log_start_offset: int = -1
    #: the leader's log end offset at the follower's previous fetch.
    last_fetch_leader_log_end_offset: int = 0
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0
    #: the broker epoch its last fetch carried (Fetch v15+), None before any fetch.
    broker_epoch: int | None = None

    def update_fetch_state(self, fetch_offset: int, log_start_offset: int, now_ms: int,
                           leader_end_offset: int, broker_epoch: int) -> None:
        """Kafka's updateFetchStateOrThrow, after the broker epoch was checked."""
        if fetch_offset >= leader_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms,
                                              self.last_fetch_time_ms)
        self.log_start_offset = log_start_offset
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end_offset = max(leader_end_offset,
                                                    self.last_fetch_leader_log_end_offset)
        self.last_fetch_time_ms = now_ms
        self.broker_epoch = broker_epoch

    def is_caught_up(self, leader_end_offset: int, now_ms: int, max_lag_ms: int) -> bool:
        """At the leader's end, or caught up within the last ``max_lag_ms``."""
        return (leader_end_offset == self.log_end_offset
                or now_ms - self.last_caught_up_time_ms <= max_lag_ms)

    def reset(self, now_ms: int, leader_end_offset: int, in_sync: bool) -> None:
        """Kafka's resetReplicaState on a new leader epoch of a partition already led: an ISR
        member counts as caught up now, any other not until it fetches."""
        self.last_caught_up_time_ms = now_ms if in_sync else 0
        self.last_fetch_time_ms = now_ms if in_sync else 0
        self.last_fetch_leader_log_end_offset = leader_end_offset


@dataclass(frozen=True, slots=True)
class LeaderAndIsrState:
    """A partition's leader epoch, ISR and partition epoch, as committed by the cluster, or
    proposed to it (the ISR new, the epochs those the proposal is made against)."""

    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int


class IsrFenced(Exception):
    """The cluster refused an ISR change made against an old leader or partition epoch
    (Kafka's FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION): this leader waits for the newer
    state, and steps down if that names another leader."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


class IsrWriter(Protocol):
    """Commits an ISR change (Kafka's AlterPartition): the completion answers the committed
    state, or fails (``IsrFenced``, or any other error: the proposal is dropped and may be made
    again)."""

    def alter_isr(self, tp: TopicPartition, proposed: LeaderAndIsrState
                  ) -> Completion[LeaderAndIsrState]: ...


class LeaderReplication:
    """What a partition led with followers keeps beyond its log (None on a partition without
    followers, whose high watermark is simply its own end): the followers' states, the ISR
    change in flight, the clock and lag its ISR decisions use, and the log end offsets of the
    appends above the high watermark with the byte counts at them (a DelayedFetch's measure)."""

    __slots__ = ("followers", "pending_isr", "clock_ms", "lag_time_max_ms", "local_end_offset",
                 "ends", "_dropped", "broker_epoch_of")

    #: append ends kept above the high watermark; past it the oldest are folded into one
    #: (a high watermark held for long, under min ISR, must not grow memory with each append).
    MAX_ENDS = 65_536

    def __init__(self, followers: dict[int, ReplicaState], clock_ms: Callable[[], int],
                 lag_time_max_ms: int, local_end_offset: int) -> None:
        self.followers = followers
        #: the ISR proposed to the cluster and not yet answered (Kafka's isInflight).
        self.pending_isr: tuple[int, ...] | None = None
        self.clock_ms = clock_ms
        self.lag_time_max_ms = lag_time_max_ms
        #: this replica's own end as the high watermark counts it (durable when gated).
        self.local_end_offset = local_end_offset
        self.ends: deque[tuple[int, int]] = deque()
        self._dropped = (-1, 0)  # the latest end folded away, and its byte count
        #: each live broker's epoch (None: not alive); None: every follower is eligible.
        self.broker_epoch_of: Callable[[int], int | None] | None = None

    def eligible(self, follower: ReplicaState) -> bool:
        """Kafka's isReplicaIsrEligible: the follower's broker is alive, and its fetches
        carried its current broker epoch (or -1, unchecked)."""
        epoch_of = self.broker_epoch_of
        if epoch_of is None:
            return True
        current = epoch_of(follower.broker_id)
        return current is not None and follower.broker_epoch is not None and (
            follower.broker_epoch == -1 or follower.broker_epoch == current)

    def record_end(self, end_offset: int, appended_bytes: int) -> None:
        ends = self.ends
        ends.append((end_offset, appended_bytes))
        if len(ends) > self.MAX_ENDS:
            self._dropped = ends.popleft()

    def bytes_at(self, high_watermark: int, floor: int) -> int:
        """The bytes appended up to the last append end at or below ``high_watermark`` (at
        least ``floor``), forgetting the ends it passed."""
        at_bytes = floor
        if self._dropped[0] <= high_watermark:
            at_bytes = max(at_bytes, self._dropped[1])
        ends = self.ends
        while ends and ends[0][0] <= high_watermark:
            at_bytes = ends.popleft()[1]
        return at_bytes
