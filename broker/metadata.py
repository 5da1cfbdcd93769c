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

from broker.fileio import atomic_write
from protocol.errors import ErrorCode, KafkaError

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")

# Topic-level keys (Kafka's names) and the broker key each one defaults from.
TOPIC_CONFIG_DEFAULTS: dict[str, str | None] = {
    "cleanup.policy": None,
    "retention.ms": "log.retention.ms",
    "retention.bytes": "log.retention.bytes",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "message.timestamp.type": "log.message.timestamp.type",
    "max.message.bytes": "message.max.bytes",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
}
_INT_TOPIC_KEYS = set(TOPIC_CONFIG_DEFAULTS) - {"cleanup.policy", "message.timestamp.type"}


def validate_topic_name(name: str | None) -> None:
    if not name or name in (".", "..") or not _LEGAL.match(name):
        raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, f"illegal topic name {name!r}")


def validate_topic_configs(configs: dict[str, str]) -> None:
    for key, value in configs.items():
        if key not in TOPIC_CONFIG_DEFAULTS:
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"unknown topic config {key}")
        if key in _INT_TOPIC_KEYS:
            try:
                int(value)
            except (TypeError, ValueError):
                msg = f"{key}={value!r} is not a number"
                raise KafkaError(ErrorCode.INVALID_CONFIG, msg) from None
        elif key == "message.timestamp.type" and value not in ("CreateTime", "LogAppendTime"):
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"{key}={value!r}")
        elif key == "cleanup.policy" and value not in ("delete", "compact", "compact,delete"):
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"{key}={value!r}")


@dataclass
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


class MetadataStore:
    """Topics by name and by id, persisted in `<first log dir>/mini-broker-topics.json`."""

    FILE = "mini-broker-topics.json"

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / self.FILE
        self.topics: dict[str, TopicInfo] = {}
        self.by_id: dict[uuid.UUID, TopicInfo] = {}
        self.cluster_id = ""

    def load(self) -> None:
        if self.path.exists():
            doc = json.loads(self.path.read_text())
            self.cluster_id = doc["cluster_id"]
            for t in doc["topics"]:
                self._index(TopicInfo(t["name"], uuid.UUID(t["id"]), t["partitions"],
                                      t["configs"]))
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
