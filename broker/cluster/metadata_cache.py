"""What a broker answers Metadata and DescribeCluster from in cluster mode (Kafka's
ZooKeeper-era MetadataCache, which UpdateMetadata requests filled): topics with their ids and
partitions, from the partition-state watcher's updates, and the live brokers with their
endpoints, from the broker's liveness view.

Invariant: a partition's ``offline_replicas`` are its replicas on brokers that are not live
at the moment of reading (Kafka's controller put replicas of dead brokers there); live
brokers are read from the liveness view at call time, so topics and brokers never disagree
about who is alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.cluster.liveness import BrokerLivenessView
from broker.cluster.partition_watcher import PartitionUpdate
from broker.cluster.registration import BrokerInfo
from broker.cluster.topic_state import NO_LEADER, PartitionState


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline_replicas: list[int]

    @property
    def leader_available(self) -> bool:
        """False: Metadata answers LEADER_NOT_AVAILABLE for it."""
        return self.leader != NO_LEADER


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: str
    partitions: dict[int, PartitionMetadata] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    """A live broker as Metadata and DescribeCluster list it, on one listener."""

    node_id: int
    host: str
    port: int
    rack: str | None


class ClusterMetadataCache:
    """A ``PartitionListener`` of the partition-state watcher, read by the request handlers."""

    def __init__(self, liveness: BrokerLivenessView) -> None:
        self.liveness = liveness
        self._topics: dict[str, tuple[str, dict[int, tuple[list[int], PartitionState]]]] = {}
        #: Moves with every update taken in, so views built from the topics know when stale.
        self.version = 0

    def partition_changed(self, update: PartitionUpdate) -> None:
        self.version += 1
        if update.state is None:
            known = self._topics.get(update.topic)
            if known is not None and known[0] == update.topic_id:
                known[1].pop(update.partition, None)
                if not known[1]:
                    del self._topics[update.topic]
            return
        known = self._topics.get(update.topic)
        if known is None or known[0] != update.topic_id:
            known = self._topics[update.topic] = (update.topic_id, {})
        known[1][update.partition] = (update.replicas, update.state)

    def has_partition(self, tp: tuple[str, int]) -> bool:
        """Whether the cluster has the partition (what OffsetCommit checks a commit against)."""
        known = self._topics.get(tp[0])
        return known is not None and tp[1] in known[1]

    def topic_names(self) -> list[str]:
        return sorted(self._topics)

    def topic(self, name: str) -> TopicMetadata | None:
        known = self._topics.get(name)
        if known is None:
            return None
        live = self.liveness.live
        partitions = {
            p: PartitionMetadata(p, state.leader, state.leader_epoch, replicas, state.isr,
                                 [r for r in replicas if r not in live])
            for p, (replicas, state) in sorted(known[1].items())}
        return TopicMetadata(name, known[0], partitions)

    def topics(self) -> list[TopicMetadata]:
        return [t for name in self.topic_names() if (t := self.topic(name)) is not None]

    def partition_counts(self) -> dict[str, tuple[str, int]]:
        """Each topic's id and its partition count: the partitions 0..n-1 that have a state
        (a partition whose state is not here yet is not counted)."""
        out = {}
        for name, (topic_id, partitions) in self._topics.items():
            count = 0
            while count in partitions:
                count += 1
            if count:
                out[name] = (topic_id, count)
        return out

    def topic_name_of(self, topic_id: str) -> str | None:
        return next((n for n, (tid, _) in self._topics.items() if tid == topic_id), None)

    def live_brokers(self, listener: str) -> list[BrokerEndpoint]:
        """The live brokers that have ``listener``, by id (a broker without it is left out, as
        Kafka's MetadataCache.getAliveBrokerNodes does)."""
        out = []
        for node_id, broker in sorted(self.liveness.live.items()):
            endpoint = broker.info.endpoints.get(listener)
            if endpoint is not None:
                out.append(BrokerEndpoint(node_id, endpoint[0], endpoint[1], broker.info.rack))
        return out

    def broker(self, node_id: int) -> BrokerInfo | None:
        broker = self.liveness.live.get(node_id)
        return broker.info if broker is not None else None
