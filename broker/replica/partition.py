"""Replica state of one partition on this broker: its log, high watermark and leader epoch.

The high watermark is the offset up to which data counts as committed. This replica's own
part in it is the offset made durable as the flush policy defines it: every append once
written when the policy does not fsync per message, and the last fsynced offset when it does
(log.flush.interval.messages=1). With no followers (a single broker, replication factor 1)
that is the high watermark. A partition led with followers (``replication``, Kafka's
Partition as leader, docs/replication.md) takes the least log end offset of the maximal ISR
and of the followers caught up enough to join it, and does not move it while the ISR is
smaller than min.insync.replicas (at most the replication factor), as Kafka's
maybeIncrementLeaderHW.

A partition whose log dir failed is offline (Kafka's HostedPartition.Offline): it stays known
to the broker, so requests for it are answered KAFKA_STORAGE_ERROR rather than as unknown, and
its high watermark stays where the last good write (or fsync) put it.

The leader epoch is Kafka's: 0 on a single broker, set by ``make_leader`` when the cluster
elects this replica leader in a new epoch. Every batch appended is stamped with it, and the
start of each epoch goes into the log's epoch cache; requests that carry a client's idea of
the epoch are checked against it (``check_leader_epoch``, Kafka's checkCurrentLeaderEpoch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from broker.log.log import AppendInfo, AppendOrigin, Log, OffsetOutOfRangeError
from broker.replica.replica_state import LeaderAndIsrState, LeaderReplication, ReplicaState
from protocol.errors import ErrorCode, KafkaError

#: a request's current leader epoch meaning "do not check" (Kafka's NO_PARTITION_LEADER_EPOCH).
NO_LEADER_EPOCH = -1

#: DeleteRecords' offset meaning "up to the high watermark" (Kafka's DeleteRecordsRequest).
HIGH_WATERMARK = -1


class Partition:
    __slots__ = (
        "topic", "index", "key", "log", "high_watermark", "leader_epoch", "hw_gated_by_flush",
        "appended_bytes", "hw_bytes", "flush_pending", "flush_again", "_unwritten",
        "leader_epoch_start_offset", "replication", "broker_id", "isr", "partition_epoch",
        "min_insync_replicas", "leader_id", "restored_high_watermark",
    )

    #: bumped whenever any partition's leader epoch changes: answers that hold leader epochs
    #: (the Metadata cache) compare it to know they are stale.
    leader_epoch_changes = 0

    def __init__(self, topic: str, index: int, log: Log, hw_gated_by_flush: bool) -> None:
        self.topic = topic
        self.index = index
        # (topic, index), made once: every dict keyed by partition shares this one tuple.
        self.key: tuple[str, int] = (topic, index)
        self.log = log
        self.high_watermark = log.log_end_offset  # recovered data is durable
        log.on_high_watermark_updated(self.high_watermark)
        # A single broker leads in the latest epoch its log knows (0 for a new log); the
        # cluster moves it on with make_leader.
        epoch = max(log.latest_epoch or 0, 0)
        self.leader_epoch = epoch
        #: the log end offset when this replica became leader in its epoch (Kafka's
        #: leaderEpochStartOffsetOpt).
        self.leader_epoch_start_offset = log.log_end_offset
        if not log.offline:
            log.maybe_assign_epoch_start_offset(epoch, log.log_end_offset)
        self.hw_gated_by_flush = hw_gated_by_flush
        # Bytes appended since start, and that count at the high watermark: a DelayedFetch
        # estimates what became readable from their difference without reading the log.
        self.appended_bytes = 0
        self.hw_bytes = 0
        self.flush_pending = False
        self.flush_again = False
        # (end offset, appended bytes) of each append still queued for the log dir's writer;
        # made on the first such append (an empty deque is 600 bytes, times every partition).
        self._unwritten: deque[tuple[int, int]] | None = None
        #: followers and ISR in flight; None while this replica has no followers.
        self.replication: LeaderReplication | None = None
        self.broker_id = -1  # this broker's id in the cluster; -1 on a single broker
        #: the committed ISR (this replica alone until the cluster says otherwise).
        self.isr: tuple[int, ...] = (self.broker_id,)
        self.partition_epoch = -1
        self.min_insync_replicas = 1  # min.insync.replicas of the topic
        #: the broker leading it, while this replica follows (-1 when it leads)
        self.leader_id = -1
        #: the high watermark checkpointed before the broker started (capped to the log),
        #: taken when it first leads with followers; dropped once it leads without.
        self.restored_high_watermark: int | None = None

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def offline(self) -> bool:
        """Whether its log dir failed; it stays offline until the broker restarts."""
        return self.log.offline

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: below it every transaction is decided; read_committed reads stop here."""
        first_unstable = self.log.first_unstable_offset
        hw = self.high_watermark
        return hw if first_unstable is None or first_unstable >= hw else first_unstable

    @property
    def low_watermark(self) -> int:
        """Kafka's lowWatermarkIfLeader: the least log start offset of this replica and the
        followers on live brokers (-1 for one that has not fetched yet), so the offset below
        which no live replica still holds data."""
        low = self.log.log_start_offset
        replication = self.replication
        if replication is None:
            return low
        alive = replication.broker_epoch_of
        for f in replication.followers.values():
            if f.log_start_offset < low and (alive is None or alive(f.broker_id) is not None):
                low = f.log_start_offset
        return low

    def make_leader(self, leader_epoch: int) -> bool:
        """Lead in ``leader_epoch`` (Kafka's makeLeader): a newer epoch starts at the log end
        offset, in the epoch cache too; the current one changes nothing; an older one is
        refused (ValueError: the cluster never goes back). Whether the epoch is new."""
        if leader_epoch < self.leader_epoch:
            raise ValueError(f"leader epoch {leader_epoch} of {self.topic}-{self.index} is "
                             f"older than the current {self.leader_epoch}")
        self.leader_id = -1
        if leader_epoch == self.leader_epoch:
            return False
        Partition.leader_epoch_changes += 1
        self.leader_epoch = leader_epoch
        log = self.log
        self.leader_epoch_start_offset = log.log_end_offset
        if not log.offline:
            log.maybe_assign_epoch_start_offset(leader_epoch, log.log_end_offset)
        return True

    def check_leader_epoch(self, current_leader_epoch: int) -> ErrorCode:
        """Kafka's checkCurrentLeaderEpoch: a client whose epoch is older than ours is
        fenced, a newer one knows of an epoch we do not yet; -1 is not checked."""
        if current_leader_epoch == NO_LEADER_EPOCH:
            return ErrorCode.NONE
        if current_leader_epoch < self.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if current_leader_epoch > self.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        return ErrorCode.NONE

    def last_offset_for_leader_epoch(self, current_leader_epoch: int, leader_epoch: int
                                     ) -> tuple[ErrorCode, int, int]:
        """OffsetForLeaderEpoch for this partition (Kafka's lastOffsetForLeaderEpoch):
        ``(error, epoch, end offset)``, -1 and -1 when the epoch cache has no answer."""
        error = self.check_leader_epoch(current_leader_epoch)
        if error != ErrorCode.NONE:
            return error, -1, -1
        found = self.log.end_offset_for_epoch(leader_epoch)
        if found is None:
            return ErrorCode.NONE, -1, -1
        return ErrorCode.NONE, found[0], found[1]

    def diverging_epoch(self, current_leader_epoch: int, last_fetched_epoch: int,
                        fetch_offset: int) -> tuple[int, int] | None:
        """Kafka's divergence check of a fetch with a LastFetchedEpoch (Fetch v12+, Partition's
        readRecords): ``(epoch, end offset)`` of this log for ``last_fetched_epoch`` when the
        fetcher's log diverged from it (the epoch ends here before ``fetch_offset``, or only an
        older epoch is known), None when it did not. OffsetOutOfRangeError when the epoch has
        no end offset here (newer than every known epoch), or ``fetch_offset`` is below the
        log start offset, diverged or not."""
        error, epoch, end_offset = self.last_offset_for_leader_epoch(current_leader_epoch,
                                                                     last_fetched_epoch)
        if error != ErrorCode.NONE:
            raise KafkaError(error, f"leader epoch {current_leader_epoch} of "
                                    f"{self.topic}-{self.index} is not {self.leader_epoch}")
        if epoch < 0 or end_offset < 0:
            raise OffsetOutOfRangeError(
                f"could not determine the end offset of the last fetched epoch "
                f"{last_fetched_epoch} of {self.topic}-{self.index}")
        start = self.log_start_offset
        if fetch_offset < start:
            raise OffsetOutOfRangeError(
                f"fetch offset {fetch_offset} of {self.topic}-{self.index} is below the log "
                f"start offset {start} (log end {self.log_end_offset})")
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    def delete_records(self, offset: int) -> tuple[int, int]:
        """Kafka's deleteRecordsOnLeader: move the log start offset up to ``offset``
        (HIGH_WATERMARK: the high watermark); the low watermark now, and the offset it must
        reach for the deletion to be complete on every replica.

        Refused with POLICY_VIOLATION when the cleanup policy lacks ``delete`` (a compacted
        log keeps its latest values), and OFFSET_OUT_OF_RANGE below 0 or past the high
        watermark: records not yet committed can not be deleted. An offset at or below the
        current start changes nothing.
        """
        log = self.log
        if not log.config.delete:
            raise KafkaError(ErrorCode.POLICY_VIOLATION,
                             f"records of partition {self.topic}-{self.index} can not be "
                             "deleted due to the configured policy")
        hw = self.high_watermark
        target = hw if offset == HIGH_WATERMARK else offset
        if target < 0:
            raise OffsetOutOfRangeError(
                f"the offset {target} for partition {self.topic}-{self.index} is not valid")
        if target > hw:
            raise OffsetOutOfRangeError(
                f"can not move the log start offset of {self.topic}-{self.index} to {target}: "
                f"past the high watermark {hw}")
        log.maybe_increment_log_start_offset(target, "client record deletion")
        return self.low_watermark, target

    def append(self, records: bytearray | memoryview | bytes, now_ms: int,
               origin: AppendOrigin = AppendOrigin.CLIENT) -> tuple[AppendInfo, bool]:
        """Append as leader; returns the append info and whether the high watermark moved."""
        return self._appended(self.log.append(records, now_ms, leader_epoch=self.leader_epoch,
                                              origin=origin))

    def append_end_txn_marker(self, producer_id: int, producer_epoch: int,
                              coordinator_epoch: int, commit: bool, now_ms: int
                              ) -> tuple[AppendInfo, bool]:
        """Append a COMMIT or ABORT marker as the transaction coordinator asks."""
        return self._appended(self.log.append_end_txn_marker(
            producer_id, producer_epoch, coordinator_epoch, commit, now_ms,
            leader_epoch=self.leader_epoch))

    def _appended(self, info: AppendInfo) -> tuple[AppendInfo, bool]:
        self.appended_bytes += info.size
        replication = self.replication
        if replication is not None and info.size:
            replication.record_end(self.log.log_end_offset, self.appended_bytes)
        if self.hw_gated_by_flush:
            if info.size and self.log.writes_on_writer:
                if self._unwritten is None:
                    self._unwritten = deque()
                self._unwritten.append((self.log.log_end_offset, self.appended_bytes))
            return info, False
        return info, self.advance_high_watermark(self.log.log_end_offset, self.appended_bytes)

    def on_durable(self, end_offset: int) -> bool:
        """The log dir's writer wrote and fsynced everything below ``end_offset``: the high
        watermark follows while gated by the flush. Whether it moved."""
        unwritten = self._unwritten
        if unwritten is None:
            return False
        at_bytes = -1
        while unwritten and unwritten[0][0] <= end_offset:
            at_bytes = unwritten.popleft()[1]
        if at_bytes < 0 or not self.hw_gated_by_flush:
            return False
        return self.advance_high_watermark(end_offset, at_bytes)

    def advance_high_watermark(self, offset: int, at_bytes: int) -> bool:
        """This replica's own end (durable, when gated by the flush) reached ``offset``,
        ``at_bytes`` appended by then: the high watermark follows, at once without
        followers. Whether it moved."""
        replication = self.replication
        if replication is not None:
            if offset > replication.local_end_offset:
                replication.local_end_offset = offset
            return self.maybe_increment_high_watermark()
        if offset <= self.high_watermark:
            return False
        self._set_high_watermark(offset, at_bytes)
        return True

    def _set_high_watermark(self, offset: int, at_bytes: int) -> None:
        self.high_watermark = offset
        self.hw_bytes = at_bytes
        self.log.on_high_watermark_updated(offset)

    @property
    def local_end_offset(self) -> int:
        """This replica's own end as the high watermark counts it (what acks=1 waits for
        when the flush gates it): the high watermark itself without followers."""
        replication = self.replication
        return self.high_watermark if replication is None else replication.local_end_offset

    # -- the follower's side (Kafka's Partition.makeFollower and the fetcher's appends) --------

    def make_follower(self, broker_id: int, leader_id: int, leader_epoch: int,
                      isr: Sequence[int], partition_epoch: int) -> bool:
        """Follow ``leader_id`` in ``leader_epoch`` (Kafka's makeFollower): no followers of
        its own, the cluster's ISR recorded; the high watermark stays, capped by the log end.
        Whether the leader or the epoch changed (the fetcher then starts over). An older
        epoch is refused (ValueError), as make_leader refuses one."""
        if leader_epoch < self.leader_epoch:
            raise ValueError(f"leader epoch {leader_epoch} of {self.topic}-{self.index} is "
                             f"older than the current {self.leader_epoch}")
        changed = leader_epoch != self.leader_epoch or leader_id != self.leader_id
        if leader_epoch != self.leader_epoch:
            Partition.leader_epoch_changes += 1
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.replication = None
        self._unwritten = None
        self.isr = tuple(isr)
        self.partition_epoch = max(self.partition_epoch, partition_epoch)
        restored, self.restored_high_watermark = self.restored_high_watermark, None
        if restored is not None and restored < self.high_watermark:
            self._set_high_watermark(restored, self.hw_bytes)  # as Kafka's follower starts
        if self.high_watermark > self.log_end_offset:
            self._set_high_watermark(self.log_end_offset, self.appended_bytes)
        return changed

    def append_as_follower(self, records: bytes | bytearray | memoryview, now_ms: int
                           ) -> AppendInfo | None:
        """The leader's batches, appended as they are."""
        info = self.log.append_as_follower(records, now_ms)
        if info is not None:
            self.appended_bytes += info.size
        return info

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """Kafka's follower high watermark: the leader's, capped by this log's end, never
        moving back (truncation lowers it). Whether it moved."""
        new_hw = min(leader_high_watermark, self.log_end_offset)
        if new_hw <= self.high_watermark:
            return False
        self._set_high_watermark(new_hw, self.appended_bytes)
        return True

    def follow_log_start_offset(self, leader_log_start_offset: int) -> bool:
        """The leader's log start moved up (retention, DeleteRecords): this replica's follows,
        up to its high watermark (Kafka's LeaderOffsetIncremented). Whether it moved."""
        target = min(leader_log_start_offset, self.high_watermark)
        if target <= self.log.log_start_offset:
            return False
        return self.log.maybe_increment_log_start_offset(target, "leader offset incremented")

    def truncate_to(self, offset: int) -> bool:
        """Kafka's truncateTo for a follower: nothing at or after ``offset`` stays; the high
        watermark follows the log end down. Whether anything was removed."""
        removed = self.log.truncate_to(offset)
        if removed and self.high_watermark > self.log_end_offset:
            self._set_high_watermark(self.log_end_offset, self.appended_bytes)
        return removed

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Kafka's truncateFullyAndStartAt: an empty log at ``offset``, the high watermark
        there too."""
        self.log.truncate_fully_and_start_at(offset)
        self._set_high_watermark(offset, self.appended_bytes)

    # -- the leader's replication (Kafka's Partition as leader) ------------------------------

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The committed ISR, plus a replica whose addition is in flight (KIP-497): the set
        the high watermark and acks=all wait for. A shrink in flight removes no one yet."""
        replication = self.replication
        pending = replication.pending_isr if replication is not None else None
        if pending is None:
            return self.isr
        return self.isr + tuple(r for r in pending if r not in self.isr)

    @property
    def effective_min_isr(self) -> int:
        """Kafka's effectiveMinIsr: min.insync.replicas, at most the replication factor."""
        replication = self.replication
        replicas = 1 if replication is None else 1 + len(replication.followers)
        return min(self.min_insync_replicas, replicas)

    @property
    def under_min_isr(self) -> bool:
        return len(self.isr) < self.effective_min_isr

    def update_assignment_and_isr(self, broker_id: int, replicas: Sequence[int],
                                  committed: LeaderAndIsrState, new_epoch: bool,
                                  clock_ms: Callable[[], int], lag_time_max_ms: int) -> bool:
        """The cluster's assignment and ISR for this partition led here (Kafka's
        updateAssignmentAndIsr with makeLeader's follower reset): followers are kept, added
        or dropped to match ``replicas``; a state older than the one applied changes no ISR.
        Whether the high watermark moved (a smaller ISR may let it)."""
        self.broker_id = broker_id
        now = clock_ms()
        replication = self.replication
        followers_ids = [r for r in replicas if r != broker_id]
        if not followers_ids:  # no followers (left): the high watermark is this replica's end
            self.restored_high_watermark = None
            self.isr = (broker_id,)
            self.partition_epoch = max(self.partition_epoch, committed.partition_epoch)
            if replication is None:
                return self._lead_alone()
            replication.followers, replication.pending_isr = {}, None
            moved = self.maybe_increment_high_watermark()
            self.replication = None
            return moved
        fresh = replication is None  # it leads with followers from now: all start anew
        if replication is None:
            replication = LeaderReplication({}, clock_ms, lag_time_max_ms, self.high_watermark)
            self.replication = replication
            self._restore_high_watermark(replication)
            self._count_own_end(replication)
        replication.clock_ms = clock_ms
        replication.lag_time_max_ms = lag_time_max_ms
        old = replication.followers
        replication.followers = {r: old.get(r) or ReplicaState(r) for r in followers_ids}
        if committed.partition_epoch > self.partition_epoch:  # what is in flight is answered
            self.isr = tuple(committed.isr)
            self.partition_epoch = committed.partition_epoch
            replication.pending_isr = None
        if new_epoch or fresh:
            for follower in replication.followers.values():
                follower.reset(now, self.log_end_offset, follower.broker_id in self.isr)
        return self.maybe_increment_high_watermark()

    def _own_end(self) -> int:
        """What this replica holds as the high watermark counts it: its log end, or what of
        it is durable when the flush gates the high watermark."""
        return self.log.recovery_point if self.hw_gated_by_flush else self.log_end_offset

    def _count_own_end(self, replication: LeaderReplication) -> None:
        """Leading with followers from now: what this replica appended until now (as a
        follower, or before a restart) counts as its own end at once, as Kafka's leader
        counts its log end offset. Otherwise only a new append as leader would move it, and a
        producer that retries only batches this log already holds (answered as duplicates,
        waiting for the high watermark) would wait for ever. Bytes still queued for the log
        dir's writer count once it made them durable."""
        end = self.log_end_offset
        if end > self.high_watermark:
            replication.record_end(end, self.appended_bytes)
        own = self._own_end()
        replication.local_end_offset = max(replication.local_end_offset, own)
        if own < end and self.log.writes_on_writer:
            self._unwritten = deque([(end, self.appended_bytes)])

    def _lead_alone(self) -> bool:
        """Leading with no followers, an ISR of one (Kafka's maybeIncrementLeaderHW): all
        this replica holds is committed, up to what is durable when the flush gates the high
        watermark. A partition that followed until now may have had a lower high watermark
        (the leader's, or its checkpoint's). Whether it moved."""
        end = self._own_end()
        if end <= self.high_watermark:
            return False
        at_bytes = self.appended_bytes if end == self.log_end_offset else self.hw_bytes + 1
        self._set_high_watermark(end, at_bytes)
        return True

    def _restore_high_watermark(self, replication: LeaderReplication) -> None:
        """Leading with followers for the first time since the broker started: the high
        watermark goes back to the checkpointed one (Kafka starts a partition there), as what
        lies above it may not be on the followers; this replica's own end stays. The data
        above it counts as one byte when the high watermark passes it again, so a parked
        consumer fetch sees it became readable."""
        restored = self.restored_high_watermark
        self.restored_high_watermark = None
        if restored is None or restored >= self.high_watermark:
            return
        replication.record_end(self.high_watermark, self.hw_bytes)
        self._set_high_watermark(restored, self.hw_bytes - 1)

    def follower(self, replica_id: int) -> ReplicaState | None:
        replication = self.replication
        return None if replication is None else replication.followers.get(replica_id)

    def update_follower_fetch_state(self, follower: ReplicaState, fetch_offset: int,
                                    log_start_offset: int, leader_end_offset: int,
                                    broker_epoch: int) -> bool:
        """A replica fetch from ``follower`` at ``fetch_offset`` (Kafka's
        updateFollowerFetchState): its state, then the high watermark. Whether it moved."""
        replication = self.replication
        assert replication is not None
        before = follower.log_end_offset
        follower.update_fetch_state(fetch_offset, log_start_offset, replication.clock_ms(),
                                    leader_end_offset, broker_epoch)
        return follower.log_end_offset != before and self.maybe_increment_high_watermark()

    def maybe_increment_high_watermark(self) -> bool:
        """Kafka's maybeIncrementLeaderHW: the least log end of this replica, the maximal ISR
        and the followers caught up enough to join it; never while under min ISR."""
        replication = self.replication
        assert replication is not None
        if self.under_min_isr:
            return False
        new_hw = replication.local_end_offset
        leader_end = self.log_end_offset
        now = replication.clock_ms()
        lag = replication.lag_time_max_ms
        maximal = self.maximal_isr
        for f in replication.followers.values():
            if f.log_end_offset < new_hw and (f.broker_id in maximal or (
                    f.is_caught_up(leader_end, now, lag) and replication.eligible(f))):
                new_hw = f.log_end_offset
        if new_hw <= self.high_watermark:
            return False
        self._set_high_watermark(new_hw, replication.bytes_at(new_hw, self.hw_bytes))
        return True

    def isr_to_expand(self, follower: ReplicaState) -> LeaderAndIsrState | None:
        """Kafka's maybeExpandIsr: a follower outside the ISR that reached the high watermark
        and the start of this leader epoch joins it; the proposal, now in flight."""
        replication = self.replication
        if (replication is None or replication.pending_isr is not None
                or follower.broker_id in self.isr
                or follower.log_end_offset < self.high_watermark
                or follower.log_end_offset < self.leader_epoch_start_offset
                or not replication.eligible(follower)):
            return None
        return self._propose(replication, self.isr + (follower.broker_id,))

    def out_of_sync_replicas(self) -> list[int]:
        """Kafka's getOutOfSyncReplicas: ISR followers not caught up within
        replica.lag.time.max.ms; none while an ISR change is in flight."""
        replication = self.replication
        if replication is None or replication.pending_isr is not None:
            return []
        now = replication.clock_ms()
        leader_end = self.log_end_offset
        out: list[int] = []
        for r in self.isr:
            if r == self.broker_id:
                continue
            f = replication.followers.get(r)
            if f is None or not f.is_caught_up(leader_end, now, replication.lag_time_max_ms):
                out.append(r)
        return out

    def isr_to_shrink(self) -> LeaderAndIsrState | None:
        """Kafka's maybeShrinkIsr: the ISR without its out-of-sync followers, proposed (in
        flight) but not applied: the high watermark still waits for them until committed."""
        out = self.out_of_sync_replicas()
        if not out or self.replication is None:
            return None
        return self._propose(self.replication, tuple(r for r in self.isr if r not in out))

    def _propose(self, replication: LeaderReplication, isr: tuple[int, ...]
                 ) -> LeaderAndIsrState:
        replication.pending_isr = isr
        return LeaderAndIsrState(self.leader_epoch, isr, self.partition_epoch)

    def isr_committed(self, state: LeaderAndIsrState) -> bool:
        """The cluster committed ``state`` (this leader's proposal): it is the ISR now.
        Whether the high watermark moved."""
        replication = self.replication
        if replication is None or state.leader_epoch != self.leader_epoch:
            return False
        replication.pending_isr = None
        if state.partition_epoch > self.partition_epoch:
            self.isr = tuple(state.isr)
            self.partition_epoch = state.partition_epoch
        return self.maybe_increment_high_watermark()

    def isr_refused(self) -> None:
        """The proposal failed for a reason other than a fence: dropped, may be made again."""
        if self.replication is not None:
            self.replication.pending_isr = None

    def check_enough_replicas_reach_offset(self, required_offset: int) -> tuple[bool, ErrorCode]:
        """Kafka's checkEnoughReplicasReachOffset for an acks=all produce: done once the high
        watermark reached ``required_offset``, NOT_ENOUGH_REPLICAS_AFTER_APPEND when by then
        the maximal ISR is smaller than the min ISR."""
        if self.high_watermark < required_offset:
            return False, ErrorCode.NONE
        if len(self.maximal_isr) < self.effective_min_isr:
            return True, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return True, ErrorCode.NONE
