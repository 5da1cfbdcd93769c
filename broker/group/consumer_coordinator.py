"""ConsumerGroupCoordinator: the consumer group protocol (KIP-848) on one event loop.

A member's ConsumerGroupHeartbeat does everything (Kafka's GroupMetadataManager
.consumerGroupHeartbeat): it joins (epoch 0), keeps the session, carries subscription changes
and the partitions the member owns, and gets back its epoch and, when it changed, its
assignment. Each heartbeat runs three steps: update the member (a changed subscription, or a
change in the subscribed topics' partitions, bumps the group epoch); compute a new target
assignment with the server-side assignor if the group epoch is ahead of it; reconcile the
member one step towards its target (consumer_group.reconcile).

Deadlines are keyed by (group, member, kind) on the coordinators' timer
(broker/coordinator/timer.py): the session (group.consumer.session.timeout.ms, renewed by each
heartbeat) and, while a member must revoke partitions, its rebalance timeout; either expiring
fences the member out of the group, which bumps the group epoch so the others take over its
partitions.

Members and assignments live in memory only: the group record written to __consumer_offsets
holds the group epoch, so after a restart the group is known (Empty) and a member heartbeating
with its old id is answered UNKNOWN_MEMBER_ID and rejoins. Committed offsets are the
OffsetMetadataManager's, by group id, for both protocols alike.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import structlog
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from broker.config import BrokerConfig
from broker.coordinator.timer import CoordinatorTimer
from broker.group.assignors import ASSIGNORS, MemberSubscription, assignor_names
from broker.group.classic_group import GroupMetadata, GroupState
from broker.group.classic_member import JoinResult
from broker.group.consumer_group import (
    ConsumerGroup,
    ConsumerGroupState,
    compile_regex,
    reconcile,
)
from broker.group.consumer_member import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroupMember,
    MemberState,
    Partitions,
)
from broker.group.offsets_store import consumer_group_key, consumer_group_value, group_key
from broker.metadata.dynamic_config import group_setting
from protocol.errors import ErrorCode
from purgatory import Timer, WallClock

if TYPE_CHECKING:
    from broker.coordinator.records import Record
    from broker.group.registry import Group, GroupRegistry
    from broker.metadata.file_store import TopicInfo, TopicsImage
    from broker.replica.delayed_result import Completion

logger = structlog.get_logger("broker.group")

#: Topics a regex never matches, as the clients never subscribe to them by pattern.
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
Owned = list[tuple[uuid.UUID | None, list[int]]]


@dataclass(frozen=True, slots=True)
class ConsumerGroupConfig:
    enabled: bool
    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_size: int
    assignors: tuple[str, ...]  # short names; the first is the default

    @classmethod
    def of(cls, cfg: BrokerConfig) -> ConsumerGroupConfig:
        return cls("consumer" in cfg["group.coordinator.rebalance.protocols"],
                   cfg["group.consumer.session.timeout.ms"],
                   cfg["group.consumer.heartbeat.interval.ms"], cfg["group.consumer.max.size"],
                   tuple(assignor_names(cfg["group.consumer.assignors"])))


@dataclass(slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: list[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Owned | None = None
    client_id: str = ""
    client_host: str = ""
    # May this member see the topic (DESCRIBE)? Regex subscriptions resolve only to those.
    topic_allowed: Callable[[str], bool] = lambda _name: True


@dataclass(slots=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Partitions | None = None  # None: unchanged, not sent


class GroupError(Exception):
    """An error answer (Kafka's ApiException), raised where the rule is checked."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def new_member_id() -> str:
    """A member id as Kafka makes one: a random UUID in URL-safe base64."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class ConsumerGroupCoordinator:
    """The consumer protocol's side of the registry: its groups' members, epochs, assignments
    and deadlines. It reads the topics and the groups' configs from ``metadata`` and writes
    its group records with ``write``; a group it creates enters the registry once it has a
    member, replacing the Empty classic group of its id, if any (the offsets, kept by group
    id, stay)."""

    def __init__(self, config: ConsumerGroupConfig, groups: GroupRegistry, timer: Timer,
                 clock: WallClock, metadata: TopicsImage,
                 write: Callable[[str, list[Record]], Completion[ErrorCode]]) -> None:
        self.config = config
        self.groups = groups  # shared with the classic protocol
        self.clock = clock
        self.metadata = metadata
        self._write = write
        # A member's deadlines, by (group id, member id, kind): its session, its rebalance
        # timeout while it revokes, and a classic member's join and sync deadlines.
        self.deadlines: CoordinatorTimer[tuple[str, str, str]] = CoordinatorTimer(timer)
        self._regexes: dict[str, re.Pattern[str]] = {}
        self.rebalances: dict[str, int] = {}  # group epoch bumps per group (metrics)
        self.heartbeats = 0
        self.classic = ClassicMembers(self)

    def _topics(self) -> Mapping[str, TopicInfo]:
        return self.metadata.topics

    def held_since_previous_epoch(self, member: ConsumerGroupMember,
                                  partitions: Iterable[tuple[str, int]]) -> bool:
        """Whether the member has held every (topic, partition) since its previous epoch."""
        topics = self._topics()
        for name, index in partitions:
            info = topics.get(name)
            if info is None:
                return False
            for held in (member.assigned, member.previous_assigned):
                if index not in held.get(info.topic_id, ()):
                    return False
        return True

    # -- ConsumerGroupHeartbeat ------------------------------------------------------------
    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        self.heartbeats += 1
        try:
            self._validate(req)
            if req.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                return self._leave(req)
            return self._heartbeat(req)
        except GroupError as e:
            logger.debug("consumer group heartbeat refused", group=req.group_id,
                         member=req.member_id, error=e.code.name, reason=e.message)
            return HeartbeatResult(e.code, e.message)

    def _validate(self, req: HeartbeatRequest) -> None:
        """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
        def invalid(message: str) -> GroupError:
            return GroupError(ErrorCode.INVALID_REQUEST, message)

        if not req.group_id:
            raise invalid("GroupId can't be empty.")
        if req.instance_id == "":
            raise invalid("InstanceId can't be empty.")
        if req.rack_id == "":
            raise invalid("RackId can't be empty.")
        epoch = req.member_epoch
        if (epoch > 0 or epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH)) \
                and not req.member_id:
            raise invalid("MemberId can't be empty.")
        if epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if req.owned is None or req.owned:
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if not req.subscribed_topic_names and not req.subscribed_topic_regex:
                raise invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in "
                              "first request.")
        elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if req.instance_id is None:
                raise invalid("InstanceId can't be null.")
        elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise invalid("MemberEpoch is invalid.")
        if req.subscribed_topic_regex:
            self._pattern(req.subscribed_topic_regex)
        if req.server_assignor is not None and req.server_assignor not in self.config.assignors:
            raise GroupError(ErrorCode.UNSUPPORTED_ASSIGNOR,
                             f"ServerAssignor {req.server_assignor} is not supported. Supported "
                             f"assignors: {', '.join(self.config.assignors)}.")

    def _pattern(self, regex: str) -> re.Pattern[str]:
        pattern = self._regexes.get(regex)
        if pattern is None:
            try:
                pattern = compile_regex(regex)
            except re.error as e:
                raise GroupError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                                 f"SubscribedTopicRegex `{regex}` is not a valid regular "
                                 f"expression: {e}.") from None
            if len(self._regexes) > 1000:
                self._regexes.clear()
            self._regexes[regex] = pattern
        return pattern

    def _heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        joining = req.member_epoch == 0
        group = self.group_for_heartbeat(req.group_id, create=joining)
        created = self.groups.get(group.group_id) is not group
        try:
            return self._member_heartbeat(group, req)
        finally:
            if created and group.members:
                self._persist(group, replaced=self.groups.put(group))

    def _member_heartbeat(self, group: ConsumerGroup, req: HeartbeatRequest) -> HeartbeatResult:
        member_id = req.member_id
        if len(group.members) >= self.config.max_size and (
                not member_id or member_id not in group.members):
            raise GroupError(ErrorCode.GROUP_MAX_SIZE_REACHED,
                             "The consumer group has reached its maximum capacity of "
                             f"{self.config.max_size} members.")
        member_id = member_id or new_member_id()
        if req.instance_id is None:
            member = self._dynamic_member(group, member_id, req)
        else:
            member = self._static_member(group, member_id, req)
        updated = replace(
            member,
            instance_id=req.instance_id if req.instance_id is not None else member.instance_id,
            rack_id=req.rack_id if req.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(req.rebalance_timeout_ms if req.rebalance_timeout_ms != -1
                                  else member.rebalance_timeout_ms),
            server_assignor=(req.server_assignor if req.server_assignor is not None
                             else member.server_assignor),
            subscribed_topic_names=(tuple(sorted(set(req.subscribed_topic_names)))
                                    if req.subscribed_topic_names is not None
                                    else member.subscribed_topic_names),
            subscribed_topic_regex=((req.subscribed_topic_regex or None)
                                    if req.subscribed_topic_regex is not None
                                    else member.subscribed_topic_regex),
            client_id=req.client_id, client_host=req.client_host)
        reconciled = self._update_and_reconcile(group, member, updated, req.owned,
                                                req.topic_allowed)
        # The group's own configs (GROUP resource) win over the broker's, read at each beat.
        session_ms, interval_ms = self._group_timeouts(group.group_id)
        self._schedule_session(group.group_id, member_id, session_ms)
        full = req.member_epoch == 0 or (
            req.rebalance_timeout_ms != -1 and req.owned is not None
            and (req.subscribed_topic_names is not None
                 or req.subscribed_topic_regex is not None))
        changed = reconciled.assigned != member.assigned
        return HeartbeatResult(ErrorCode.NONE, None, member_id, reconciled.member_epoch,
                               interval_ms,
                               reconciled.assigned if full or changed else None)

    def _group_timeouts(self, group_id: str) -> tuple[int, int]:
        """consumer.session.timeout.ms and consumer.heartbeat.interval.ms of the group's
        configs (IncrementalAlterConfigs on the GROUP resource), else the broker's."""
        metadata = self.metadata
        return (group_setting(metadata, group_id, "consumer.session.timeout.ms",
                              self.config.session_timeout_ms),
                group_setting(metadata, group_id, "consumer.heartbeat.interval.ms",
                              self.config.heartbeat_interval_ms))

    def _update_and_reconcile(self, group: ConsumerGroup, member: ConsumerGroupMember,
                              updated: ConsumerGroupMember, owned: Owned | None,
                              topic_allowed: Callable[[str], bool]) -> ConsumerGroupMember:
        """The three steps of every heartbeat (and of a classic member's join): the member's
        update, bumping the group epoch if the subscriptions changed; a new target assignment
        if the group epoch is ahead of it; the member's next reconciliation step."""
        bump = (updated.subscribed_topic_names != member.subscribed_topic_names
                or updated.subscribed_topic_regex != member.subscribed_topic_regex)
        if updated.member_id not in group.members:
            logger.info("member joins the consumer group", group=group.group_id,
                        member=updated.member_id, instance=updated.instance_id,
                        protocol="classic" if updated.uses_classic_protocol else "consumer")
        group.update_member(updated)
        bump = self._resolve_regex(group, updated, topic_allowed) or bump
        bump = self._refresh_subscription_metadata(group) or bump
        if bump:
            self._bump_group_epoch(group, f"member {updated.member_id} joined or changed")
        if group.group_epoch > group.assignment_epoch:
            self._compute_target_assignment(group)
        return self._reconcile(group, updated, owned)

    def group_for_heartbeat(self, group_id: str, create: bool) -> ConsumerGroup:
        """Kafka's getOrMaybeCreateConsumerGroup: an empty classic group gives way to a new
        consumer group (the group id's offsets stay); a group with classic members is not a consumer
        group. A created group joins ``groups`` once it has a member."""
        found = self.groups.get(group_id)
        if isinstance(found, ConsumerGroup):
            return found
        if not create:
            if found is None:
                raise GroupError(ErrorCode.GROUP_ID_NOT_FOUND,
                                 f"Consumer group {group_id} not found.")
            raise GroupError(ErrorCode.GROUP_ID_NOT_FOUND,
                             f"Group {group_id} is not a consumer group.")
        group = ConsumerGroup(group_id=group_id, clock=self.clock)
        if found is not None and not found.is_(GroupState.EMPTY):
            raise GroupError(ErrorCode.GROUP_ID_NOT_FOUND,
                             f"Group {group_id} is not a consumer group.")
        return group

    def _dynamic_member(self, group: ConsumerGroup, member_id: str, req: HeartbeatRequest
                        ) -> ConsumerGroupMember:
        member = group.members.get(member_id)
        if member is None:
            if req.member_epoch != 0:
                raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                                 f"Member {member_id} is not a member of group "
                                 f"{group.group_id}.")
            return ConsumerGroupMember(member_id, rebalance_timeout_ms=req.rebalance_timeout_ms)
        self._check_member_epoch(member, req.member_epoch, req.owned)
        return member

    def _static_member(self, group: ConsumerGroup, member_id: str, req: HeartbeatRequest
                       ) -> ConsumerGroupMember:
        """Kafka's getOrMaybeSubscribeStaticConsumerGroupMember: a static member rejoining
        under a new member id replaces the previous one, which must have left (epoch -2)."""
        assert req.instance_id is not None
        existing = group.static_member(req.instance_id)
        if req.member_epoch == 0:
            if existing is None:
                member = group.members.get(member_id)
                if member is not None:
                    return member
                return ConsumerGroupMember(member_id,
                                           rebalance_timeout_ms=req.rebalance_timeout_ms)
            if existing.member_id == member_id:
                return existing  # the same member rejoining
            if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                raise GroupError(ErrorCode.UNRELEASED_INSTANCE_ID,
                                 f"Static member {member_id} with instance id "
                                 f"{req.instance_id} cannot join the group because the instance "
                                 f"id is owned by {existing.member_id} member.")
            return self._replace_static_member(group, existing, member_id)
        if existing is None:
            raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                             f"Instance id {req.instance_id} is unknown.")
        if existing.member_id != member_id:
            raise GroupError(ErrorCode.FENCED_INSTANCE_ID,
                             f"Static member {member_id} with instance id {req.instance_id} "
                             f"was fenced by member {existing.member_id}.")
        self._check_member_epoch(existing, req.member_epoch, req.owned)
        return existing

    def _replace_static_member(self, group: ConsumerGroup, old: ConsumerGroupMember,
                               member_id: str) -> ConsumerGroupMember:
        """The new member id takes over the old one's partitions and target, at epoch 0."""
        target = group.target_assignment.get(old.member_id)
        regex = group.resolved_regex.get(old.member_id)
        group.remove_member(old.member_id)
        self._cancel_deadlines(group.group_id, old.member_id)
        new = replace(old, member_id=member_id, member_epoch=0, previous_member_epoch=0)
        if target is not None:
            group.target_assignment[member_id] = target
        if regex is not None:
            group.resolved_regex[member_id] = regex
        group.update_member(new)
        logger.info("static member replaced", group=group.group_id, instance=old.instance_id,
                    old=old.member_id, new=member_id)
        return new

    @staticmethod
    def _check_member_epoch(member: ConsumerGroupMember, epoch: int, owned: Owned | None
                            ) -> None:
        """Kafka's throwIfConsumerGroupMemberEpochIsInvalid. Epoch 0 is a rejoin, always
        accepted; the previous epoch is accepted with a subset of the assignment, since the
        answer that moved the member on may have been lost."""
        if epoch == 0:
            return
        if epoch > member.member_epoch:
            raise GroupError(ErrorCode.FENCED_MEMBER_EPOCH,
                             f"The consumer group member has a greater member epoch ({epoch}) "
                             "than the one known by the group coordinator "
                             f"({member.member_epoch}). The member must abandon all its "
                             "partitions and rejoin.")
        if epoch < member.member_epoch and (
                epoch != member.previous_member_epoch or not _is_subset(owned, member.assigned)):
            raise GroupError(ErrorCode.FENCED_MEMBER_EPOCH,
                             f"The consumer group member has a smaller member epoch ({epoch}) "
                             "than the one known by the group coordinator "
                             f"({member.member_epoch}). The member must abandon all its "
                             "partitions and rejoin.")

    # -- subscriptions and the target assignment ------------------------------------------
    def _resolve_regex(self, group: ConsumerGroup, member: ConsumerGroupMember,
                       allowed: Callable[[str], bool]) -> bool:
        """The topics the member's regex matches now (whole names, internal topics never, only
        those the member may DESCRIBE); True if that changed."""
        old = group.resolved_regex.get(member.member_id, frozenset())
        if member.subscribed_topic_regex is None:
            new: frozenset[str] = frozenset()
        else:
            pattern = self._pattern(member.subscribed_topic_regex)
            new = frozenset(name for name in self._topics()
                            if name not in INTERNAL_TOPICS and pattern.fullmatch(name)
                            and allowed(name))
        if new:
            group.resolved_regex[member.member_id] = new
        else:
            group.resolved_regex.pop(member.member_id, None)
        return new != old

    def _refresh_subscription_metadata(self, group: ConsumerGroup) -> bool:
        """The subscribed topics that exist, with their ids and partition counts; a change
        (a topic created, deleted, grown) bumps the group epoch."""
        topics = self._topics()
        metadata = {}
        for name in group.subscribed_topics():
            info = topics.get(name)
            if info is not None:
                metadata[name] = (info.topic_id, info.partitions)
        if metadata == group.subscription_metadata:
            return False
        group.subscription_metadata = metadata
        return True

    def _bump_group_epoch(self, group: ConsumerGroup, reason: str) -> None:
        group.group_epoch += 1
        group.update_state()
        self.rebalances[group.group_id] = self.rebalances.get(group.group_id, 0) + 1
        logger.info("group epoch bumped", group=group.group_id, epoch=group.group_epoch,
                    reason=reason, members=len(group.members))
        self._persist(group)

    def _compute_target_assignment(self, group: ConsumerGroup) -> None:
        """Kafka's TargetAssignmentBuilder: the assignor sees each member's existing subscribed
        topics and its current target (for stickiness); the result is the new target at the
        group epoch."""
        metadata = group.subscription_metadata
        names = {topic_id: name for name, (topic_id, _count) in metadata.items()}
        subscriptions = {}
        for member_id, m in group.members.items():
            owned = {names[t]: parts for t, parts in group.target_assignment.get(
                member_id, {}).items() if t in names}
            subscriptions[member_id] = MemberSubscription(
                member_id, m.instance_id, m.rack_id,
                frozenset(t for t in group.member_topics(m) if t in metadata), owned)
        assignor_name = group.preferred_assignor(self.config.assignors[0])
        result = ASSIGNORS[assignor_name].assign(
            subscriptions, {name: count for name, (_id, count) in metadata.items()})
        group.target_assignment = {
            member_id: {metadata[t][0]: frozenset(parts) for t, parts in assignment.items()
                        if parts and t in metadata}
            for member_id, assignment in result.items()}
        group.assignment_epoch = group.group_epoch
        group.update_state()
        logger.info("target assignment computed", group=group.group_id, epoch=group.group_epoch,
                    assignor=assignor_name, members=len(group.members))

    def _reconcile(self, group: ConsumerGroup, member: ConsumerGroupMember, owned: Owned | None
                   ) -> ConsumerGroupMember:
        """Kafka's maybeReconcile: one step towards the target; a member that must revoke gets
        its rebalance timeout, which any other state cancels."""
        if member.is_reconciled_to(group.assignment_epoch):
            return member
        target = group.target_assignment.get(member.member_id, {})
        updated = reconcile(member, group.assignment_epoch, target,
                            group.current_partition_epoch, owned)
        if updated == member:
            return member
        group.update_member(updated)
        key = (group.group_id, member.member_id, "rebalance")
        if updated.state == MemberState.UNREVOKED_PARTITIONS:
            epoch = updated.member_epoch
            self.deadlines.schedule(key, updated.rebalance_timeout_ms,
                                    lambda: self._rebalance_expired(group.group_id,
                                                                    member.member_id, epoch))
        else:
            self.deadlines.cancel(key)
        logger.debug("member reconciled", group=group.group_id, member=member.member_id,
                     epoch=updated.member_epoch, state=updated.state.value)
        return updated

    # -- leaving and fencing ---------------------------------------------------------------
    def _leave(self, req: HeartbeatRequest) -> HeartbeatResult:
        """Kafka's consumerGroupLeave: -1 leaves; -2 is a static member leaving for a while,
        keeping its place (and partitions) until its session ends or it is replaced."""
        group = self.groups.get_consumer(req.group_id)
        if group is None:
            raise GroupError(ErrorCode.GROUP_ID_NOT_FOUND,
                             f"Consumer group {req.group_id} not found.")
        if req.instance_id is None:
            member = group.members.get(req.member_id)
            if member is None:
                raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                                 f"Member {req.member_id} is not a member of group "
                                 f"{req.group_id}.")
        else:
            member = group.static_member(req.instance_id)
            if member is None:
                raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID,
                                 f"Instance id {req.instance_id} is unknown.")
            if member.member_id != req.member_id:
                raise GroupError(ErrorCode.FENCED_INSTANCE_ID,
                                 f"Static member {req.member_id} with instance id "
                                 f"{req.instance_id} was fenced by member {member.member_id}.")
            if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                group.update_member(replace(member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                                            pending_revocation={}))
                logger.info("static member left for now", group=group.group_id,
                            member=member.member_id, instance=req.instance_id)
                return HeartbeatResult(ErrorCode.NONE, None, member.member_id,
                                       LEAVE_GROUP_STATIC_MEMBER_EPOCH)
        self.fence_member(group, member.member_id, "left the group")
        return HeartbeatResult(ErrorCode.NONE, None, req.member_id, req.member_epoch)

    def fence_member(self, group: ConsumerGroup, member_id: str, reason: str) -> None:
        """Kafka's consumerGroupFenceMember: the member goes and the group epoch is bumped."""
        if group.remove_member(member_id) is None:
            return
        self._cancel_deadlines(group.group_id, member_id)
        logger.info("member removed", group=group.group_id, member=member_id, reason=reason)
        self._refresh_subscription_metadata(group)
        self._bump_group_epoch(group, f"member {member_id} {reason}")

    def _session_expired(self, group_id: str, member_id: str) -> None:
        group = self.groups.get_consumer(group_id)
        if group is not None and member_id in group.members:
            self.fence_member(group, member_id, "session timed out")

    def _rebalance_expired(self, group_id: str, member_id: str, epoch: int) -> None:
        group = self.groups.get_consumer(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is not None and member is not None and member.member_epoch == epoch:
            self.fence_member(group, member_id,
                              f"did not revoke its partitions of epoch {epoch} within the "
                              "rebalance timeout")

    # -- deadlines -------------------------------------------------------------------------
    def _schedule_session(self, group_id: str, member_id: str, timeout_ms: int) -> None:
        self.deadlines.schedule((group_id, member_id, "session"), timeout_ms,
                                lambda: self._session_expired(group_id, member_id))

    def _schedule_classic_deadline(self, group_id: str, member_id: str, kind: str,
                                   timeout_ms: int) -> None:
        """A classic member's join or sync deadline (its rebalance timeout): missing it fences
        the member, as Kafka's consumerGroupJoinTimeout / SyncTimeout do."""
        self.deadlines.schedule((group_id, member_id, kind), timeout_ms,
                                lambda: self._classic_deadline_expired(group_id, member_id, kind))

    def _classic_deadline_expired(self, group_id: str, member_id: str, kind: str) -> None:
        group = self.groups.get_consumer(group_id)
        if group is not None and member_id in group.members:
            self.fence_member(group, member_id, f"did not {kind} within the rebalance timeout")

    def _cancel_deadlines(self, group_id: str, member_id: str) -> None:
        for kind in ("session", "rebalance", "join", "sync"):
            self.deadlines.cancel((group_id, member_id, kind))

    # -- the group record ------------------------------------------------------------------
    def _persist(self, group: ConsumerGroup, replaced: Group | None = None) -> None:
        """The group epoch to __consumer_offsets, so the group outlives a restart as a consumer
        group, with the tombstone of the classic group it ``replaced`` if that one was stored.
        Written behind the answer: members are not stored, so nothing a client is told
        depends on it."""
        if self.groups.get(group.group_id) is not group:
            return
        records: list[Record] = [
            (consumer_group_key(group.group_id), consumer_group_value(group.group_epoch))]
        if isinstance(replaced, GroupMetadata) and replaced.generation_id > 0:
            records.append((group_key(group.group_id), None))
        self._write(group.group_id, records).add_done_callback(
            lambda f: f.result() == ErrorCode.NONE or logger.warning(
                "consumer group record not written", group=group.group_id,
                error=f.result().name))

    def tombstone(self, group_id: str) -> tuple[bytes, None]:
        return consumer_group_key(group_id), None

    def remove_group(self, group: ConsumerGroup) -> None:
        """The group is deleted or gives way to a classic group (the caller writes the
        tombstone); its members' deadlines go with it."""
        for member_id in list(group.members):
            self._cancel_deadlines(group.group_id, member_id)
        group.state = ConsumerGroupState.DEAD
        if self.groups.get(group.group_id) is group:
            self.groups.remove(group.group_id)
        self.rebalances.pop(group.group_id, None)

    def restore(self) -> None:
        """The groups were read back from the log (Empty, without members): set their
        states."""
        for group in self.groups.consumer_groups():
            group.update_state()


def _is_subset(owned: Owned | None, assigned: Partitions) -> bool:
    if owned is None:
        return False
    for topic_id, indexes in owned:
        held = assigned.get(topic_id) if topic_id is not None else None
        if held is None or any(p not in held for p in indexes):
            return False
    return True


class ClassicMembers:
    """Members speaking the classic protocol inside a consumer group (Kafka 4's mixed groups,
    for rolling upgrades): JoinGroup is their heartbeat with a subscription, answered at once
    with their member epoch as the generation; SyncGroup hands them their current assignment;
    Heartbeat says REBALANCE_IN_PROGRESS when they should join again to move on."""

    def __init__(self, coordinator: ConsumerGroupCoordinator) -> None:
        self.c = coordinator

    def join(self, group: ConsumerGroup, member_id: str, instance_id: str | None,
             require_known_id: bool, client_id: str, client_host: str, rebalance_ms: int,
             session_ms: int, protocol_type: str, protocols: list[tuple[str, bytes]]
             ) -> JoinResult:
        """Kafka's classicGroupJoinToConsumerGroup."""
        c = self.c
        unknown = not member_id
        member_id = member_id or new_member_id()
        try:
            if len(group.members) >= c.config.max_size and member_id not in group.members:
                raise GroupError(ErrorCode.GROUP_MAX_SIZE_REACHED)
            if not group.supports_classic_protocols(protocol_type, {n for n, _ in protocols}):
                raise GroupError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            if require_known_id and unknown and instance_id is None:
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, member_id=member_id)
            subscription = _subscription(protocols)
            if subscription is None:
                raise GroupError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            topics, owned_names, rack = subscription
            member = self._member(group, member_id, instance_id, unknown, rebalance_ms)
        except GroupError as e:
            return JoinResult(e.code, member_id=member_id)
        updated = replace(
            member, instance_id=instance_id if instance_id is not None else member.instance_id,
            rack_id=rack if rack is not None else member.rack_id,
            rebalance_timeout_ms=rebalance_ms, subscribed_topic_names=tuple(sorted(set(topics))),
            client_id=client_id, client_host=client_host, classic_session_timeout_ms=session_ms,
            classic_protocols=tuple(protocols))
        ids = {name: info.topic_id for name, info in c._topics().items()}
        owned: Owned = [(ids[t], parts) for t, parts in owned_names if t in ids]
        reconciled = c._update_and_reconcile(group, member, updated, owned, lambda _n: True)
        gid = group.group_id
        c.deadlines.cancel((gid, member_id, "join"))
        c._schedule_session(gid, member_id, session_ms)
        c._schedule_classic_deadline(gid, member_id, "sync", rebalance_ms)
        return JoinResult(ErrorCode.NONE, reconciled.member_epoch, "consumer", protocols[0][0],
                          "", member_id, [])

    def _member(self, group: ConsumerGroup, member_id: str, instance_id: str | None,
                unknown: bool, rebalance_ms: int) -> ConsumerGroupMember:
        if instance_id is None:
            member = group.members.get(member_id)
            return member or ConsumerGroupMember(member_id, rebalance_timeout_ms=rebalance_ms)
        existing = group.static_member(instance_id)
        if existing is None:
            return group.members.get(member_id) or ConsumerGroupMember(
                member_id, rebalance_timeout_ms=rebalance_ms)
        if existing.member_id == member_id:
            return existing
        if not unknown:
            raise GroupError(ErrorCode.FENCED_INSTANCE_ID)
        return self.c._replace_static_member(group, existing, member_id)

    def _known(self, group: ConsumerGroup, member_id: str, instance_id: str | None
               ) -> ConsumerGroupMember:
        """Kafka's validateConsumerGroupMember, for a member of the classic protocol."""
        if instance_id is None:
            member = group.members.get(member_id)
        else:
            member = group.static_member(instance_id)
            if member is not None and member.member_id != member_id:
                raise GroupError(ErrorCode.FENCED_INSTANCE_ID)
        if member is None or not member.uses_classic_protocol:
            raise GroupError(ErrorCode.UNKNOWN_MEMBER_ID)
        return member

    def sync(self, group: ConsumerGroup, generation_id: int, member_id: str,
             instance_id: str | None, protocol_type: str | None, protocol_name: str | None
             ) -> tuple[ErrorCode, bytes]:
        """Kafka's classicGroupSyncToConsumerGroup: the member's assignment as it stands."""
        try:
            member = self._known(group, member_id, instance_id)
            if generation_id != member.member_epoch:
                raise GroupError(ErrorCode.ILLEGAL_GENERATION)
            first = (member.classic_protocols or (("", b""),))[0][0]
            if (protocol_type is not None and protocol_type != "consumer") or (
                    protocol_name is not None and protocol_name != first):
                raise GroupError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            self._raise_if_rebalancing(group, member)
        except GroupError as e:
            return e.code, b""
        gid = group.group_id
        self.c.deadlines.cancel((gid, member.member_id, "sync"))
        self.c._schedule_session(gid, member.member_id, member.classic_session_timeout_ms or 0)
        names = {info.topic_id: name for name, info in self.c._topics().items()}
        assignment = ConsumerProtocolAssignment(assigned_partitions=[
            ConsumerProtocolAssignment.TopicPartition(topic=names[t], partitions=sorted(ps))
            for t, ps in sorted(member.assigned.items(), key=lambda kv: str(kv[0]))
            if t in names], user_data=None)
        return ErrorCode.NONE, bytes(assignment.encode(version=0))

    def _raise_if_rebalancing(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        if group.group_epoch > member.member_epoch and (
                member.state != MemberState.UNREVOKED_PARTITIONS):
            self._join_again(group, member)
            raise GroupError(ErrorCode.REBALANCE_IN_PROGRESS)

    def _join_again(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        key = (group.group_id, member.member_id, "join")
        if not self.c.deadlines.is_scheduled(key):
            self.c._schedule_classic_deadline(group.group_id, member.member_id, "join",
                                              member.rebalance_timeout_ms)

    def heartbeat(self, group: ConsumerGroup, member_id: str, instance_id: str | None,
                  generation_id: int) -> ErrorCode:
        """Kafka's classicGroupHeartbeatToConsumerGroup: REBALANCE_IN_PROGRESS when the group
        moved on, the member must revoke, or partitions it waits for are free now."""
        try:
            member = self._known(group, member_id, instance_id)
            if generation_id != member.member_epoch:
                raise GroupError(ErrorCode.ILLEGAL_GENERATION)
        except GroupError as e:
            return e.code
        self.c._schedule_session(group.group_id, member.member_id,
                                 member.classic_session_timeout_ms or 0)
        if (member.member_epoch < group.group_epoch
                or member.state == MemberState.UNREVOKED_PARTITIONS
                or (member.state == MemberState.UNRELEASED_PARTITIONS
                    and not group.waiting_on_unreleased_partition(member))):
            self._join_again(group, member)
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group: ConsumerGroup, members: list[tuple[str, str | None]]
              ) -> list[ErrorCode]:
        """Kafka's classicGroupLeaveToConsumerGroup: each classic member named leaves."""
        results = []
        for member_id, instance_id in members:
            if instance_id is None:
                member = group.members.get(member_id)
            else:
                member = group.static_member(instance_id)
                if member is not None and member_id and member.member_id != member_id:
                    results.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
            if member is None or not member.uses_classic_protocol:
                results.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            self.c.fence_member(group, member.member_id, "left the group")
            results.append(ErrorCode.NONE)
        return results


def _subscription(protocols: list[tuple[str, bytes]]
                  ) -> tuple[list[str], list[tuple[str, list[int]]], str | None] | None:
    """The first protocol's ConsumerProtocolSubscription: topics, owned partitions, rack."""
    for _name, metadata in protocols:
        try:
            sub = ConsumerProtocolSubscription.decode(metadata)
        except Exception:
            continue
        owned = [(tp.topic, list(tp.partitions)) for tp in (
            getattr(sub, "owned_partitions", None) or [])]
        return list(sub.topics or []), owned, getattr(sub, "rack_id", None)
    return None
