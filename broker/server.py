"""Broker lifecycle: load logs and metadata, serve the listener, shut down cleanly.

Shutdown order follows Kafka's: stop accepting, let in-flight requests finish, flush every log,
then write the clean-shutdown marker so the next start skips recovery.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import structlog

from broker import apis
from broker.config import BrokerConfig
from broker.fetch_session import FetchSessionCache
from broker.group.coordinator import GroupCoordinator
from broker.log.log import LogConfig
from broker.log.manager import LogManager
from broker.logging import redact
from broker.metadata import (
    TOPIC_CONFIG_DEFAULTS,
    MetadataStore,
    TopicInfo,
    validate_topic_configs,
    validate_topic_name,
)
from broker.metrics import BrokerMetrics, MetricsServer
from broker.network.connection import Connection
from broker.network.request_channel import Request, RequestChannel
from broker.partition import Partition
from broker.producer_ids import ProducerIdManager
from broker.replica_manager import ReplicaManager
from protocol.errors import ErrorCode, KafkaError
from purgatory import Timer

log = structlog.get_logger("broker")


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.node_id: int = config["node.id"]
        self.log_dirs = [Path(d) for d in config["log.dirs"]]
        self.metadata = MetadataStore(self.log_dirs[0])
        self.log_manager = LogManager(self.log_dirs, self._log_config({}))
        self.replica_manager: ReplicaManager | None = None
        self.coordinator: GroupCoordinator | None = None
        self.fetch_sessions = FetchSessionCache()
        self.producer_ids = ProducerIdManager(self.log_dirs[0])
        self.channel: RequestChannel | None = None
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.metrics: BrokerMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()

    # -- configuration of topics ---------------------------------------------------------------
    def topic_config(self, topic: TopicInfo | None) -> dict[str, str]:
        """Effective topic configs: the topic's overrides over the broker's defaults."""
        overrides = topic.configs if topic else {}
        out: dict[str, str] = {}
        for key, broker_key in TOPIC_CONFIG_DEFAULTS.items():
            default = str(self.config[broker_key]) if broker_key else "delete"
            out[key] = overrides.get(key, default)
        return out

    def _log_config(self, overrides: dict[str, str]) -> LogConfig:
        eff = {**{k: str(self.config[b]) if b else "delete"
                  for k, b in TOPIC_CONFIG_DEFAULTS.items()}, **overrides}
        return LogConfig(
            segment_bytes=int(eff["segment.bytes"]),
            roll_ms=int(eff["segment.ms"]),
            retention_ms=int(eff["retention.ms"]),
            retention_bytes=int(eff["retention.bytes"]),
            flush_interval_messages=int(eff["flush.messages"]),
            flush_interval_ms=int(eff["flush.ms"]),
            index_interval_bytes=int(eff["index.interval.bytes"]),
            message_timestamp_type=eff["message.timestamp.type"],
            max_message_bytes=int(eff["max.message.bytes"]),
        )

    # -- topics -------------------------------------------------------------------------------
    @property
    def group_coordinator(self) -> GroupCoordinator:
        assert self.coordinator is not None
        return self.coordinator

    @property
    def rm(self) -> ReplicaManager:
        assert self.replica_manager is not None
        return self.replica_manager

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        validate_topic_name(name)
        if name in self.metadata.topics:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name} already exists")
        if partitions < 1:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, "partitions must be at least 1")
        validate_topic_configs(configs)
        info = self.metadata.add(name, partitions, configs)
        for index in range(partitions):
            self._open_partition(info, index, create=True)
        log.info("topic created", topic=name, partitions=partitions, configs=configs)
        return info

    def add_partitions(self, name: str, total: int) -> None:
        info = self.metadata.topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
        if total <= info.partitions:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS,
                             f"topic {name} has {info.partitions} partitions; asked for {total}")
        old = info.partitions
        info.partitions = total
        self.metadata.save()
        for index in range(old, total):
            self._open_partition(info, index, create=True)
        log.info("partitions added", topic=name, partitions=total)

    def delete_topic(self, name: str) -> TopicInfo:
        info = self.metadata.topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
        self.metadata.remove(name)
        for index in range(info.partitions):
            self.rm.remove_partition((name, index))
            self.log_manager.delete_log((name, index))
        log.info("topic deleted", topic=name)
        return info

    def auto_create(self, name: str) -> TopicInfo | None:
        """Kafka's auto.create.topics.enable: a metadata request for a new name creates it."""
        if not self.config["auto.create.topics.enable"]:
            return None
        return self.create_topic(name, self.config["num.partitions"], {})

    def _open_partition(self, info: TopicInfo, index: int, create: bool) -> Partition:
        cfg = self._log_config(info.configs)
        tp = (info.name, index)
        plog = self.log_manager.get_log(tp)
        if plog is None:
            plog = self.log_manager.create_log(info.name, index, cfg)
        else:
            plog.update_config(cfg)
        partition = Partition(info.name, index, plog, cfg.flush_interval_messages == 1)
        self.rm.add_partition(partition)
        return partition

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
        self.metadata.load()
        self.producer_ids.load()
        self.log_manager.load()
        timer = Timer()
        self.replica_manager = ReplicaManager(self.config["log.flush.interval.ms"], timer)
        for info in self.metadata.topics.values():
            for index in range(info.partitions):
                self._open_partition(info, index, create=False)
        self.coordinator = GroupCoordinator(self, timer)
        self.coordinator.start()
        metrics_listener = self.config.metrics_listener
        if metrics_listener is not None:
            self.metrics = BrokerMetrics(self)
        self.channel = RequestChannel(
            self.config["num.io.threads"], self.config["queued.max.request.bytes"], self._dispatch,
            self.metrics,
        )
        self.channel.start()
        if self.metrics is not None and metrics_listener is not None:
            self.metrics_server = MetricsServer(self.metrics, *metrics_listener)
            await self.metrics_server.start()
        host, port = self.config.listener
        serial = self.config["request.processing.mode"] == "serial"
        max_frame = self.config["socket.request.max.bytes"]
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: Connection(self.channel, serial, max_frame),  # type: ignore[arg-type]
            host, port, reuse_address=True,
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self._tasks.append(asyncio.create_task(self._retention_loop()))
        self._tasks.append(asyncio.create_task(self._checkpoint_loop()))
        self._tasks.append(asyncio.create_task(self._offsets_retention_loop()))
        if self.config["log.flush.interval.ms"] < 2**63 - 1:
            self._tasks.append(asyncio.create_task(self.rm.run_time_flusher()))
        ms = self.metrics_server
        log.info("broker started", host=host, port=self.port, node_id=self.node_id,
                 topics=len(self.metadata.topics),
                 metrics=ms.url if ms is not None else None,
                 metrics_port=ms.port if ms is not None else None,
                 config=redact(dict(self.config.items())))

    @property
    def advertised(self) -> tuple[str, int]:
        host, port = self.config.advertised
        return host, (port or self.port)

    def _dispatch(self, request: Request):  # type: ignore[no-untyped-def]
        return apis.HANDLERS[request.spec.key](self, request)

    async def _retention_loop(self) -> None:
        interval = self.config["log.retention.check.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            self.apply_retention()

    async def _checkpoint_loop(self) -> None:
        """Kafka's recovery-point checkpoint: after a crash, recovery starts from here."""
        interval = self.config["log.flush.offset.checkpoint.interval.ms"] / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            await loop.run_in_executor(None, self.log_manager.checkpoint)

    async def _offsets_retention_loop(self) -> None:
        interval = self.config["offsets.retention.check.interval.ms"] / 1000
        while True:
            await asyncio.sleep(interval)
            self.group_coordinator.expire_offsets()

    def apply_retention(self) -> None:
        from broker.replica_manager import now_ms

        ts = now_ms()
        for p in list(self.rm.partitions.values()):
            deleted = p.log.delete_old_segments(ts, p.high_watermark)
            if deleted:
                log.info("retention deleted segments", topic=p.topic, partition=p.index,
                         segments=deleted, log_start_offset=p.log_start_offset)
                # A fetch parked below the new log start now has an error to report.
                self.rm.fetch_purgatory.check_and_complete(p.key)

    async def stop(self) -> None:
        log.info("broker shutting down")
        if self.server is not None:
            self.server.close()
        if self.channel is not None:
            self.channel.mute_all()
            if self.replica_manager is not None:
                self.rm.complete_all_parked()
            await self.channel.stop()
            for conn in list(self.channel.connections):
                conn.close("broker shutting down")
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.replica_manager is not None:
            await self.rm.flush_all()
            self.rm.timer.close()
            self.rm.shutdown()
        self.log_manager.shutdown()
        log.info("broker stopped cleanly")
        self._stopped.set()
