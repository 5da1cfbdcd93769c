"""Metadata (key 3): brokers, topics and partition leaders, with topic auto-creation.
In cluster mode the answer comes from the cluster's metadata (broker/apis/cluster_metadata.py).

Authorization as Kafka's KafkaApis: the all-topics form lists only topics the principal may
DESCRIBE; a named topic it may not describe answers TOPIC_AUTHORIZATION_FAILED without
revealing whether it exists (no topic id; by id, the id but no name); a missing topic is
auto-created only with CREATE on the cluster or on the topic, else TOPIC_AUTHORIZATION_FAILED.
Authorized-operations fields (v8+) are the principal's, the cluster's only through v10. The
broker answered is this listener's advertised endpoint.

The answer is assembled from topics already encoded, as Kafka answers from its metadata cache:
each topic's bytes are kept per version until the topic changes, and the every-topic form
(no ACLs to filter by) is kept whole per version until any topic changes, so a full answer for
tens of thousands of partitions costs a few list operations on the loop, not one message
object per partition. The bytes are those kafka-python encodes for the same answer.

Each partition's leader epoch (v7+) is the partition's own (Partition.leader_epoch): the kept
bytes are rebuilt when any partition's epoch changes (``Partition.leader_epoch_changes``);
a topic whose partitions all share one epoch keeps the one-template encoding.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kafka.protocol.metadata import MetadataResponse

from broker.apis import cluster_metadata
from broker.apis.add_partitions_to_txn import INTERNAL_TOPICS
from broker.apis.authorize import allowed, authorized_ops, cluster_allowed, cluster_ops
from broker.metadata.file_store import MetadataStore, TopicInfo
from broker.replica.partition import Partition
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.templates import (
    MetadataTopics,
    PackedMetadataResponse,
    metadata_partition_around,
    metadata_topic_bytes,
    metadata_topic_of_like_partitions,
)

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 3  # Metadata
VERSIONS = range(0, 13)

Topic = MetadataResponse.MetadataResponseTopic
PartitionMeta = Topic.MetadataResponsePartition
DESCRIBE, TOPIC = AclOperation.DESCRIBE, ResourceType.TOPIC


def handle(ctx: ApiContext, request: Request) -> PackedMetadataResponse:
    if ctx.cluster is not None:
        return cluster_metadata.metadata(ctx, request, ctx.cluster)
    req = request.body
    version = request.version
    store = ctx.topics.metadata
    cache = metadata_cache(store, ctx.replica_manager.partitions)
    node = ctx.node.node_id
    on = ctx.authorizer.enabled
    pieces: list[MetadataTopics]
    if req.topics is None or (version == 0 and not req.topics):
        if on:
            pieces = [cache.topic(t, node) for t in list(store.topics.values())
                      if allowed(ctx, request, DESCRIBE, TOPIC, t.name, log_if_denied=False)]
        else:
            pieces = [cache.every_topic(store, node)]
    else:
        allow_create = req.allow_auto_topic_creation if version >= 4 else True
        pieces = _requested(ctx, request, req.topics, allow_create, cache)
    if version >= 8 and getattr(req, "include_topic_authorized_operations", False):
        pieces = [_with_authorized_ops(ctx, request, piece, node) for piece in pieces]
    host, port = ctx.node.address(request.connection.session.listener)
    cluster_asked = 8 <= version <= 10 and bool(
        getattr(req, "include_cluster_authorized_operations", False))
    return PackedMetadataResponse({
        "throttle_time_ms": 0,
        "brokers": [MetadataResponse.MetadataResponseBroker(node_id=node, host=host,
                                                            port=port, rack=None)],
        "cluster_id": store.cluster_id,
        "controller_id": node,
        "authorized_operations": cluster_ops(ctx, request, cluster_asked),
    }, pieces)


def _with_authorized_ops(ctx: ApiContext, request: Request, piece: MetadataTopics,
                         node: int) -> MetadataTopics:
    """The piece with each described topic's authorized operations (the principal's, so never
    kept): a described topic is encoded afresh with them, an error topic keeps none."""
    if isinstance(piece, _EveryTopic):
        return MetadataTopics([m for t in piece.described
                               for m in _with_authorized_ops(ctx, request, t, node).messages()])
    if isinstance(piece, _LedTopic):
        ops = authorized_ops(ctx, request, TOPIC, piece.info.name, True)
        return _LedTopic(piece.info, node, ops, piece.epochs)
    for topic in piece.topics:
        if topic.name is not None and topic.error_code != ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            topic.authorized_operations = authorized_ops(ctx, request, TOPIC, topic.name, True)
    return piece


def _requested(ctx: ApiContext, request: Request, wanted: list, allow_create: bool,
               cache: MetadataCache) -> list[MetadataTopics]:
    """The named topics (or ids) in Kafka's answer order: unknown ids, the described topics,
    those refused creation, those refused description."""
    store = ctx.topics.metadata
    node = ctx.node.node_id
    on = ctx.authorizer.enabled
    unknown_ids: list[Topic] = []
    described: list[MetadataTopics] = []
    refused_create: list[Topic] = []
    refused_describe: list[Topic] = []
    seen: set[object] = set()
    may_create: bool | None = None  # CREATE on the cluster, asked once when first needed
    for t in wanted:
        name, topic_id = t.name, getattr(t, "topic_id", None)
        key = name if name is not None else topic_id
        if key in seen:
            continue  # Kafka answers a topic named twice once
        seen.add(key)
        if name is None:
            info = store.by_id.get(topic_id)  # type: ignore[arg-type]
            if info is None:
                unknown_ids.append(_error(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id))
            elif on and not allowed(ctx, request, DESCRIBE, TOPIC, info.name):
                # Topic ids are not secret: the id comes back, the name does not.
                refused_describe.append(_error(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                               topic_id))
            else:
                described.append(cache.topic(info, node))
            continue
        if on and not allowed(ctx, request, DESCRIBE, TOPIC, name):
            refused_describe.append(_error(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            continue
        info = store.topics.get(name)
        if info is None:
            if on and allow_create and ctx.config["auto.create.topics.enable"]:
                if may_create is None:
                    may_create = cluster_allowed(ctx, request, AclOperation.CREATE,
                                                 log_if_denied=False)
                if not may_create and not allowed(ctx, request, AclOperation.CREATE, TOPIC,
                                                  name):
                    refused_create.append(_error(name, ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                 internal=name in INTERNAL_TOPICS))
                    continue
            described.append(_lookup(ctx, name, allow_create, cache))
            continue
        described.append(cache.topic(info, node))
    pieces: list[MetadataTopics] = []
    if unknown_ids:
        pieces.append(MetadataTopics(unknown_ids))
    pieces += described
    if refused_create or refused_describe:
        pieces.append(MetadataTopics(refused_create + refused_describe))
    return pieces


def _lookup(ctx: ApiContext, name: str, allow_create: bool, cache: MetadataCache
            ) -> MetadataTopics:
    """A topic not in the metadata: auto-created when allowed, else UNKNOWN_TOPIC_OR_PARTITION."""
    if not allow_create:
        return MetadataTopics([_error(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)])
    try:
        info = ctx.topics.auto_create(name)
    except KafkaError as exc:
        return MetadataTopics([_error(name, exc.error_code)])
    if info is None:
        return MetadataTopics([_error(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)])
    # Kafka answers LEADER_NOT_AVAILABLE right after creation; our leader exists at once.
    return cache.topic(info, ctx.node.node_id)


def _error(name: str | None, code: ErrorCode, topic_id: object = None,
           internal: bool = False) -> Topic:
    return Topic(error_code=code, name=name, topic_id=topic_id, is_internal=internal,
                 partitions=[], authorized_operations=None)


# -- the metadata cache ---------------------------------------------------------------------------


#: (version, node, leader epoch) -> a led partition's bytes around its index: the same for
#: every topic.
_around: dict[tuple[int, int, int], tuple[bytes, bytes]] = {}

#: the leader epochs of a topic's partitions: one int when they all share it.
Epochs = int | tuple[int, ...]


class _LedTopic(MetadataTopics):
    """A topic whose every partition this broker leads, alone in its ISR: its encoded bytes
    per version, kept until the topic changes (a new TopicInfo, or more partitions) or a
    leader epoch does."""

    __slots__ = ("info", "partitions", "node", "ops", "by_version", "epochs", "epoch_changes")

    def __init__(self, info: TopicInfo, node: int, ops: Any = None, epochs: Epochs = 0) -> None:
        super().__init__([])
        self.info = info
        self.partitions = info.partitions
        self.node = node
        self.ops = ops  # the principal's authorized operations (then never kept), or None
        self.by_version: dict[int, bytes] = {}
        self.epochs = epochs
        self.epoch_changes = Partition.leader_epoch_changes

    def current(self, info: TopicInfo, node: int) -> bool:
        return (self.info is info and self.partitions == info.partitions and self.node == node
                and self.epoch_changes == Partition.leader_epoch_changes)

    def _epoch(self, index: int) -> int:
        epochs = self.epochs
        return epochs if isinstance(epochs, int) else epochs[index]

    @property
    def count(self) -> int:
        return 1

    def encoded(self, version: int) -> bytes:
        data = self.by_version.get(version)
        if data is None:
            epoch = self.epochs
            if isinstance(epoch, int):
                key = (version, self.node, epoch)
                around = _around.get(key)
                if around is None:
                    around = _around[key] = metadata_partition_around(self._partition(0),
                                                                      version)
                data = metadata_topic_of_like_partitions(self._topic([]), around,
                                                         self.partitions, version)
            else:  # partitions of different epochs: encoded one by one
                data = metadata_topic_bytes(self.messages()[0], version)
            self.by_version[version] = data
        return data

    def messages(self) -> list[Any]:
        return [self._topic([self._partition(i) for i in range(self.partitions)])]

    def count_errors(self, errors: dict[int, int]) -> None:
        return None  # no error, on the topic or any partition

    def _topic(self, partitions: list[Any]) -> Topic:
        info = self.info
        return Topic(error_code=0, name=info.name, topic_id=info.topic_id,
                     is_internal=info.name.startswith("__"),  # __consumer_offsets
                     partitions=partitions, authorized_operations=self.ops)

    def _partition(self, index: int) -> Any:
        node = self.node
        return PartitionMeta(error_code=0, partition_index=index, leader_id=node,
                             leader_epoch=self._epoch(index), replica_nodes=[node],
                             isr_nodes=[node], offline_replicas=[])


class _EveryTopic(MetadataTopics):
    """Every topic in the store's order, encoded together per version: the full answer."""

    __slots__ = ("described", "epoch", "node", "by_version", "epoch_changes")

    def __init__(self, described: list[_LedTopic], epoch: int, node: int) -> None:
        super().__init__([])
        self.described = described
        self.epoch = epoch
        self.node = node
        self.by_version: dict[int, bytes] = {}
        self.epoch_changes = Partition.leader_epoch_changes

    @property
    def count(self) -> int:
        return len(self.described)

    def encoded(self, version: int) -> bytes:
        data = self.by_version.get(version)
        if data is None:
            data = b"".join(t.encoded(version) for t in self.described)
            self.by_version[version] = data
        return data

    def messages(self) -> list[Any]:
        return [m for t in self.described for m in t.messages()]

    def count_errors(self, errors: dict[int, int]) -> None:
        return None


class MetadataCache:
    """Kafka's metadata cache for this broker's answers: each topic's encoded piece, and the
    every-topic answer, rebuilt only for what changed since (the store's epoch says when)."""

    def __init__(self, partitions: Mapping[tuple[str, int], Partition] | None = None) -> None:
        self.led: dict[str, _LedTopic] = {}
        self.every: _EveryTopic | None = None
        #: the replica manager's partitions, whose leader epochs the answers carry.
        self.partitions: Mapping[tuple[str, int], Partition] = partitions or {}

    def topic(self, info: TopicInfo, node: int) -> _LedTopic:
        led = self.led.get(info.name)
        if led is None or not led.current(info, node):
            led = self.led[info.name] = _LedTopic(info, node, epochs=self._epochs(info))
        return led

    def _epochs(self, info: TopicInfo) -> Epochs:
        """The partitions' leader epochs (0 for one not open here); one int when shared."""
        partitions = self.partitions
        epochs = []
        for index in range(info.partitions):
            p = partitions.get((info.name, index))
            epochs.append(0 if p is None else p.leader_epoch)
        if not epochs or all(e == epochs[0] for e in epochs):
            return epochs[0] if epochs else 0
        return tuple(epochs)

    def every_topic(self, store: MetadataStore, node: int) -> _EveryTopic:
        every = self.every
        if (every is None or every.epoch != store.epoch or every.node != node
                or every.count != len(store.topics)
                or every.epoch_changes != Partition.leader_epoch_changes):
            described = [self.topic(info, node) for info in store.topics.values()]
            self.led = {t.info.name: t for t in described}  # deleted topics go
            every = self.every = _EveryTopic(described, store.epoch, node)
        return every


_caches: weakref.WeakKeyDictionary[MetadataStore, MetadataCache] = weakref.WeakKeyDictionary()


def metadata_cache(store: MetadataStore,
                   partitions: Mapping[tuple[str, int], Partition] | None = None
                   ) -> MetadataCache:
    """The cache of one broker's metadata (the store's, so an embedded broker has its own),
    reading the leader epochs of ``partitions`` (the replica manager's)."""
    cache = _caches.get(store)
    if cache is None:
        cache = _caches[store] = MetadataCache(partitions)
    elif partitions is not None:
        cache.partitions = partitions
    return cache
