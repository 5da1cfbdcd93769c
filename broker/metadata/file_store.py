"""Cluster metadata of one broker: topics, their ids, partition counts and config overrides.

Kafka keeps this in the KRaft metadata log; a single broker keeps it in one JSON file, replaced
atomically (write, fsync, rename) so a crash leaves either the old or the new version.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from broker.log.disk import atomic_write
from broker.log.validator import (
    COMPRESSION_LEVELS,
    LONG_MAX,
    TOPIC_CODECS,
    codec_available,
    compression_level_problem,
)
from protocol.errors import ErrorCode, KafkaError

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

# Topic-level keys (Kafka's names) and the broker key each one defaults from.
TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "message.timestamp.type": "log.message.timestamp.type",
    "max.message.bytes": "message.max.bytes",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "compression.type": "compression.type",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
}
# Topic keys of Kafka's LIST type: the only ones IncrementalAlterConfigs may APPEND/SUBTRACT.
TOPIC_LIST_KEYS = frozenset({"cleanup.policy"})
_STRING_TOPIC_KEYS = {"cleanup.policy", "message.timestamp.type", "compression.type"}
_DOUBLE_TOPIC_KEYS = {"min.cleanable.dirty.ratio"}  # Kafka's DOUBLE, between(0, 1)
_INT_TOPIC_KEYS = set(TOPIC_CONFIG_DEFAULTS) - _STRING_TOPIC_KEYS - _DOUBLE_TOPIC_KEYS
# Kafka's LONG type with atLeast(0) (atLeast(1) for max.compaction.lag.ms).
_NON_NEGATIVE_LONG_KEYS = {"message.timestamp.before.max.ms", "message.timestamp.after.max.ms",
                           "delete.retention.ms", "min.compaction.lag.ms"}


def validate_topic_name(name: str | None) -> None:
    if not name or name in (".", "..") or not _LEGAL.match(name):
        raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"illegal topic name {name!r}")


def validate_topic_configs(configs: dict[str, str],
                           defaults: dict[str, str] | None = None) -> None:
    """Refuse what Kafka's LogConfig.validate refuses, with INVALID_CONFIG naming the key.

    ``defaults`` (the broker's topic defaults) take part in the cross-key check, as Kafka
    combines the broker's log config with the topic's before checking min <= max lag.
    """
    for key, value in configs.items():
        if key not in TOPIC_CONFIG_DEFAULTS:
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key}")
        if key in _INT_TOPIC_KEYS:
            problem = _int_problem(key, value)
        elif key in _DOUBLE_TOPIC_KEYS:
            problem = _ratio_problem(key, value)
        else:
            problem = _string_problem(key, value)
        if problem is not None:
            raise KafkaError(ErrorCode.INVALID_CONFIG, problem)
    combined = {**(defaults or {}), **configs}
    min_lag = int(combined.get("min.compaction.lag.ms", "0"))
    max_lag = int(combined.get("max.compaction.lag.ms", str(LONG_MAX)))
    if min_lag > max_lag:
        raise KafkaError(ErrorCode.INVALID_CONFIG,
                         f"conflicting topic configs: min.compaction.lag.ms ({min_lag}) > "
                         f"max.compaction.lag.ms ({max_lag})")


def _int_problem(key: str, value: str) -> str | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return f"{key}={value!r} is not a number"
    if key in COMPRESSION_LEVELS:
        return compression_level_problem(key, number)
    if key in _NON_NEGATIVE_LONG_KEYS and not 0 <= number <= LONG_MAX:
        return f"{key}={value!r} must be between 0 and {LONG_MAX}"
    if key == "max.compaction.lag.ms" and not 1 <= number <= LONG_MAX:
        return f"{key}={value!r} must be between 1 and {LONG_MAX}"
    return None


def _ratio_problem(key: str, value: str) -> str | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"{key}={value!r} is not a number"
    if not 0.0 <= number <= 1.0:
        return f"{key}={value!r} must be between 0 and 1"
    return None


def _string_problem(key: str, value: str) -> str | None:
    if key == "message.timestamp.type":
        ok = value in ("CreateTime", "LogAppendTime")
    elif key == "cleanup.policy":
        policies = [p.strip() for p in str(value).split(",")]
        ok = bool(policies) and all(p in ("compact", "delete") for p in policies)
    else:  # compression.type
        if value in TOPIC_CODECS and not codec_available(value):
            return f"{key}={value!r}: the {value} codec library is not installed"
        ok = value in TOPIC_CODECS
    return None if ok else f"{key}={value!r}"


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


class MetadataStore:
    """Topics by name and by id, and the broker's dynamic configs, persisted in
    `<first log dir>/mini-broker-topics.json`.

    ``broker_configs`` maps a BROKER resource name ("" for the cluster default, or a node id)
    to its dynamic overrides, as Kafka keeps them beside the topic configs in its metadata.
    ``acls`` (the authorizer's bindings) and ``scram_credentials`` (user -> mechanism -> salted
    keys, never a password) are kept here too, as Kafka keeps both in its metadata log; each is
    read and written only by its owner (broker/security/), as plain JSON values.
    """

    FILE = "mini-broker-topics.json"

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / self.FILE
        self.topics: dict[str, TopicInfo] = {}
        self.by_id: dict[uuid.UUID, TopicInfo] = {}
        self.broker_configs: dict[str, dict[str, str]] = {}
        self.acls: list[dict[str, object]] = []
        self.scram_credentials: dict[str, dict[str, dict[str, object]]] = {}
        self.cluster_id = ""

    def load(self) -> None:
        if self.path.exists():
            doc = json.loads(self.path.read_text())
            self.cluster_id = doc["cluster_id"]
            for t in doc["topics"]:
                self._index(TopicInfo(t["name"], uuid.UUID(t["id"]), t["partitions"],
                                      t["configs"]))
            self.broker_configs = {name: dict(configs) for name, configs
                                   in doc.get("broker_configs", {}).items()}
            self.acls = list(doc.get("acls", []))
            self.scram_credentials = dict(doc.get("scram_credentials", {}))
        else:
            self.cluster_id = _base64_uuid(uuid.uuid4())
            self.save()

    def save(self) -> None:
        doc = {
            "cluster_id": self.cluster_id,
            "topics": [
                {"name": t.name, "id": str(t.topic_id), "partitions": t.partitions,
                 "configs": t.configs}
                for t in self.topics.values()
            ],
            "broker_configs": {name: configs for name, configs in self.broker_configs.items()
                               if configs},
            "acls": self.acls,
            "scram_credentials": {user: creds for user, creds in self.scram_credentials.items()
                                  if creds},
        }
        atomic_write(self.path, json.dumps(doc, indent=1).encode())

    def add(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        info = TopicInfo(name, uuid.uuid4(), partitions, dict(configs))
        self._index(info)
        self.save()
        return info

    def remove(self, name: str) -> TopicInfo:
        info = self.topics.pop(name)
        del self.by_id[info.topic_id]
        self.save()
        return info

    def _index(self, info: TopicInfo) -> None:
        self.topics[info.name] = info
        self.by_id[info.topic_id] = info


def _base64_uuid(u: uuid.UUID) -> str:
    import base64

    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")
