"""The controller's topic and partition-state writes (Kafka's ZooKeeper-era KafkaController
with its PartitionStateMachine, through ControllerContext's epoch fence).

Invariants:
- Every write is a ``ControllerContext.txn``: a deposed controller's create, delete or
  election raises ``ControllerMoved`` and changes nothing.
- A topic is created whole or not at all: its assignment, configs and every partition's
  initial state in one txn that requires the assignment key to be absent, so of two creates
  of one name exactly one succeeds and the other gets TOPIC_ALREADY_EXISTS.
- A partition state is only rewritten by compare-and-swap on its version (Kafka's zkVersion):
  a lost race re-reads the winner's state (in the same round trip) and decides again, at most
  ``max_cas_attempts`` times; every leader or ISR change moves the leader epoch by one.
- Elections are Kafka's OfflinePartitionLeaderElectionStrategy: the first replica in
  assignment order that is live and in the ISR; else, with ``unclean.leader.election.enable``,
  the first live replica; else no leader (-1) and the ISR left as Kafka left it (the dead
  replicas removed, but never the last one: "last replica standing").
- Operations run one at a time (Kafka's single controller event thread).
- Controller work the store fails (unreachable, refused) is run again, after a backoff growing
  from ``RETRY_BACKOFF_MIN_MS`` to ``RETRY_BACKOFF_MAX_MS``, for as long as this broker stays
  the same controller: Kafka's controller retried a ZooKeeper request until connected, for
  as long as its session lasted. Every piece of work re-reads what it decides on, so running
  it again is safe.
- Leadership moves only to a replica that is live, in the ISR and not shutting down
  (controlled shutdown, preferred election, the auto rebalance); a broker in controlled
  shutdown keeps leading what could not be moved until it goes.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import random
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from broker.cluster.controller import ControllerContext, ControllerMoved
from broker.cluster.liveness import BrokerChange, BrokerLivenessView
from broker.cluster.placement import (
    PlacementError,
    RackAwareMode,
    assign_replicas,
    brokers_for_placement,
    new_partitions_assignment,
    validate_manual_assignment,
)
from broker.cluster.prefix_follower import PrefixFollower
from broker.cluster.store import (
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    Listing,
    MetadataStore,
    Op,
    Put,
    StoreError,
    StoreUnavailable,
    WatchEvent,
    sleep_until,
)
from broker.cluster.topic_state import (
    NO_LEADER,
    TOPIC_CONFIGS,
    TOPICS,
    UNCLEAN_LEADER_ELECTION,
    MalformedLog,
    MalformedMetadata,
    PartitionState,
    TopicAssignment,
    config_key,
    decode_topic_config,
    encode_topic_config,
    new_topic_id,
    parse_state_key,
    parse_topic_key,
    partitions_prefix,
    state_key,
    topic_key,
    topic_name_problem,
)
from protocol.errors import ErrorCode

logger = structlog.get_logger("broker.cluster")


@dataclass(frozen=True, slots=True)
class TopicResult:
    """One topic's outcome, as CreateTopics / CreatePartitions / DeleteTopics answer it."""

    name: str
    error_code: ErrorCode = ErrorCode.NONE
    message: str | None = None
    topic_id: str | None = None
    partitions: Mapping[int, list[int]] | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is ErrorCode.NONE


def _shrunk_isr(isr: list[int], live: Collection[int]) -> list[int]:
    """The ISR without dead replicas; the last one stays when none is live (the ZooKeeper-era
    controller never emptied an ISR)."""
    return [r for r in isr if r in live] or isr[-1:]


def elect_leader(replicas: Sequence[int], state: PartitionState, live: Collection[int],
                 unclean: bool, controller_epoch: int, shutting_down: Collection[int] = ()
                 ) -> PartitionState | None:
    """The partition's next state given the live brokers, None when it stays as it is.
    ``shutting_down`` (live brokers in controlled shutdown) keep what they lead but are
    never elected (Kafka's liveBrokerIds leave them out)."""
    if state.leader != NO_LEADER and state.leader in live:
        isr = _shrunk_isr(state.isr, live)
        return None if isr == state.isr else state.next(state.leader, isr, controller_epoch)
    leader = next((r for r in replicas
                   if r in live and r in state.isr and r not in shutting_down), None)
    if leader is not None:
        return state.next(leader, [r for r in state.isr if r in live], controller_epoch)
    if unclean:
        leader = next((r for r in replicas if r in live and r not in shutting_down), None)
        if leader is not None:
            return state.next(leader, [leader], controller_epoch)
    if state.leader == NO_LEADER:
        return None  # offline already, nothing to elect
    return state.next(NO_LEADER, _shrunk_isr(state.isr, live), controller_epoch)


def _elect_in(replicas: Sequence[int], live: Collection[int], unclean: bool,
              controller_epoch: int, shutting_down: Collection[int], state: PartitionState
              ) -> PartitionState | None:
    return elect_leader(replicas, state, live, unclean, controller_epoch, shutting_down)


def controlled_shutdown_leader(replicas: Sequence[int], state: PartitionState,
                               live: Collection[int], shutting_down: Collection[int],
                               controller_epoch: int) -> PartitionState | None:
    """Kafka's ControlledShutdownPartitionLeaderElectionStrategy: the first replica in
    assignment order that is live, in the ISR and not shutting down leads, with the ISR
    without the brokers shutting down; None when there is none (the leader stays)."""
    leader = next((r for r in replicas
                   if r in live and r in state.isr and r not in shutting_down), None)
    if leader is None:
        return None
    return state.next(leader, [r for r in state.isr if r not in shutting_down],
                      controller_epoch)


def without_replica(state: PartitionState, broker_id: int, controller_epoch: int
                    ) -> PartitionState | None:
    """Kafka's OfflineReplica transition of a follower: it leaves the ISR (never emptied);
    None when it is not in it."""
    if broker_id not in state.isr or len(state.isr) == 1:
        return None
    leader = NO_LEADER if state.leader == broker_id else state.leader
    return state.next(leader, [r for r in state.isr if r != broker_id], controller_epoch)


def preferred_leader(replicas: Sequence[int], state: PartitionState, live: Collection[int],
                     controller_epoch: int) -> PartitionState | None:
    """Kafka's PreferredReplicaPartitionLeaderElectionStrategy: the first assigned replica
    leads if it is live and in the ISR (the ISR kept); None when it cannot."""
    preferred = replicas[0] if replicas else NO_LEADER
    if preferred == state.leader or preferred not in live or preferred not in state.isr:
        return None
    return state.next(preferred, state.isr, controller_epoch)


class ElectionType(enum.IntEnum):
    """ElectLeaders' ElectionType (KIP-460)."""

    PREFERRED = 0
    UNCLEAN = 1


@dataclass(frozen=True, slots=True)
class ElectionResult:
    """One partition's outcome of ElectLeaders, with Kafka's error and message."""

    error_code: ErrorCode = ErrorCode.NONE
    message: str | None = None
    state: PartitionState | None = None  # the state written, when elected


ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."
UNKNOWN_PARTITION_MESSAGE = "The partition does not exist."
_STRATEGY = {ElectionType.PREFERRED: "PreferredReplicaPartitionLeaderElectionStrategy",
             ElectionType.UNCLEAN: "OfflinePartitionLeaderElectionStrategy(true)"}


@dataclass(frozen=True, slots=True)
class ShutdownResult:
    """ControlledShutdown's answer: an error, or the partitions the broker still leads."""

    error_code: ErrorCode = ErrorCode.NONE
    message: str | None = None
    remaining: tuple[tuple[str, int], ...] = ()


def imbalanced_partitions(snapshot: Mapping[tuple[str, int], tuple[Sequence[int],
                                                                   PartitionState]],
                          live: Collection[int], percentage: int) -> list[tuple[str, int]]:
    """Kafka's checkAndTriggerAutoLeaderRebalance: partitions grouped by preferred replica;
    for each broker whose share of partitions led by another exceeds ``percentage`` %, those
    of them whose preferred replica can lead now (live and in the ISR)."""
    by_preferred: dict[int, list[tuple[str, int]]] = {}
    for tp, (replicas, _state) in snapshot.items():
        if replicas:
            by_preferred.setdefault(replicas[0], []).append(tp)
    out: list[tuple[str, int]] = []
    for broker, tps in sorted(by_preferred.items()):
        not_preferred = [tp for tp in tps if snapshot[tp][1].leader != broker]
        if len(not_preferred) / len(tps) <= percentage / 100:
            continue
        out += [tp for tp in not_preferred
                if broker in live and broker in snapshot[tp][1].isr]
    return sorted(out)


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Every topic, config and partition state key, read at one revision."""

    topics: dict[str, TopicAssignment]
    configs: dict[str, dict[str, str]]
    states: dict[tuple[str, int], KeyValue]


class TopicController:
    """Creates and deletes topics and elects partition leaders for one controller epoch."""

    def __init__(
        self,
        context: ControllerContext,
        liveness: BrokerLivenessView,
        *,
        unclean_leader_election: bool = False,
        rack_aware_mode: RackAwareMode = RackAwareMode.ENFORCED,
        rng: random.Random | None = None,
        max_cas_attempts: int = 5,
        brokers_known_timeout_s: float = 5.0,
    ) -> None:
        self.context = context
        self.store = context.store
        self.liveness = liveness
        self.unclean_leader_election = unclean_leader_election
        self.rack_aware_mode = rack_aware_mode
        self.rng = rng or random.Random()
        self.max_cas_attempts = max_cas_attempts
        self.brokers_known_timeout_s = brokers_known_timeout_s
        self.malformed = MalformedLog()
        self._lock = asyncio.Lock()
        #: Live brokers in controlled shutdown (Kafka's shuttingDownBrokerIds): never elected.
        self.shutting_down: set[int] = set()

    def _live(self) -> set[int]:
        return set(self.liveness.live)

    def _electable(self) -> set[int]:
        return self._live() - self.shutting_down

    async def brokers_known(self) -> None:
        """Wait until the liveness view has listed the brokers: a controller elected a
        moment ago (etcd just back) has an empty view until then, and placing a topic on it
        would refuse the request for want of brokers. ``StoreUnavailable`` (the request's
        retriable REQUEST_TIMED_OUT) when the listing does not come in time."""
        if self.liveness.ready.is_set():
            return
        try:
            async with asyncio.timeout(self.brokers_known_timeout_s):
                await self.liveness.ready.wait()
        except TimeoutError:
            raise StoreUnavailable("the live brokers are not listed yet") from None

    # -- topics -----------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        partitions: int = -1,
        replication_factor: int = -1,
        *,
        configs: Mapping[str, str] | None = None,
        assignment: Mapping[int, Sequence[int]] | None = None,
    ) -> TopicResult:
        """Create a topic placed over the live brokers (or on ``assignment``), each partition
        led by its first live replica at leader epoch 0 with the live replicas as ISR."""
        problem = topic_name_problem(name)
        if problem is not None:
            return TopicResult(name, ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        await self.brokers_known()
        async with self._lock:
            live = self._live()
            try:
                if assignment is not None:
                    placed = validate_manual_assignment(assignment.items(), live)
                else:
                    brokers = brokers_for_placement(self.liveness.placement_brokers(),
                                                    self.rack_aware_mode)
                    placed = assign_replicas(brokers, partitions, replication_factor,
                                             rng=self.rng)
            except PlacementError as e:
                return TopicResult(name, e.error_code, e.message)
            topic = TopicAssignment(name, new_topic_id(), placed)
            ops: list[Op] = [Put(topic_key(name), topic.encode()),
                             Put(config_key(name), encode_topic_config(configs or {}))]
            ops += self._initial_states(name, placed, live)
            result = await self.context.txn([Compare.absent(topic_key(name))], ops)
            if not result.succeeded:
                return TopicResult(name, ErrorCode.TOPIC_ALREADY_EXISTS,
                                   f"Topic '{name}' already exists.")
            logger.info("topic created", topic=name, topic_id=topic.topic_id,
                        partitions=len(placed), epoch=self.context.epoch)
            return TopicResult(name, topic_id=topic.topic_id, partitions=placed)

    def _initial_states(self, name: str, placed: Mapping[int, list[int]],
                        live: Collection[int]) -> list[Op]:
        ops: list[Op] = []
        for p, replicas in placed.items():
            isr = [r for r in replicas if r in live]
            state = PartitionState(isr[0] if isr else NO_LEADER, 0, isr or replicas[-1:],
                                   self.context.epoch)
            ops.append(Put(state_key(name, p), state.encode()))
        return ops

    async def create_partitions(self, name: str, count: int,
                                assignments: Sequence[Sequence[int]] | None = None, *,
                                validate_only: bool = False) -> TopicResult:
        """Grow a topic to ``count`` partitions, placed as Kafka's addPartitions: the new
        partitions continue the round robin from the broker leading partition 0, with its
        replication factor; or on ``assignments`` (one replica list per new partition),
        checked against the live brokers. ``validate_only``: checked, nothing written."""
        await self.brokers_known()
        async with self._lock:
            for _ in range(self.max_cas_attempts):
                kv = await self.store.get(topic_key(name))
                if kv is None:
                    return TopicResult(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                       f"The topic '{name}' does not exist.")
                topic = TopicAssignment.decode(name, kv.value)
                current = len(topic.partitions)
                if count <= current:
                    return TopicResult(
                        name, ErrorCode.INVALID_PARTITIONS,
                        f"The number of partitions for a topic can only be increased. Topic "
                        f"{name} currently has {current} partitions, {count} would not be an "
                        f"increase.")
                live = self._live()
                try:
                    added = (new_partitions_assignment(topic.partitions, count, assignments,
                                                       live)
                             if assignments is not None
                             else self._place_more(topic, count - current))
                except PlacementError as e:
                    return TopicResult(name, e.error_code, e.message)
                if validate_only:
                    return TopicResult(name, topic_id=topic.topic_id,
                                       partitions={**topic.partitions, **added})
                grown = TopicAssignment(name, topic.topic_id, {**topic.partitions, **added})
                ops: list[Op] = [Put(topic_key(name), grown.encode())]
                ops += self._initial_states(name, added, live)
                result = await self.context.txn(
                    [Compare.mod_revision(topic_key(name), "==", kv.mod_revision)], ops)
                if result.succeeded:
                    logger.info("partitions added", topic=name, partitions=count)
                    return TopicResult(name, topic_id=topic.topic_id,
                                       partitions=grown.partitions)
            return TopicResult(name, ErrorCode.UNKNOWN_SERVER_ERROR,
                               f"topic {name} kept changing while partitions were added")

    def _place_more(self, topic: TopicAssignment, more: int) -> dict[int, list[int]]:
        brokers = brokers_for_placement(self.liveness.placement_brokers(), self.rack_aware_mode)
        first = topic.partitions[0]
        start = next((i for i, b in enumerate(brokers) if b.id >= first[0]), 0)
        return assign_replicas(brokers, more, len(first), start_index=start,
                               start_partition_id=len(topic.partitions))

    async def initialize_partitions(self, name: str) -> list[int]:
        """Give the topic's partitions that have no state yet their first state (Kafka's
        onNewPartitionCreation, for a topic another broker wrote: ``propose_topic``); the
        partitions initialized. Nothing when the topic is gone or every state exists."""
        await self.brokers_known()
        async with self._lock:
            key = topic_key(name)
            read = await self.store.txn([], [Get(key), Get(partitions_prefix(name),
                                                         prefix=True)])
            topic_kvs, state_kvs = read.responses
            assert isinstance(topic_kvs, list) and isinstance(state_kvs, list)
            if not topic_kvs:
                return []
            try:
                topic = TopicAssignment.decode(name, topic_kvs[0].value)
            except MalformedMetadata as e:
                self.malformed.report(topic_kvs[0], e)
                return []
            have = {tp[1] for kv in state_kvs if (tp := parse_state_key(kv.key)) is not None}
            missing = {p: r for p, r in topic.partitions.items() if p not in have}
            if not missing:
                return []
            compares = [Compare.create_revision(key, "==", topic_kvs[0].create_revision)]
            compares += [Compare.absent(state_key(name, p)) for p in missing]
            result = await self.context.txn(compares,
                                            self._initial_states(name, missing, self._live()))
            if not result.succeeded:
                return []  # re-created or initialized meanwhile: its next event says
            logger.info("new partitions initialized", topic=name, partitions=sorted(missing),
                        epoch=self.context.epoch)
            return sorted(missing)

    async def delete_topic(self, name: str) -> TopicResult:
        """Remove the topic's assignment, configs and partition states in one txn.

        Kafka marked the topic under ``/admin/delete_topics`` and removed the znodes only
        once every replica had acknowledged StopReplica, because brokers learnt of deletions
        only through that RPC. Here every broker follows the keys: the delete event (or the
        key's absence in a re-list) is its StopReplica, which it cannot miss, and the topic
        id tells a re-created topic of the same name apart, so there is nothing to wait for."""
        async with self._lock:
            kv = await self.store.get(topic_key(name))
            if kv is None:
                return TopicResult(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                   "This server does not host this topic-partition.")
            result = await self.context.txn(
                [Compare.create_revision(topic_key(name), "==", kv.create_revision)],
                [Delete(topic_key(name)), Delete(f"{topic_key(name)}/", prefix=True),
                 Delete(config_key(name))])
            if not result.succeeded:
                return TopicResult(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                   "This server does not host this topic-partition.")
            logger.info("topic deleted", topic=name)
            return TopicResult(name)

    # -- partition leaders --------------------------------------------------------------------

    async def on_broker_change(self, change: BrokerChange) -> None:
        """Kafka's onBrokerFailure / onBrokerStartup: partitions led by brokers that went get
        a new leader (or go offline), and offline partitions whose replicas came back get one.
        A broker that went is handled as gone even when it is back by the time this runs, and a
        bounced one (same id, newer epoch) first as gone, then as back: it stopped acting on
        its old registration when it lost it, so it must hear of a new leader epoch."""
        gone = ({b.info.node_id for b in change.removed}
                | {new.info.node_id for _, new in change.bounced})
        # A broker that went or registered again is no longer shutting down.
        self.shutting_down -= gone | {b.info.node_id for b in change.added}
        if gone:
            await self.elect_leaders(exclude=gone)
        await self.elect_leaders()

    async def elect_leaders(self, exclude: Collection[int] = ()) -> list[tuple[str, int,
                                                                           PartitionState]]:
        """Bring every partition's state in line with the live brokers (minus ``exclude``);
        the states written. Also what a newly elected controller runs first, as Kafka's
        onControllerFailover did, for brokers that changed while there was no controller."""
        async with self._lock:
            live = self._live() - set(exclude)
            snapshot = await self._read_all()
            written = []
            for (topic, p), kv in snapshot.states.items():
                assignment = snapshot.topics.get(topic)
                if assignment is None or p not in assignment.partitions:
                    continue
                decide = functools.partial(
                    _elect_in, assignment.partitions[p], live,
                    self._unclean(snapshot.configs.get(topic, {})), self.context.epoch,
                    self.shutting_down)
                state = await self._cas(kv, decide)
                if state is not None:
                    logger.info("partition leader changed", topic=topic, partition=p,
                                leader=state.leader, leader_epoch=state.leader_epoch,
                                isr=state.isr)
                    written.append((topic, p, state))
            return written

    async def controlled_shutdown(self, broker_id: int, broker_epoch: int = -1
                                  ) -> ShutdownResult:
        """Kafka's doControlledShutdown: the broker is marked shutting down; each partition
        with more than one replica that it leads gets another live ISR member as leader, and
        it leaves the ISR of those it follows. The answer names the partitions it still leads
        (none to move to). A ``broker_epoch`` older than the live registration's is
        STALE_BROKER_EPOCH (-1: not checked, as Kafka)."""
        async with self._lock:
            registered = self.liveness.live.get(broker_id)
            if (registered is not None and broker_epoch != -1
                    and broker_epoch < registered.epoch):
                return ShutdownResult(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"Received controlled shutdown request from an old broker epoch "
                    f"{broker_epoch} for broker {broker_id}. Current broker epoch is "
                    f"{registered.epoch}.")
            if registered is None:
                return ShutdownResult(ErrorCode.BROKER_NOT_AVAILABLE,
                                      f"Broker id {broker_id} does not exist.")
            self.shutting_down.add(broker_id)
            live = self._live()
            snapshot = await self._read_all()
            remaining = []
            for (topic, p), kv in sorted(snapshot.states.items()):
                assignment = snapshot.topics.get(topic)
                replicas = assignment.partitions.get(p) if assignment is not None else None
                if replicas is None or broker_id not in replicas or len(replicas) < 2:
                    continue
                state = await self._move_off(kv, replicas, broker_id, live)
                if state is not None and state.leader == broker_id:
                    remaining.append((topic, p))
            logger.info("controlled shutdown", broker=broker_id, remaining=len(remaining),
                        epoch=self.context.epoch)
            return ShutdownResult(remaining=tuple(remaining))

    async def _move_off(self, kv: KeyValue, replicas: Sequence[int], broker_id: int,
                        live: Collection[int]) -> PartitionState | None:
        """One partition of a broker in controlled shutdown: leadership moved away or the
        broker taken out of the ISR; the partition's state afterwards."""
        last: list[PartitionState] = []

        def decide(state: PartitionState) -> PartitionState | None:
            last[:] = [state]
            if state.leader == broker_id:
                return controlled_shutdown_leader(replicas, state, live, self.shutting_down,
                                                  self.context.epoch)
            return without_replica(state, broker_id, self.context.epoch)

        written = await self._cas(kv, decide)
        if written is not None:
            logger.info("partition state changed for controlled shutdown", key=kv.key,
                        leader=written.leader, leader_epoch=written.leader_epoch,
                        isr=written.isr)
            return written
        return last[0] if last else None

    async def elect(self, partitions: Collection[tuple[str, int]] | None,
                    election_type: ElectionType) -> dict[tuple[str, int], ElectionResult]:
        """Kafka's processReplicaLeaderElection for ElectLeaders: per partition, elected
        (NONE), ELECTION_NOT_NEEDED (already led by its preferred replica; for UNCLEAN, led
        by a live broker), PREFERRED_LEADER_NOT_AVAILABLE / ELIGIBLE_LEADERS_NOT_AVAILABLE
        (no replica may lead), or UNKNOWN_TOPIC_OR_PARTITION. ``None``: every partition."""
        async with self._lock:
            snapshot = await self._read_all()
            known = {(t, p): (a.partitions[p], snapshot.states.get((t, p)))
                     for t, a in snapshot.topics.items() for p in a.partitions}
            wanted = sorted(known) if partitions is None else sorted(set(partitions))
            results: dict[tuple[str, int], ElectionResult] = {}
            for tp in wanted:
                replicas, kv = known.get(tp, ((), None))
                if kv is None:
                    results[tp] = ElectionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                                 UNKNOWN_PARTITION_MESSAGE)
                    continue
                unclean = election_type is ElectionType.UNCLEAN
                results[tp] = await self._elect_one(tp, kv, replicas, unclean)
            return results

    async def _elect_one(self, tp: tuple[str, int], kv: KeyValue, replicas: Sequence[int],
                         unclean: bool) -> ElectionResult:
        live = self._electable()
        election = ElectionType.UNCLEAN if unclean else ElectionType.PREFERRED
        outcome: list[ElectionResult] = []

        def decide(state: PartitionState) -> PartitionState | None:
            needed = (state.leader == NO_LEADER or state.leader not in live) if unclean \
                else state.leader != (replicas[0] if replicas else NO_LEADER)
            if not needed:
                outcome[:] = [ElectionResult(ErrorCode.ELECTION_NOT_NEEDED,
                                             ELECTION_NOT_NEEDED_MESSAGE)]
                return None
            new = (elect_leader(replicas, state, live, True, self.context.epoch,
                                self.shutting_down) if unclean
                   else preferred_leader(replicas, state, live, self.context.epoch))
            if new is None or new.leader == NO_LEADER:
                error = (ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE if unclean
                         else ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE)
                outcome[:] = [ElectionResult(
                    error, f"Failed to elect leader for partition {tp[0]}-{tp[1]} under "
                           f"strategy {_STRATEGY[election]}")]
                return None
            return new

        written = await self._cas(kv, decide)
        if written is not None:
            logger.info("partition leader elected", topic=tp[0], partition=tp[1],
                        election=election.name, leader=written.leader,
                        leader_epoch=written.leader_epoch)
            return ElectionResult(state=written)
        if outcome:
            return outcome[0]
        return ElectionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION_MESSAGE)

    async def rebalance_leaders(self, percentage: int) -> list[tuple[str, int]]:
        """Kafka's checkAndTriggerAutoLeaderRebalance: a preferred election for the
        partitions of every broker whose leader imbalance exceeds ``percentage``; the
        partitions whose leadership moved back."""
        snapshot = await self._read_all()
        states: dict[tuple[str, int], tuple[Sequence[int], PartitionState]] = {}
        for (topic, p), kv in snapshot.states.items():
            assignment = snapshot.topics.get(topic)
            if assignment is None or p not in assignment.partitions:
                continue
            try:
                states[(topic, p)] = (assignment.partitions[p], PartitionState.from_kv(kv))
            except MalformedMetadata as e:
                self.malformed.report(kv, e)
        candidates = imbalanced_partitions(states, self._electable(), percentage)
        if not candidates:
            return []
        results = await self.elect(candidates, ElectionType.PREFERRED)
        return [tp for tp, r in results.items() if r.state is not None]

    def _unclean(self, configs: Mapping[str, str]) -> bool:
        value = configs.get(UNCLEAN_LEADER_ELECTION)
        return self.unclean_leader_election if value is None else value.lower() == "true"

    async def _cas(self, kv: KeyValue, decide: Callable[[PartitionState], PartitionState | None]
                   ) -> PartitionState | None:
        """Write ``decide(state)`` if not None, compare-and-swap on the key's version; on a
        lost race decide again on the state that won."""
        for _ in range(self.max_cas_attempts):
            try:
                state = PartitionState.from_kv(kv)
            except MalformedMetadata as e:
                self.malformed.report(kv, e)
                return None
            new = decide(state)
            if new is None:
                return None
            result = await self.context.txn([Compare.version(kv.key, "==", kv.version)],
                                            [Put(kv.key, new.encode())], [Get(kv.key)])
            if result.succeeded:
                return new
            current = result.responses[0]
            assert isinstance(current, list)
            if not current:
                return None  # deleted meanwhile
            kv = current[0]
        logger.warning("partition state kept changing, election given up", key=kv.key,
                       attempts=self.max_cas_attempts)
        return None

    async def _read_all(self) -> _Snapshot:
        read = await self.store.txn([], [Get(TOPICS, prefix=True),
                                         Get(TOPIC_CONFIGS, prefix=True)])
        topic_kvs, config_kvs = read.responses
        assert isinstance(topic_kvs, list) and isinstance(config_kvs, list)
        snapshot = _Snapshot({}, {}, {})
        for kv in topic_kvs:
            name = parse_topic_key(kv.key)
            tp = parse_state_key(kv.key)
            try:
                if name is not None:
                    snapshot.topics[name] = TopicAssignment.decode(name, kv.value)
                elif tp is not None:
                    snapshot.states[tp] = kv
            except MalformedMetadata as e:
                self.malformed.report(kv, e)
        for kv in config_kvs:
            name = kv.key[len(TOPIC_CONFIGS):]
            try:
                snapshot.configs[name] = decode_topic_config(name, kv.value)
            except MalformedMetadata as e:
                self.malformed.report(kv, e)
        return snapshot


def plan_topic(liveness: BrokerLivenessView, name: str, partitions: int,
               replication_factor: int, rack_aware_mode: RackAwareMode = RackAwareMode.SAFE,
               rng: random.Random | None = None) -> dict[int, list[int]]:
    """A new topic's placement over the brokers ``liveness`` sees (what a ZooKeeper-era broker
    computed before writing an auto-created topic's znode). Raises ``PlacementError``, with
    INVALID_TOPIC_EXCEPTION for a name Kafka refuses."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise PlacementError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
    brokers = brokers_for_placement(liveness.placement_brokers(), rack_aware_mode)
    return assign_replicas(brokers, partitions, replication_factor, rng=rng)


async def propose_topic(store: MetadataStore, name: str, placed: Mapping[int, list[int]],
                        configs: Mapping[str, str] | None = None) -> bool:
    """Write a new topic's assignment and configs, without partition states, if no topic of
    that name exists: what Kafka's AdminZkClient did on any broker. The controller sees the
    topic (``NewTopicFollower``) and gives its partitions their first state. False: the
    topic exists already."""
    topic = TopicAssignment(name, new_topic_id(), dict(placed))
    result = await store.txn([Compare.absent(topic_key(name))],
                             [Put(topic_key(name), topic.encode()),
                              Put(config_key(name), encode_topic_config(configs or {}))])
    if result.succeeded:
        logger.info("topic proposed to the controller", topic=name, topic_id=topic.topic_id,
                    partitions=len(placed))
    return result.succeeded


class NewTopicFollower(PrefixFollower):
    """The controller's watch for topics whose partitions have no state (written by another
    broker, or left so by a controller that failed between the writes): each is handed to
    ``on_topic``. A listing (the failover's) reports those it finds; then every write of a
    topic's assignment is reported, and ``initialize_partitions`` reads what is missing."""

    prefix = TOPICS
    description = "controller-new-topics"

    def __init__(self, store: MetadataStore, on_topic: Callable[[str], object]) -> None:
        super().__init__(store)
        self.on_topic = on_topic

    def _listed(self, listing: Listing) -> None:
        assignments: dict[str, KeyValue] = {}
        stated: set[tuple[str, int]] = set()
        for kv in listing.kvs:
            name, tp = parse_topic_key(kv.key), parse_state_key(kv.key)
            if name is not None:
                assignments[name] = kv
            elif tp is not None:
                stated.add(tp)
        for name, kv in assignments.items():
            try:
                partitions = TopicAssignment.decode(name, kv.value).partitions
            except MalformedMetadata:
                continue  # the watcher logs it
            if any((name, p) not in stated for p in partitions):
                self.on_topic(name)

    def _changed(self, event: WatchEvent) -> None:
        if event.type is EventType.PUT:
            name = parse_topic_key(event.kv.key)
            if name is not None:
                self.on_topic(name)


#: Kafka's controller schedules its first auto rebalance this long after its failover.
AUTO_REBALANCE_FIRST_DELAY_S = 5.0
#: Controller work the store failed is run again after this, doubling up to the maximum.
RETRY_BACKOFF_MIN_MS = 100.0
RETRY_BACKOFF_MAX_MS = 3200.0


@dataclass(frozen=True, slots=True)
class LeaderRebalance:
    """``leader.imbalance.check.interval.seconds`` and ``leader.imbalance.per.broker.percentage``
    (with ``auto.leader.rebalance.enable``)."""

    interval_s: float = 300.0
    percentage: int = 10


class ControllerDuties:
    """What this broker does as controller, hooked to the election and the liveness view
    (``ClusterMembership.register``'s ``on_elected``, ``on_brokers``, ``on_resigned``):
    on election a ``TopicController`` for the new epoch, which first brings every partition in
    line with the live brokers (Kafka's onControllerFailover); then each change of the live
    brokers is handled in order (Kafka's controller event queue); on resignation, nothing more.
    Work the store fails is retried while this controller lasts (``_until_done``).
    """

    def __init__(
        self,
        liveness: Callable[[], BrokerLivenessView | None],
        *,
        unclean_leader_election: bool = False,
        rack_aware_mode: RackAwareMode = RackAwareMode.ENFORCED,
        rng: random.Random | None = None,
        rebalance: LeaderRebalance | None = None,
    ) -> None:
        """``rebalance``: the periodic preferred-leader check (``auto.leader.rebalance.enable``
        and its keys); None: off."""
        self._liveness = liveness
        self._unclean = unclean_leader_election
        self._rack_aware_mode = rack_aware_mode
        self._rng = rng
        self.rebalance = rebalance
        self.controller: TopicController | None = None
        self._new_topics: NewTopicFollower | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._rebalancer: asyncio.Task[Any] | None = None

    def elected(self, context: ControllerContext) -> None:
        view = self._liveness()
        if view is None:
            logger.error("elected controller without a liveness view", epoch=context.epoch)
            return
        self.controller = TopicController(
            context, view, unclean_leader_election=self._unclean,
            rack_aware_mode=self._rack_aware_mode, rng=self._rng)
        self._spawn(self._failover(self.controller))

    async def _failover(self, controller: TopicController) -> None:
        await controller.liveness.ready.wait()
        self._spawn(self._follow_new_topics(controller))
        if self.rebalance is not None and self.controller is controller:
            self._stop_rebalancer()
            self._rebalancer = asyncio.get_running_loop().create_task(
                self._rebalance_leaders(controller, self.rebalance),
                name="auto-leader-rebalance")
        await self._until_done(controller, controller.elect_leaders)

    async def _until_done(self, controller: TopicController,
                          work: Callable[[], Awaitable[object]]) -> None:
        """Run ``work``; when the store fails it, run it again after a backoff, for as long as
        ``controller`` is this broker's controller. A broker that died while etcd could not be
        reached must not leave its partitions leaderless until some other broker changes.
        ``ControllerMoved`` and any other error end it (``_done`` logs them); a resignation
        or a new epoch ends it at the next attempt, ``stop`` at once. It cannot outlast the
        controller: one that cannot reach etcd loses its lease within the TTL and resigns."""
        backoff_ms = RETRY_BACKOFF_MIN_MS
        for attempt in itertools.count(1):
            try:
                await work()
                if attempt > 1:
                    logger.info("controller work done after retries", attempts=attempt)
                return
            except ControllerMoved:
                raise
            except StoreError as e:
                if not self._still_controller(controller):
                    raise
                if attempt == 1:  # once: it may fail every few seconds until etcd is back
                    logger.warning("controller work failed, retrying", error=str(e),
                                   epoch=controller.context.epoch)
            clock = controller.store.clock
            await sleep_until(clock, clock.time() + backoff_ms)
            if not self._still_controller(controller):
                return  # resigned meanwhile: the next controller's failover does it
            backoff_ms = min(backoff_ms * 2, RETRY_BACKOFF_MAX_MS)

    def _still_controller(self, controller: TopicController) -> bool:
        return self.controller is controller and controller.context.active

    async def _rebalance_leaders(self, controller: TopicController,
                                 rebalance: LeaderRebalance) -> None:
        """Kafka's auto-leader-rebalance task: first 5 s after the failover, then every
        ``leader.imbalance.check.interval.seconds`` while this is the controller."""
        delay = min(AUTO_REBALANCE_FIRST_DELAY_S, rebalance.interval_s)
        while self.controller is controller:
            await asyncio.sleep(delay)
            delay = rebalance.interval_s
            try:
                moved = await controller.rebalance_leaders(rebalance.percentage)
            except ControllerMoved:
                return
            except StoreError as e:
                logger.warning("leader rebalance failed", error=str(e))
                continue
            except Exception:
                logger.exception("leader rebalance failed")
                continue
            if moved:
                logger.info("leaders moved back to preferred replicas", partitions=len(moved))

    def _stop_rebalancer(self) -> None:
        task, self._rebalancer = self._rebalancer, None
        if task is not None:
            task.cancel()

    async def _follow_new_topics(self, controller: TopicController) -> None:
        """While ``controller`` is the controller, initialize the topics other brokers
        propose (retrying the first listing while the store cannot be reached)."""
        await self._stop_new_topics()
        follower = NewTopicFollower(controller.store, self._new_topic)
        self._new_topics = follower
        while self.controller is controller and self._new_topics is follower:
            try:
                await follower.start()
                return
            except StoreError:
                await asyncio.sleep(0.5)

    def _new_topic(self, name: str) -> None:
        controller = self.controller
        if controller is not None:
            self._spawn(self._until_done(
                controller, functools.partial(controller.initialize_partitions, name)))

    async def _stop_new_topics(self) -> None:
        follower, self._new_topics = self._new_topics, None
        if follower is not None:
            await follower.stop()

    def brokers_changed(self, change: BrokerChange) -> None:
        controller = self.controller
        if controller is not None:
            self._spawn(self._until_done(
                controller, functools.partial(controller.on_broker_change, change)))

    def resigned(self, context: ControllerContext, reason: str) -> None:
        if self.controller is not None and self.controller.context is context:
            self.controller = None
            self._stop_rebalancer()
            self._spawn(self._stop_new_topics())

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(work, name="controller-duty")
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, ControllerMoved):
            return  # resigned meanwhile: the next controller does it
        if isinstance(error, StoreError):
            # No longer the controller when it failed: the next controller's failover
            # brings the partitions in line.
            logger.warning("controller work failed", error=str(error))
        elif error is not None:
            logger.error("controller work failed", exc_info=error)

    async def stop(self) -> None:
        self.controller = None
        rebalancer = self._rebalancer
        self._stop_rebalancer()
        if rebalancer is not None:
            await asyncio.gather(rebalancer, return_exceptions=True)
        await self._stop_new_topics()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
