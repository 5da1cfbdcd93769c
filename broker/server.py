"""Broker: the composition root. It builds every owner from the configuration, wires them,
serves the listener and shuts down; nothing else in the broker imports it.

Shutdown order follows Kafka's: stop accepting, let in-flight requests finish, flush every log,
then write the clean-shutdown marker so the next start skips recovery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import structlog

from broker import apis
from broker.config import BrokerConfig
from broker.context import ApiContext, Node
from broker.dynamic_config import (
    CLEANER_KEYS,
    CONNECTION_KEYS,
    DynamicBrokerConfig,
    thread_count_check,
)
from broker.fetch_session import FetchSessionCache
from broker.group.coordinator import GroupConfig, GroupCoordinator
from broker.group.offsets_store import OffsetsStore
from broker.log.cleaner import CleanerConfig
from broker.log.manager import LogManager
from broker.logging import redact
from broker.metadata import MetadataStore
from broker.metrics import BrokerMetrics, MetricsServer
from broker.network.connection import Connection
from broker.network.request_channel import HandlerResult, Request, RequestChannel
from broker.producer_ids import ProducerIdManager
from broker.replica_manager import ReplicaManager
from broker.security.authorizer import Authorizer
from broker.security.scram import ScramCredentialStore
from broker.topic_admin import TopicAdmin, log_config
from broker.txn import TransactionCoordinator
from purgatory import Timer

log = structlog.get_logger("broker")


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.log_dirs = [Path(d) for d in config["log.dirs"]]
        self.metadata = MetadataStore(self.log_dirs[0])
        self.log_manager = LogManager(self.log_dirs, log_config(config, {}))
        self.producer_ids = ProducerIdManager(self.log_dirs[0])
        self.context: ApiContext | None = None
        self.channel: RequestChannel | None = None
        self.replica_manager: ReplicaManager | None = None
        self.transactions: TransactionCoordinator | None = None
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.metrics: BrokerMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
        self.metadata.load()
        # Kafka's DynamicBrokerConfig: the stored dynamic configs count from the first read.
        dynamic = DynamicBrokerConfig(cfg, self.metadata)
        dynamic.load()
        self.producer_ids.load()
        timer = Timer()
        rm = self.replica_manager = ReplicaManager(cfg["log.flush.interval.ms"], timer)
        topics = TopicAdmin(cfg, self.metadata, self.log_manager, rm, dynamic)
        self.log_manager.load()
        topics.open_all()
        loop = asyncio.get_running_loop()
        cleaner = self.log_manager.start_cleaner(CleanerConfig.of(cfg), loop)
        dynamic.add_reconfigurable(CLEANER_KEYS,
                                   lambda c: cleaner.reconfigure(CleanerConfig.of(c)),
                                   thread_count_check("log.cleaner.threads"))
        store = OffsetsStore(rm, topics, cfg["offsets.topic.num.partitions"])
        coordinator = GroupCoordinator(GroupConfig.of(cfg), timer, store,
                                       rm.partitions.__contains__)
        coordinator.start()
        transactions = self.transactions = TransactionCoordinator(
            cfg, timer, rm, topics, self.producer_ids, coordinator.handle_txn_completion,
            coordinator.partition_for)
        transactions.start()
        rm.verify_transaction = transactions.verify_partition
        host, port = cfg.listener
        node = Node(cfg["node.id"], *cfg.advertised, self.metadata.cluster_id)
        self.context = ApiContext(node, cfg, topics, rm, coordinator, FetchSessionCache(),
                                  self.producer_ids, transactions,
                                  Authorizer.of(cfg, self.metadata),
                                  ScramCredentialStore(self.metadata))
        metrics_listener = cfg.metrics_listener
        if metrics_listener is not None:
            self.metrics = BrokerMetrics(node.node_id)
        self.channel = RequestChannel(
            cfg["num.io.threads"], cfg["queued.max.request.bytes"], self._dispatch, self.metrics,
            max_connections=cfg["max.connections"],
            max_connections_per_ip=cfg["max.connections.per.ip"],
            idle_ms=cfg["connections.max.idle.ms"])
        quotas = self.channel.quotas
        dynamic.add_reconfigurable(CONNECTION_KEYS, lambda c: quotas.set_limits(
            c["max.connections"], c["max.connections.per.ip"]))
        if self.metrics is not None and metrics_listener is not None:
            self.metrics.observe(self.channel, rm, coordinator, self.metadata, self.log_manager,
                                 transactions)
            self.metrics_server = MetricsServer(self.metrics, *metrics_listener)
            await self.metrics_server.start()
        self.channel.start()
        serial = cfg["request.processing.mode"] == "serial"
        max_frame = cfg["socket.request.max.bytes"]
        channel = self.channel
        self.server = await loop.create_server(
            lambda: Connection(channel, serial, max_frame), host, port, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]
        node.port = node.port or self.port
        self._tasks += [
            asyncio.create_task(self._every("log.retention.check.interval.ms",
                                            rm.apply_retention)),
            asyncio.create_task(self._checkpoint_loop()),
            asyncio.create_task(self._every("offsets.retention.check.interval.ms",
                                            coordinator.expire_offsets)),
        ]
        if cfg["log.flush.interval.ms"] < 2**63 - 1:
            self._tasks.append(asyncio.create_task(rm.run_time_flusher()))
        ms = self.metrics_server
        log.info("broker started", host=host, port=self.port, node_id=node.node_id,
                 topics=len(self.metadata.topics),
                 metrics=ms.url if ms is not None else None,
                 metrics_port=ms.port if ms is not None else None,
                 config=redact(dict(cfg.items())))

    def _dispatch(self, request: Request) -> HandlerResult:
        return apis.HANDLERS[request.spec.key](self.context, request)

    async def _every(self, key: str, job: Callable[[], object]) -> None:
        interval = self.config[key] / 1000
        while True:
            await asyncio.sleep(interval)
            job()

    async def _checkpoint_loop(self) -> None:
        """Kafka's recovery-point checkpoint: after a crash, recovery starts from here."""
        interval = self.config["log.flush.offset.checkpoint.interval.ms"] / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            await loop.run_in_executor(None, self.log_manager.checkpoint)

    async def stop(self) -> None:
        log.info("broker shutting down")
        rm = self.replica_manager
        if self.server is not None:
            self.server.close()
        if self.channel is not None:
            self.channel.mute_all()
            if self.transactions is not None:
                self.transactions.shutdown()
            if rm is not None:
                rm.complete_all_parked()
            await self.channel.stop()
            for conn in list(self.channel.connections):
                conn.close("broker shutting down")
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if rm is not None:
            await rm.flush_all()
            rm.timer.close()
            rm.shutdown()
        self.log_manager.shutdown()
        log.info("broker stopped cleanly")
