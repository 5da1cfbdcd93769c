"""DescribeConfigs (key 32): topic configs (overrides over broker defaults) and broker configs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeConfigsResponse

from broker.config import KEYS
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

Result = DescribeConfigsResponse.DescribeConfigsResult
Entry = Result.DescribeConfigsResourceResult

TOPIC, BROKER = 2, 4
# ConfigSource values of Kafka's DescribeConfigs.
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
# ConfigType values (v3+), which the Java Admin shows as ConfigEntry.type().
BOOLEAN, STRING, INT, LONG, LIST = 1, 2, 3, 5, 7
# Kafka's ConfigDef types of the topic keys served (TopicConfig / LogConfig).
TOPIC_TYPES = {
    "cleanup.policy": LIST, "compression.type": STRING, "message.timestamp.type": STRING,
    "segment.bytes": INT, "max.message.bytes": INT, "index.interval.bytes": INT,
    "compression.gzip.level": INT, "compression.lz4.level": INT, "compression.zstd.level": INT,
}
# Broker keys Kafka types LONG although they are not durations.
_LONG_BROKER_KEYS = {"log.retention.bytes", "log.flush.interval.messages",
                     "queued.max.request.bytes"}


def handle(ctx: ApiContext, request: Request) -> DescribeConfigsResponse:
    results = [_describe(ctx, r) for r in request.body.resources]
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)


def _describe(ctx: ApiContext, res) -> Result:  # type: ignore[no-untyped-def]
    if res.resource_type == TOPIC:
        info = ctx.topics.metadata.topics.get(res.resource_name)
        if info is None:
            return _error(res, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "unknown topic")
        values = {
            k: (v, DYNAMIC_TOPIC_CONFIG if k in info.configs else DEFAULT_CONFIG)
            for k, v in ctx.topics.topic_config(info).items()
        }
    elif res.resource_type == BROKER:
        if res.resource_name not in ("", str(ctx.node.node_id)):
            return _error(res, ErrorCode.INVALID_REQUEST, "unknown broker")
        values = {
            k: (",".join(v) if isinstance(v, list) else str(v).lower()
                if isinstance(v, bool) else str(v), STATIC_BROKER_CONFIG)
            for k, v in ctx.config.items() if k in KEYS
        }
    else:
        return _error(res, ErrorCode.INVALID_REQUEST, f"resource type {res.resource_type}")
    keys = res.configuration_keys
    entries = [
        Entry(name=k, value=v, read_only=res.resource_type == BROKER, config_source=src,
              is_default=src == DEFAULT_CONFIG, is_sensitive=False, synonyms=[],
              config_type=_type(res.resource_type, k), documentation=None)
        for k, (v, src) in values.items() if keys is None or k in keys
    ]
    return Result(error_code=0, error_message=None, resource_type=res.resource_type,
                  resource_name=res.resource_name, configs=entries)


def _type(resource_type: int, key: str) -> int:
    if resource_type == TOPIC:
        return TOPIC_TYPES.get(key, LONG)  # the other topic keys are Kafka LONGs (.ms, bytes)
    spec = KEYS[key]
    if spec.parse is int:
        return LONG if key.endswith(".ms") or key in _LONG_BROKER_KEYS else INT
    try:
        default = spec.parse(spec.default)
    except ValueError:
        return STRING
    if isinstance(default, bool):
        return BOOLEAN
    return LIST if isinstance(default, list) else STRING


def _error(res, code: ErrorCode, message: str) -> Result:  # type: ignore[no-untyped-def]
    return Result(error_code=code, error_message=message, resource_type=res.resource_type,
                  resource_name=res.resource_name, configs=[])
