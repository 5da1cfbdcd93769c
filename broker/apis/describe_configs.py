"""DescribeConfigs (key 32): topic and broker configs, each with where its value comes from.

As Kafka's ConfigHelper: a value's source is that of its first synonym in order of precedence
(the topic's own override, this broker's dynamic config, the cluster default, the static
config, the default), and v1+ lists those synonyms when asked. A topic key's synonyms are its
broker key's (retention.ms -> log.retention.ms). Values are written as Kafka writes them back
(lists with commas, doubles as Java's Double.toString). A topic needs DESCRIBE_CONFIGS on it
(TOPIC_AUTHORIZATION_FAILED), a broker DESCRIBE_CONFIGS on the cluster
(CLUSTER_AUTHORIZATION_FAILED), a group DESCRIBE_CONFIGS on it (GROUP_AUTHORIZATION_FAILED);
refused resources are answered after the others, as Kafka's
ConfigHelper answers them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DescribeConfigsResponse

from broker.apis.authorize import MESSAGES, allowed, cluster_allowed
from broker.config import ALIASES, KEYS, value_text
from broker.metadata.dynamic_config import (
    DEFAULT_CONFIG,
    DYNAMIC_TOPIC_CONFIG,
    NULL_DEFAULT_KEYS,
    STORED_BROKER_KEYS,
    GroupConfigs,
)
from broker.metadata.file_store import (
    STORED_TOPIC_CONFIGS,
    TOPIC_CONFIG_DEFAULTS,
    stored_topic_value_text,
    validate_topic_name,
)
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 32  # DescribeConfigs
VERSIONS = range(1, 5)

Result = DescribeConfigsResponse.DescribeConfigsResult
Entry = Result.DescribeConfigsResourceResult
Synonym = Entry.DescribeConfigsSynonym

TOPIC, BROKER, GROUP = 2, 4, 32
# ConfigType values (v3+), which the Java Admin shows as ConfigEntry.type().
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
# Kafka's ConfigDef types of the topic keys served (TopicConfig / LogConfig); others are LONG.
TOPIC_TYPES = {
    "cleanup.policy": LIST, "compression.type": STRING, "message.timestamp.type": STRING,
    "segment.bytes": INT, "max.message.bytes": INT, "index.interval.bytes": INT,
    "compression.gzip.level": INT, "compression.lz4.level": INT, "compression.zstd.level": INT,
    "min.cleanable.dirty.ratio": DOUBLE,
}
_STORED_TYPES = {"boolean": BOOLEAN, "int": INT, "long": LONG, "list": LIST}
# ConfigType of the broker keys stored without effect (SHORT 4, CLASS 8).
_STORED_BROKER_TYPES = {**_STORED_TYPES, "short": 4, "double": DOUBLE, "string": STRING,
                        "class": 8}
# Broker keys Kafka types LONG although they are not durations, and .ms keys it types INT.
_LONG_BROKER_KEYS = {"log.retention.bytes", "log.flush.interval.messages",
                     "queued.max.request.bytes", "log.cleaner.dedupe.buffer.size"}
_INT_MS_BROKER_KEYS = {
    "group.initial.rebalance.delay.ms", "group.min.session.timeout.ms",
    "group.max.session.timeout.ms", "transaction.max.timeout.ms",
    "transactional.id.expiration.ms", "log.flush.offset.checkpoint.interval.ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms",
}


def handle(ctx: ApiContext, request: Request) -> DescribeConfigsResponse:
    body = request.body
    synonyms = bool(getattr(body, "include_synonyms", False))
    docs = bool(getattr(body, "include_documentation", False))
    results = []
    refused = []
    for res in body.resources:
        denied = _denied(ctx, request, res) if ctx.authorizer.enabled else None
        if denied is not None:
            refused.append(_error(res, denied, MESSAGES[denied]))
            continue
        try:
            results.append(_describe(ctx, res, synonyms, docs))
        except KafkaError as exc:
            results.append(_error(res, exc.error_code, str(exc)))
    return DescribeConfigsResponse(throttle_time_ms=0, results=results + refused)


def _denied(ctx: ApiContext, request: Request, res: Any) -> ErrorCode | None:
    op = AclOperation.DESCRIBE_CONFIGS
    if res.resource_type == TOPIC and not allowed(ctx, request, op, ResourceType.TOPIC,
                                                  res.resource_name):
        return ErrorCode.TOPIC_AUTHORIZATION_FAILED
    if res.resource_type == BROKER and not cluster_allowed(ctx, request, op):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    if res.resource_type == GROUP and not allowed(ctx, request, op, ResourceType.GROUP,
                                                  res.resource_name):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    return None


def _describe(ctx: ApiContext, res: Any, synonyms: bool, docs: bool) -> Result:
    if res.resource_type == TOPIC:
        entries = _topic_entries(ctx, res.resource_name, synonyms, docs)
        if entries is None:  # Kafka answers an unknown topic without a message
            return _error(res, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
    elif res.resource_type == BROKER:
        entries = _broker_entries(ctx, res.resource_name, synonyms, docs)
    elif res.resource_type == GROUP:
        entries = _group_entries(ctx, res.resource_name, synonyms, docs)
    else:
        return _error(res, ErrorCode.INVALID_REQUEST,
                      f"Unsupported resource type: {res.resource_type}")
    wanted = res.configuration_keys
    if wanted:  # null or empty: every key
        entries = [e for e in entries if e.name in wanted]
    return Result(error_code=0, error_message=None, resource_type=res.resource_type,
                  resource_name=res.resource_name, configs=entries)


def _topic_entries(ctx: ApiContext, name: str, synonyms: bool, docs: bool) -> list[Entry] | None:
    validate_topic_name(name)
    overrides = ctx.topics.shared.topic_overrides(name)  # this broker's or the cluster's
    if overrides is None:
        return None
    dynamic = ctx.topics.dynamic
    entries = []
    for key, value in ctx.topics.topic_config(overrides).items():
        broker_key = TOPIC_CONFIG_DEFAULTS.get(key) or STORED_TOPIC_CONFIGS[key][0]
        if broker_key not in KEYS:
            entries.append(_stored_entry(key, value, key in overrides, synonyms, docs))
            continue
        if key in STORED_TOPIC_CONFIGS:
            text = stored_topic_value_text(key, value)
            kind = _STORED_TYPES[STORED_TOPIC_CONFIGS[key][2]]
        else:
            text, kind = _topic_value_text(key, value), TOPIC_TYPES.get(key, LONG)
        found = dynamic.synonyms(broker_key)
        if key in overrides:
            found.insert(0, (key, text, DYNAMIC_TOPIC_CONFIG))
        source = found[0][2] if found else DEFAULT_CONFIG
        entries.append(_entry(key, text, source, False, found if synonyms else [], kind,
                              KEYS[broker_key].doc if docs else None))
    return entries


def _group_entries(ctx: ApiContext, group_id: str, synonyms: bool, docs: bool) -> list[Entry]:
    """Kafka's ConfigHelper for a group: every group key, the group's own value
    (GROUP_CONFIG) or the broker's default (DEFAULT_CONFIG); a group need not exist."""
    if not group_id:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Group name must not be empty")
    doc = "Kafka's group config (GroupConfig); the share.* keys have no effect here."
    return [_entry(key, value, source, False, [(key, value, source)] if synonyms else [],
                   STRING if key == "share.auto.offset.reset" else INT, doc if docs else None)
            for key, value, source in GroupConfigs(ctx.config, ctx.topics.metadata).effective(
                group_id)]


def _stored_entry(key: str, value: str, overridden: bool, synonyms: bool, docs: bool) -> Entry:
    """A key Kafka accepts that has no effect here: the topic's value, else Kafka's default,
    whose synonym is Kafka's broker key at its default (this broker has no such key)."""
    broker_key, default, kind, _least = STORED_TOPIC_CONFIGS[key]
    found = [(broker_key, stored_topic_value_text(key, default), DEFAULT_CONFIG)] if (
        broker_key is not None) else []
    text = stored_topic_value_text(key, value)
    if overridden:
        found.insert(0, (key, text, DYNAMIC_TOPIC_CONFIG))
    source = DYNAMIC_TOPIC_CONFIG if overridden else DEFAULT_CONFIG
    doc = "Kafka's topic config; stored and shown, with no effect on this broker."
    return _entry(key, text, source, False, found if synonyms else [], _STORED_TYPES[kind],
                  doc if docs else None)


def _broker_entries(ctx: ApiContext, name: str, synonyms: bool, docs: bool) -> list[Entry]:
    """Every broker key, Kafka's other names (log.dir, log.retention.hours ...) each an entry
    of its own as in Kafka's answer; a value is what its own name was given, and the served
    key's value in use when Kafka has a default for it."""
    dynamic = ctx.topics.dynamic
    per_broker = bool(dynamic.resource(name))
    keys = ([*KEYS, *ALIASES, *STORED_BROKER_KEYS] if per_broker
            else list(dynamic.overrides("")))
    updatable = dynamic.updatable
    entries = []
    for key in keys:
        found = dynamic.synonyms(key, per_broker)
        if key in STORED_BROKER_KEYS:
            entries.append(_stored_broker_entry(key, found, synonyms, docs))
            continue
        served = ALIASES[key].target if key in ALIASES else key
        if not per_broker:
            text: str | None = found[0][1]
        elif key in ALIASES or key in NULL_DEFAULT_KEYS:
            text = found[0][1] if found else None
        else:
            text = value_text(ctx.config[key])
        source = found[0][2] if found else DEFAULT_CONFIG
        entries.append(_entry(key, text, source, served not in updatable,  # type: ignore[arg-type]
                              found if synonyms else [], _broker_type(key),
                              _alias_doc(key) if docs else None))
    return entries


def _alias_doc(key: str) -> str:
    if key in ALIASES:
        return f"Kafka's other name for {ALIASES[key].target}."
    return KEYS[key].doc


def _stored_broker_entry(key: str, found: list[tuple[str, str, int]], synonyms: bool,
                         docs: bool) -> Entry:
    """A dynamic key of Kafka's that has no effect here: shown as Kafka shows it (updatable,
    its dynamic value or Kafka's default, null when Kafka has none)."""
    kind = STORED_BROKER_KEYS[key][0]
    value, source = (found[0][1], found[0][2]) if found else (None, DEFAULT_CONFIG)
    doc = "Kafka's dynamic broker config; stored and shown, with no effect on this broker."
    return _entry(key, value, source, False, found if synonyms else [],  # type: ignore[arg-type]
                  _STORED_BROKER_TYPES[kind], doc if docs else None)


def _entry(name: str, value: str, source: int, read_only: bool,
           synonyms: list[tuple[str, str, int]], config_type: int, doc: str | None) -> Entry:
    return Entry(name=name, value=value, read_only=read_only, config_source=source,
                 is_default=source == DEFAULT_CONFIG, is_sensitive=False,
                 synonyms=[Synonym(name=n, value=v, source=s) for n, v, s in synonyms],
                 config_type=config_type, documentation=doc)


def _topic_value_text(key: str, text: str) -> str:
    """A topic value as Kafka writes its parsed value back ("1" for a ratio is "1.0")."""
    kind = TOPIC_TYPES.get(key, LONG)
    if kind in (INT, LONG):
        return str(int(text))
    if kind == DOUBLE:
        return value_text(float(text))
    if kind == LIST:
        return ",".join(p.strip() for p in text.split(",") if p.strip())
    return text


def _broker_type(key: str) -> int:
    if key in ALIASES:  # Kafka's hours, minutes and broker.id are INT, log.dir a STRING
        return STRING if key == "log.dir" else INT
    spec = KEYS[key]
    if spec.parse is int:
        if key in _INT_MS_BROKER_KEYS:
            return INT
        return LONG if key.endswith(".ms") or key in _LONG_BROKER_KEYS else INT
    if spec.parse is float:
        return DOUBLE
    try:
        default = spec.parse(spec.default)
    except ValueError:
        return STRING
    if isinstance(default, bool):
        return BOOLEAN
    return LIST if isinstance(default, list) else STRING


def _error(res: Any, code: ErrorCode, message: str | None) -> Result:
    return Result(error_code=code, error_message=message, resource_type=res.resource_type,
                  resource_name=res.resource_name, configs=[])
