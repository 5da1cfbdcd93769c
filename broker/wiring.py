"""The composition root: every owner of one broker, built from its configuration in one place.

broker/server.py (the broker process and the embedded broker) and tests/support/components.py
(the unit tests' broker, without sockets) both build their owners here, so the unit tests run
the wiring that clients meet.

Two steps. ``Owners(config, clock)`` makes what needs no I/O (the stores, the log manager,
the SCRAM store that the listeners' SASL needs before anything is bound). ``load()`` then
checks and locks the log dirs, reads the metadata, opens the logs and starts the
coordinators. The server binds its listeners between the two, so a start that fails on a
port never touches a log dir: the clean-shutdown marker stays for the next start.

Time is one ``purgatory.Clock``: the coordinators' timer runs on it and every owner that
stamps or compares wall-clock time reads its ``wall_ms``. Produce and fetch waits run on
``request_clock``: the server passes the loop's whatever ``clock`` is (a client's own wait must
not hang on a manual clock), the unit tests the same manual clock. Two threads keep real time
on purpose: the log cleaner (LogCleaner) and the time-based flusher (ReplicaManager's
``run_time_flusher``), which the server, not this module, starts.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from broker.apis.context import ApiContext, Node
from broker.client_telemetry import ClientTelemetry
from broker.cluster.broker_node import ClusterNode
from broker.cluster.group_topics import ClusterTopicsImage
from broker.cluster.metadata_cache import ClusterMetadataCache
from broker.config import BrokerConfig
from broker.group.coordinator import GroupConfig, GroupCoordinator
from broker.group.offsets_store import TOPIC as OFFSETS_TOPIC
from broker.group.offsets_store import OffsetsStore
from broker.interbroker.replica_fetcher import FetcherSettings, ReplicaFetcherManager
from broker.interbroker.txn import ClusterMarkerChannel, RemoteTransactionVerifier
from broker.log.manager import LogDirLockedError, LogManager
from broker.metadata.dynamic_config import DynamicBrokerConfig
from broker.metadata.file_store import MetadataStore
from broker.metadata.producer_ids import LocalProducerIdManager, ProducerIdManager
from broker.metadata.shared_state import LocalSharedState, SharedState
from broker.metadata.topic_admin import TopicAdmin, log_config
from broker.replica.fetch_session import FetchSessionCache
from broker.replica.hw_checkpoint import HighWatermarkCheckpoints
from broker.replica.replica_manager import ReplicaManager
from broker.security.authorizer import Authorizer
from broker.security.scram import ScramCredentialStore
from broker.startup_error import StartupError
from broker.txn import TransactionCoordinator
from broker.txn.state_log import TOPIC as TRANSACTION_TOPIC
from purgatory import Clock, Timer


class Owners:
    """The owners of one broker; see the module docstring for the two steps."""

    # Built by ``load``.
    dynamic: DynamicBrokerConfig
    request_timer: Timer  # parked produce and fetch requests, on ``request_clock``
    timer: Timer  # the coordinators' deadlines, on ``clock``
    replica_manager: ReplicaManager
    topics: TopicAdmin
    offsets_store: OffsetsStore
    groups: GroupCoordinator
    transactions: TransactionCoordinator
    authorizer: Authorizer
    node: Node
    context: ApiContext

    def __init__(self, config: BrokerConfig, clock: Clock, *,
                 request_clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock
        self.request_clock = clock if request_clock is None else request_clock
        self.log_dirs = [Path(d) for d in config["log.dirs"]]
        self.metadata = MetadataStore(self.log_dirs[0])
        self.log_manager = LogManager.for_broker(self.log_dirs, log_config(config, {}), config,
                                                 clock)
        self.producer_ids: ProducerIdManager = LocalProducerIdManager(self.log_dirs[0])
        #: The ACLs and SCRAM credentials: this broker's file, or the cluster's (``use_cluster``).
        self.shared: SharedState = LocalSharedState(self.metadata)
        self.scram = ScramCredentialStore(self.shared)
        self.fetch_sessions = FetchSessionCache()
        self.telemetry = ClientTelemetry.of(config)
        #: Cluster mode: set by the server before ``load`` (its cluster id checked); the
        #: handlers then answer from the cluster's metadata.
        self.cluster: ClusterNode | None = None
        #: Cluster mode: the replica fetchers (``load`` makes them).
        self.replica_fetchers: ReplicaFetcherManager | None = None
        self.loaded = False

    def use_cluster(self, cluster: ClusterNode) -> None:
        """Cluster mode, before ``load``: the cluster's shared state and producer ids in place
        of this broker's own."""
        self.cluster = cluster
        self.shared = self.scram.state = cluster.shared_state
        self.producer_ids = cluster.producer_ids

    @property
    def timers(self) -> list[Timer]:
        """Each distinct timer made so far, once (one when both clocks are the same)."""
        made = [getattr(self, "request_timer", None), getattr(self, "timer", None)]
        return list({id(t): t for t in made if t is not None}.values())

    def load(self) -> None:
        """Lock the log dirs, read the metadata, open the logs, start the coordinators.
        StartupError when a log dir is not a writable directory or another broker holds it."""
        cfg = self.config
        check_log_dirs(self.log_dirs)
        try:
            self.log_manager.lock_dirs()
        except LogDirLockedError as exc:
            raise StartupError(f"log dir {exc.log_dir} (log.dirs) is locked by another "
                               "process, most likely another broker: stop it, or set log.dirs "
                               "to another directory") from None
        self.metadata.load()
        self.authorizer = Authorizer.of(cfg, self.shared)  # ConfigError: not Kafka's class
        # Kafka's DynamicBrokerConfig: the stored dynamic configs count from the first read.
        dynamic = self.dynamic = DynamicBrokerConfig(cfg, self.shared)
        dynamic.load()
        self.producer_ids.load()
        self.request_timer = Timer(self.request_clock)
        self.timer = (self.request_timer if self.request_clock is self.clock
                      else Timer(self.clock))
        rm = self.replica_manager = ReplicaManager(cfg["log.flush.interval.ms"],
                                                   self.request_timer, self.clock)
        rm.replica_lag_time_max_ms = cfg["replica.lag.time.max.ms"]
        log_manager = self.log_manager
        rm.hw_checkpoints = HighWatermarkCheckpoints(lambda: log_manager.live_log_dirs,
                                                     log_manager.failure_channel)
        topics = self.topics = TopicAdmin(cfg, self.metadata, self.log_manager, rm, dynamic,
                                          self.shared)
        self.log_manager.load()
        topics.open_all()
        store = self.offsets_store = OffsetsStore(rm, topics, cfg["offsets.topic.num.partitions"],
                                                  self.clock)
        cluster = self.cluster
        # A commit names a partition the cluster has, wherever it is led.
        partition_exists = (rm.partitions.__contains__ if cluster is None
                            else cluster.cache.has_partition)
        groups = self.groups = GroupCoordinator(GroupConfig.of(cfg), self.timer, store,
                                                partition_exists, self.clock)
        transactions = self.transactions = TransactionCoordinator(
            cfg, self.timer, rm, topics, self.producer_ids, groups.handle_txn_completion,
            groups.partition_for, self.clock)
        rm.verify_transaction = transactions.verify_partition
        if cluster is not None:
            self._replica_fetchers(cluster)
            groups.follow_partition_leadership()
            # The consumer protocol's assignor sees the cluster's topics, not this broker's.
            groups.consumer.metadata = ClusterTopicsImage(cluster.cache, self.metadata)
            transactions.follow_partition_leadership()
            self._transactions_across_brokers(cluster, transactions)
        groups.start()
        transactions.start()
        cluster_id = cluster.cluster_id if cluster is not None else self.metadata.cluster_id
        self.node = Node(cfg["node.id"], *cfg.advertised, cluster_id)
        self.context = ApiContext(self.node, cfg, topics, rm, groups, self.fetch_sessions,
                                  self.producer_ids, transactions, self.authorizer, self.scram,
                                  self.telemetry, self.clock, cluster)
        self.loaded = True


    def _replica_fetchers(self, cluster: ClusterNode) -> None:
        """Cluster mode: the fetchers copying the partitions this broker follows from their
        leaders (stopped with the cluster node, before its client closes)."""
        client = cluster.client
        if client is None:
            return
        def broker_epoch() -> int:
            """The current registration's epoch (a lost lease registers anew), -1 between."""
            registration = cluster.membership.registration
            epoch = registration.epoch if registration is not None else None
            return -1 if epoch is None else epoch

        fetchers = self.replica_fetchers = ReplicaFetcherManager(
            self.replica_manager, client, FetcherSettings.from_config(self.config),
            cluster.node_id, broker_epoch)
        cluster.closers.append(fetchers.stop)

    def _transactions_across_brokers(self, cluster: ClusterNode,
                                     transactions: TransactionCoordinator) -> None:
        """Cluster mode: markers go to each partition's leader, and a transactional produce
        whose coordinator is another broker is verified there (the server set the client)."""
        client = cluster.client
        if client is None:
            return
        rm = self.replica_manager
        markers = ClusterMarkerChannel(cluster.node_id, rm, cluster.cache, client,
                                       joined=lambda: cluster.watcher is not None)
        verifier = RemoteTransactionVerifier(
            cluster.node_id, cluster.cache, client, transactions.partition_for,
            transactions.transactions.__contains__)
        transactions.markers = markers
        rm.verify_transaction_remote = verifier
        cluster.closers += [markers.close, verifier.close]


def check_log_dirs(log_dirs: list[Path]) -> None:
    """Each log dir is a directory this process can write (created when missing), else one
    StartupError line naming it. Checked before anything is read or written there."""
    for d in log_dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StartupError(f"log dir {d} (log.dirs) is not a directory: move what is "
                               "there away, or set log.dirs to a directory") from None
        except OSError as exc:
            raise StartupError(f"log dir {d} (log.dirs) cannot be created ({exc.strerror}): "
                               "create it, or set log.dirs to a writable directory") from None
        if not os.access(d, os.W_OK | os.X_OK):
            raise StartupError(f"log dir {d} (log.dirs) is read-only: make it writable for "
                               "the broker's user, or set log.dirs to a writable directory")


class CoordinatorLeadership:
    """Kafka's onLeadershipChange for the internal topics (cluster mode): the group
    coordinator follows the leadership of ``__consumer_offsets``' partitions, the transaction
    coordinator that of ``__transaction_state``'s (onElection / onResignation). A partition
    won is loaded on the next loop turn, COORDINATOR_LOAD_IN_PROGRESS meanwhile; one lost is
    unloaded at once."""

    def __init__(self, groups: GroupCoordinator, transactions: TransactionCoordinator,
                 cache: ClusterMetadataCache) -> None:
        self.groups = groups
        self.transactions = transactions
        self.cache = cache

    def became_leader(self, tp: tuple[str, int], leader_epoch: int) -> None:
        coordinator = self._coordinator(tp[0])
        if coordinator is None:
            return
        self._partition_count(tp[0])
        coordinator.begin_loading(tp[1])
        asyncio.get_running_loop().call_soon(self._load, coordinator, tp[1])

    def stopped_leading(self, tp: tuple[str, int]) -> None:
        coordinator = self._coordinator(tp[0])
        if coordinator is not None:
            coordinator.unload_partition(tp[1])

    @staticmethod
    def _load(coordinator: GroupCoordinator | TransactionCoordinator, partition: int) -> None:
        ownership = coordinator.ownership
        if ownership is not None and partition in ownership.loading:  # not lost meanwhile
            coordinator.load_partition(partition)

    def _coordinator(self, topic: str) -> GroupCoordinator | TransactionCoordinator | None:
        if topic == OFFSETS_TOPIC:
            return self.groups
        if topic == TRANSACTION_TOPIC:
            return self.transactions
        return None

    def _partition_count(self, topic: str) -> None:
        """Keys hash over the cluster topic's partitions, whatever the local config says."""
        metadata = self.cache.topic(topic)
        if metadata is None or not metadata.partitions:
            return
        count = max(metadata.partitions) + 1
        if topic == OFFSETS_TOPIC:
            self.groups.store.num_partitions = count
        else:
            self.transactions.state_log.num_partitions = count
