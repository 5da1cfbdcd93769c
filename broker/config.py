"""Broker configuration: Kafka's server.properties keys, parsed and checked at start.

A key Kafka does not know, or a bad value, stops the broker before it binds a port, with a
message that names the key (every unknown key at once, a near miss with the key it likely
meant), because a typo silently ignored is a misconfigured production broker. Kafka's other
names for served keys (log.dir, broker.id, log.retention.hours, ...) are read as Kafka reads
them; the rest of Kafka's keys (broker/kafka_keys.py) are accepted and named in one warning,
so Kafka's own server.properties starts the broker.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.config_error import ConfigError
from broker.group.assignors import assignor_names
from broker.kafka_keys import KAFKA_BROKER_KEYS
from broker.log.validator import (
    LONG_MAX,
    TOPIC_CODECS,
    codec_available,
    compression_level_problem,
)


def _bool(v: str) -> bool:
    low = v.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    raise ValueError("expected true or false")


def _list(v: str) -> list[str]:
    return [p.strip() for p in v.split(",") if p.strip()]


def _level(v: str) -> str:
    level = v.strip().upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError("expected DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return level


def _compression_type(v: str) -> str:
    name = _choice(*TOPIC_CODECS)(v)
    if not codec_available(name):
        raise ValueError(f"the {name} codec library is not installed")
    return name


def _compression_level(key: str) -> Callable[[str], int]:
    """A KIP-390 compression level, checked against Kafka's range for its codec."""

    def parse(v: str) -> int:
        level = int(v)
        problem = compression_level_problem(key, level)
        if problem is not None:
            raise ValueError(problem)
        return level

    return parse


def _cleanup_policy(v: str) -> list[str]:
    policies = _list(v)
    if not policies or any(p not in ("compact", "delete") for p in policies):
        raise ValueError("expected delete, compact, or compact,delete")
    return policies


def _migration_policy(v: str) -> str:
    """Kafka's ConsumerGroupMigrationPolicy values; only disabled is what the coordinator does."""
    policy = _choice("bidirectional", "upgrade", "downgrade", "disabled")(v.strip().lower())
    if policy != "disabled":
        raise ValueError("only disabled is served: a non-empty group never moves between the "
                         "classic and consumer protocols here (an empty group does, as in Kafka)")
    return policy


def _choice(*options: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        if v.strip() not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return v.strip()

    return parse


@dataclass(frozen=True)
class Key:
    name: str
    parse: Callable[[str], Any]
    default: str
    doc: str
    min: int | None = None
    max: int | None = None
    # Kafka's key, accepted so a Kafka file starts, but nothing here reads it: given, it is
    # named in the start-up warning of keys not used, as the keys outside KEYS are.
    unused: bool = False
    # Read in cluster mode only (the internal topics' replication): named in that warning
    # when given to a single broker (no minibroker.etcd.endpoints), which keeps one replica.
    cluster_only: bool = False


KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("listeners", _list, "PLAINTEXT://127.0.0.1:9092",
            "NAME://host:port entries the broker binds, one server each (empty host: all "
            "interfaces); NAME maps to a security protocol in listener.security.protocol.map."),
        Key("advertised.listeners", _list, "",
            "NAME://host:port given to clients per listener (a listener not named here: its "
            "listeners entry)."),
        Key("node.id", int, "1", "This broker's id (broker.id is Kafka's other name for it).",
            min=0),
        Key("broker.rack", str.strip, "",
            "This broker's rack, registered in the cluster: replicas of a partition are "
            "placed on different racks when every broker has one."),
        Key("minibroker.etcd.endpoints", _list, "",
            "host:port of the etcd holding the cluster's metadata (empty: a single broker, "
            "no cluster); see docs/cluster.md."),
        Key("minibroker.etcd.prefix", str.strip, "/mini-broker",
            "Key prefix under which the cluster lives in etcd (several clusters may share "
            "one etcd), as Kafka's ZooKeeper chroot."),
        Key("broker.session.timeout.ms", int, "9000",
            "A broker that has not renewed its registration's etcd lease for this long is "
            "taken as gone (the lease's TTL, whole seconds, rounded up).", min=1),
        Key("broker.heartbeat.interval.ms", int, "2000",
            "How often a broker renews its registration's lease at the longest (it renews "
            "at a third of the session timeout when that is sooner); must be less than "
            "broker.session.timeout.ms.", min=1),
        Key("unclean.leader.election.enable", _bool, "false",
            "Cluster mode: the controller may elect a replica outside the ISR when none in it "
            "is live (data loss); a topic's config of that name overrides it."),
        Key("min.insync.replicas", int, "1",
            "The fewest in-sync replicas (the leader counted) with which a partition led "
            "here takes an acks=all produce, and moves its high watermark; at most the "
            "replication factor counts. A topic's config of that name overrides it.", min=1),
        Key("replica.lag.time.max.ms", int, "30000",
            "A follower that has not caught up with its leader for this long leaves the ISR "
            "(checked every half of it).", min=1),
        Key("replica.high.watermark.checkpoint.interval.ms", int, "5000",
            "How often each log dir's replication-offset-checkpoint is written with the high "
            "watermarks of its partitions (and at shutdown); a partition led with followers "
            "starts from it.", min=1),
        Key("controller.listener.names", _list, "",
            "Listeners of a KRaft controller: there is none here, so the listeners named are "
            "not bound (a combined-mode server.properties starts as it is)."),
        Key("controlled.shutdown.enable", _bool, "true",
            "Cluster mode: on shutdown, ask the controller to move this broker's leaderships "
            "to other in-sync replicas first."),
        Key("controlled.shutdown.max.retries", int, "3",
            "Controlled shutdown attempts before the broker stops anyway.", min=1),
        Key("controlled.shutdown.retry.backoff.ms", int, "5000",
            "Wait between controlled shutdown attempts.", min=0),
        Key("auto.leader.rebalance.enable", _bool, "true",
            "Cluster mode: the controller moves leadership back to preferred replicas when a "
            "broker's imbalance exceeds leader.imbalance.per.broker.percentage."),
        Key("leader.imbalance.check.interval.seconds", int, "300",
            "How often the controller checks the leader imbalance.", min=1),
        Key("leader.imbalance.per.broker.percentage", int, "10",
            "Share of a broker's preferred partitions led elsewhere that triggers a "
            "rebalance.", min=0, max=100),
        Key("log.dirs", _list, "./data",
            "Directories holding the partition logs (log.dir: Kafka's single-directory form, "
            "used when log.dirs is not given)."),
        Key("num.partitions", int, "1", "Partitions of an auto-created topic.", min=1),
        Key("default.replication.factor", int, "1",
            "Replication factor of a topic created without one (CreateTopics -1, "
            "auto-created), at most the live brokers. A single broker serves only 1: "
            "CreateTopics -1 with this above 1 is refused INVALID_REPLICATION_FACTOR, as by a "
            "cluster of one broker, and its auto-created topics have 1.", min=1),
        # The replica fetcher: a follower's Fetch requests to its leader (Kafka's
        # ReplicationConfigs).
        Key("num.replica.fetchers", int, "1",
            "Fetcher tasks per source broker; partitions are hashed among them.", min=1),
        Key("replica.fetch.wait.max.ms", int, "500",
            "MaxWaitMs of a follower's Fetch (below replica.lag.time.max.ms).", min=0),
        Key("replica.fetch.min.bytes", int, "1", "MinBytes of a follower's Fetch.", min=1),
        Key("replica.fetch.max.bytes", int, "1048576",
            "Bytes a follower's Fetch asks per partition (a larger first batch still comes).",
            min=0),
        Key("replica.fetch.response.max.bytes", int, "10485760",
            "MaxBytes of a follower's Fetch, over all its partitions.", min=0),
        Key("replica.fetch.backoff.ms", int, "1000",
            "How long a fetcher waits after an error before asking again.", min=0),
        Key("auto.create.topics.enable", _bool, "true", "Create a topic on first metadata."),
        Key("log.segment.bytes", int, "1073741824", "Roll a segment at this size.", min=1024),
        Key("log.roll.ms", int, "604800000",
            "Roll a segment at this age (log.roll.hours when not given).", min=1),
        Key("log.retention.ms", int, "604800000",
            "Delete segments older than this (-1: never); log.retention.minutes, then "
            "log.retention.hours, when not given.", min=-1),
        Key("log.retention.bytes", int, "-1", "Delete oldest segments past this size (-1: never).",
            min=-1),
        Key("log.retention.check.interval.ms", int, "300000", "How often retention runs.", min=1),
        Key("log.flush.interval.messages", int, str(LONG_MAX),
            "fsync after this many unflushed messages.", min=1),
        Key("log.flush.interval.ms", int, str(LONG_MAX), "fsync data older than this.", min=0),
        Key("log.flush.offset.checkpoint.interval.ms", int, "60000",
            "How often recovery points are checkpointed (bounds recovery work).", min=1),
        Key("log.index.interval.bytes", int, "4096", "Bytes between offset index entries.", min=0),
        Key("log.roll.jitter.ms", int, "0",
            "Default segment.jitter.ms: the most a segment's time-based roll comes early, "
            "drawn per segment (log.roll.jitter.hours when not given).", min=0),
        Key("log.index.size.max.bytes", int, "10485760",
            "Default segment.index.bytes: a segment rolls once an index holds this many "
            "bytes of entries.", min=4, max=2**31 - 1),
        Key("log.segment.delete.delay.ms", int, "60000",
            "Default file.delete.delay.ms: how long a segment deleted by retention or swapped "
            "out by the cleaner stays on disk renamed .deleted (0: removed at once).", min=0),
        Key("log.preallocate", _bool, "false",
            "Default preallocate: a new segment's file is created at segment.bytes and cut "
            "to its data when rolled or closed."),
        Key("num.recovery.threads.per.data.dir", int, "1",
            "Logs of one log dir loaded at once after an unclean shutdown (each rereads only "
            "what lies past its recovery point).", min=1),
        Key("minibroker.log.max.open.files", int, "128",
            "Inactive segments' .log files kept open for reads at most (least recently read "
            "closed first); each partition also holds its active segment's, and indexes hold "
            "none. The broker raises its soft open-file limit to the hard one at start.",
            min=1),
        Key("log.cleanup.policy", _cleanup_policy, "delete",
            "Default cleanup.policy of topics: delete, compact, or both."),
        Key("log.cleaner.enable", _bool, "true",
            "Run the log cleaner, which compacts topics whose cleanup.policy has compact."),
        Key("log.cleaner.threads", int, "1", "Cleaner threads, each cleaning one log at a time.",
            min=0),
        Key("log.cleaner.backoff.ms", int, "15000",
            "How long a cleaner thread sleeps when no log needs cleaning.", min=0),
        Key("log.cleaner.dedupe.buffer.size", int, "134217728",
            "Memory bound of the key-to-offset maps of all cleaner threads together.", min=0),
        Key("log.cleaner.io.buffer.size", int, "524288",
            "Read and write buffer of each cleaner thread.", min=0),
        Key("log.cleaner.io.buffer.load.factor", float, "0.9",
            "How full a cleaner's key-to-offset map may get.", min=0, max=1),
        Key("log.cleaner.io.max.bytes.per.second", float, "1.7976931348623157e308",
            "Cleaner I/O (read plus written) per second, all threads together.", min=0),
        Key("log.cleaner.min.cleanable.ratio", float, "0.5",
            "Default min.cleanable.dirty.ratio of topics.", min=0, max=1),
        Key("log.cleaner.delete.retention.ms", int, "86400000",
            "Default delete.retention.ms: how long tombstones outlive their first clean.",
            min=0),
        Key("log.cleaner.min.compaction.lag.ms", int, "0",
            "Default min.compaction.lag.ms: records younger than this are never compacted.",
            min=0),
        Key("log.cleaner.max.compaction.lag.ms", int, str(LONG_MAX),
            "Default max.compaction.lag.ms: a record older than this is compacted whatever "
            "the dirty ratio.", min=1),
        Key("log.message.timestamp.type", _choice("CreateTime", "LogAppendTime"), "CreateTime",
            "Default message.timestamp.type of topics."),
        Key("message.max.bytes", int, "1048588", "Largest record batch accepted.", min=0),
        Key("log.message.timestamp.before.max.ms", int, str(LONG_MAX),
            "CreateTime records older than this (vs the broker's clock) are refused.", min=0,
            max=LONG_MAX),
        Key("log.message.timestamp.after.max.ms", int, str(LONG_MAX),
            "CreateTime records further ahead than this are refused.", min=0, max=LONG_MAX),
        Key("compression.type", _compression_type, "producer",
            "Default compression.type of topics (producer keeps the producer's codec)."),
        Key("compression.gzip.level", _compression_level("compression.gzip.level"), "-1",
            "gzip level when a topic recompresses to gzip (1..9, -1: zlib's default)."),
        Key("compression.lz4.level", _compression_level("compression.lz4.level"), "9",
            "lz4 level when a topic recompresses to lz4 (1..17)."),
        Key("compression.zstd.level", _compression_level("compression.zstd.level"), "3",
            "zstd level when a topic recompresses to zstd (-131072..22)."),
        Key("socket.request.max.bytes", int, "104857600", "Largest request frame accepted.",
            min=1),
        Key("num.io.threads", int, "8",
            "Request handler tasks, sharing one round-robin of connections.", min=1),
        Key("queued.max.request.bytes", int, "104857600",
            "Request and unsent response bytes held before connections are muted, shared "
            "fairly between connections (-1: unbounded).", min=-1),
        Key("max.connections", int, "2147483647", "Connections accepted at once.", min=0),
        Key("max.connections.per.ip", int, "2147483647", "Connections from one address.",
            min=0),
        Key("connections.max.idle.ms", int, "600000",
            "Close connections with no traffic for this long (-1: never).", min=-1),
        Key("group.initial.rebalance.delay.ms", int, "3000",
            "First rebalance of an empty group waits this long for more members.", min=0),
        Key("group.min.session.timeout.ms", int, "6000", "Smallest session timeout allowed.",
            min=0),
        Key("group.max.session.timeout.ms", int, "1800000", "Largest session timeout allowed.",
            min=1),
        Key("group.max.size", int, "2147483647", "Members a classic group may have.", min=1),
        # The consumer group protocol (KIP-848): Kafka's keys and defaults.
        Key("group.coordinator.rebalance.protocols", _list, "classic,consumer",
            "Group protocols served: classic (JoinGroup/SyncGroup) and consumer "
            "(ConsumerGroupHeartbeat)."),
        Key("group.consumer.assignors", _list, "uniform,range",
            "Server-side assignors a consumer group may pick, the first the default: uniform "
            "and range, by short name or Kafka's class name."),
        Key("group.consumer.session.timeout.ms", int, "45000",
            "Session timeout of consumer group members.", min=1),
        Key("group.consumer.min.session.timeout.ms", int, "45000",
            "Smallest group.consumer.session.timeout.ms allowed.", min=1),
        Key("group.consumer.max.session.timeout.ms", int, "60000",
            "Largest group.consumer.session.timeout.ms allowed.", min=1),
        Key("group.consumer.heartbeat.interval.ms", int, "5000",
            "Heartbeat interval given to consumer group members.", min=1),
        Key("group.consumer.min.heartbeat.interval.ms", int, "5000",
            "Smallest group.consumer.heartbeat.interval.ms allowed.", min=1),
        Key("group.consumer.max.heartbeat.interval.ms", int, "15000",
            "Largest group.consumer.heartbeat.interval.ms allowed.", min=1),
        Key("group.consumer.max.size", int, "2147483647",
            "Members a consumer group may have.", min=1),
        Key("group.consumer.migration.policy", _migration_policy, "disabled",
            "Whether a non-empty group may move between the classic and consumer protocols: "
            "only disabled is served (an empty group still changes protocol, as in Kafka; "
            "Kafka's default, bidirectional, converts non-empty groups too)."),
        # Client telemetry (KIP-714). Kafka takes subscriptions from client-metrics resources;
        # here they are these two keys of ours, and pushed metrics are counted, not exported.
        Key("telemetry.max.bytes", int, "1048576", "Largest PushTelemetry payload accepted.",
            min=1),
        Key("minibroker.client.telemetry.metrics", _list, "",
            "Metric name prefixes every client is asked to push (empty: none, so clients "
            "push nothing; a single empty entry is not a way to ask for all)."),
        Key("minibroker.client.telemetry.push.interval.ms", int, "300000",
            "Push interval given to clients with GetTelemetrySubscriptions.", min=100),
        Key("minibroker.gc.policy", _choice("default", "freeze", "tuned"), "tuned",
            "The broker process's garbage collection once started: default (CPython as is), "
            "freeze (gc.freeze() what start-up built, so collections skip it) or tuned (freeze, "
            "and gen0's threshold at minibroker.gc.gen0.threshold: a burst of parked requests "
            "then costs a few collections instead of hundreds). The command line only: an "
            "embedded broker leaves its host process's collector alone."),
        Key("minibroker.gc.gen0.threshold", int, "50000",
            "gen0's threshold under the tuned policy (CPython's default is 700).", min=1),
        Key("offsets.topic.num.partitions", int, "50", "Partitions of __consumer_offsets.", min=1),
        Key("offsets.topic.replication.factor", int, "3",
            "Replicas of __consumer_offsets in cluster mode: until that many brokers are "
            "alive the topic is not created and FindCoordinator answers "
            "COORDINATOR_NOT_AVAILABLE, as Kafka. A single broker (no etcd) keeps its one "
            "replica whatever this says.", min=1, max=32767,
            cluster_only=True),
        Key("offsets.topic.segment.bytes", int, "104857600",
            "Segment size of __consumer_offsets (smaller segments compact sooner).", min=1),
        Key("offsets.retention.minutes", int, "10080",
            "Committed offsets of a group empty this long are deleted.", min=1),
        Key("offsets.retention.check.interval.ms", int, "600000",
            "How often expired offsets are looked for.", min=1),
        Key("transaction.state.log.num.partitions", int, "50",
            "Partitions of __transaction_state.", min=1),
        Key("transaction.state.log.segment.bytes", int, "104857600",
            "Segment size of __transaction_state.", min=14),
        Key("transaction.state.log.replication.factor", int, "3",
            "Replicas of __transaction_state in cluster mode: until that many brokers are "
            "alive the topic is not created and FindCoordinator answers "
            "COORDINATOR_NOT_AVAILABLE, as Kafka. A single broker (no etcd) keeps its one "
            "replica whatever this says.", min=1, max=32767,
            cluster_only=True),
        Key("transaction.state.log.min.isr", int, "2",
            "min.insync.replicas of __transaction_state in cluster mode (the topic's config, "
            "set when it is created). A single broker's one replica ignores it.", min=1,
            cluster_only=True),
        Key("transaction.max.timeout.ms", int, "900000",
            "Largest transaction.timeout.ms a producer may ask for.", min=1),
        Key("transactional.id.expiration.ms", int, "604800000",
            "A transactional id idle this long (no transaction open) is forgotten.", min=1),
        Key("transaction.abort.timed.out.transaction.cleanup.interval.ms", int, "10000",
            "Accepted for compatibility: expired transactions are aborted on their own "
            "deadline here, not by a periodic scan.", min=1, unused=True),
        # Security: Kafka's keys. A key may also be given per listener as
        # listener.name.<listener>.<key> (lower-case listener name), as in Kafka.
        Key("listener.security.protocol.map", _list,
            "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "Listener name to security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)."),
        Key("inter.broker.listener.name", str.strip, "",
            "Cluster mode: the listener brokers connect to each other on (not with "
            "security.inter.broker.protocol)."),
        Key("security.inter.broker.protocol", str.strip, "PLAINTEXT",
            "Cluster mode: the inter-broker listener named by its protocol, when "
            "inter.broker.listener.name is not set."),
        Key("sasl.mechanism.inter.broker.protocol", str.strip, "GSSAPI",
            "Cluster mode: the SASL mechanism brokers log in to each other with (PLAIN, "
            "SCRAM-SHA-256, SCRAM-SHA-512), its credentials the username and password of the "
            "inter-broker listener's jaas config for that mechanism."),
        Key("request.timeout.ms", int, "30000",
            "How long a broker waits for another broker's answer (connecting included).",
            min=1),
        Key("minibroker.reconnect.backoff.ms", int, "50",
            "First wait before reconnecting to another broker; doubles per failure.", min=0),
        Key("minibroker.reconnect.backoff.max.ms", int, "1000",
            "Longest wait before reconnecting to another broker.", min=0),
        Key("sasl.enabled.mechanisms", _list, "GSSAPI",
            "SASL mechanisms of SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512."),
        Key("sasl.server.max.receive.size", int, "524288",
            "Largest request accepted before a SASL client has authenticated.", min=1),
        Key("connection.failed.authentication.delay.ms", int, "100",
            "How long a connection whose authentication failed stays open after its answer.",
            min=0),
        Key("connections.max.reauth.ms", int, "0",
            "Session lifetime of a SASL connection before it must re-authenticate (0: none).",
            min=0),
        Key("ssl.keystore.type", str.strip, "JKS", "Only PEM is served."),
        Key("ssl.keystore.location", str.strip, "",
            "PEM file with the private key and the certificate chain."),
        Key("ssl.keystore.password", str, "", "Unused for PEM files (Kafka's rule)."),
        Key("ssl.key.password", str, "", "Password of an encrypted private key."),
        Key("ssl.keystore.certificate.chain", str.strip, "",
            "The certificate chain, PEM text given inline."),
        Key("ssl.keystore.key", str.strip, "", "The private key, PEM text given inline."),
        Key("ssl.truststore.type", str.strip, "JKS", "Only PEM is served."),
        Key("ssl.truststore.location", str.strip, "", "PEM file of trusted CA certificates."),
        Key("ssl.truststore.password", str, "", "Unused for PEM files (Kafka's rule)."),
        Key("ssl.truststore.certificates", str.strip, "",
            "Trusted CA certificates, PEM text given inline."),
        Key("ssl.client.auth", _choice("none", "requested", "required"), "none",
            "Ask TLS clients for a certificate: none, requested or required."),
        Key("ssl.enabled.protocols", _list, "TLSv1.2,TLSv1.3", "TLS versions accepted."),
        Key("ssl.protocol", str.strip, "TLSv1.3",
            "Accepted for compatibility (ssl.enabled.protocols decides).", unused=True),
        Key("ssl.cipher.suites", _list, "", "Cipher suites allowed (empty: the defaults)."),
        Key("ssl.endpoint.identification.algorithm", str.strip, "https",
            "https: a broker checks another broker's certificate names its host (empty: "
            "not checked)."),
        Key("ssl.principal.mapping.rules", str.strip, "DEFAULT",
            "Rules mapping a client certificate's distinguished name to a user name."),
        Key("authorizer.class.name", str.strip, "",
            "Kafka's StandardAuthorizer or AclAuthorizer class name turns ACLs on."),
        Key("super.users", str.strip, "",
            "Principals allowed everything, separated by ';' (User:admin;User:ops)."),
        Key("allow.everyone.if.no.acl.found", _bool, "false",
            "With ACLs on: allow access to a resource that no ACL matches."),
        Key("request.processing.mode", _choice("pipelined", "serial"), "pipelined",
            "pipelined (AutoMQ) or serial (Kafka's mute-until-response)."),
        # Ours, not Kafka's (Kafka exposes JMX): the Prometheus endpoint and the log output.
        Key("metrics.listener", str.strip, "http://127.0.0.1:9404/metrics",
            "Prometheus endpoint http://host:port/path (port 0: ephemeral; empty: no metrics)."),
        Key("log.format", _choice("", "json", "console"), "",
            "json or console (unset: console on a terminal, json otherwise)."),
        Key("log.level", _level, "INFO", "DEBUG, INFO, WARNING or ERROR."),
    )
}


@dataclass(frozen=True)
class Alias:
    """Kafka's other name for a served key (KafkaConfig's synonyms): used when the key itself
    is not given, the first alias given winning, its value times ``factor`` in the key's unit."""

    name: str
    target: str
    factor: int = 0  # 0: the text as it is; else an integer scaled to the target's unit
    min: int | None = None


# In Kafka's order of precedence for each target: log.retention.ms over .minutes over .hours.
ALIASES: dict[str, Alias] = {
    a.name: a
    for a in (
        Alias("broker.id", "node.id"),
        Alias("log.dir", "log.dirs"),
        Alias("log.retention.minutes", "log.retention.ms", 60_000),
        Alias("log.retention.hours", "log.retention.ms", 3_600_000),
        Alias("log.roll.hours", "log.roll.ms", 3_600_000, min=1),
        Alias("log.roll.jitter.hours", "log.roll.jitter.ms", 3_600_000, min=0),
    )
}


def _with_aliases(raw: dict[str, str]) -> tuple[dict[str, str], set[str]]:
    """``raw`` with each served key an alias stands for filled in from the alias, as Kafka's
    KafkaConfig reads them (ConfigError naming the alias on a bad value), and the aliases
    that were used; one given after its key or a stronger alias is not."""
    out = dict(raw)
    used: set[str] = set()
    if "broker.id" in raw and "node.id" in raw:
        if raw["broker.id"].strip() != raw["node.id"].strip():
            raise ConfigError(f"broker.id={raw['broker.id']} and node.id={raw['node.id']}: set "
                              f"node.id to the same value as broker.id (or give only one)")
        used.add("broker.id")  # the same id twice: both say what is used
    for alias in ALIASES.values():
        if alias.name not in raw or alias.target in out:
            continue
        text = raw[alias.name]
        if alias.factor:
            try:
                number = int(text)
            except ValueError:
                raise ConfigError(f"invalid value {text!r} for {alias.name}: expected an "
                                  f"integer") from None
            if alias.min is not None and number < alias.min:
                raise ConfigError(f"invalid value {text!r} for {alias.name}: must be >= "
                                  f"{alias.min}")
            # Kafka's logRetentionTimeMillis: any negative retention is "never" (-1).
            text = str(-1 if number < 0 else number * alias.factor)
        out[alias.target] = text
        used.add(alias.name)
    return out, used


def unknown_keys_message(unknown: list[str], problems: Sequence[str] = ()) -> str:
    """One message for every key Kafka does not know either, a near miss with its likely key."""
    candidates = [*KEYS, *ALIASES, *sorted(KAFKA_BROKER_KEYS - set(KEYS))]
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.8)
        named.append(f"{name} (did you mean {close[0]}?)" if close else name)
    parts = []
    if named:
        which = "key" if len(named) == 1 else "keys"
        parts.append(f"unknown configuration {which} (neither Kafka's nor mini-broker's): "
                     + ", ".join(named))
    return "; ".join([*parts, *problems])


class BrokerConfig:
    """Parsed configuration; attribute access by Kafka key via `cfg["log.dirs"]`.

    One object for the broker's life, as Kafka's KafkaConfig: a dynamic config change replaces
    its values in place (``update_from``), so every owner holding it reads the new values on
    its next use. ``static`` keeps the text given at start (server.properties and overrides),
    which DescribeConfigs reports as STATIC_BROKER_CONFIG.
    """

    def __init__(self, values: dict[str, Any], static: dict[str, str] | None = None,
                 listener_values: dict[str, dict[str, Any]] | None = None) -> None:
        self._values = values
        self.static: dict[str, str] = dict(static or {})
        # listener.name.<listener>.<key> values, parsed, by lower-case listener name.
        self._listener_values: dict[str, dict[str, Any]] = listener_values or {}
        # Kafka's keys given that nothing here reads, for the one start-up warning.
        self.unused_keys: list[str] = []

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._values.items()

    def layered(self, *layers: dict[str, str]) -> BrokerConfig:
        """A new config: the static text overridden by each layer in turn (ConfigError on a
        bad value), so a dynamic change is checked exactly as server.properties is."""
        raw = dict(self.static)
        for layer in layers:
            raw.update(layer)
        config = BrokerConfig.from_dict(raw)
        config.static = dict(self.static)
        return config

    def update_from(self, other: BrokerConfig) -> None:
        """Take ``other``'s values (the dynamic change applied); the static text stays."""
        self._values = dict(other._values)
        self._listener_values = {k: dict(v) for k, v in other._listener_values.items()}

    # -- listeners ------------------------------------------------------------------------------
    def security_protocol_map(self) -> dict[str, str]:
        """listener.security.protocol.map as Kafka reads it: names normalised to upper case."""
        return parse_protocol_map(self["listener.security.protocol.map"])

    def listener_specs(self) -> list[ListenerSpec]:
        """Every entry of ``listeners`` but the controller's, checked as Kafka's
        listenerListToEndPoints checks them."""
        return endpoints(self._served(self["listeners"], "listeners"),
                         self.security_protocol_map(), "listeners", distinct_ports=True)

    def _served(self, entries: list[str], key: str) -> list[str]:
        """The entries not named in controller.listener.names: a KRaft controller's listeners
        are not bound, there being no controller quorum here."""
        controllers = {n.upper() for n in self["controller.listener.names"]}
        return [e for e in entries if parse_endpoint(e, key)[0] not in controllers]

    def advertised_endpoints(self) -> dict[str, tuple[str, int]]:
        """The (host, port) given to clients of each listener: its advertised.listeners entry,
        else its listeners entry (an empty host: this machine's canonical name, as Kafka's
        broker registers it). Port 0 means "the bound port", filled in by the server.

        Kafka advertises only the names listed when advertised.listeners is set; here a
        listener left out keeps its own address, so a partial list never hides a listener."""
        advertised = {s.name: (s.host, s.port) for s in self._advertised_specs()}
        out: dict[str, tuple[str, int]] = {}
        for spec in self.listener_specs():
            host, port = advertised.get(spec.name, (spec.host, spec.port))
            out[spec.name] = (host or socket.getfqdn(), port)
        return out

    def _advertised_specs(self) -> list[ListenerSpec]:
        if not self["advertised.listeners"]:
            return []
        return endpoints(self._served(self["advertised.listeners"], "advertised.listeners"),
                         self.security_protocol_map(), "advertised.listeners",
                         distinct_ports=False)

    def listener_key_name(self, listener_name: str, key: str) -> str:
        """The name ``key`` was given under for a listener: its ``listener.name.<l>.`` form
        when set for that listener, else the plain key (what an error message should name)."""
        own = self._listener_values.get(listener_name.lower(), {})
        return f"{LISTENER_PREFIX}{listener_name.lower()}.{key}" if key in own else key

    def listener_value(self, listener_name: str, key: str) -> Any:
        """``key`` for one listener: listener.name.<listener>.<key> when set, else the plain
        key's value (Kafka's valuesWithPrefixOverride). A SASL mechanism's JAAS text
        (``plain.sasl.jaas.config``) has no plain form: the prefixed value or None."""
        own = self._listener_values.get(listener_name.lower(), {})
        if key in own:
            return own[key]
        if key.endswith(JAAS_SUFFIX):
            return None
        return self[key]

    def listener_overrides(self) -> dict[str, Any]:
        """Every listener.name.* value given, by its full key (for the start log, redacted)."""
        return {f"{LISTENER_PREFIX}{name}.{key}": value
                for name, keys in sorted(self._listener_values.items())
                for key, value in sorted(keys.items())}

    @property
    def listener(self) -> tuple[str, int]:
        """The first listener's bind address (host "" = every interface)."""
        first = self.listener_specs()[0]
        return first.host, first.port

    @property
    def metrics_listener(self) -> tuple[str, int, str] | None:
        """(host, port, path) of the metrics endpoint, or None when metrics are off."""
        text = self["metrics.listener"]
        return parse_metrics_listener(text) if text else None

    @property
    def advertised(self) -> tuple[str, int]:
        """The first listener's advertised address."""
        return next(iter(self.advertised_endpoints().values()))

    @classmethod
    def from_properties(
        cls, path: str | Path | None = None, overrides: Iterable[str] = ()
    ) -> BrokerConfig:
        raw: dict[str, str] = {}
        if path is not None:
            raw.update(read_properties(Path(path)))
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"--override {item!r}: expected key=value")
            raw[key.strip()] = value.strip()
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, str]) -> BrokerConfig:
        """Kafka's keys: served ones parsed, aliases folded into their key, the rest of Kafka's
        kept in ``unused_keys``; every key Kafka does not know refused in one ConfigError."""
        given, aliases_used = _with_aliases(raw)
        controllers = {n.lower() for n in _list(given.get("controller.listener.names", ""))}
        per_listener: dict[str, dict[str, Any]] = {}
        unknown: list[str] = []
        unused: list[str] = []
        problems: list[str] = []
        for name in sorted(set(raw) - set(KEYS) - set(ALIASES)):
            if not name.startswith(LISTENER_PREFIX):
                (unused if name in KAFKA_BROKER_KEYS else unknown).append(name)
                continue
            listener, _, key = name[len(LISTENER_PREFIX):].partition(".")
            if listener in controllers or (key in KAFKA_LISTENER_KEYS and key not in
                                           PER_LISTENER_KEYS):
                unused.append(name)  # a controller's listener, or a key read for none here
                continue
            try:
                listener, key = _split_listener_key(name)
            except ConfigError as exc:
                problems.append(str(exc))
                continue
            per_listener.setdefault(listener, {})[key] = _parse_listener_key(name, key, raw[name])
            if key in KEYS and KEYS[key].unused:
                unused.append(name)
        if unknown or problems:
            raise ConfigError(unknown_keys_message(unknown, problems))
        values = {name: _parse(key, given.get(name, key.default)) for name, key in KEYS.items()}
        config = cls(values, raw, per_listener)
        config.unused_keys = sorted(
            unused + [n for n in raw if n in KEYS and KEYS[n].unused]
            + [n for n in raw if n in KEYS and KEYS[n].cluster_only
               and not values["minibroker.etcd.endpoints"]]
            + [n for n in raw if n in ALIASES and n not in aliases_used])
        config._check_listeners()
        config._check_groups()
        return config

    def _check_groups(self) -> None:
        """What Kafka's GroupCoordinatorConfig refuses at start."""
        protocols = self["group.coordinator.rebalance.protocols"]
        unknown = [p for p in protocols if p not in ("classic", "consumer")]
        if unknown or "classic" not in protocols:
            raise ConfigError("group.coordinator.rebalance.protocols: expected classic, "
                              f"optionally with consumer, got {','.join(protocols)}")
        try:
            assignor_names(self["group.consumer.assignors"])
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for what in ("session.timeout.ms", "heartbeat.interval.ms"):
            key = f"group.consumer.{what}"
            low, high = self[f"group.consumer.min.{what}"], self[f"group.consumer.max.{what}"]
            if high < low:
                raise ConfigError(f"group.consumer.max.{what}={high} is below "
                                  f"group.consumer.min.{what}={low}")
            if not low <= self[key] <= high:
                raise ConfigError(f"{key}={self[key]} must lie within group.consumer.min.{what}"
                                  f"={low} and group.consumer.max.{what}={high}")
        interval, session = (self["group.consumer.heartbeat.interval.ms"],
                             self["group.consumer.session.timeout.ms"])
        if interval >= session:
            raise ConfigError("group.consumer.heartbeat.interval.ms must be less than "
                              "group.consumer.session.timeout.ms")

    def _check_listeners(self) -> None:
        """What Kafka refuses at start about listeners, plus what this broker cannot serve:
        a TLS listener without a PEM key store, a SASL mechanism other than PLAIN and SCRAM."""
        specs = self.listener_specs()
        if not specs:
            raise ConfigError("listeners: at least one listener is needed")
        names = {s.name for s in specs}
        advertised = self._advertised_specs()
        extra = [s.name for s in advertised if s.name not in names]
        if extra:
            raise ConfigError(
                f"advertised.listeners: listener {extra[0]} is not in listeners; the names of "
                f"advertised.listeners must be among those of listeners "
                f"({', '.join(sorted(names))})")
        given = {s.name: s.host for s in advertised}
        for s in specs:
            if given.get(s.name, s.host) == "0.0.0.0":
                raise ConfigError(
                    f"advertised.listeners cannot use the non-routable meta-address 0.0.0.0 "
                    f"(listener {s.name}, advertised as its listeners entry when not given): set "
                    f"advertised.listeners={s.name}://<routable host>:{s.port}")
        for listener in sorted(self._listener_values):
            if listener.upper() not in names:
                raise ConfigError(
                    f"{LISTENER_PREFIX}{listener}.* is set but listeners has no listener named "
                    f"{listener.upper()} ({', '.join(sorted(names))})")

def value_text(value: Any) -> str:
    """A parsed value as Kafka writes it back (ConfigDef.convertToString): lists joined by
    commas, booleans in lower case, doubles as Java's Double.toString (0.5, 1.0E7)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, float):
        return _java_double(value)
    return str(value)


def _java_double(x: float) -> str:
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0 or 1e-3 <= abs(x) < 1e7:
        return repr(x)  # Python's shortest digits, plain notation in this range as Java's
    from decimal import Decimal  # about 0.4 MB, for the rare double printed in E notation

    exact = Decimal(repr(x))
    digits = "".join(map(str, exact.as_tuple().digits)).rstrip("0") or "0"
    sign = "-" if x < 0 else ""
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exact.adjusted()}"


def parse_value(name: str, text: str) -> Any:
    """One key's text parsed and range-checked as at start (ConfigError naming the key)."""
    if name not in KEYS:
        raise ConfigError(f"unknown configuration key: {name}")
    return _parse(KEYS[name], text)


def _parse(key: Key, text: str) -> Any:
    try:
        value = key.parse(text)
    except ValueError as exc:
        raise ConfigError(f"invalid value {text!r} for {key.name}: {exc}") from None
    if key.min is not None and value < key.min:
        raise ConfigError(f"invalid value {text!r} for {key.name}: must be >= {key.min}")
    if key.max is not None and value > key.max:
        raise ConfigError(f"invalid value {text!r} for {key.name}: must be <= {key.max}")
    if key.name in ("listeners", "advertised.listeners"):
        for item in value:
            parse_endpoint(item, key.name)
    if key.name == "listener.security.protocol.map":
        parse_protocol_map(value)
    if key.name == "metrics.listener" and value:
        parse_metrics_listener(value)
    return value


def parse_listener(text: str, key: str) -> tuple[str, int]:
    """NAME://host:port -> (host, port)."""
    _name, host, port = parse_endpoint(text, key)
    return host, port


# Kafka's endpoint syntax (SocketServerConfigs): NAME://host:port, the host possibly in [].
_ENDPOINT = re.compile(r"(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)")


def parse_endpoint(text: str, key: str) -> tuple[str, str, int]:
    """NAME://host:port -> (NAME upper-cased as Kafka normalises it, host, port); an empty host
    (PLAINTEXT://:9092) binds every interface."""
    m = _ENDPOINT.fullmatch(text.strip())
    if m is None or not m.group(1).strip():
        raise ConfigError(f"invalid value {text!r} for {key}: expected NAME://host:port, e.g. "
                          f"PLAINTEXT://127.0.0.1:9092 or SASL_SSL://:9093")
    port = int(m.group(3))
    if not 0 <= port <= 65535:
        raise ConfigError(f"invalid value {text!r} for {key}: port out of range")
    return m.group(1).strip().upper(), m.group(2), port


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """One entry of ``listeners`` (or ``advertised.listeners``): Kafka's EndPoint."""

    name: str  # upper case, as Kafka's ListenerName.normalised
    security_protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    host: str  # "" binds every interface
    port: int  # 0: an ephemeral port


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
TLS_VERSIONS = ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")
LISTENER_PREFIX = "listener.name."
JAAS_SUFFIX = ".sasl.jaas.config"
# Keys a listener may override as listener.name.<listener>.<key> (Kafka lets every channel
# key be prefixed; these are the ones this broker reads per listener).
PER_LISTENER_KEYS = frozenset(
    {k for k in KEYS if k.startswith("ssl.")}
    | {"sasl.enabled.mechanisms", "sasl.server.max.receive.size", "connections.max.reauth.ms"})


# Keys Kafka reads per listener (its channel builders and connection quotas): given with a
# listener prefix but not read per listener here, they are Kafka's unused keys, not typos.
KAFKA_LISTENER_KEYS = frozenset(
    k for k in KAFKA_BROKER_KEYS
    if k.startswith(("ssl.", "sasl.")) or k in ("max.connections", "max.connection.creation.rate",
                                                 "connections.max.reauth.ms",
                                                 "principal.builder.class"))


def parse_protocol_map(entries: list[str]) -> dict[str, str]:
    """NAME:PROTOCOL entries -> {NAME: PROTOCOL}, both upper-cased as Kafka reads them."""
    out: dict[str, str] = {}
    for entry in entries:
        name, sep, protocol = entry.partition(":")
        protocol = protocol.strip().upper()
        if not sep or not name.strip():
            raise ConfigError(f"invalid value {entry!r} in listener.security.protocol.map: "
                              f"expected NAME:PROTOCOL")
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"invalid security protocol {protocol!r} for listener "
                              f"{name.strip().upper()} in listener.security.protocol.map "
                              f"(expected {', '.join(SECURITY_PROTOCOLS)})")
        out[name.strip().upper()] = protocol
    return out


def endpoints(entries: list[str], protocols: dict[str, str], key: str, *,
              distinct_ports: bool) -> list[ListenerSpec]:
    """Kafka's listenerListToEndPoints: names unique, each mapped to a protocol; with
    ``distinct_ports`` (listeners, not advertised.listeners) no two listeners on one port,
    except port 0 and one IPv4 plus one IPv6 address on the same port."""
    specs = []
    for entry in entries:
        name, host, port = parse_endpoint(entry, key)
        if name not in protocols:
            raise ConfigError(f"{key}: no security protocol defined for listener {name}: add "
                              f"{name}:<PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL> to "
                              f"listener.security.protocol.map")
        specs.append(ListenerSpec(name, protocols[name], host, port))
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise ConfigError(f"{key}: each listener must have a different name, {s.name} is "
                              f"given twice ({','.join(entries)})")
        seen.add(s.name)
    if distinct_ports:
        by_port: dict[int, list[ListenerSpec]] = {}
        for s in specs:
            if s.port != 0:
                by_port.setdefault(s.port, []).append(s)
        for port, same in by_port.items():
            if len(same) > 1 and not _one_ipv4_one_ipv6(same):
                raise ConfigError(
                    f"{key}: each listener must have a different port, {port} is used by "
                    f"{', '.join(s.name for s in same)} (two listeners may share a port only "
                    f"when one is on an IPv4 and the other on an IPv6 address)")
    return specs


def _one_ipv4_one_ipv6(specs: list[ListenerSpec]) -> bool:
    if len(specs) != 2:
        return False
    try:
        versions = {ipaddress.ip_address(s.host).version for s in specs}
    except ValueError:
        return False
    return versions == {4, 6}


_MECHANISM_JAAS = {m.lower() + JAAS_SUFFIX for m in SASL_MECHANISMS}


def _split_listener_key(name: str) -> tuple[str, str]:
    """listener.name.<listener>.<key> -> (listener, key); ConfigError naming the key."""
    listener, dot, key = name[len(LISTENER_PREFIX):].partition(".")
    if not listener or not dot or not key:
        raise ConfigError(f"unknown configuration key: {name} (expected "
                          f"{LISTENER_PREFIX}<listener>.<key>)")
    if listener != listener.lower():
        raise ConfigError(f"unknown configuration key: {name}: the listener name is written in "
                          f"lower case here ({LISTENER_PREFIX}{listener.lower()}.{key}), as Kafka "
                          f"reads it")
    if key not in PER_LISTENER_KEYS and key not in _MECHANISM_JAAS:
        raise ConfigError(f"unknown configuration key: {name} (a listener may override "
                          f"ssl.*, sasl.enabled.mechanisms, sasl.server.max.receive.size, "
                          f"connections.max.reauth.ms and <mechanism>.sasl.jaas.config for "
                          f"{', '.join(SASL_MECHANISMS)})")
    return listener, key


def _parse_listener_key(name: str, key: str, text: str) -> Any:
    if key in _MECHANISM_JAAS:
        return text.strip()
    try:
        return _parse(KEYS[key], text)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f" for {key}", f" for {name}", 1)) from None


def parse_metrics_listener(text: str) -> tuple[str, int, str]:
    """http://host:port/path -> (host, port, path); the path defaults to /metrics."""
    proto, sep, rest = text.strip().partition("://")
    hostport, slash, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    if not sep or proto.lower() != "http" or not host or "@" in host or not port.isdigit():
        raise ConfigError(
            f"invalid value {text!r} for metrics.listener: expected http://host:port/path")
    return host.strip("[]"), int(port), "/" + path if slash and path else "/metrics"


def read_properties(path: Path) -> dict[str, str]:
    """Java .properties, the subset Kafka's files use: key=value or key: value, # and ! comments."""
    out: dict[str, str] = {}
    pending = ""
    for line in path.read_text().splitlines():
        line = pending + line.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        for i, ch in enumerate(line):
            if ch in "=:":
                out[line[:i].strip()] = line[i + 1 :].strip()
                break
        else:
            out[line] = ""
    return out
