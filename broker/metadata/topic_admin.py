"""Topic administration: create, delete and grow topics, and the configs each one runs with.

The one owner of the topics' metadata (MetadataStore) on the way in: it validates, records the
topic, opens or deletes its logs and hands its partitions to the ReplicaManager, so handlers and
the group coordinator never touch those pieces themselves.
"""

from __future__ import annotations

import uuid

import structlog

from broker.config import KEYS, BrokerConfig, value_text
from broker.log.config import LogConfig
from broker.log.dir_failure import KafkaStorageError
from broker.log.manager import LogManager
from broker.metadata.dynamic_config import TOPIC_DEFAULT_KEYS, DynamicBrokerConfig
from broker.metadata.file_store import (
    STORED_TOPIC_CONFIGS,
    TOPIC_CONFIG_DEFAULTS,
    TOPIC_CONFIG_KEYS,
    MetadataStore,
    TopicInfo,
    validate_topic_configs,
    validate_topic_name,
)
from broker.metadata.shared_state import LocalSharedState, SharedState
from broker.replica.partition import Partition
from broker.replica.replica_manager import ReplicaManager
from protocol.errors import ErrorCode, KafkaError

logger = structlog.get_logger("broker")

_MAX_LOG_CONFIGS = 1024
_NO_ID = uuid.UUID(int=0)  # distinct sets of topic overrides whose LogConfig is kept


def topic_defaults(config: BrokerConfig) -> dict[str, str]:
    """Each topic config's value when a topic does not override it: the broker's key's (a
    stored key's too when config.py serves its broker synonym, as log.preallocate), else
    Kafka's default for the keys stored without effect."""
    return {**{key: value_text(config[broker_key])
               for key, broker_key in TOPIC_CONFIG_DEFAULTS.items()},
            **{key: value_text(config[syn]) if syn in KEYS else default
               for key, (syn, default, _kind, _least) in STORED_TOPIC_CONFIGS.items()}}


def log_config(config: BrokerConfig, overrides: dict[str, str]) -> LogConfig:
    """The LogConfig a topic's logs run with: its overrides over the broker's defaults."""
    return LogConfig.from_topic_configs({**topic_defaults(config), **overrides})


class TopicAdmin:
    def __init__(self, config: BrokerConfig, metadata: MetadataStore, log_manager: LogManager,
                 replica_manager: ReplicaManager,
                 dynamic: DynamicBrokerConfig | None = None,
                 shared: SharedState | None = None) -> None:
        """Build after MetadataStore.load and before LogManager.load: without ``dynamic`` it
        loads the broker's dynamic configs itself, so the logs open with them. ``shared``
        holds the topics' overrides (the metadata file's unless given: the cluster's)."""
        self.config = config
        self.metadata = metadata
        self.shared = shared if shared is not None else LocalSharedState(metadata)
        self.shared.on_topic_configs_changed(self._topic_configs_changed)
        self.log_manager = log_manager
        self.replica_manager = replica_manager
        self._log_configs: dict[tuple[tuple[str, str], ...], LogConfig] = {}
        if dynamic is None:
            dynamic = DynamicBrokerConfig(config, metadata)
            dynamic.load()
        self.dynamic = dynamic
        # Kafka's DynamicLogConfig: a changed broker default reaches every topic at once.
        dynamic.add_reconfigurable(TOPIC_DEFAULT_KEYS, lambda _config: self.refresh_all())
        log_manager.default_config = self.log_config({})

    # -- configs --------------------------------------------------------------------------------
    def topic_config(self, topic: TopicInfo | dict[str, str] | None) -> dict[str, str]:
        """Effective topic configs: the topic's overrides over the broker's defaults."""
        overrides = (topic if isinstance(topic, dict) else topic.configs) if topic else {}
        return {**self._defaults(), **{k: v for k, v in overrides.items()
                                       if k in TOPIC_CONFIG_KEYS}}

    def _defaults(self) -> dict[str, str]:
        return topic_defaults(self.config)

    def log_config(self, overrides: dict[str, str]) -> LogConfig:
        """Built once per set of overrides (every partition of a topic asks), until the
        broker's defaults change; the LogConfig is shared, never changed in place."""
        key = tuple(sorted(overrides.items()))
        cfg = self._log_configs.get(key)
        if cfg is None:
            if len(self._log_configs) >= _MAX_LOG_CONFIGS:
                self._log_configs.clear()
            cfg = self._log_configs[key] = log_config(self.config, overrides)
        return cfg

    def topic_overrides(self, name: str) -> dict[str, str]:
        """A topic's own configs (empty for an unknown topic, as Kafka's config store)."""
        return dict(self.shared.topic_overrides(name) or {})

    def alter_topic_configs(self, name: str, configs: dict[str, str],
                            validate_only: bool = False) -> None:
        """Replace a topic's overrides with ``configs`` (AlterConfigs; IncrementalAlterConfigs
        passes the set its operations produce): checked as Kafka's controller checks them
        (name, then LogConfig.validate over the broker defaults, then existence), persisted,
        and applied to every partition's log at once."""
        if not name:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "Default topic resources are not allowed.")
        validate_topic_name(name)
        validate_topic_configs(configs, self._defaults())
        if self.shared.topic_overrides(name) is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
        if validate_only:
            return
        self.shared.change_topic_configs(name, configs)
        info = self.metadata.topics.get(name)
        if info is not None:
            self._apply(info)
        else:  # a topic of the cluster: the partitions this broker holds
            self._apply_held(name, configs)
        logger.info("topic configs altered", topic=name, configs=configs)

    def _topic_configs_changed(self, name: str, configs: dict[str, str] | None) -> None:
        """Another broker altered a topic of the cluster: its partitions here follow."""
        if configs is not None:
            self._apply_held(name, configs)
            logger.info("topic configs changed", topic=name, configs=configs)

    def _apply_held(self, name: str, configs: dict[str, str]) -> None:
        held = [index for topic, index in list(self.replica_manager.partitions)
                if topic == name]
        self._apply(TopicInfo(name, _NO_ID, max(held, default=-1) + 1, configs))

    def refresh_all(self) -> None:
        """The broker's topic defaults changed: every topic's logs take their new config."""
        self._log_configs.clear()
        self.log_manager.default_config = self.log_config({})
        for info in list(self.metadata.topics.values()):
            self._apply(info)

    def _apply(self, info: TopicInfo) -> None:
        cfg = self.log_config(info.configs)
        cleaner = self.log_manager.cleaner
        for index in range(info.partitions):
            partition = self.replica_manager.partitions.get((info.name, index))
            if partition is None:
                continue
            was_compacted = partition.log.config.compact
            partition.log.update_config(cfg)
            if was_compacted and not cfg.compact and cleaner is not None:
                # Kafka's updateTopicConfig: a clean under way would remove what the topic
                # now keeps, so it is aborted.
                cleaner.abort_and_pause(partition.key)
                cleaner.resume(partition.key)
            self._gate_by_flush(partition, cfg)

    def _gate_by_flush(self, partition: Partition, cfg: LogConfig) -> None:
        """flush.messages=1 holds the high watermark at the last fsync; ungated, what is
        appended is readable at once, so the high watermark moves up to the log end."""
        gated = cfg.flush_interval_messages == 1
        if partition.hw_gated_by_flush == gated:
            return
        partition.hw_gated_by_flush = gated
        if not gated and partition.advance_high_watermark(partition.log_end_offset,
                                                          partition.appended_bytes):
            self.replica_manager.on_high_watermark(partition)

    # -- topics ---------------------------------------------------------------------------------
    def check_new_topic(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        """Everything create_topic checks, without creating (CreateTopics' validate_only)."""
        validate_topic_name(name)
        if name in self.metadata.topics:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name} already exists")
        if partitions < 1:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, "partitions must be at least 1")
        validate_topic_configs(configs, self._defaults())

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        self.check_new_topic(name, partitions, configs)
        if not self.log_manager.live_log_dirs:  # before the topic is recorded without logs
            raise KafkaStorageError("every log dir is offline: no log can be created")
        self._create_logs(name, range(partitions), self.log_config(configs))
        info = self.metadata.add(name, partitions, configs)  # recorded once its logs exist
        for index in range(partitions):
            self._open_partition(info, index)
        logger.info("topic created", topic=name, partitions=partitions, configs=configs)
        return info

    def _create_logs(self, name: str, partitions: range, cfg: LogConfig) -> None:
        """Every new partition's log, or none: a log that can not be created (no descriptor
        left, a failing disk) removes the ones made before it, so nothing is recorded that a
        restart could not open."""
        try:
            for index in partitions:
                self.log_manager.create_log(name, index, cfg)
        except KafkaError:
            for index in partitions:
                self.log_manager.delete_log((name, index))
            raise

    def auto_create(self, name: str) -> TopicInfo | None:
        """Kafka's auto.create.topics.enable: a metadata request for a new name creates it."""
        if not self.config["auto.create.topics.enable"]:
            return None
        return self.create_topic(name, self.config["num.partitions"], {})

    def add_partitions(self, name: str, total: int, validate_only: bool = False) -> None:
        info = self.metadata.topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
        if total <= info.partitions:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS,
                             f"topic {name} has {info.partitions} partitions; asked for {total}")
        if validate_only:
            return
        if not self.log_manager.live_log_dirs:  # before the count is recorded without logs
            raise KafkaStorageError("every log dir is offline: no log can be created")
        added = range(info.partitions, total)
        self._create_logs(name, added, self.log_config(info.configs))
        self.metadata.set_partitions(name, total)  # recorded once its logs exist
        for index in added:
            self._open_partition(info, index)
        logger.info("partitions added", topic=name, partitions=total)

    def delete_topic(self, name: str) -> TopicInfo:
        info = self.metadata.topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}")
        self.metadata.remove(name)
        for index in range(info.partitions):
            self.replica_manager.remove_partition((name, index))
            self.log_manager.delete_log((name, index))
        logger.info("topic deleted", topic=name)
        return info

    def open_all(self) -> None:
        """At start: every known topic's partitions, on the logs the LogManager recovered."""
        for info in self.metadata.topics.values():
            for index in range(info.partitions):
                self._open_partition(info, index)

    def _open_partition(self, info: TopicInfo, index: int) -> Partition:
        cfg = self.log_config(info.configs)
        tp = (info.name, index)
        plog = self.log_manager.get_log(tp)
        if plog is None:
            plog = self.log_manager.create_log(info.name, index, cfg)
        else:
            plog.update_config(cfg)
        partition = Partition(info.name, index, plog, cfg.flush_interval_messages == 1)
        self.replica_manager.add_partition(partition)
        return partition
