"""A broker's view of every partition's state, followed from the store (what Kafka's brokers
learnt from the controller's LeaderAndIsr and UpdateMetadata requests).

``PartitionStateWatcher`` lists ``/brokers/topics/``, then watches it from the listing's
revision + 1 (``PrefixFollower``: resuming from the last revision seen after a reconnect,
re-listing when that history has been compacted) and reports a ``PartitionUpdate`` per
partition whose assignment or state changed, or which was deleted. ``LocalReplicaTransitions``
turns those into what a LeaderAndIsr request told one broker: become leader, become follower,
stop and delete.

Invariants:
- A partition is reported once both its topic's assignment and its state are known; each
  update differs from the last one reported for it; a partition reported is reported deleted
  when its topic goes (or is re-created with another topic id, before the new one is reported).
- Within a topic id, a state with an older leader epoch than one already reported is ignored
  (Kafka's brokers refused a LeaderAndIsr with a stale leader epoch).
- A malformed value is logged once and skipped (the last good value stays); it never stops
  the watcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from broker.cluster.prefix_follower import PrefixFollower
from broker.cluster.store import EventType, KeyValue, Listing, MetadataStore, WatchEvent
from broker.cluster.topic_state import (
    TOPICS,
    MalformedLog,
    MalformedMetadata,
    PartitionState,
    TopicAssignment,
    parse_state_key,
    parse_topic_key,
)

logger = structlog.get_logger("broker.cluster")

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionUpdate:
    """A partition as it is now; ``state`` None: the partition was deleted."""

    topic: str
    topic_id: str
    partition: int
    replicas: list[int]
    state: PartitionState | None
    revision: int

    @property
    def deleted(self) -> bool:
        return self.state is None


class PartitionListener(Protocol):
    def partition_changed(self, update: PartitionUpdate) -> object: ...


class PartitionStateWatcher(PrefixFollower):
    """Every topic's assignment and partition state, kept current from a watch."""

    prefix = TOPICS
    description = "partition-state-watcher"

    def __init__(self, store: MetadataStore, *,
                 listeners: Sequence[PartitionListener] = (), retry_ms: float = 200.0) -> None:
        super().__init__(store, retry_ms=retry_ms)
        self.listeners = list(listeners)
        self.topics: dict[str, TopicAssignment] = {}
        self.states: dict[TopicPartition, PartitionState] = {}
        #: The last update reported per partition (deleted ones removed).
        self.reported: dict[TopicPartition, PartitionUpdate] = {}
        self.stale_ignored = 0
        self.malformed = MalformedLog()

    # -- reading --------------------------------------------------------------------------

    def _listed(self, listing: Listing) -> None:
        old_topics, old_states = self.topics, self.states
        self.topics, self.states = {}, {}
        for kv in listing.kvs:
            self._read(kv)
            # A malformed value keeps the last good one, as it does when watched.
            name, tp = parse_topic_key(kv.key), parse_state_key(kv.key)
            if name is not None and name not in self.topics and name in old_topics:
                self.topics[name] = old_topics[name]
            if tp is not None and tp not in self.states and tp in old_states:
                self.states[tp] = old_states[tp]
        tps = set(self.reported) | {(t, p) for t, a in self.topics.items() for p in a.partitions}
        self._sync(tps, listing.revision)
        gone = set(old_topics) - set(self.topics)
        if gone:
            logger.info("topics gone while not watched", topics=sorted(gone))

    def _changed(self, event: WatchEvent) -> None:
        if event.type is EventType.DELETE:
            changed = self._forget(event.kv.key)
        else:
            changed = self._read(event.kv)
        self._sync(changed, event.revision)

    def _read(self, kv: KeyValue) -> set[TopicPartition]:
        """Take one key's new value in; the partitions it may have changed."""
        try:
            name = parse_topic_key(kv.key)
            if name is not None:
                assignment = TopicAssignment.decode(name, kv.value)
                self.topics[name] = assignment
                return self._of_topic(name) | {(name, p) for p in assignment.partitions}
            tp = parse_state_key(kv.key)
            if tp is not None:
                self.states[tp] = PartitionState.from_kv(kv)
                return {tp}
        except MalformedMetadata as e:
            self.malformed.report(kv, e)
        return set()

    def _forget(self, key: str) -> set[TopicPartition]:
        name = parse_topic_key(key)
        if name is not None:
            self.topics.pop(name, None)
            return self._of_topic(name)
        tp = parse_state_key(key)
        if tp is not None:
            self.states.pop(tp, None)
        return set()  # a state alone going changes nothing until its topic goes

    def _of_topic(self, name: str) -> set[TopicPartition]:
        return {tp for tp in self.reported if tp[0] == name}

    # -- reporting ------------------------------------------------------------------------

    def _sync(self, tps: set[TopicPartition], revision: int) -> None:
        for tp in sorted(tps):
            old = self.reported.get(tp)
            topic = self.topics.get(tp[0])
            if topic is None or tp[1] not in topic.partitions:
                if old is not None:
                    del self.reported[tp]
                    self._tell(PartitionUpdate(tp[0], old.topic_id, tp[1], old.replicas,
                                               None, revision))
                continue
            state = self.states.get(tp)
            if state is None:
                continue
            new = PartitionUpdate(tp[0], topic.topic_id, tp[1], topic.partitions[tp[1]], state,
                                  revision)
            if old is not None and old.topic_id != new.topic_id:
                del self.reported[tp]
                self._tell(PartitionUpdate(tp[0], old.topic_id, tp[1], old.replicas, None,
                                           revision))
                old = None
            if old is not None:
                assert old.state is not None
                if state.leader_epoch < old.state.leader_epoch:
                    self.stale_ignored += 1
                    logger.info("stale partition state ignored", topic=tp[0], partition=tp[1],
                                leader_epoch=state.leader_epoch,
                                known_leader_epoch=old.state.leader_epoch)
                    continue
                if (old.state, old.replicas) == (state, new.replicas):
                    continue
            self.reported[tp] = new
            self._tell(new)

    def _tell(self, update: PartitionUpdate) -> None:
        for listener in self.listeners:
            try:
                listener.partition_changed(update)
            except Exception:
                logger.exception("partition listener failed", topic=update.topic,
                                 partition=update.partition)


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """What Kafka's LeaderAndIsr request carried for one partition of this broker."""

    topic: str
    topic_id: str
    partition: int
    leader: int
    leader_epoch: int
    isr: list[int]
    replicas: list[int]
    partition_epoch: int
    controller_epoch: int


class ReplicaListener(Protocol):
    """What the replica manager does with its partitions (Kafka's becomeLeaderOrFollower and
    StopReplica with deletion)."""

    def become_leader(self, partition: LeaderAndIsr) -> object: ...

    def become_follower(self, partition: LeaderAndIsr) -> object: ...

    def partition_deleted(self, topic: str, topic_id: str, partition: int) -> object: ...


class LocalReplicaTransitions:
    """A ``PartitionListener`` telling one broker about the partitions it holds a replica
    of: every new leader epoch, ISR or replica set of such a partition is a become-leader or
    become-follower; losing its replica (the topic deleted, or reassigned away) a deletion."""

    def __init__(self, broker_id: int, listener: ReplicaListener) -> None:
        self.broker_id = broker_id
        self.listener = listener
        #: The partitions this broker holds a replica of: topic id by partition.
        self.hosted: dict[TopicPartition, str] = {}

    def partition_changed(self, update: PartitionUpdate) -> None:
        tp = (update.topic, update.partition)
        state = update.state
        if state is None or self.broker_id not in update.replicas:
            topic_id = self.hosted.pop(tp, None)
            if topic_id is not None:
                self.listener.partition_deleted(update.topic, topic_id, update.partition)
            return
        self.hosted[tp] = update.topic_id
        request = LeaderAndIsr(update.topic, update.topic_id, update.partition, state.leader,
                               state.leader_epoch, state.isr, update.replicas,
                               state.partition_epoch, state.controller_epoch)
        if state.leader == self.broker_id:
            self.listener.become_leader(request)
        else:
            self.listener.become_follower(request)
