"""Broker configs changed at run time: Kafka's DynamicBrokerConfig for a single broker.

Two layers of overrides sit over the static configuration, as in Kafka: the cluster default
(BROKER resource "") and this broker's own (resource = its node id), which wins. Both persist
in the MetadataStore, are loaded at start before any log opens, and are applied at once by
replacing the values of the one BrokerConfig every owner holds. A key is updatable only when
Kafka updates it dynamically AND something here applies it: the owners that can apply a
change register for its keys (``add_reconfigurable``); a key Kafka calls dynamic that nothing
here applies is refused, rather than stored and silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from broker.config import KEYS, BrokerConfig, ConfigError, parse_value, value_text
from broker.metadata.file_store import TOPIC_CONFIG_DEFAULTS, MetadataStore
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("broker")

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
TOPIC_DEFAULT_KEYS = frozenset(TOPIC_CONFIG_DEFAULTS.values())
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
    spec = KEYS.get(key)
    return spec is not None and isinstance(spec.parse(spec.default), list)


class DynamicBrokerConfig:
    def __init__(self, config: BrokerConfig, metadata: MetadataStore) -> None:
        self.config = config
        self.metadata = metadata
        self.node = str(config["node.id"])
        self._layers: dict[str, dict[str, str]] = {"": {}, self.node: {}}
        self._reconfigurables: list[Reconfigurable] = []

    # -- start ----------------------------------------------------------------------------------
    def load(self) -> None:
        """Apply the persisted overrides over the static config (call after MetadataStore.load,
        before the logs open). An entry no longer valid (a key not dynamic, a bad value) is
        left out and logged, as Kafka ignores such persisted entries rather than not start."""
        for name in ("", self.node):
            self._layers[name] = self._usable(name, self.metadata.broker_configs.get(name, {}))
        self.config.update_from(self.config.layered(self._layers[""], self._layers[self.node]))

    def _usable(self, name: str, stored: dict[str, str]) -> dict[str, str]:
        kept: dict[str, str] = {}
        for key, value in stored.items():
            try:
                if key not in KAFKA_DYNAMIC_KEYS or (not name and key in PER_BROKER_KEYS):
                    raise ConfigError(f"{key} cannot be updated dynamically")
                parse_value(key, value)
            except ConfigError as exc:
                log.error("persisted dynamic broker config ignored", resource=name, key=key,
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
        """(name, value, source) of a broker key, highest precedence first, as Kafka lists
        them; the cluster default resource shows only its own layer."""
        found: list[tuple[str, str, int]] = []
        if per_broker and key in self._layers[self.node]:
            found.append((key, self._layers[self.node][key], DYNAMIC_BROKER_CONFIG))
        if key in self._layers[""]:
            found.append((key, self._layers[""][key], DYNAMIC_DEFAULT_BROKER_CONFIG))
        if per_broker and key in self.config.static:
            found.append((key, self.config.static[key], STATIC_BROKER_CONFIG))
        if per_broker:
            spec = KEYS[key]
            found.append((key, value_text(spec.parse(spec.default)), DEFAULT_CONFIG))
        return found

    # -- changing -------------------------------------------------------------------------------
    def alter(self, resource: str, overrides: dict[str, str], validate_only: bool = False) -> None:
        """Replace a BROKER resource's overrides: checked (INVALID_REQUEST, as Kafka answers
        a broker config it cannot take), persisted, then applied to every registered owner."""
        name = self.resource(resource)
        self._check_keys(name, overrides)
        layers = {**self._layers, name: dict(overrides)}
        try:
            new = self.config.layered(layers[""], layers[self.node])
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
        before = self.metadata.broker_configs.get(name)
        self.metadata.broker_configs[name] = dict(overrides)
        try:
            self.metadata.save()
        except BaseException:
            if before is None:
                self.metadata.broker_configs.pop(name, None)
            else:
                self.metadata.broker_configs[name] = before
            raise
        self._layers[name] = dict(overrides)
        self.config.update_from(new)
        log.info("dynamic broker config updated", resource=name or "<default>",
                 overrides=overrides, changed=sorted(changed))
        for r in due:
            try:
                r.apply(self.config)
            except Exception:  # stored already, as Kafka's: the owner logs and keeps going
                log.exception("applying a dynamic broker config failed", keys=sorted(r.keys))

    def _check_keys(self, name: str, overrides: dict[str, str]) -> None:
        updatable = self.updatable
        for key in overrides:
            if key not in KEYS:
                problem = f"Unknown broker config: {key}"
            elif key not in KAFKA_DYNAMIC_KEYS:
                problem = f"Cannot update these configs dynamically: {key}"
            elif key not in updatable:
                problem = f"{key} cannot be updated dynamically by this broker (needs a restart)"
            elif not name and key in PER_BROKER_KEYS:
                problem = ("Cannot update these configs at default cluster level, broker id "
                           f"must be specified: {key}")
            else:
                continue
            raise KafkaError(ErrorCode.INVALID_REQUEST, problem)
