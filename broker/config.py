"""Broker configuration: Kafka's server.properties keys, parsed and checked at start.

An unknown key or a bad value stops the broker before it binds a port, with a message that
names the key, because a typo silently ignored is a misconfigured production broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from broker.log.validator import (
    LONG_MAX,
    TOPIC_CODECS,
    codec_available,
    compression_level_problem,
)


class ConfigError(ValueError):
    pass


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


KEYS: dict[str, Key] = {
    k.name: k
    for k in (
        Key("listeners", _list, "PLAINTEXT://127.0.0.1:9092", "Addresses the broker binds."),
        Key("advertised.listeners", _list, "", "Addresses given to clients (default: listeners)."),
        Key("node.id", int, "1", "This broker's id.", min=0),
        Key("log.dirs", _list, "./data", "Directories holding the partition logs."),
        Key("num.partitions", int, "1", "Partitions of an auto-created topic.", min=1),
        Key("default.replication.factor", int, "1", "Only 1 is served (one broker).", 1, 1),
        Key("auto.create.topics.enable", _bool, "true", "Create a topic on first metadata."),
        Key("log.segment.bytes", int, "1073741824", "Roll a segment at this size.", min=1024),
        Key("log.roll.ms", int, "604800000", "Roll a segment at this age.", min=1),
        Key("log.retention.ms", int, "604800000", "Delete segments older than this (-1: never).",
            min=-1),
        Key("log.retention.bytes", int, "-1", "Delete oldest segments past this size (-1: never).",
            min=-1),
        Key("log.retention.check.interval.ms", int, "300000", "How often retention runs.", min=1),
        Key("log.flush.interval.messages", int, str(LONG_MAX),
            "fsync after this many unflushed messages.", min=1),
        Key("log.flush.interval.ms", int, str(LONG_MAX), "fsync data older than this.", min=0),
        Key("log.flush.offset.checkpoint.interval.ms", int, "60000",
            "How often recovery points are checkpointed (bounds recovery work).", min=1),
        Key("log.index.interval.bytes", int, "4096", "Bytes between offset index entries.", min=0),
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
        Key("offsets.topic.num.partitions", int, "50", "Partitions of __consumer_offsets.", min=1),
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
        Key("transaction.state.log.replication.factor", int, "1",
            "Accepted for compatibility: one broker keeps one replica.", min=1),
        Key("transaction.state.log.min.isr", int, "1",
            "Accepted for compatibility: one broker keeps one replica.", min=1),
        Key("transaction.max.timeout.ms", int, "900000",
            "Largest transaction.timeout.ms a producer may ask for.", min=1),
        Key("transactional.id.expiration.ms", int, "604800000",
            "A transactional id idle this long (no transaction open) is forgotten.", min=1),
        Key("transaction.abort.timed.out.transaction.cleanup.interval.ms", int, "10000",
            "Accepted for compatibility: expired transactions are aborted on their own "
            "deadline here, not by a periodic scan.", min=1),
        # Security: Kafka's keys. A key may also be given per listener as
        # listener.name.<listener>.<key> (lower-case listener name), as in Kafka.
        Key("listener.security.protocol.map", _list,
            "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "Listener name to security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)."),
        Key("inter.broker.listener.name", str.strip, "",
            "Accepted for compatibility: one broker has no inter-broker traffic."),
        Key("security.inter.broker.protocol", str.strip, "PLAINTEXT",
            "Accepted for compatibility: one broker has no inter-broker traffic."),
        Key("sasl.mechanism.inter.broker.protocol", str.strip, "GSSAPI",
            "Accepted for compatibility: one broker has no inter-broker traffic."),
        Key("sasl.enabled.mechanisms", _list, "GSSAPI",
            "SASL mechanisms of SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512."),
        Key("sasl.server.max.receive.size", int, "524288",
            "Largest request accepted before a SASL client has authenticated.", min=1),
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
        Key("ssl.protocol", str.strip, "TLSv1.3", "Accepted for compatibility."),
        Key("ssl.cipher.suites", _list, "", "Cipher suites allowed (empty: the defaults)."),
        Key("ssl.endpoint.identification.algorithm", str.strip, "https",
            "Accepted for compatibility (a client-side check)."),
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


class BrokerConfig:
    """Parsed configuration; attribute access by Kafka key via `cfg["log.dirs"]`.

    One object for the broker's life, as Kafka's KafkaConfig: a dynamic config change replaces
    its values in place (``update_from``), so every owner holding it reads the new values on
    its next use. ``static`` keeps the text given at start (server.properties and overrides),
    which DescribeConfigs reports as STATIC_BROKER_CONFIG.
    """

    def __init__(self, values: dict[str, Any], static: dict[str, str] | None = None) -> None:
        self._values = values
        self.static: dict[str, str] = dict(static or {})

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

    @property
    def listener(self) -> tuple[str, int]:
        return parse_listener(self["listeners"][0], "listeners")

    @property
    def metrics_listener(self) -> tuple[str, int, str] | None:
        """(host, port, path) of the metrics endpoint, or None when metrics are off."""
        text = self["metrics.listener"]
        return parse_metrics_listener(text) if text else None

    @property
    def advertised(self) -> tuple[str, int]:
        adv = self["advertised.listeners"] or self["listeners"]
        return parse_listener(adv[0], "advertised.listeners")

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
        unknown = sorted(set(raw) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown configuration key: {unknown[0]}")
        values = {name: _parse(key, raw.get(name, key.default)) for name, key in KEYS.items()}
        return cls(values, raw)


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
            parse_listener(item, key.name)
    if key.name == "metrics.listener" and value:
        parse_metrics_listener(value)
    return value


def parse_listener(text: str, key: str) -> tuple[str, int]:
    """PLAINTEXT://host:port -> (host, port); only PLAINTEXT is served."""
    proto, sep, rest = text.partition("://")
    host, _, port = rest.rpartition(":")
    if not sep or proto.upper() != "PLAINTEXT" or not port.isdigit():
        raise ConfigError(f"invalid value {text!r} for {key}: expected PLAINTEXT://host:port")
    return host.strip("[]"), int(port)


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
