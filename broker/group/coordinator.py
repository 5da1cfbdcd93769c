"""GroupCoordinator: Kafka's classic group protocol on one event loop.

Members join (JoinGroup), the rebalance waits in the join purgatory until all known members
have rejoined, the leader's assignment is distributed (SyncGroup), and sessions are kept by
heartbeats, each session a deadline on the coordinator's timer. Group metadata and
committed offsets are written to __consumer_offsets and answered once committed there.

Transactional offset commits (KIP-98, KIP-447) are written at once as a transactional batch
but stay pending, by producer id, until the transaction coordinator has the transaction's
marker written to the group's partition and calls handle_txn_completion; only then do they
become the group's committed offsets (commit) or vanish (abort).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from broker.config import BrokerConfig
from broker.coordinator.records import Record
from broker.coordinator.timer import CoordinatorTimer
from broker.group.classic_group import GroupMetadata, GroupState
from broker.group.classic_member import JoinResult, MemberMetadata
from broker.group.consumer_coordinator import (
    ConsumerGroupConfig,
    ConsumerGroupCoordinator,
    HeartbeatRequest,
    HeartbeatResult,
)
from broker.group.consumer_group import ConsumerGroup
from broker.group.consumer_member import ConsumerGroupMember
from broker.group.delayed import DelayedJoin, InitialDelayedJoin
from broker.group.offset_cache import GroupOffsets, OffsetAndMetadata
from broker.group.offsets_store import (
    OffsetsStore,
    group_key,
    group_value,
    offset_key,
    offset_value,
)
from broker.replica.delayed_result import Completion, all_of, completed
from protocol.errors import ErrorCode
from purgatory import Purgatory, Timer, WallClock

logger = structlog.get_logger("broker.group")

S = GroupState
TopicPartition = tuple[str, int]
MAX_METADATA = 4096  # Kafka's offset.metadata.max.bytes
# Kafka's GroupCoordinator.NewMemberJoinTimeoutMs: a new member cannot heartbeat while its first
# JoinGroup is parked, so its session is this instead; a client that gave up simply rejoins.
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000


@dataclass(frozen=True, slots=True)
class GroupConfig:
    initial_rebalance_delay_ms: int
    min_session_timeout_ms: int
    max_session_timeout_ms: int
    offsets_retention_ms: int
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS
    consumer: ConsumerGroupConfig = ConsumerGroupConfig(True, 45_000, 5_000, 2**31 - 1,
                                                        ("uniform", "range"))
    max_size: int = 2**31 - 1  # group.max.size: members a classic group may have

    @classmethod
    def of(cls, cfg: BrokerConfig) -> GroupConfig:
        return cls(cfg["group.initial.rebalance.delay.ms"], cfg["group.min.session.timeout.ms"],
                   cfg["group.max.session.timeout.ms"], cfg["offsets.retention.minutes"] * 60_000,
                   consumer=ConsumerGroupConfig.of(cfg), max_size=cfg["group.max.size"])


class GroupCoordinator:
    def __init__(self, config: GroupConfig, timer: Timer, store: OffsetsStore,
                 partition_exists: Callable[[TopicPartition], bool], clock: WallClock) -> None:
        """``timer`` runs the groups' deadlines; ``clock`` is the broker's wall clock (state
        changes, offset expiry)."""
        self.config = config
        self.clock = clock
        self.groups: dict[str, GroupMetadata] = {}
        self.join_purgatory: Purgatory = Purgatory("join", timer)
        # Deadlines by key: a member's session (or a pending member's join deadline, the same
        # key, as Kafka), ("heartbeat", group id, member id); a generation's SyncGroup
        # deadline, ("sync", group id).
        self.deadlines: CoordinatorTimer[tuple[str, ...]] = CoordinatorTimer(timer)
        self.store = store
        self._partition_exists = partition_exists
        self.rebalances: dict[str, int] = {}  # rebalances started per group (metrics)
        # Kafka's openGroupsForProducer: the groups holding a producer's pending transactional
        # offsets, so a marker finds them without scanning every group.
        self.open_groups_for_producer: dict[int, set[str]] = {}
        # The consumer protocol's groups (KIP-848); a group id is in one of the two at most.
        self.consumer = ConsumerGroupCoordinator(config.consumer, self, timer,
                                                 lambda: store.topics.metadata.topics)

    def start(self) -> None:
        """Rebuild every group from the offsets topic, if any (it is created on first use)."""
        loaded = self.store.load()
        self.groups = {g: v for g, v in loaded.items() if isinstance(v, GroupMetadata)}
        self.consumer.restore({g: v for g, v in loaded.items() if isinstance(v, ConsumerGroup)})
        self.open_groups_for_producer.clear()
        for group in loaded.values():
            for producer_id in group.pending_txn_offset_commits:
                self.open_groups_for_producer.setdefault(producer_id, set()).add(group.group_id)
        for classic in self.groups.values():
            for member in classic.members.values():
                self._schedule_heartbeat(classic, member)

    def classic_group(self, group_id: str) -> GroupMetadata | None:
        return self.groups.get(group_id)

    def remove_classic_group(self, group_id: str) -> GroupMetadata | None:
        """An empty classic group gives way to a consumer group (the caller took its offsets
        and writes its tombstone)."""
        return self.groups.pop(group_id, None)

    def write(self, group_id: str, records: list[Record]) -> Completion[ErrorCode]:
        """Records of the group to its __consumer_offsets partition, committed there."""
        return self.store.write(group_id, records)

    def offsets_group(self, group_id: str) -> GroupMetadata | ConsumerGroup | None:
        """The group holding ``group_id``'s offsets, whichever protocol it speaks."""
        return self.groups.get(group_id) or self.consumer.groups.get(group_id)

    # -- ConsumerGroupHeartbeat (the consumer protocol) -------------------------------------
    def consumer_group_heartbeat(self, request: HeartbeatRequest) -> HeartbeatResult:
        return self.consumer.heartbeat(request)

    def partition_for(self, group_id: str) -> int:
        """The __consumer_offsets partition holding the group (AddOffsetsToTxn adds it)."""
        return self.store.partition_for(group_id)

    # -- JoinGroup -------------------------------------------------------------------------------
    def join_group(
        self, group_id: str, member_id: str, instance_id: str | None, require_known_id: bool,
        client_id: str, client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int,
        protocol_type: str, protocols: list[tuple[str, bytes]],
    ) -> Completion[JoinResult]:
        if not group_id:
            return completed(JoinResult(ErrorCode.INVALID_GROUP_ID, member_id=member_id))
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return completed(JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=member_id))
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            if not consumer_group.is_empty():
                # A classic member joins the consumer group as it is (Kafka's mixed groups).
                if rebalance_timeout_ms < 0:
                    rebalance_timeout_ms = session_timeout_ms
                return completed(self.consumer.classic.join(
                    consumer_group, member_id, instance_id, require_known_id, client_id,
                    client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type,
                    protocols))
            self._classic_from_empty_consumer_group(consumer_group)
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return completed(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id))
            group = self.groups[group_id] = GroupMetadata(group_id, clock=self.clock)
        if group.is_(S.DEAD):
            return completed(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=member_id))
        if not group.supports(protocol_type, protocols):
            return completed(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id))
        if not self._accepts_joining(group, member_id):
            # A member of the group that is not rejoining in time is dropped from it (Kafka).
            member = group.members.get(member_id)
            if member is not None:
                self._remove_and_update(group, member, "found the group full")
            return completed(JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED))
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms  # JoinGroup v0 has no rebalance timeout
        details = (client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
                   protocol_type, protocols)
        if not member_id:
            return self._join_unknown(group, instance_id, require_known_id, *details)
        return self._join_known(group, member_id, instance_id, *details)

    def _accepts_joining(self, group: GroupMetadata, member_id: str) -> bool:
        """Kafka's acceptJoiningMember under group.max.size: while a rebalance gathers members
        those already rejoined count, so the last to rejoin an over-full group are turned away;
        otherwise the members count."""
        if group.is_(S.EMPTY, S.DEAD):
            return True
        member = group.members.get(member_id)
        if group.is_(S.PREPARING_REBALANCE):
            awaiting = sum(m.awaiting_join is not None for m in group.members.values())
            return (member is not None and member.awaiting_join is not None
                    ) or awaiting < self.config.max_size
        return member is not None or len(group.members) < self.config.max_size

    def _classic_from_empty_consumer_group(self, consumer_group: ConsumerGroup) -> None:
        """An empty consumer group may change protocol: a classic group takes its place and
        its offsets (Kafka's maybeDeleteEmptyConsumerGroup)."""
        gid = consumer_group.group_id
        self.consumer.remove_group(consumer_group)
        group = self.groups[gid] = GroupMetadata(gid, clock=self.clock)
        group.take_offsets(consumer_group)
        self.store.write(gid, [self.consumer.tombstone(gid)])
        logger.info("empty consumer group becomes a classic group", group=gid)

    def _join_unknown(
        self, group: GroupMetadata, instance_id: str | None, require_known_id: bool,
        client_id: str, client_host: str, rebalance_ms: int, session_ms: int,
        protocol_type: str, protocols: list[tuple[str, bytes]],
    ) -> Completion[JoinResult]:
        new_id = f"{client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            old_id = group.static_members.get(instance_id)
            if old_id is not None and old_id in group.members:
                return self._replace_static_member(group, old_id, new_id, rebalance_ms,
                                                   session_ms, protocols)
        elif require_known_id:
            group.pending_members.add(new_id)
            self.deadlines.schedule(_heartbeat_key(group.group_id, new_id), session_ms,
                                    lambda: self.expire_pending(group, new_id))
            return completed(JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=new_id))
        member = MemberMetadata(new_id, instance_id, client_id, client_host, rebalance_ms,
                                session_ms, protocol_type, protocols)
        return self._add_and_rebalance(group, member)

    def _replace_static_member(
        self, group: GroupMetadata, old_id: str, new_id: str, rebalance_ms: int,
        session_ms: int, protocols: list[tuple[str, bytes]],
    ) -> Completion[JoinResult]:
        """A restarted static member takes over its identity and its assignment (KIP-345).

        The old id is fenced; in a Stable group whose protocol stays the same nothing else
        changes: no rebalance, the member syncs and gets its stored assignment back. The answer
        names the leader as it was, so a replaced leader does not run the assignor again.
        """
        member = group.members[old_id]
        previous_leader = group.leader_id or ""
        self.deadlines.cancel(_heartbeat_key(group.group_id, old_id))  # the old id's session
        self._fence(member)
        member.awaiting_join = member.awaiting_sync = None
        group.rename(old_id, new_id)
        member.rebalance_timeout_ms, member.session_timeout_ms = rebalance_ms, session_ms
        unchanged = member.matches(protocols)
        member.protocols = protocols
        self._schedule_heartbeat(group, member)
        logger.info("static member replaced", group=group.group_id,
                    instance=member.group_instance_id, old=old_id, new=new_id)
        if group.is_(S.STABLE) and unchanged:
            result = JoinResult(ErrorCode.NONE, group.generation_id, group.protocol_type,
                                group.protocol_name, previous_leader, new_id, [])
            answer: Completion[JoinResult] = Completion()
            stored = self.store.write(group.group_id,
                                      [(group_key(group.group_id), group_value(group))])
            stored.add_done_callback(lambda f: answer.set_result(
                result if f.result() == ErrorCode.NONE
                else JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=new_id)))
            return answer
        return self._update_and_rebalance(group, member)

    def _join_known(
        self, group: GroupMetadata, member_id: str, instance_id: str | None, client_id: str,
        client_host: str, rebalance_ms: int, session_ms: int, protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> Completion[JoinResult]:
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self.deadlines.cancel(_heartbeat_key(group.group_id, member_id))
            member = MemberMetadata(member_id, instance_id, client_id, client_host, rebalance_ms,
                                    session_ms, protocol_type, protocols)
            return self._add_and_rebalance(group, member)
        if instance_id is not None and group.static_members.get(instance_id) != member_id:
            return completed(JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=member_id))
        member = group.members.get(member_id)
        if member is None or group.is_(S.EMPTY, S.DEAD):
            return completed(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id))
        member.rebalance_timeout_ms, member.session_timeout_ms = rebalance_ms, session_ms
        unchanged = member.matches(protocols)
        if group.is_(S.COMPLETING_REBALANCE) and unchanged:
            return completed(self._join_result(group, member))  # a retried join of this generation
        if group.is_(S.STABLE) and unchanged and member_id != group.leader_id:
            return completed(self._join_result(group, member))
        member.protocols = protocols
        return self._update_and_rebalance(group, member)

    def _add_and_rebalance(self, group: GroupMetadata, member: MemberMetadata
                           ) -> Completion[JoinResult]:
        fut = member.awaiting_join = Completion()
        # Only a member arriving while the first rebalance waits extends its initial delay.
        if group.is_(S.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member)
        self._schedule_heartbeat(group, member)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} joined")
        return fut

    def _update_and_rebalance(self, group: GroupMetadata, member: MemberMetadata
                              ) -> Completion[JoinResult]:
        fut = member.awaiting_join = Completion()
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoined")
        return fut

    def _maybe_prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if group.is_(S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY):
            self._prepare_rebalance(group, reason)
        elif group.is_(S.PREPARING_REBALANCE):
            self.join_purgatory.check_and_complete(group.group_id)

    def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        group.pending_sync.clear()
        self.deadlines.cancel(("sync", group.group_id))
        if group.is_(S.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment(group, ErrorCode.REBALANCE_IN_PROGRESS)
        if group.is_(S.EMPTY):
            delay = self.config.initial_rebalance_delay_ms
            op: DelayedJoin = InitialDelayedJoin(
                self, group, delay, delay, max(group.max_rebalance_timeout() - delay, 0))
        else:
            op = DelayedJoin(self, group, group.max_rebalance_timeout())
        group.transition(S.PREPARING_REBALANCE)
        self.rebalances[group.group_id] = self.rebalances.get(group.group_id, 0) + 1
        logger.info("rebalance started", group=group.group_id, generation=group.generation_id,
                    reason=reason, members=len(group.members))
        self.park_join(op)

    def park_join(self, op: DelayedJoin) -> None:
        self.join_purgatory.try_complete_else_watch(op, [op.group.group_id])

    def complete_join(self, group: GroupMetadata) -> None:
        """The rebalance's join phase is over: drop laggards, start the next generation."""
        if not group.is_(S.PREPARING_REBALANCE):
            return
        # Dynamic members that did not rejoin are gone; static ones stay until their session
        # times out (KIP-345), so a restarting instance keeps its place.
        for member in [m for m in group.members.values()
                       if m.awaiting_join is None and m.group_instance_id is None]:
            self._remove_member(group, member)
        group.pending_members.clear()
        if not group.members:
            group.generation_id += 1
            group.protocol_name = None
            group.transition(S.EMPTY)
            self.store.write(group.group_id, [(group_key(group.group_id), group_value(group))])
            logger.info("group is empty", group=group.group_id, generation=group.generation_id)
            return
        group.generation_id += 1
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.transition(S.COMPLETING_REBALANCE)
        logger.info("rebalance joined", group=group.group_id, generation=group.generation_id,
                    protocol=group.protocol_name, leader=group.leader_id,
                    members=len(group.members))
        for member in group.members.values():
            fut, member.awaiting_join = member.awaiting_join, None
            member.is_new = False
            if fut is not None and not fut.done():
                fut.set_result(self._join_result(group, member))
            self._schedule_heartbeat(group, member)
        self._schedule_pending_sync(group)

    def _schedule_pending_sync(self, group: GroupMetadata) -> None:
        """Every member must send its SyncGroup within the rebalance timeout (Kafka's
        DelayedSync), heartbeating or not; those that do not are removed."""
        group.pending_sync = set(group.members)
        generation = group.generation_id
        self.deadlines.schedule(("sync", group.group_id), group.max_rebalance_timeout(),
                                lambda: self.expire_pending_sync(group, generation))

    def _synced(self, group: GroupMetadata, member_id: str) -> None:
        if member_id in group.pending_sync:
            group.pending_sync.discard(member_id)
            if not group.pending_sync:
                self.deadlines.cancel(("sync", group.group_id))

    def expire_pending_sync(self, group: GroupMetadata, generation: int) -> None:
        """The rebalance timeout passed with members that never sent SyncGroup."""
        if (group.generation_id != generation or not group.pending_sync
                or not group.is_(S.COMPLETING_REBALANCE, S.STABLE)):
            return
        laggards = [m for m in map(group.members.get, group.pending_sync) if m is not None]
        group.pending_sync.clear()
        for member in laggards:
            self._remove_member(group, member)
            logger.info("member removed", group=group.group_id, member=member.member_id,
                        reason="no SyncGroup within the rebalance timeout")
        if laggards:
            self._prepare_rebalance(group, "members did not sync within the rebalance timeout")

    def _join_result(self, group: GroupMetadata, member: MemberMetadata) -> JoinResult:
        members = []
        if member.member_id == group.leader_id and group.protocol_name is not None:
            members = [(m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name))
                       for m in group.members.values()]
        return JoinResult(ErrorCode.NONE, group.generation_id, group.protocol_type,
                          group.protocol_name, group.leader_id or "", member.member_id, members)

    # -- SyncGroup ---------------------------------------------------------------------------------
    def sync_group(
        self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
        protocol_type: str | None, protocol_name: str | None, assignments: dict[str, bytes],
    ) -> Completion[tuple[ErrorCode, bytes]]:
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return completed(self.consumer.classic.sync(
                consumer_group, generation_id, member_id, instance_id, protocol_type,
                protocol_name))
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, instance_id, generation_id)
        if error is not None:
            return completed((error, b""))
        assert group is not None
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name):
            return completed((ErrorCode.INCONSISTENT_GROUP_PROTOCOL, b""))
        member = group.members[member_id]
        if group.is_(S.PREPARING_REBALANCE):
            return completed((ErrorCode.REBALANCE_IN_PROGRESS, b""))
        self._synced(group, member_id)
        self._schedule_heartbeat(group, member)
        if group.is_(S.STABLE):
            return completed((ErrorCode.NONE, member.assignment))
        fut = member.awaiting_sync = Completion()
        if member_id == group.leader_id:
            generation = group.generation_id
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            stored = self.store.write(group_id, [(group_key(group_id), group_value(group))])
            stored.add_done_callback(
                lambda f: self._assignment_stored(group, generation, f.result()))
        return fut

    def _assignment_stored(self, group: GroupMetadata, generation: int, error: ErrorCode
                           ) -> None:
        if not group.is_(S.COMPLETING_REBALANCE) or group.generation_id != generation:
            return
        if error != ErrorCode.NONE:
            self._reset_and_propagate_assignment(group, ErrorCode.COORDINATOR_NOT_AVAILABLE)
            self._prepare_rebalance(group, f"storing the assignment failed: {error.name}")
            return
        self._propagate_assignment(group, ErrorCode.NONE)
        group.transition(S.STABLE)
        logger.info("group stable", group=group.group_id, generation=generation)

    def _propagate_assignment(self, group: GroupMetadata, error: ErrorCode) -> None:
        for member in group.members.values():
            fut, member.awaiting_sync = member.awaiting_sync, None
            if fut is not None and not fut.done():
                fut.set_result((error, member.assignment if error == ErrorCode.NONE else b""))
            self._schedule_heartbeat(group, member)

    def _reset_and_propagate_assignment(self, group: GroupMetadata, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    # -- Heartbeat and LeaveGroup ----------------------------------------------------------------
    def heartbeat(self, group_id: str, member_id: str, instance_id: str | None,
                  generation_id: int) -> ErrorCode:
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return self.consumer.classic.heartbeat(consumer_group, member_id, instance_id,
                                                   generation_id)
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, instance_id, generation_id)
        if error is not None:
            return error
        assert group is not None
        self._schedule_heartbeat(group, group.members[member_id])
        if group.is_(S.PREPARING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode, list[ErrorCode]]:
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return ErrorCode.NONE, self.consumer.classic.leave(consumer_group, members)
        group = self.groups.get(group_id)
        if group is None or group.is_(S.DEAD):
            return ErrorCode.UNKNOWN_MEMBER_ID, [ErrorCode.UNKNOWN_MEMBER_ID for _ in members]
        results = []
        for member_id, instance_id in members:
            if instance_id is not None:
                known = group.static_members.get(instance_id)
                if known is None:
                    results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and member_id != known:
                    results.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
                member_id = known
            if member_id in group.pending_members:
                group.pending_members.discard(member_id)
                self.deadlines.cancel(_heartbeat_key(group_id, member_id))
                self.join_purgatory.check_and_complete(group_id)
                results.append(ErrorCode.NONE)
                continue
            member = group.members.get(member_id)
            if member is None:
                results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            self._remove_and_update(group, member, "left the group")
            results.append(ErrorCode.NONE)
        return ErrorCode.NONE, results

    def expire_member(self, group: GroupMetadata, member: MemberMetadata) -> None:
        """The member's session deadline passed: its session is over, unless it is kept alive
        by a JoinGroup or SyncGroup the broker has not answered yet."""
        if group.members.get(member.member_id) is member and not member.has_satisfied_heartbeat():
            self._remove_and_update(group, member, "session timed out")

    def expire_pending(self, group: GroupMetadata, member_id: str) -> None:
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self.join_purgatory.check_and_complete(group.group_id)

    def _remove_and_update(self, group: GroupMetadata, member: MemberMetadata, reason: str
                           ) -> None:
        self._remove_member(group, member)
        logger.info("member removed", group=group.group_id, member=member.member_id, reason=reason)
        if group.is_(S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {member.member_id} {reason}")
        elif group.is_(S.PREPARING_REBALANCE):
            self.join_purgatory.check_and_complete(group.group_id)

    def _remove_member(self, group: GroupMetadata, member: MemberMetadata) -> None:
        group.remove(member.member_id)
        self._synced(group, member.member_id)
        self.deadlines.cancel(_heartbeat_key(group.group_id, member.member_id))
        for fut in (member.awaiting_join, member.awaiting_sync):
            if fut is not None and not fut.done():
                if fut is member.awaiting_join:
                    fut.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID,
                                              member_id=member.member_id))
                else:
                    fut.set_result((ErrorCode.UNKNOWN_MEMBER_ID, b""))
        member.awaiting_join = member.awaiting_sync = None

    def _fence(self, member: MemberMetadata) -> None:
        if member.awaiting_join is not None and not member.awaiting_join.done():
            member.awaiting_join.set_result(JoinResult(ErrorCode.FENCED_INSTANCE_ID,
                                                       member_id=member.member_id))
        if member.awaiting_sync is not None and not member.awaiting_sync.done():
            member.awaiting_sync.set_result((ErrorCode.FENCED_INSTANCE_ID, b""))

    def _schedule_heartbeat(self, group: GroupMetadata, member: MemberMetadata) -> None:
        """The member's next session deadline, replacing the current one (Kafka's
        completeAndScheduleNextHeartbeatExpiration). A member awaiting its JoinGroup or
        SyncGroup answer has none meanwhile: it cannot heartbeat while the broker holds it."""
        key = _heartbeat_key(group.group_id, member.member_id)
        if group.members.get(member.member_id) is not member or member.has_satisfied_heartbeat():
            self.deadlines.cancel(key)
            return
        timeout = (self.config.new_member_join_timeout_ms if member.is_new
                   else member.session_timeout_ms)
        self.deadlines.schedule(key, timeout, lambda: self.expire_member(group, member))

    def _check_member(self, group: GroupMetadata | None, member_id: str,
                      instance_id: str | None, generation_id: int) -> ErrorCode | None:
        if group is None or group.is_(S.DEAD):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if instance_id is not None and group.static_members.get(instance_id) != member_id:
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    # -- offsets ---------------------------------------------------------------------------
    def _held(self, member: ConsumerGroupMember, offsets: Iterable[TopicPartition]) -> bool:
        return self.consumer.held_since_previous_epoch(member, offsets)

    def commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], api_version: int = 8,
    ) -> Completion[dict[TopicPartition, ErrorCode]]:
        """OffsetCommit; ``generation_id`` is a member epoch for a consumer group (v9+)."""
        consumer_group = self.consumer.groups.get(group_id)
        group: GroupOffsets | None
        if consumer_group is not None:
            error = _consumer_commit_error(consumer_group, member_id, generation_id,
                                           transactional=False, api_version=api_version,
                                           held=lambda m: self._held(m, offsets))
            group = consumer_group
        else:
            classic = self.groups.get(group_id)
            error = self._check_commit(classic, member_id, instance_id, generation_id)
            if classic is None and error == ErrorCode.ILLEGAL_GENERATION and api_version >= 9:
                error = ErrorCode.GROUP_ID_NOT_FOUND  # Kafka's answer from v9, both protocols
            if error is None and classic is None:
                classic = self.groups[group_id] = GroupMetadata(group_id, clock=self.clock)
            elif error is None and classic is not None:
                member = classic.members.get(member_id)
                if member is not None:
                    self._schedule_heartbeat(classic, member)
            group = classic
        if error is not None:
            return completed({tp: error for tp in offsets})
        assert group is not None
        results: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in offsets.items():
            if len(om.metadata.encode()) > MAX_METADATA:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            elif not self._partition_exists(tp):
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                accepted[tp] = om
        if not accepted:
            return completed(results)
        records = [(offset_key(group_id, t, p), offset_value(om)) for (t, p), om in
                   accepted.items()]
        answer: Completion[dict[TopicPartition, ErrorCode]] = Completion()
        group.prepare_offset_commit(accepted)

        def stored(f: Completion[tuple[ErrorCode, int]]) -> None:
            code, batch_offset = f.result()
            if not group.is_dead():
                for tp, om in accepted.items():
                    if code == ErrorCode.NONE:
                        group.on_offset_commit_append(tp, om, batch_offset)
                    else:
                        group.fail_pending_offset_write(tp, om)
            if code != ErrorCode.NONE:
                code = _commit_error(code)
            answer.set_result({**results, **{tp: code for tp in accepted}})

        self.store.append(group_id, records).add_done_callback(stored)
        return answer

    # -- transactional offsets (KIP-98, KIP-447) -------------------------------------------------
    def commit_transactional_offsets(
        self, group_id: str, producer_id: int, producer_epoch: int, member_id: str,
        group_instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> Completion[dict[TopicPartition, ErrorCode]]:
        """TxnOffsetCommit: the offsets go to the log now, as one transactional batch of the
        producer, and stay pending until the transaction's marker (Kafka's
        handleTxnCommitOffsets and storeOffsets with a producer id).

        A group that does not exist is created Empty, as Kafka does. Requests before v3 carry
        no member id nor generation (-1, ""), so only v3+ are checked against the group.
        Whether the offsets partition is in the producer's transaction is the caller's check.
        """
        results: dict[TopicPartition, ErrorCode] = {}
        known: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in offsets.items():
            if self._partition_exists(tp):
                known[tp] = om
            else:
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if not known:
            return completed(results)
        if not group_id:
            return completed({**results, **{tp: ErrorCode.INVALID_GROUP_ID for tp in known}})
        group: GroupOffsets
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            group = consumer_group
            error = _consumer_commit_error(consumer_group, member_id, generation_id,
                                           transactional=True, api_version=-1,
                                           held=lambda m: self._held(m, known))
            if error == ErrorCode.STALE_MEMBER_EPOCH:
                error = ErrorCode.ILLEGAL_GENERATION  # what a producer understands
        else:
            classic = self.groups.get(group_id)
            if classic is None:
                classic = self.groups[group_id] = GroupMetadata(group_id, clock=self.clock)
            group = classic
            error = self._validate_offset_commit(classic, generation_id, member_id,
                                                 group_instance_id, transactional=True)
        if error is not None:
            return completed({**results, **{tp: error for tp in known}})
        accepted: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in known.items():
            if len(om.metadata.encode()) > MAX_METADATA:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[tp] = om
        if not accepted:
            return completed(results)
        self.open_groups_for_producer.setdefault(producer_id, set()).add(group_id)
        group.prepare_txn_offset_commit(producer_id, accepted)
        records = [(offset_key(group_id, t, p), offset_value(om)) for (t, p), om in
                   accepted.items()]

        answer: Completion[dict[TopicPartition, ErrorCode]] = Completion()

        def stored(f: Completion[tuple[ErrorCode, int]]) -> None:
            code, batch_offset = f.result()
            if not group.is_dead():
                for tp, om in accepted.items():
                    if code == ErrorCode.NONE:
                        group.on_txn_offset_commit_append(producer_id, tp, om, batch_offset)
                    else:
                        group.fail_pending_txn_offset_commit(producer_id, tp)
                if code != ErrorCode.NONE and not group.has_pending_offset_commits_from_producer(
                        producer_id):
                    self._remove_producer_group(producer_id, group_id)
            if code != ErrorCode.NONE:
                logger.info("transactional offset commit failed", group=group_id,
                            producer_id=producer_id, error=code.name)
                code = offset_commit_error(code)
            answer.set_result({**results, **{tp: code for tp in accepted}})

        self.store.append(group_id, records, producer_id=producer_id,
                          producer_epoch=producer_epoch).add_done_callback(stored)
        return answer

    def handle_txn_completion(self, producer_id: int, offsets_partitions: Iterable[int],
                              commit: bool) -> None:
        """The transaction's marker is durable in these __consumer_offsets partitions: the
        producer's pending offsets of the groups there are committed or dropped (Kafka's
        GroupMetadataManager.handleTxnCompletion)."""
        partitions = set(offsets_partitions)
        groups = [g for g in self.open_groups_for_producer.get(producer_id, ())
                  if self.partition_for(g) in partitions]
        for group_id in groups:
            group = self.offsets_group(group_id)
            if group is not None and not group.is_dead():
                changed = group.complete_pending_txn_offset_commit(producer_id, commit)
                logger.debug("transactional offsets completed", group=group_id,
                             producer_id=producer_id, commit=commit, committed=len(changed))
            self._remove_producer_group(producer_id, group_id)

    def _remove_producer_group(self, producer_id: int, group_id: str) -> None:
        groups = self.open_groups_for_producer.get(producer_id)
        if groups is not None:
            groups.discard(group_id)
            if not groups:
                del self.open_groups_for_producer[producer_id]

    def _validate_offset_commit(self, group: GroupMetadata, generation_id: int, member_id: str,
                                instance_id: str | None, *, transactional: bool
                                ) -> ErrorCode | None:
        """Kafka's validateOffsetCommit. A transactional commit with no member nor generation
        (TxnOffsetCommit before v3) is accepted whatever the group's state."""
        if group.is_(S.DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.is_(S.EMPTY):
            return None
        if generation_id >= 0 or member_id or instance_id is not None:
            error = self._validate_current_member(group, member_id, instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
            return None
        if not transactional and not group.is_(S.EMPTY):
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    @staticmethod
    def _validate_current_member(group: GroupMetadata, member_id: str, instance_id: str | None
                                 ) -> ErrorCode | None:
        """Kafka's validateCurrentMember: a static instance must map to this member id (an
        unknown instance is an unknown member), and the member must be in the group."""
        if instance_id is not None:
            current = group.static_members.get(instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    def _check_commit(self, group: GroupMetadata | None, member_id: str,
                      instance_id: str | None, generation_id: int) -> ErrorCode | None:
        if generation_id < 0 and (group is None or group.is_(S.EMPTY)):
            return None  # a standalone consumer (assign + commit), no membership
        if group is None:
            return ErrorCode.ILLEGAL_GENERATION
        error = self._check_member(group, member_id, instance_id, generation_id)
        if error is not None:
            return error
        if group.is_(S.COMPLETING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return None

    def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None,
                      require_stable: bool = False
                      ) -> dict[TopicPartition, OffsetAndMetadata | ErrorCode | None]:
        """Committed offsets (None where there is none; every committed partition when
        ``partitions`` is None). With ``require_stable`` (KIP-447) a partition with a commit
        still pending, transactional or not, answers UNSTABLE_OFFSET_COMMIT instead, so a
        consumer taking over does not start from an offset its predecessor's open
        transaction is about to replace (Kafka's getOffsets)."""
        group = self.offsets_group(group_id)
        if group is None or group.is_dead():
            return {} if partitions is None else {tp: None for tp in partitions}
        wanted = list(group.offsets) if partitions is None else partitions
        found: dict[TopicPartition, OffsetAndMetadata | ErrorCode | None] = {}
        for tp in wanted:
            if require_stable and group.has_pending_offset_commits_for(tp):
                found[tp] = ErrorCode.UNSTABLE_OFFSET_COMMIT
            else:
                found[tp] = group.offsets.get(tp)
        return found

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int
                              ) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetFetch (OffsetFetch v9+): a member of a consumer
        group fetches at its current epoch; without member id and epoch (admin tools, classic
        members) the fetch is not checked."""
        group = self.consumer.groups.get(group_id)
        if group is None or (member_id is None and member_epoch < 0):
            return None
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return None

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]
                       ) -> Completion[tuple[ErrorCode, dict[TopicPartition, ErrorCode]]]:
        group = self.offsets_group(group_id)
        if group is None or group.is_dead():
            return completed((ErrorCode.GROUP_ID_NOT_FOUND, {}))
        if isinstance(group, ConsumerGroup):
            subscribed = group.subscribed_topics()
        else:
            subscribed = self._subscribed_topics(group)
        results = {tp: (ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in subscribed
                        else ErrorCode.NONE) for tp in partitions}
        removed = group.remove_offsets([tp for tp, e in results.items() if e == ErrorCode.NONE])
        records = [(offset_key(group_id, t, p), None) for t, p in removed]
        if isinstance(group, GroupMetadata):
            records += self._maybe_dead(group)
        if not records:
            return completed((ErrorCode.NONE, results))
        answer: Completion[tuple[ErrorCode, dict[TopicPartition, ErrorCode]]] = Completion()
        self.store.write(group_id, records).add_done_callback(
            lambda f: answer.set_result((ErrorCode.NONE, results)))
        return answer

    def _maybe_dead(self, group: GroupMetadata) -> list[tuple[bytes, bytes | None]]:
        """Kafka's cleanupGroupMetadata: an Empty group with no offsets left, committed or
        pending, is dead and forgotten; its metadata gets a tombstone if it ever had one
        (generation > 0). Pending transactional offsets keep the group: their marker may
        still commit them."""
        if not group.is_(S.EMPTY) or group.has_offsets():
            return []
        gid = group.group_id
        group.transition(S.DEAD)
        del self.groups[gid]
        self.rebalances.pop(gid, None)
        return [(group_key(gid), None)] if group.generation_id > 0 else []

    def _subscribed_topics(self, group: GroupMetadata) -> set[str]:
        """Topics of the members' consumer-protocol subscriptions (all, if unreadable)."""
        if group.is_(S.EMPTY) or group.protocol_type != "consumer" or not group.protocol_name:
            return set()
        from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

        topics: set[str] = set()
        for m in group.members.values():
            try:
                sub = ConsumerProtocolSubscription.decode(m.metadata_for(group.protocol_name))
                topics.update(sub.topics)
            except Exception:
                return {tp[0] for tp in group.offsets}
        return topics

    # -- admin -----------------------------------------------------------------------------
    def list_groups(self) -> list[GroupMetadata | ConsumerGroup]:
        """Every live group, classic and consumer."""
        groups: list[GroupMetadata | ConsumerGroup] = [
            g for g in self.groups.values() if not g.is_(S.DEAD)]
        return groups + list(self.consumer.groups.values())

    def delete_groups(self, group_ids: list[str]) -> Completion[dict[str, ErrorCode]]:
        results: dict[str, ErrorCode] = {}
        writes: list[Completion[ErrorCode]] = []
        for gid in group_ids:
            consumer_group = self.consumer.groups.get(gid)
            if consumer_group is not None:
                results[gid] = self._delete_consumer_group(consumer_group, writes)
                continue
            group = self.groups.get(gid)
            if group is None or group.is_(S.DEAD):
                results[gid] = ErrorCode.GROUP_ID_NOT_FOUND
            elif not group.is_(S.EMPTY):
                results[gid] = ErrorCode.NON_EMPTY_GROUP
            else:
                group.transition(S.DEAD)
                del self.groups[gid]
                self.rebalances.pop(gid, None)
                removed = group.remove_offsets(list(group.offsets))
                records = [(offset_key(gid, t, p), None) for t, p in removed]
                if group.generation_id > 0:
                    records.append((group_key(gid), None))
                if records:
                    writes.append(self.store.write(gid, records))
                results[gid] = ErrorCode.NONE
                logger.info("group deleted", group=gid)
        if not writes:
            return completed(results)
        answer: Completion[dict[str, ErrorCode]] = Completion()
        all_of(writes).add_done_callback(lambda _f: answer.set_result(results))
        return answer

    def _delete_consumer_group(self, group: ConsumerGroup,
                               writes: list[Completion[ErrorCode]]) -> ErrorCode:
        """Kafka's ConsumerGroup.validateDeleteGroup: only an Empty consumer group goes."""
        if not group.is_empty():
            return ErrorCode.NON_EMPTY_GROUP
        gid = group.group_id
        self.consumer.remove_group(group)
        removed = group.remove_offsets(list(group.offsets))
        records = [(offset_key(gid, t, p), None) for t, p in removed]
        records.append(self.consumer.tombstone(gid))
        writes.append(self.store.write(gid, records))
        logger.info("group deleted", group=gid)
        return ErrorCode.NONE

    def expire_offsets(self) -> int:
        """offsets.retention.minutes (Kafka's removeExpiredOffsets): committed offsets of
        groups Empty for that long, or of standalone groups by their commit time, are
        deleted; an offset with a plain commit on its way is kept. Pending transactional
        offsets never expire here: the transaction's marker decides them."""
        now = self.clock.wall_ms()
        removed = 0
        retention_ms = self.config.offsets_retention_ms
        for gid, group in list(self.groups.items()):
            if not group.is_(S.EMPTY):
                continue
            if group.protocol_type is not None:
                expired = [tp for tp in group.offsets if tp not in group.pending_offset_commits
                           and now - group.state_timestamp >= retention_ms]
            else:
                expired = [tp for tp, om in group.offsets.items()
                           if tp not in group.pending_offset_commits
                           and now - om.commit_timestamp >= retention_ms]
            for tp in expired:
                del group.offsets[tp]
                group.commit_record_offsets.pop(tp, None)
            records = [(offset_key(gid, t, p), None) for t, p in expired]
            records += self._maybe_dead(group)
            if not records:
                continue
            self.store.write(gid, records)
            removed += len(expired)
            if expired:
                logger.info("offsets expired", group=gid, partitions=len(expired))
        for consumer_group in list(self.consumer.groups.values()):
            removed += self._expire_consumer_group_offsets(consumer_group, now, retention_ms)
        return removed

    def _expire_consumer_group_offsets(self, group: ConsumerGroup, now: int,
                                       retention_ms: int) -> int:
        """Kafka's cleanupExpiredOffsets for a consumer group: offsets of topics no member
        subscribes to expire by their commit time; an Empty group left without offsets is
        deleted."""
        gid = group.group_id
        subscribed = group.subscribed_topics()
        expired = [tp for tp, om in group.offsets.items()
                   if tp[0] not in subscribed and not group.has_pending_offset_commits_for(tp)
                   and now - om.commit_timestamp >= retention_ms]
        for tp in expired:
            del group.offsets[tp]
            group.commit_record_offsets.pop(tp, None)
        records: list[tuple[bytes, bytes | None]] = [
            (offset_key(gid, t, p), None) for t, p in expired]
        if group.is_empty() and not group.has_offsets():
            self.consumer.remove_group(group)
            records.append(self.consumer.tombstone(gid))
            logger.info("empty consumer group without offsets removed", group=gid)
        if records:
            self.store.write(gid, records)
        if expired:
            logger.info("offsets expired", group=gid, partitions=len(expired))
        return len(expired)


def _heartbeat_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return "heartbeat", group_id, member_id


def _consumer_commit_error(group: ConsumerGroup, member_id: str, member_epoch: int, *,
                           transactional: bool, api_version: int,
                           held: Callable[[ConsumerGroupMember], bool]) -> ErrorCode | None:
    """Kafka's ConsumerGroup.validateOffsetCommit: without an epoch only an Empty group takes
    commits (admin tools, assign() consumers); a member commits at its current epoch, with
    OffsetCommit v9+.

    A commit one epoch behind is taken when the member has held every partition it commits
    since that epoch, as Kafka 4.3 relaxed the check (KIP-1251): the client sent it before
    reading the heartbeat answer that moved it on, and librdkafka hands STALE_MEMBER_EPOCH to
    the application."""
    if member_epoch < 0 and group.is_empty():
        return None
    member = group.members.get(member_id)
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if member.uses_classic_protocol:
        # A classic member's generation is its member epoch.
        return None if member_epoch == member.member_epoch else ErrorCode.ILLEGAL_GENERATION
    if not transactional and api_version < 9:
        return ErrorCode.UNSUPPORTED_VERSION
    if member_epoch != member.member_epoch:
        if member_epoch == member.previous_member_epoch and held(member):
            return None
        return ErrorCode.STALE_MEMBER_EPOCH
    return None


def _commit_error(append_error: ErrorCode) -> ErrorCode:
    """What a failed append to __consumer_offsets means to a committing client (Kafka's
    GroupMetadataManager): its coordinator moved or failed, or the commit was too large."""
    if append_error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if append_error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE,
                        ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return ErrorCode.COORDINATOR_NOT_AVAILABLE


def offset_commit_error(error: ErrorCode) -> ErrorCode:
    """Kafka's GroupMetadataManager.maybeConvertOffsetCommitError, for transactional offset
    commits: a failed append or verification as a producer understands it. Fencing and
    transaction-state errors (INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE ...) pass unchanged."""
    if error == ErrorCode.NETWORK_EXCEPTION:
        # Retriable, and without a needless coordinator lookup.
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    if error in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                 ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE,
                 ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return error
