"""Topics and partition states in the store, in Kafka's ZooKeeper layout (ZkData's TopicZNode,
TopicPartitionStateZNode, ConfigEntityZNode) and its JSON documents.

- ``/brokers/topics/<topic>``: the assignment, ``{"version":3,"partitions":{"0":[1,2]},
  "adding_replicas":{},"removing_replicas":{},"topic_id":"<22 chars>"}``.
- ``/brokers/topics/<topic>/partitions/<p>/state``: Kafka's LeaderAndIsr znode,
  ``{"version":1,"leader":1,"leader_epoch":0,"isr":[1,2],"controller_epoch":3}``; the
  **partition epoch** is the key's version - 1 (Kafka's zkVersion, which starts at 0).
- ``/config/topics/<topic>``: the topic's configs, ``{"version":1,"config":{...}}``.

Invariant: ``decode_*`` either return a value whose every field has its type and range
(replicas distinct non-negative ids, a leader of -1 or an id, epochs >= 0) or raise
``MalformedMetadata``: a reader logs it once and skips the key, it never stops reading.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import structlog

from broker.cluster.store import KeyValue, StoreError

logger = structlog.get_logger("broker.cluster")

TOPICS = "/brokers/topics/"
TOPIC_CONFIGS = "/config/topics/"
NO_LEADER = -1
UNCLEAN_LEADER_ELECTION = "unclean.leader.election.enable"

_STATE_KEY = re.compile(r"^/brokers/topics/([^/]+)/partitions/(\d+)/state$")
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


class MalformedMetadata(StoreError):
    """A key's value is not the document its path calls for."""


def topic_key(topic: str) -> str:
    return f"{TOPICS}{topic}"


def partitions_prefix(topic: str) -> str:
    return f"{TOPICS}{topic}/partitions/"


def state_key(topic: str, partition: int) -> str:
    return f"{partitions_prefix(topic)}{partition}/state"


def config_key(topic: str) -> str:
    return f"{TOPIC_CONFIGS}{topic}"


def parse_topic_key(key: str) -> str | None:
    """The topic of a ``/brokers/topics/<topic>`` key; None for any other key."""
    if not key.startswith(TOPICS):
        return None
    tail = key[len(TOPICS):]
    return tail if tail and "/" not in tail else None


def parse_state_key(key: str) -> tuple[str, int] | None:
    """(topic, partition) of a partition state key; None for any other key."""
    m = _STATE_KEY.match(key)
    return (m.group(1), int(m.group(2))) if m else None


def topic_name_problem(name: str) -> str | None:
    """Kafka's Topic.validate message for an illegal name, None for a legal one (a legal name
    is also a safe key segment: no '/')."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return "Topic name cannot be \".\" or \"..\""
    if len(name) > MAX_TOPIC_NAME:
        return (f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME} characters, "
                f"topic name: {name}")
    if not _LEGAL_TOPIC.match(name):
        return (f"Topic name \"{name}\" is illegal, it contains a character other than ASCII "
                f"alphanumerics, '.', '_' and '-'")
    return None


def new_topic_id() -> str:
    """Kafka's Uuid.randomUuid().toString(): 16 random bytes, URL-safe base64 unpadded
    (never the all-zero ZERO_UUID)."""
    while True:
        raw = uuid.uuid4().bytes
        if any(raw):
            return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _broker_ids(value: object, what: str) -> list[int]:
    if not isinstance(value, list) or not all(
            type(r) is int and r >= 0 for r in value) or len(set(value)) != len(value):
        raise MalformedMetadata(f"{what} is not a list of distinct broker ids: {value!r}")
    return list(value)


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """A topic's id and each partition's replicas, the first being the preferred leader."""

    name: str
    topic_id: str
    partitions: Mapping[int, list[int]]

    def encode(self) -> bytes:
        return json.dumps({
            "version": 3,
            "partitions": {str(p): r for p, r in sorted(self.partitions.items())},
            "adding_replicas": {},
            "removing_replicas": {},
            "topic_id": self.topic_id,
        }).encode()

    @classmethod
    def decode(cls, name: str, data: bytes) -> TopicAssignment:
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise MalformedMetadata(f"topic {name}: not JSON ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), dict):
            raise MalformedMetadata(f"topic {name}: no partitions map: {data[:200]!r}")
        topic_id = doc.get("topic_id")
        if not isinstance(topic_id, str) or not topic_id:
            raise MalformedMetadata(f"topic {name}: no topic_id: {data[:200]!r}")
        partitions: dict[int, list[int]] = {}
        for p, replicas in doc["partitions"].items():
            if not isinstance(p, str) or not p.isdigit():
                raise MalformedMetadata(f"topic {name}: partition {p!r} is not a number")
            partitions[int(p)] = _broker_ids(replicas, f"topic {name} partition {p} replicas")
            if not partitions[int(p)]:
                raise MalformedMetadata(f"topic {name}: partition {p} has no replicas")
        if sorted(partitions) != list(range(len(partitions))):
            raise MalformedMetadata(f"topic {name}: partitions are not 0..n-1: "
                                    f"{sorted(partitions)}")
        return cls(name, topic_id, partitions)


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Kafka's LeaderAndIsr of a partition, with its partition epoch (the key's version - 1,
    -1 before it was ever written)."""

    leader: int
    leader_epoch: int
    isr: list[int]
    controller_epoch: int
    partition_epoch: int = -1

    def encode(self) -> bytes:
        return json.dumps({"version": 1, "leader": self.leader,
                           "leader_epoch": self.leader_epoch, "isr": self.isr,
                           "controller_epoch": self.controller_epoch}).encode()

    @classmethod
    def decode(cls, data: bytes, version: int = 0, what: str = "partition state"
               ) -> PartitionState:
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise MalformedMetadata(f"{what}: not JSON ({e})") from None
        if not isinstance(doc, dict):
            raise MalformedMetadata(f"{what}: not an object: {data[:200]!r}")
        fields: dict[str, int] = {}
        for name in ("leader", "leader_epoch", "controller_epoch"):
            v = doc.get(name)
            if type(v) is not int or v < (NO_LEADER if name == "leader" else 0):
                raise MalformedMetadata(f"{what}: {name} is {v!r}")
            fields[name] = v
        isr = _broker_ids(doc.get("isr"), f"{what} isr")
        return cls(fields["leader"], fields["leader_epoch"], isr, fields["controller_epoch"],
                   version - 1)

    @classmethod
    def from_kv(cls, kv: KeyValue) -> PartitionState:
        return cls.decode(kv.value, kv.version, kv.key)

    @property
    def online(self) -> bool:
        return self.leader != NO_LEADER

    def next(self, leader: int, isr: list[int], controller_epoch: int) -> PartitionState:
        """Kafka's newLeaderAndIsr: the leader epoch moves on with every controller change."""
        return replace(self, leader=leader, leader_epoch=self.leader_epoch + 1, isr=isr,
                       controller_epoch=controller_epoch, partition_epoch=self.partition_epoch + 1)


def encode_topic_config(configs: Mapping[str, str]) -> bytes:
    return json.dumps({"version": 1, "config": dict(configs)}).encode()


def decode_topic_config(topic: str, data: bytes) -> dict[str, str]:
    try:
        doc = json.loads(data)
        configs = doc["config"]
    except (ValueError, KeyError, TypeError) as e:
        raise MalformedMetadata(f"topic {topic} configs cannot be read ({e!r})") from None
    if not isinstance(configs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
        raise MalformedMetadata(f"topic {topic} configs are not a string map: {data[:200]!r}")
    return configs


@dataclass
class MalformedLog:
    """Logs each malformed value once: the same key at the same revision is not logged
    again (a re-list reads it again), a new value of the key is."""

    seen: set[tuple[str, int]] = field(default_factory=set)
    skipped: int = 0

    def report(self, kv: KeyValue, error: MalformedMetadata) -> None:
        self.skipped += 1
        if (kv.key, kv.mod_revision) in self.seen:
            return
        if len(self.seen) > 10_000:
            self.seen.clear()
        self.seen.add((kv.key, kv.mod_revision))
        logger.warning("malformed cluster metadata skipped", key=kv.key,
                       revision=kv.mod_revision, error=str(error))
