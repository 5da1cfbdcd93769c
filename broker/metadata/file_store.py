"""Cluster metadata of one broker: topics, their ids, partition counts and config overrides.

Kafka keeps this in the KRaft metadata log; a single broker keeps it in a JSON snapshot,
replaced atomically (write, fsync, rename) so a crash leaves either the old or the new version,
and a journal of the topic changes made since (one checksummed line each, fsynced): recording
a topic costs one short append, not a rewrite of every topic. A line torn by a crash fails its
checksum and is dropped whole, so a topic is recorded entirely or not at all. When the journal
holds about as many changes as the snapshot holds topics, the snapshot is rewritten and the
journal starts over (amortised O(1) per change); both carry a generation, so a journal the
newer snapshot already includes is never replayed twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from broker.log import disk
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
# The rest of Kafka 4.0's topic keys (LogConfig), checked as Kafka checks them and stored. Those
# whose broker synonym config.py serves (segment.jitter.ms, segment.index.bytes,
# file.delete.delay.ms, preallocate) apply and default to it; the others are described with
# Kafka's defaults and have no effect here (one broker, no replicas to elect or throttle, no
# tiered storage; docs/operations.md says which and why). Key -> (its broker synonym in Kafka,
# or None; Kafka's default; ConfigDef type; least value of a number).
STORED_TOPIC_CONFIGS: dict[str, tuple[str | None, str, str, int | None]] = {
    "segment.jitter.ms": ("log.roll.jitter.ms", "0", "long", 0),
    "segment.index.bytes": ("log.index.size.max.bytes", "10485760", "int", 4),
    "file.delete.delay.ms": ("log.segment.delete.delay.ms", "60000", "long", 0),
    "preallocate": ("log.preallocate", "false", "boolean", None),
    "min.insync.replicas": ("min.insync.replicas", "1", "int", 1),
    "unclean.leader.election.enable": ("unclean.leader.election.enable", "false", "boolean",
                                       None),
    "message.downconversion.enable": ("log.message.downconversion.enable", "true", "boolean",
                                      None),
    "leader.replication.throttled.replicas": (None, "", "list", None),
    "follower.replication.throttled.replicas": (None, "", "list", None),
    "remote.storage.enable": (None, "false", "boolean", None),
    "local.retention.ms": ("log.local.retention.ms", "-2", "long", -2),
    "local.retention.bytes": ("log.local.retention.bytes", "-2", "long", -2),
    "remote.log.copy.disable": (None, "false", "boolean", None),
    "remote.log.delete.on.disable": (None, "false", "boolean", None),
}
# Every topic key Kafka 4.0 accepts (CreateTopics, AlterConfigs, IncrementalAlterConfigs).
TOPIC_CONFIG_KEYS = frozenset(TOPIC_CONFIG_DEFAULTS) | frozenset(STORED_TOPIC_CONFIGS)
# Topic keys of Kafka's LIST type: the only ones IncrementalAlterConfigs may APPEND/SUBTRACT.
TOPIC_LIST_KEYS = frozenset({"cleanup.policy"} | {
    k for k, (_syn, _default, kind, _least) in STORED_TOPIC_CONFIGS.items() if kind == "list"})
_STRING_TOPIC_KEYS = {"cleanup.policy", "message.timestamp.type", "compression.type"}
_DOUBLE_TOPIC_KEYS = {"min.cleanable.dirty.ratio"}  # Kafka's DOUBLE, between(0, 1)
_INT_TOPIC_KEYS = set(TOPIC_CONFIG_DEFAULTS) - _STRING_TOPIC_KEYS - _DOUBLE_TOPIC_KEYS
_INT_MAX = (1 << 31) - 1
_THROTTLED_REPLICA = re.compile(r"^\s*\d+\s*:\s*\d+\s*$")  # partition:broker
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
        if key not in TOPIC_CONFIG_KEYS:
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {key}")
        if key in STORED_TOPIC_CONFIGS:
            problem = _stored_problem(key, value)
        elif key in _INT_TOPIC_KEYS:
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


def _stored_problem(key: str, value: str) -> str | None:
    """Kafka's ConfigDef check of a key of STORED_TOPIC_CONFIGS (its type, its least value),
    and the tiered storage check: remote storage cannot be enabled on a broker without it."""
    _synonym, _default, kind, least = STORED_TOPIC_CONFIGS[key]
    text = str(value).strip()
    if kind == "boolean":
        if text.lower() not in ("true", "false"):
            return f"{key}={value!r}: expected true or false"
        if key == "remote.storage.enable" and text.lower() == "true":
            return ("Tiered Storage functionality is disabled in the broker. Topic cannot be "
                    "configured with remote log storage.")
        return None
    if kind == "list":
        entries = [e for e in text.split(",") if e.strip()]
        if entries == ["*"] or all(_THROTTLED_REPLICA.match(e) for e in entries):
            return None
        return (f"{key}={value!r}: must be the literal '*' or a list of replicas in the "
                "format [PartitionId]:[BrokerId]")
    try:
        number = int(text)
    except ValueError:
        return f"{key}={value!r} is not a number"
    upper = _INT_MAX if kind == "int" else LONG_MAX
    if least is not None and not least <= number <= upper:
        return f"{key}={value!r} must be between {least} and {upper}"
    return None


def stored_topic_value_text(key: str, value: str) -> str:
    """A value of STORED_TOPIC_CONFIGS as Kafka writes its parsed value back."""
    kind = STORED_TOPIC_CONFIGS[key][2]
    text = str(value).strip()
    if kind == "boolean":
        return text.lower()
    if kind == "list":
        return ",".join(e.strip() for e in text.split(",") if e.strip())
    return str(int(text))


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


class TopicsImage(Protocol):
    """What the consumer-group coordinator reads: topics by name and the groups' configs
    (a single broker's ``MetadataStore``, or the cluster's topics in cluster mode)."""

    @property
    def topics(self) -> Mapping[str, TopicInfo]: ...

    @property
    def group_configs(self) -> dict[str, dict[str, str]]: ...


class MetadataStore:
    """Topics by name and by id, and the broker's dynamic configs, persisted in
    `<first log dir>/mini-broker-topics.json` and the journal beside it.

    ``broker_configs`` maps a BROKER resource name ("" for the cluster default, or a node id)
    to its dynamic overrides, as Kafka keeps them beside the topic configs in its metadata.
    ``acls`` (the authorizer's bindings) and ``scram_credentials`` (user -> mechanism -> salted
    keys, never a password) are kept here too, as Kafka keeps both in its metadata log; each is
    read and written only by its owner (broker/security/), as plain JSON values, and saved with
    ``save()`` (a new snapshot). Topic changes go through ``add``, ``remove``,
    ``set_partitions`` and ``set_configs``, which journal them.

    ``epoch`` counts topic changes, so what is built from the topics (the Metadata answer's
    pieces) knows when it is stale without comparing them.
    """

    FILE = "mini-broker-topics.json"
    JOURNAL = "mini-broker-topics.journal"
    #: Changes journaled before a new snapshot, at the least (else: as many as there are topics).
    MIN_COMPACTION_RECORDS = 64

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / self.FILE
        self.journal_path = log_dir / self.JOURNAL
        self.topics: dict[str, TopicInfo] = {}
        self.by_id: dict[uuid.UUID, TopicInfo] = {}
        self.broker_configs: dict[str, dict[str, str]] = {}
        self.group_configs: dict[str, dict[str, str]] = {}  # group id -> its config overrides
        self.acls: list[dict[str, object]] = []
        self.scram_credentials: dict[str, dict[str, dict[str, object]]] = {}
        self.cluster_id = ""
        self.epoch = 0
        self.generation = 0  # of the snapshot; the journal replays only onto its own
        self.journal_records = 0

    def load(self) -> None:
        if self.path.exists():
            doc = json.loads(self.path.read_text())
            self.cluster_id = doc["cluster_id"]
            self.generation = int(doc.get("generation", 0))
            for t in doc["topics"]:
                self._index(TopicInfo(t["name"], uuid.UUID(t["id"]), t["partitions"],
                                      t["configs"]))
            self.broker_configs = {name: dict(configs) for name, configs
                                   in doc.get("broker_configs", {}).items()}
            self.group_configs = {g: dict(c) for g, c in doc.get("group_configs", {}).items()}
            self.acls = list(doc.get("acls", []))
            self.scram_credentials = dict(doc.get("scram_credentials", {}))
            self._replay()
        else:
            self.cluster_id = _base64_uuid(uuid.uuid4())
            self.save()

    def save(self) -> None:
        """A new snapshot of everything, and an empty journal after it."""
        generation = self.generation + 1
        doc = {
            "cluster_id": self.cluster_id,
            "generation": generation,
            "topics": [
                {"name": t.name, "id": str(t.topic_id), "partitions": t.partitions,
                 "configs": t.configs}
                for t in self.topics.values()
            ],
            "broker_configs": {name: configs for name, configs in self.broker_configs.items()
                               if configs},
            "group_configs": {g: c for g, c in self.group_configs.items() if c},
            "acls": self.acls,
            "scram_credentials": {user: creds for user, creds in self.scram_credentials.items()
                                  if creds},
        }
        atomic_write(self.path, json.dumps(doc, indent=1).encode())
        self.generation = generation
        # A crash here leaves the old journal, whose generation no longer matches: ignored.
        atomic_write(self.journal_path, _journal_line({"generation": generation}))
        self.journal_records = 0

    # -- topic changes, journaled -----------------------------------------------------------------
    def add(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        info = TopicInfo(name, uuid.uuid4(), partitions, dict(configs))
        self._record({"op": "add", "name": name, "id": str(info.topic_id),
                      "partitions": partitions, "configs": info.configs})
        self._index(info)
        self.epoch += 1
        self._maybe_compact()
        return info

    def remove(self, name: str) -> TopicInfo:
        info = self.topics[name]
        self._record({"op": "remove", "name": name})
        del self.topics[name]
        del self.by_id[info.topic_id]
        self.epoch += 1
        self._maybe_compact()
        return info

    def set_partitions(self, name: str, partitions: int) -> None:
        """Grow a topic (CreatePartitions)."""
        self._record({"op": "partitions", "name": name, "partitions": partitions})
        self.topics[name].partitions = partitions
        self.epoch += 1
        self._maybe_compact()

    def set_configs(self, name: str, configs: dict[str, str]) -> None:
        """Replace a topic's config overrides."""
        self._record({"op": "configs", "name": name, "configs": dict(configs)})
        self.topics[name].configs = dict(configs)
        self.epoch += 1
        self._maybe_compact()

    def _record(self, change: dict[str, object]) -> None:
        """Append one change and fsync it: once this returns, the change survives a crash."""
        if not self.journal_path.exists():  # a snapshot of an older broker: start the journal
            atomic_write(self.journal_path, _journal_line({"generation": self.generation}))
        fd = disk.open_file(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(_journal_line(change))
                while view:
                    view = view[disk.write(fd, view):]
                disk.fsync(fd)
            except OSError:
                # Never leave half a line for the next change to follow (replay stops there).
                with contextlib.suppress(OSError):
                    disk.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
        self.journal_records += 1

    def _maybe_compact(self) -> None:
        if self.journal_records >= max(self.MIN_COMPACTION_RECORDS, len(self.topics)):
            self.save()

    def _replay(self) -> None:
        """Apply the journal's changes made after the snapshot; a torn or corrupt line ends it
        (nothing after a crash's torn append was ever acknowledged) and is cut off."""
        try:
            data = self.journal_path.read_bytes()
        except FileNotFoundError:
            return
        good_end = 0
        records = 0
        position = 0
        while position < len(data):
            newline = data.find(b"\n", position)
            if newline < 0:
                break
            change = _parse_line(data[position:newline])
            if change is None:
                break
            if position == 0:
                if change.get("generation") != self.generation:
                    return  # the snapshot already holds every change of this journal
            else:
                self._apply(change)
                records += 1
            position = good_end = newline + 1
        if good_end < len(data):
            with open(self.journal_path, "r+b") as f:
                f.truncate(good_end)
                os.fsync(f.fileno())
        self.journal_records = records

    def _apply(self, change: dict[str, object]) -> None:
        op, name = change.get("op"), change.get("name")
        if op == "add":
            replaced = self.topics.get(str(name))
            if replaced is not None:
                del self.by_id[replaced.topic_id]
            self._index(TopicInfo(str(name), uuid.UUID(str(change["id"])),
                                  int(change["partitions"]),  # type: ignore[call-overload]
                                  dict(change["configs"])))  # type: ignore[call-overload]
            return
        info = self.topics.get(str(name))
        if info is None:
            return
        if op == "remove":
            del self.topics[info.name]
            del self.by_id[info.topic_id]
        elif op == "partitions":
            info.partitions = int(change["partitions"])  # type: ignore[call-overload]
        elif op == "configs":
            info.configs = dict(change["configs"])  # type: ignore[call-overload]

    def _index(self, info: TopicInfo) -> None:
        self.topics[info.name] = info
        self.by_id[info.topic_id] = info


def _journal_line(change: dict[str, object]) -> bytes:
    """``<crc32 of the JSON, 8 hex digits> <JSON>\\n``: a torn or altered line fails the check."""
    body = json.dumps(change, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def _parse_line(line: bytes) -> dict[str, object] | None:
    crc, _, body = line.partition(b" ")
    try:
        if int(crc, 16) != zlib.crc32(body):
            return None
        change = json.loads(body)
    except ValueError:
        return None
    return change if isinstance(change, dict) else None


def _base64_uuid(u: uuid.UUID) -> str:
    import base64

    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")
