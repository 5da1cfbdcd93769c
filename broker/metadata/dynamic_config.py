"""Broker configs changed at run time: Kafka's DynamicBrokerConfig for a single broker.

Two layers of overrides sit over the static configuration, as in Kafka: the cluster default
(BROKER resource "") and this broker's own (resource = its node id), which wins. Both persist
in the MetadataStore, are loaded at start before any log opens, and are applied at once by
replacing the values of the one BrokerConfig every owner holds. A key is updatable only when
Kafka updates it dynamically AND something here applies it: the owners that can apply a
change register for its keys (``add_reconfigurable``); a key Kafka calls dynamic that nothing
here applies is refused, rather than stored and silently ignored. Kafka's dynamic keys this
broker has no use for at all (Kerberos, replica fetchers, tiered storage ...) are the exception:
as in Kafka they are accepted (type-checked), stored and described, and change nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from broker.config import (
    ALIASES,
    KEYS,
    BrokerConfig,
    ConfigError,
    parse_value,
    value_text,
)
from broker.metadata.file_store import (
    STORED_TOPIC_CONFIGS,
    TOPIC_CONFIG_DEFAULTS,
    MetadataStore,
    TopicsImage,
)
from broker.metadata.shared_state import SharedState, shared_state_of
from protocol.errors import ErrorCode, KafkaError

logger = structlog.get_logger("broker")

# DescribeConfigs' ConfigSource ids (TOPIC_CONFIG is DYNAMIC_TOPIC_CONFIG on the wire).
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# Kafka's dynamically updatable broker keys (DynamicBrokerConfig.AllDynamicConfigs) that this
# broker knows: the topic defaults (DynamicLogConfig), the cleaner's (LogCleaner), the
# request handler pool (DynamicThreadPool), the connection limits (SocketServer) and the
# listeners (DynamicListenerConfig, per broker only).
TOPIC_DEFAULT_KEYS = frozenset(TOPIC_CONFIG_DEFAULTS.values()) | frozenset(
    syn for syn, _default, _kind, _least in STORED_TOPIC_CONFIGS.values() if syn in KEYS)
CLEANER_KEYS = frozenset({
    "log.cleaner.threads", "log.cleaner.dedupe.buffer.size",
    "log.cleaner.io.buffer.load.factor", "log.cleaner.io.buffer.size",
    "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms", "message.max.bytes",
})
THREAD_POOL_KEYS = frozenset({"num.io.threads"})
CONNECTION_KEYS = frozenset({"max.connections", "max.connections.per.ip"})
PER_BROKER_KEYS = frozenset({"listeners", "advertised.listeners"})
KAFKA_DYNAMIC_KEYS = (TOPIC_DEFAULT_KEYS | CLEANER_KEYS | THREAD_POOL_KEYS | CONNECTION_KEYS
                      | PER_BROKER_KEYS)

# Kafka's other dynamic broker keys (AllDynamicConfigs) that this broker has no use for: an
# AlterConfigs of one is checked for its type, stored and described as Kafka would, and answered
# NO_ERROR as Kafka answers it, with no effect here (docs/operations.md). Name -> (ConfigDef
# type, Kafka 4.0's default, per broker only). Keys config.py knows are left out, so a key
# added there is served by the broker's own config instead.
_STORED_BROKER_KEYS: dict[str, tuple[str, str | None, bool]] = {
    "principal.builder.class": (
        "class", "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
        True),
    "ssl.provider": ("string", None, True),
    "ssl.keymanager.algorithm": ("string", "SunX509", True),
    "ssl.trustmanager.algorithm": ("string", "PKIX", True),
    "ssl.secure.random.implementation": ("string", None, True),
    "ssl.engine.factory.class": ("class", None, True),
    "sasl.kerberos.service.name": ("string", None, True),
    "sasl.kerberos.kinit.cmd": ("string", "/usr/bin/kinit", True),
    "sasl.kerberos.ticket.renew.window.factor": ("double", "0.8", True),
    "sasl.kerberos.ticket.renew.jitter": ("double", "0.05", True),
    "sasl.kerberos.min.time.before.relogin": ("long", "60000", True),
    "sasl.kerberos.principal.to.local.rules": ("list", "DEFAULT", True),
    "sasl.login.refresh.window.factor": ("double", "0.8", True),
    "sasl.login.refresh.window.jitter": ("double", "0.05", True),
    "sasl.login.refresh.min.period.seconds": ("short", "60", True),
    "sasl.login.refresh.buffer.seconds": ("short", "300", True),
    "max.connection.creation.rate": ("int", "2147483647", False),
    "num.network.threads": ("int", "3", False),
    "max.connections.per.ip.overrides": ("string", "", False),
    "num.replica.fetchers": ("int", "1", False),
    "num.recovery.threads.per.data.dir": ("int", "2", False),
    "background.threads": ("int", "10", False),
    "metric.reporters": ("list", "org.apache.kafka.common.metrics.JmxReporter", False),
    "producer.id.expiration.ms": ("int", "86400000", False),
    "transaction.partition.verification.enable": ("boolean", "true", False),
    "remote.log.index.file.cache.total.size.bytes": ("long", "1073741824", False),
    "remote.fetch.max.wait.ms": ("int", "500", False),
    "remote.log.manager.copy.max.bytes.per.second": ("long", "9223372036854775807", False),
    "remote.log.manager.fetch.max.bytes.per.second": ("long", "9223372036854775807", False),
    "remote.list.offsets.request.timeout.ms": ("long", "30000", False),
    "log.roll.jitter.ms": ("long", None, False),
    "log.index.size.max.bytes": ("int", "10485760", False),
    "log.segment.delete.delay.ms": ("long", "60000", False),
    "unclean.leader.election.enable": ("boolean", "false", False),
    "min.insync.replicas": ("int", "1", False),
    "log.preallocate": ("boolean", "false", False),
    "log.message.downconversion.enable": ("boolean", "true", False),
    "log.local.retention.ms": ("long", "-2", False),
    "log.local.retention.bytes": ("long", "-2", False),
}
STORED_BROKER_KEYS = {k: v for k, v in _STORED_BROKER_KEYS.items() if k not in KEYS}
_NUMBER_RANGES = {"short": (-(1 << 15), (1 << 15) - 1), "int": (-(1 << 31), (1 << 31) - 1),
                  "long": (-(1 << 63), (1 << 63) - 1)}


def stored_value_problem(key: str, value: str) -> str | None:
    """Kafka's type check of a value of a STORED_BROKER_KEYS key (ConfigDef.parseType)."""
    kind = STORED_BROKER_KEYS[key][0]
    text = value.strip()
    if kind == "boolean":
        ok = text.lower() in ("true", "false")
    elif kind in _NUMBER_RANGES:
        low, high = _NUMBER_RANGES[kind]
        ok = text.lstrip("-").isdigit() and low <= int(text) <= high
    elif kind == "double":
        try:
            float(text)
            ok = True
        except ValueError:
            ok = False
    else:
        ok = True
    return None if ok else f"Invalid value {value} for configuration {key}: not a {kind}"


def stored_value_text(key: str, value: str | None) -> str | None:
    """A STORED_BROKER_KEYS value as Kafka writes its parsed value back."""
    if value is None:
        return None
    kind = STORED_BROKER_KEYS[key][0]
    text = value.strip()
    if kind == "boolean":
        return text.lower()
    if kind in _NUMBER_RANGES:
        return str(int(text))
    if kind == "double":
        return value_text(float(text))
    if kind == "list":
        return ",".join(e.strip() for e in text.split(",") if e.strip())
    return text


# Kafka's brokerConfigSynonyms: the names of one setting, highest precedence first.
_SYNONYM_GROUPS: tuple[tuple[str, ...], ...] = (
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
)
_SYNONYMS = {name: group for group in _SYNONYM_GROUPS for name in group}
# Keys Kafka defines without a default (null): their value comes from a later synonym, and
# DescribeConfigs shows them null, with no DEFAULT_CONFIG synonym, unless given by name.
NULL_DEFAULT_KEYS = frozenset({"log.roll.ms", "log.roll.jitter.ms", "log.retention.ms",
                               "log.retention.minutes", "log.dirs"})
# Kafka's ConfigDef defaults of its other names served here (log.dir's is this broker's
# log.dirs default, the directory a broker given neither uses; broker.id's is node.id's).
_ALIAS_DEFAULTS = {"log.roll.hours": "168", "log.roll.jitter.hours": "0",
                   "log.retention.hours": "168", "log.dir": KEYS["log.dirs"].default,
                   "broker.id": KEYS["node.id"].default}


def _served_name(key: str) -> str:
    """The served key a broker key sets: itself, or the key Kafka's other name stands for
    (log.retention.hours -> log.retention.ms), updatable when that key is."""
    return ALIASES[key].target if key in ALIASES else key


def broker_synonyms(key: str) -> tuple[str, ...]:
    """Kafka's brokerConfigSynonyms of a broker key (the key alone when it has none)."""
    return _SYNONYMS.get(key, (key,))


def static_with_synonyms(static: dict[str, str]) -> dict[str, str]:
    """The static text as Kafka's KafkaConfig holds it: broker.id and node.id each given the
    other's value when only one is set (KafkaConfig.populateSynonyms)."""
    out = dict(static)
    if "broker.id" in out and "node.id" not in out:
        out["node.id"] = out["broker.id"]
    elif "node.id" in out and "broker.id" not in out:
        out["broker.id"] = out["node.id"]
    return out


def _defaults_of(names: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        if name in STORED_BROKER_KEYS:
            default = stored_value_text(name, STORED_BROKER_KEYS[name][1])
            if default is not None:
                out[name] = default
        elif name in _ALIAS_DEFAULTS:
            out[name] = _ALIAS_DEFAULTS[name]
        elif name in KEYS and name not in NULL_DEFAULT_KEYS:
            spec = KEYS[name]
            out[name] = value_text(spec.parse(spec.default))
    return out


Apply = Callable[[BrokerConfig], None]
Validate = Callable[[BrokerConfig, BrokerConfig], None]


@dataclass(frozen=True)
class Reconfigurable:
    """An owner that applies changes of ``keys``: ``validate(current, new)`` may refuse one
    (ValueError, before anything is stored), ``apply(config)`` runs after the change."""

    keys: frozenset[str]
    apply: Apply
    validate: Validate | None = None


def thread_count_check(key: str) -> Validate:
    """Kafka's rule for resizing a thread pool (LogCleaner, DynamicThreadPool): at least 1,
    and no less than half nor more than double the current count in one step."""

    def check(current: BrokerConfig, new: BrokerConfig) -> None:
        old, wanted = current[key], new[key]
        if wanted == old:
            return
        if wanted < 1:
            raise ValueError(f"{key}={wanted}: must be at least 1")
        if wanted < old // 2:
            raise ValueError(f"{key}={wanted}: cannot be less than half the current value {old}")
        if wanted > old * 2:
            raise ValueError(f"{key}={wanted}: cannot be more than double the current value "
                             f"{old}")

    return check


def is_list_key(key: str) -> bool:
    """Whether a broker key is of Kafka's LIST type (APPEND/SUBTRACT apply to it)."""
    if key in STORED_BROKER_KEYS:
        return STORED_BROKER_KEYS[key][0] == "list"
    spec = KEYS.get(key)
    return spec is not None and isinstance(spec.parse(spec.default), list)


class DynamicBrokerConfig:
    def __init__(self, config: BrokerConfig, metadata: MetadataStore | SharedState) -> None:
        """The overrides live in ``metadata``: a single broker's file, or the cluster's
        shared state, where the cluster default altered on another broker reaches this one."""
        self.config = config
        self.shared = shared_state_of(metadata)
        self.node = str(config["node.id"])
        self._layers: dict[str, dict[str, str]] = {"": {}, self.node: {}}
        self._reconfigurables: list[Reconfigurable] = []
        self.shared.on_broker_configs_changed(self._changed_elsewhere)

    # -- start ----------------------------------------------------------------------------------
    def load(self) -> None:
        """Apply the persisted overrides over the static config (call after MetadataStore.load,
        before the logs open). An entry no longer valid (a key not dynamic, a bad value) is
        left out and logged, as Kafka ignores such persisted entries rather than not start."""
        for name in ("", self.node):
            self._layers[name] = self._usable(name, self.shared.broker_configs(name))
        self.config.update_from(self._layered(self._layers))

    def _layered(self, layers: dict[str, dict[str, str]]) -> BrokerConfig:
        """The config with both layers over it; stored keys of Kafka's are not config.py's."""
        def known(layer: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in layer.items() if k not in STORED_BROKER_KEYS}

        return self.config.layered(known(layers[""]), known(layers[self.node]))

    def _usable(self, name: str, stored: dict[str, str]) -> dict[str, str]:
        kept: dict[str, str] = {}
        for key, value in stored.items():
            try:
                if key in STORED_BROKER_KEYS:
                    if (not name and STORED_BROKER_KEYS[key][2]) or stored_value_problem(
                            key, value):
                        raise ConfigError(f"{key}={value!r} cannot be stored here")
                    kept[key] = value
                    continue
                served = _served_name(key)
                if served not in KAFKA_DYNAMIC_KEYS or (not name and served in PER_BROKER_KEYS):
                    raise ConfigError(f"{key} cannot be updated dynamically")
                if served == key:
                    parse_value(key, value)
                else:
                    self.config.layered({key: value})  # the alias checked as at start
            except ConfigError as exc:
                logger.error("persisted dynamic broker config ignored", resource=name, key=key,
                          reason=str(exc))
                continue
            kept[key] = value
        return kept

    def add_reconfigurable(self, keys: Iterable[str], apply: Apply,
                           validate: Validate | None = None) -> None:
        """Make ``keys`` updatable: ``apply(config)`` runs after each change of any of them."""
        wanted = frozenset(keys)
        if not wanted <= KAFKA_DYNAMIC_KEYS:
            raise ValueError(f"not dynamic in Kafka: {sorted(wanted - KAFKA_DYNAMIC_KEYS)}")
        self._reconfigurables.append(Reconfigurable(wanted, apply, validate))

    # -- reading --------------------------------------------------------------------------------
    @property
    def updatable(self) -> frozenset[str]:
        """The keys AlterConfigs may change now (DescribeConfigs shows the others read-only)."""
        return frozenset().union(*(r.keys for r in self._reconfigurables))

    def overrides(self, resource: str) -> dict[str, str]:
        """The dynamic overrides of a BROKER resource ("" or this node's id)."""
        return dict(self._layers[self.resource(resource)])

    def resource(self, name: str) -> str:
        """A BROKER resource name checked as Kafka does: "" (the cluster default) or this
        broker's id; INVALID_REQUEST otherwise."""
        if not name:
            return ""
        try:
            node = int(name)
        except ValueError:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"Broker id must be an integer, but it is: {name}") from None
        if str(node) != self.node:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"Unexpected broker id, expected {self.node}, but received {name}")
        return self.node

    def synonyms(self, key: str, per_broker: bool = True) -> list[tuple[str, str, int]]:
        """(name, value, source) of a broker key and Kafka's other names for it, as Kafka's
        ConfigHelper lists them: layer by layer (this broker's dynamic config, the cluster
        default, the static config, the defaults), each layer in the synonyms' order, then
        whatever precedes the key's own name dropped; the cluster default resource shows only
        its own layer."""
        names = broker_synonyms(key)
        layers: list[tuple[dict[str, str], int]] = [
            (self._layers[self.node], DYNAMIC_BROKER_CONFIG),
            (self._layers[""], DYNAMIC_DEFAULT_BROKER_CONFIG),
            (static_with_synonyms(self.config.static), STATIC_BROKER_CONFIG),
            (_defaults_of(names), DEFAULT_CONFIG)]
        found = [(name, layer[name], source) for layer, source in layers for name in names
                 if name in layer]
        while found and found[0][0] != key:
            found.pop(0)  # Kafka's dropWhile: an alias above the key is not its synonym
        if not per_broker:
            found = [f for f in found if f[2] == DYNAMIC_DEFAULT_BROKER_CONFIG]
        return found

    # -- changing -------------------------------------------------------------------------------
    def alter(self, resource: str, overrides: dict[str, str], validate_only: bool = False) -> None:
        """Replace a BROKER resource's overrides: checked (INVALID_REQUEST, as Kafka answers
        a broker config it cannot take), persisted, then applied to every registered owner."""
        name = self.resource(resource)
        self._check_keys(name, overrides)
        layers = {**self._layers, name: dict(overrides)}
        try:
            new = self._layered(layers)
        except ConfigError as exc:
            raise KafkaError(ErrorCode.INVALID_REQUEST, str(exc)) from None
        changed = {k for k in KEYS if new[k] != self.config[k]}
        due = [r for r in self._reconfigurables if r.keys & changed]
        for r in due:
            if r.validate is not None:
                try:
                    r.validate(self.config, new)
                except ValueError as exc:
                    raise KafkaError(ErrorCode.INVALID_REQUEST, str(exc)) from None
        if validate_only:
            return
        self.shared.change_broker_configs(name, overrides)
        self._layers[name] = dict(overrides)
        self.config.update_from(new)
        logger.info("dynamic broker config updated", resource=name or "<default>",
                 overrides=overrides, changed=sorted(changed))
        self._reconfigure(due)

    def _changed_elsewhere(self, name: str, overrides: dict[str, str]) -> None:
        """Another broker altered the cluster default (or this broker's own resource was
        changed in the cluster's store): taken in as at start, each owner told."""
        if name not in self._layers:
            return  # another broker's own overrides
        usable = self._usable(name, overrides)
        if usable == self._layers[name]:
            return  # this broker's own change, coming back from the store
        layers = {**self._layers, name: usable}
        try:
            new = self._layered(layers)
        except ConfigError as exc:
            logger.error("dynamic broker config from the cluster ignored",
                         resource=name or "<default>", reason=str(exc))
            return
        changed = {k for k in KEYS if new[k] != self.config[k]}
        self._layers = layers
        self.config.update_from(new)
        logger.info("dynamic broker config updated by the cluster",
                    resource=name or "<default>", overrides=usable, changed=sorted(changed))
        self._reconfigure([r for r in self._reconfigurables if r.keys & changed])

    def _reconfigure(self, due: list[Reconfigurable]) -> None:
        for r in due:
            try:
                r.apply(self.config)
            except Exception:  # stored already, as Kafka's: the owner logs and keeps going
                logger.exception("applying a dynamic broker config failed", keys=sorted(r.keys))

    def _check_keys(self, name: str, overrides: dict[str, str]) -> None:
        updatable = self.updatable
        for given, value in overrides.items():
            key = _served_name(given)
            if key in STORED_BROKER_KEYS:
                if not name and STORED_BROKER_KEYS[key][2]:
                    problem = ("Cannot update these configs at default cluster level, broker "
                               f"id must be specified: {key}")
                else:
                    problem = stored_value_problem(key, value)
                if problem is None:
                    continue
                raise KafkaError(ErrorCode.INVALID_REQUEST, problem)
            if key not in KEYS:
                problem = f"Unknown broker config: {given}"
            elif key not in KAFKA_DYNAMIC_KEYS:
                problem = f"Cannot update these configs dynamically: {given}"
            elif key not in updatable:
                problem = f"{given} cannot be updated dynamically by this broker (needs a restart)"
            elif not name and key in PER_BROKER_KEYS:
                problem = ("Cannot update these configs at default cluster level, broker id "
                           f"must be specified: {given}")
            else:
                continue
            raise KafkaError(ErrorCode.INVALID_REQUEST, problem)


# -- group configs (resource type GROUP) ----------------------------------------------------------
GROUP_CONFIG = 8  # DescribeConfigs' ConfigSource of a group's own value
# Kafka 4.0's GroupConfig keys -> (the broker key whose value is the default, or Kafka's fixed
# default; least value). The share.* keys are stored and shown only: no share groups here.
GROUP_CONFIG_KEYS: dict[str, tuple[str, int | None]] = {
    "consumer.session.timeout.ms": ("group.consumer.session.timeout.ms", 1),
    "consumer.heartbeat.interval.ms": ("group.consumer.heartbeat.interval.ms", 1),
    "share.session.timeout.ms": ("45000", 1),
    "share.heartbeat.interval.ms": ("5000", 1),
    "share.record.lock.duration.ms": ("30000", 1000),
    "share.auto.offset.reset": ("latest", None),
}
# Bounds Kafka checks a group's value against (GroupConfig.validateValues): key -> (min, max),
# each a broker key or Kafka's fixed share-group bound.
_GROUP_BOUNDS = {
    "consumer.session.timeout.ms": ("group.consumer.min.session.timeout.ms",
                                    "group.consumer.max.session.timeout.ms"),
    "consumer.heartbeat.interval.ms": ("group.consumer.min.heartbeat.interval.ms",
                                       "group.consumer.max.heartbeat.interval.ms"),
    "share.session.timeout.ms": ("45000", "60000"),
    "share.heartbeat.interval.ms": ("5000", "15000"),
    "share.record.lock.duration.ms": ("15000", "60000"),
}


class GroupConfigs:
    """Kafka's group configs (KIP-848's GroupConfig): per-group overrides of the broker's group
    keys, kept in the metadata file beside the topics' and read by the consumer group
    coordinator at each heartbeat (consumer.session.timeout.ms, .heartbeat.interval.ms)."""

    def __init__(self, config: BrokerConfig, metadata: MetadataStore) -> None:
        self.config = config
        self.metadata = metadata

    def _default(self, key: str) -> str:
        source = GROUP_CONFIG_KEYS[key][0]
        return value_text(self.config[source]) if source in KEYS else source

    def _bound(self, text: str) -> int:
        return int(self.config[text]) if text in KEYS else int(text)

    def effective(self, group_id: str) -> list[tuple[str, str, int]]:
        """(key, value, source) of every group key: the group's own value (GROUP_CONFIG), else
        the default (DEFAULT_CONFIG), as Kafka's ConfigHelper describes a group."""
        own = self.metadata.group_configs.get(group_id, {})
        return [(key, own[key], GROUP_CONFIG) if key in own
                else (key, self._default(key), DEFAULT_CONFIG) for key in GROUP_CONFIG_KEYS]

    def overrides(self, group_id: str) -> dict[str, str]:
        return dict(self.metadata.group_configs.get(group_id, {}))

    def alter(self, group_id: str, overrides: dict[str, str], validate_only: bool = False
              ) -> None:
        """Replace a group's overrides: checked as Kafka's GroupConfig.validate checks them
        (INVALID_CONFIG), persisted, then read by the coordinator at the next heartbeat."""
        if not group_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "Group name must not be empty")
        self._validate(overrides)
        if validate_only:
            return
        normalized = {k: v.strip() for k, v in overrides.items()}
        before = self.metadata.group_configs.get(group_id)
        self.metadata.group_configs[group_id] = normalized
        try:
            self.metadata.save()
        except BaseException:
            if before is None:
                self.metadata.group_configs.pop(group_id, None)
            else:
                self.metadata.group_configs[group_id] = before
            raise
        logger.info("group configs altered", group=group_id, configs=normalized)

    def _validate(self, overrides: dict[str, str]) -> None:
        values: dict[str, int] = {}
        for key, value in overrides.items():
            if key not in GROUP_CONFIG_KEYS:
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"Unknown group config name: {key}")
            text = value.strip()
            if key == "share.auto.offset.reset":
                if text.lower() not in ("latest", "earliest"):
                    raise KafkaError(ErrorCode.INVALID_CONFIG,
                                     f"Invalid value {value} for configuration {key}: String "
                                     "must be one of: latest, earliest")
                continue
            least = GROUP_CONFIG_KEYS[key][1]
            if not text.lstrip("-").isdigit() or not (least or 0) <= int(text) < 1 << 31:
                raise KafkaError(ErrorCode.INVALID_CONFIG,
                                 f"Invalid value {value} for configuration {key}: Value must "
                                 f"be at least {least}")
            values[key] = int(text)
        combined = {k: int(self._default(k)) for k in _GROUP_BOUNDS} | values
        for key, (low, high) in _GROUP_BOUNDS.items():
            if combined[key] < self._bound(low):
                raise KafkaError(ErrorCode.INVALID_CONFIG,
                                 f"{key} must be greater than or equal to {low}")
            if combined[key] > self._bound(high):
                raise KafkaError(ErrorCode.INVALID_CONFIG,
                                 f"{key} must be less than or equal to {high}")
        for kind in ("consumer", "share"):
            if combined[f"{kind}.session.timeout.ms"] <= combined[f"{kind}.heartbeat.interval.ms"]:
                raise KafkaError(ErrorCode.INVALID_CONFIG,
                                 f"{kind}.session.timeout.ms must be greater than "
                                 f"{kind}.heartbeat.interval.ms")


def group_setting(metadata: TopicsImage, group_id: str, key: str, default: int) -> int:
    """A group's own value of a numeric group key, else ``default`` (the broker's)."""
    value = metadata.group_configs.get(group_id, {}).get(key)
    return int(value) if value is not None else default
