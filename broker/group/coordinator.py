"""GroupCoordinator: Kafka's classic group protocol on one event loop, and the door to the rest.

Members join (JoinGroup), the rebalance waits in the join purgatory until all known members
have rejoined, the leader's assignment is distributed (SyncGroup), and sessions are kept by
heartbeats, each session a deadline on the coordinator's timer. Group metadata is written to
__consumer_offsets and answered once committed there.

Like Kafka's GroupMetadataManager it keeps one registry of groups (registry.py) shared with
the consumer protocol's coordinator (consumer_coordinator.py): a request finds the group
whatever its type and is answered by that type's rules. Offsets (commits, fetches, deletes,
transactional commits and expiry) are the OffsetMetadataManager's (offsets.py); this class
hands those requests on.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from broker.config import BrokerConfig
from broker.coordinator.ownership import PartitionOwnership
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
from broker.group.delayed import DelayedJoin, InitialDelayedJoin
from broker.group.offset_cache import OffsetAndMetadata
from broker.group.offsets import OffsetMetadataManager
from broker.group.offsets_store import OffsetsStore, group_key, group_value
from broker.group.registry import GroupRegistry
from broker.replica.delayed_result import Completion, all_of, completed
from protocol.errors import ErrorCode
from purgatory import Purgatory, Timer, WallClock

logger = structlog.get_logger("broker.group")

S = GroupState
TopicPartition = tuple[str, int]
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
    """The classic protocol's rebalances and sessions, and the door the APIs use.

    Invariants: `groups` is the only map of groups (the consumer coordinator and the
    offsets manager hold the same registry); a classic member with a session has one
    deadline, keyed ("heartbeat", group id, member id), none while its JoinGroup or SyncGroup
    is held; a group in PreparingRebalance has one DelayedJoin in the join purgatory.
    """

    def __init__(self, config: GroupConfig, timer: Timer, store: OffsetsStore,
                 partition_exists: Callable[[TopicPartition], bool], clock: WallClock) -> None:
        """``timer`` runs the groups' deadlines; ``clock`` is the broker's wall clock (state
        changes, offset expiry)."""
        self.config = config
        self.clock = clock
        # Every group, classic and consumer protocol: a group id is one group at most.
        self.groups = GroupRegistry()
        self.join_purgatory: Purgatory = Purgatory("join", timer)
        # Deadlines by key: a member's session (or a pending member's join deadline, the same
        # key, as Kafka), ("heartbeat", group id, member id); a generation's SyncGroup
        # deadline, ("sync", group id).
        self.deadlines: CoordinatorTimer[tuple[str, ...]] = CoordinatorTimer(timer)
        self.store = store
        self.rebalances: dict[str, int] = {}  # rebalances started per group (metrics)
        # The consumer protocol (KIP-848), on the same registry.
        self.consumer = ConsumerGroupCoordinator(
            config.consumer, self.groups, timer, clock, store.topics.metadata, store.write)
        self.offsets = OffsetMetadataManager(
            self.groups, store, clock, config.offsets_retention_ms, partition_exists,
            keep_session=self._keep_session, held=self.consumer.held_since_previous_epoch,
            delete_group=self._delete_group)
        #: Cluster mode: the __consumer_offsets partitions this broker coordinates and those
        #: it is loading. None: a single broker, every partition local and loaded at start.
        self.ownership: PartitionOwnership | None = None

    def start(self) -> None:
        """Rebuild every group from the offsets topic, if any (it is created on first use).
        Following partition leadership, nothing is loaded here: each partition is loaded when
        this broker becomes its leader."""
        self.groups.clear()
        self.offsets.clear()
        if self.ownership is None:
            self.store.load(self.groups, self.offsets)
        self._loaded(self.groups.values())

    def _loaded(self, groups: Iterable[GroupMetadata | ConsumerGroup]) -> None:
        """Groups read back from the log: their states and sessions."""
        self.consumer.restore()
        for classic in groups:
            if isinstance(classic, GroupMetadata):
                for member in classic.members.values():
                    self._schedule_heartbeat(classic, member)

    # -- partition leadership (cluster mode) ---------------------------------------------------
    def follow_partition_leadership(self) -> None:
        """Coordinate only the groups of the partitions this broker leads (cluster mode):
        nothing until ``load_partition``; the topic is created through the controller."""
        self.ownership = PartitionOwnership()
        self.store.auto_create = False

    def coordinator_error(self, group_id: str) -> ErrorCode | None:
        """Kafka's validateGroupStatus: COORDINATOR_LOAD_IN_PROGRESS while the group's
        partition is loading, NOT_COORDINATOR when this broker does not lead it."""
        if self.ownership is None:
            return None
        return self.ownership.error(self.partition_for(group_id))

    def begin_loading(self, partition: int) -> None:
        """Kafka's onElection: the partition is this broker's, its groups not yet read."""
        if self.ownership is not None:
            self.ownership.begin_loading(partition)

    def load_partition(self, partition: int) -> None:
        """The partition's groups and offsets read back from its log (the loader start uses),
        then served (Kafka's loadGroupsAndOffsets). Anything held of the partition before is
        dropped first, so a reload starts clean."""
        self.begin_loading(partition)
        self._unload_groups(partition)
        before = set(self.groups)
        self.store.load_partition(partition, self.groups, self.offsets)
        self._loaded([g for g in self.groups.values() if g.group_id not in before])
        if self.ownership is not None:
            self.ownership.loaded(partition)

    def unload_partition(self, partition: int) -> None:
        """Kafka's onResignation (removeGroupsForPartition): the partition's groups leave
        this broker; their parked JoinGroup and SyncGroup answer NOT_COORDINATOR."""
        if self.ownership is not None:
            self.ownership.lost(partition)
        unloaded = self._unload_groups(partition)
        if unloaded:
            logger.info("groups unloaded", partition=partition, groups=unloaded)

    def _unload_groups(self, partition: int) -> int:
        groups = [g for g in self.groups.values() if self.partition_for(g.group_id) == partition]
        for group in groups:
            if isinstance(group, ConsumerGroup):
                self.consumer.remove_group(group)
            else:
                self._unload_classic(group)
            self.offsets.unload_group(group.group_id)
        return len(groups)

    def _unload_classic(self, group: GroupMetadata) -> None:
        """Kafka's onGroupUnloaded: Dead, its waiters answered NOT_COORDINATOR, its
        deadlines dropped (the new coordinator keeps the sessions)."""
        gid = group.group_id
        self.groups.remove(gid)
        self.rebalances.pop(gid, None)
        group.transition(S.DEAD)
        for member in group.members.values():
            join, sync = member.awaiting_join, member.awaiting_sync
            member.awaiting_join = member.awaiting_sync = None
            if join is not None and not join.done():
                join.set_result(JoinResult(ErrorCode.NOT_COORDINATOR, member_id=member.member_id))
            if sync is not None and not sync.done():
                sync.set_result((ErrorCode.NOT_COORDINATOR, b""))
        for member_id in [*group.members, *group.pending_members]:
            self.deadlines.cancel(_heartbeat_key(gid, member_id))
        self.deadlines.cancel(("sync", gid))
        self.join_purgatory.check_and_complete(gid)

    # -- ConsumerGroupHeartbeat (the consumer protocol) -------------------------------------
    def consumer_group_heartbeat(self, request: HeartbeatRequest) -> HeartbeatResult:
        if request.group_id and (moved := self.coordinator_error(request.group_id)) is not None:
            return HeartbeatResult(moved)
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
        if (moved := self.coordinator_error(group_id)) is not None:
            return completed(JoinResult(moved, member_id=member_id))
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            return completed(JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=member_id))
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            if not group.is_empty():
                # A classic member joins the consumer group as it is (Kafka's mixed groups).
                if rebalance_timeout_ms < 0:
                    rebalance_timeout_ms = session_timeout_ms
                return completed(self.consumer.classic.join(
                    group, member_id, instance_id, require_known_id, client_id,
                    client_host, rebalance_timeout_ms, session_timeout_ms, protocol_type,
                    protocols))
            group = self._classic_from_empty_consumer_group(group)
        if group is None:
            if member_id:
                return completed(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id))
            group = GroupMetadata(group_id, clock=self.clock)
            self.groups.put(group)
        if group.is_(S.DEAD):
            return completed(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id=member_id))
        if not group.supports(protocol_type, protocols):
            return completed(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id=member_id))
        member = group.members.get(member_id)
        if not self._accepts_joining(group, member):
            # A member of the group that is not rejoining in time is dropped from it (Kafka).
            if member is not None:
                self._remove_and_update(group, member, "found the group full")
            return completed(JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED))
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms  # JoinGroup v0 has no rebalance timeout
        details = (client_id, client_host, rebalance_timeout_ms, session_timeout_ms,
                   protocol_type, protocols)
        if not member_id:
            return self._join_unknown(group, instance_id, require_known_id, *details)
        return self._join_known(group, member_id, member, instance_id, *details)

    def _accepts_joining(self, group: GroupMetadata, member: MemberMetadata | None) -> bool:
        """Kafka's acceptJoiningMember under group.max.size: while a rebalance gathers members
        those already rejoined count, so the last to rejoin an over-full group are turned away;
        otherwise the members count."""
        if group.is_(S.EMPTY, S.DEAD):
            return True
        if group.is_(S.PREPARING_REBALANCE):
            awaiting = sum(m.awaiting_join is not None for m in group.members.values())
            return (member is not None and member.awaiting_join is not None
                    ) or awaiting < self.config.max_size
        return member is not None or len(group.members) < self.config.max_size

    def _classic_from_empty_consumer_group(self, consumer_group: ConsumerGroup
                                           ) -> GroupMetadata:
        """An empty consumer group may change protocol: a classic group takes its place; the
        offsets, kept by group id, stay (Kafka's maybeDeleteEmptyConsumerGroup)."""
        gid = consumer_group.group_id
        self.consumer.remove_group(consumer_group)
        group = GroupMetadata(gid, clock=self.clock)
        self.groups.put(group)
        self.store.write(gid, [self.consumer.tombstone(gid)])
        logger.info("empty consumer group becomes a classic group", group=gid)
        return group

    def _join_unknown(
        self, group: GroupMetadata, instance_id: str | None, require_known_id: bool,
        client_id: str, client_host: str, rebalance_ms: int, session_ms: int,
        protocol_type: str, protocols: list[tuple[str, bytes]],
    ) -> Completion[JoinResult]:
        new_id = f"{client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            old = group.static_member(instance_id)
            if old is not None:
                return self._replace_static_member(group, old, new_id, rebalance_ms,
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
        self, group: GroupMetadata, member: MemberMetadata, new_id: str, rebalance_ms: int,
        session_ms: int, protocols: list[tuple[str, bytes]],
    ) -> Completion[JoinResult]:
        """A restarted static member takes over its identity and its assignment (KIP-345).

        The old id is fenced; in a Stable group whose protocol stays the same nothing else
        changes: no rebalance, the member syncs and gets its stored assignment back. The answer
        names the leader as it was, so a replaced leader does not run the assignor again.
        """
        old_id = member.member_id
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
        self, group: GroupMetadata, member_id: str, member: MemberMetadata | None,
        instance_id: str | None, client_id: str, client_host: str, rebalance_ms: int,
        session_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]],
    ) -> Completion[JoinResult]:
        """A JoinGroup with a member id: a pending member's first join, or a member's
        rejoin (``member`` is the group's member of that id, if any)."""
        if group.remove_pending_member(member_id):
            self.deadlines.cancel(_heartbeat_key(group.group_id, member_id))
            joined = MemberMetadata(member_id, instance_id, client_id, client_host, rebalance_ms,
                                    session_ms, protocol_type, protocols)
            return self._add_and_rebalance(group, joined)
        if instance_id is not None and group.static_members.get(instance_id) != member_id:
            return completed(JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id=member_id))
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
        if group.sync_received(member_id) and not group.pending_sync:
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
        if (moved := self.coordinator_error(group_id)) is not None:
            return completed((moved, b""))
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            return completed(self.consumer.classic.sync(
                group, generation_id, member_id, instance_id, protocol_type, protocol_name))
        member = _current_member(group, member_id, instance_id, generation_id)
        if isinstance(member, ErrorCode):
            return completed((member, b""))
        assert group is not None
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
                protocol_name is not None and protocol_name != group.protocol_name):
            return completed((ErrorCode.INCONSISTENT_GROUP_PROTOCOL, b""))
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
        if (moved := self.coordinator_error(group_id)) is not None:
            return moved
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            return self.consumer.classic.heartbeat(group, member_id, instance_id,
                                                   generation_id)
        member = _current_member(group, member_id, instance_id, generation_id)
        if isinstance(member, ErrorCode):
            return member
        assert group is not None
        self._schedule_heartbeat(group, member)
        if group.is_(S.PREPARING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode, list[ErrorCode]]:
        if (moved := self.coordinator_error(group_id)) is not None:
            return moved, [moved for _ in members]
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            return ErrorCode.NONE, self.consumer.classic.leave(group, members)
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
            if group.remove_pending_member(member_id):
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
        if group.remove_pending_member(member_id):
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
        join, sync = member.awaiting_join, member.awaiting_sync
        if join is not None and not join.done():
            join.set_result(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member.member_id))
        if sync is not None and not sync.done():
            sync.set_result((ErrorCode.UNKNOWN_MEMBER_ID, b""))
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

    # -- offsets (the OffsetMetadataManager's) ---------------------------------------------
    def commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], api_version: int = 8,
    ) -> Completion[dict[TopicPartition, ErrorCode]]:
        if (moved := self.coordinator_error(group_id)) is not None:
            return completed({tp: moved for tp in offsets})
        return self.offsets.commit_offsets(group_id, member_id, instance_id, generation_id,
                                           offsets, api_version)

    def commit_transactional_offsets(
        self, group_id: str, producer_id: int, producer_epoch: int, member_id: str,
        group_instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> Completion[dict[TopicPartition, ErrorCode]]:
        if (moved := self.coordinator_error(group_id)) is not None:
            return completed({tp: moved for tp in offsets})
        return self.offsets.commit_transactional_offsets(
            group_id, producer_id, producer_epoch, member_id, group_instance_id, generation_id,
            offsets)

    def handle_txn_completion(self, producer_id: int, offsets_partitions: Iterable[int],
                              commit: bool) -> None:
        self.offsets.handle_txn_completion(producer_id, offsets_partitions, commit)

    def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None,
                      require_stable: bool = False
                      ) -> dict[TopicPartition, OffsetAndMetadata | ErrorCode | None]:
        return self.offsets.fetch_offsets(group_id, partitions, require_stable)

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int
                              ) -> ErrorCode | None:
        return self.offsets.validate_offset_fetch(group_id, member_id, member_epoch)

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]
                       ) -> Completion[tuple[ErrorCode, dict[TopicPartition, ErrorCode]]]:
        if (moved := self.coordinator_error(group_id)) is not None:
            return completed((moved, {}))
        return self.offsets.delete_offsets(group_id, partitions)

    def expire_offsets(self) -> int:
        return self.offsets.expire_offsets()

    def _keep_session(self, group: GroupMetadata, member_id: str) -> None:
        """A classic member's offset commit keeps its session, as a heartbeat does."""
        member = group.members.get(member_id)
        if member is not None:
            self._schedule_heartbeat(group, member)

    # -- admin -----------------------------------------------------------------------------
    def list_groups(self) -> list[GroupMetadata | ConsumerGroup]:
        """Every live group, classic and consumer."""
        groups: list[GroupMetadata | ConsumerGroup] = [
            g for g in self.groups.classic_groups() if not g.is_(S.DEAD)]
        return groups + self.groups.consumer_groups()

    def delete_groups(self, group_ids: list[str]) -> Completion[dict[str, ErrorCode]]:
        """Kafka's deleteGroups: only an Empty group goes, with its offsets and metadata."""
        results: dict[str, ErrorCode] = {}
        writes: list[Completion[ErrorCode]] = []
        for gid in group_ids:
            if (moved := self.coordinator_error(gid)) is not None:
                results[gid] = moved
                continue
            group = self.groups.get(gid)
            if group is None or group.is_dead():
                results[gid] = ErrorCode.GROUP_ID_NOT_FOUND
                continue
            if not group.is_empty():
                results[gid] = ErrorCode.NON_EMPTY_GROUP
                continue
            records = self.offsets.delete_all_offsets(group) + self._delete_group(group)
            if records:
                writes.append(self.store.write(gid, records))
            results[gid] = ErrorCode.NONE
            logger.info("group deleted", group=gid)
        if not writes:
            return completed(results)
        answer: Completion[dict[str, ErrorCode]] = Completion()
        all_of(writes).add_done_callback(lambda _f: answer.set_result(results))
        return answer

    def _delete_group(self, group: GroupMetadata | ConsumerGroup) -> list[Record]:
        """The group is gone (deleted, or Empty without offsets): out of the registry with
        its deadlines and counters; returns the tombstone of its metadata record, if it has
        one (a classic group has one once it reached a generation)."""
        gid = group.group_id
        if isinstance(group, ConsumerGroup):
            self.consumer.remove_group(group)
            return [self.consumer.tombstone(gid)]
        group.transition(S.DEAD)
        self.groups.remove(gid)
        self.rebalances.pop(gid, None)
        return [(group_key(gid), None)] if group.generation_id > 0 else []


def _heartbeat_key(group_id: str, member_id: str) -> tuple[str, str, str]:
    return "heartbeat", group_id, member_id


def _current_member(group: GroupMetadata | None, member_id: str, instance_id: str | None,
                    generation_id: int) -> MemberMetadata | ErrorCode:
    """The member a SyncGroup or Heartbeat speaks for; UNKNOWN_MEMBER_ID without a group."""
    if group is None:
        return ErrorCode.UNKNOWN_MEMBER_ID
    return group.current_member(member_id, instance_id, generation_id)


