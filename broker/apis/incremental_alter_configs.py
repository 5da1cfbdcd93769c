"""IncrementalAlterConfigs (key 44, v0-1): SET, DELETE, APPEND and SUBTRACT on single keys.

The operations turn the resource's current overrides into new ones (APPEND/SUBTRACT only on
LIST keys, starting from the key's default when it has no override, as Kafka's controller
does), then the new set goes through the same checks, the same authorization (ALTER_CONFIGS
on the topic or, for a broker, on the cluster) and the same apply as AlterConfigs. A GROUP
resource (Kafka's group configs) needs ALTER_CONFIGS on the group (GROUP_AUTHORIZATION_FAILED);
its keys are checked as Kafka's GroupConfig checks them (INVALID_CONFIG) and persisted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import IncrementalAlterConfigsResponse

from broker.apis.alter_configs import (
    BROKER,
    TOPIC,
    answer,
    broker_alter_allowed,
    check_alter_allowed,
    check_keys,
)
from broker.apis.authorize import MESSAGES, allowed
from broker.config import ALIASES, KEYS
from broker.metadata.dynamic_config import STORED_BROKER_KEYS, GroupConfigs, is_list_key
from broker.metadata.file_store import STORED_TOPIC_CONFIGS, TOPIC_CONFIG_DEFAULTS, TOPIC_LIST_KEYS
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 44  # IncrementalAlterConfigs
VERSIONS = range(0, 2)

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
GROUP = 32
_OP_NAMES = {APPEND: "APPEND", SUBTRACT: "SUBTRACT"}


def handle(ctx: ApiContext, request: Request) -> Any:
    body = request.body
    return ctx.topics.shared.answer(answer(IncrementalAlterConfigsResponse, body.resources,
                                           lambda res: _alter(ctx, request, res,
                                                              body.validate_only)))


def _alter(ctx: ApiContext, request: Request, res: Any, validate_only: bool) -> None:
    check_keys([c.name for c in res.configs],
               [c.name for c in res.configs if c.value is None and c.config_operation != DELETE])
    ops = [(c.name, c.config_operation, c.value) for c in res.configs]
    if res.resource_type == TOPIC:
        check_alter_allowed(ctx, request, res)
        current = ctx.topics.topic_overrides(res.resource_name)
        new = apply_ops(current, ops, TOPIC_LIST_KEYS.__contains__, _topic_default)
        ctx.topics.alter_topic_configs(res.resource_name, new, validate_only)
    elif res.resource_type == GROUP:
        if not allowed(ctx, request, AclOperation.ALTER_CONFIGS, ResourceType.GROUP,
                       res.resource_name):
            raise KafkaError(ErrorCode.GROUP_AUTHORIZATION_FAILED,
                             MESSAGES[ErrorCode.GROUP_AUTHORIZATION_FAILED])
        groups = GroupConfigs(ctx.config, ctx.topics.metadata)
        new = apply_ops(groups.overrides(res.resource_name), ops, lambda _key: False,
                        lambda _key: "")
        groups.alter(res.resource_name, new, validate_only)
    elif res.resource_type == BROKER:
        dynamic = ctx.topics.dynamic
        current = dynamic.overrides(res.resource_name)
        new = apply_ops(current, ops, _broker_list_key, _broker_default)
        if not broker_alter_allowed(ctx, request):
            dynamic.alter(res.resource_name, new, True)  # the preprocessing's errors come first
            check_alter_allowed(ctx, request, res)
        dynamic.alter(res.resource_name, new, validate_only)
    else:
        raise KafkaError(ErrorCode.INVALID_REQUEST,
                         f"Unknown resource type {res.resource_type}")


def apply_ops(current: dict[str, str], ops: list[tuple[str, int, str | None]],
              is_list: Callable[[str], bool], default: Callable[[str], str]) -> dict[str, str]:
    """The overrides after ``ops``, in order; INVALID_REQUEST for an unknown operation,
    INVALID_CONFIG for APPEND/SUBTRACT on a key that is not a LIST."""
    new = dict(current)
    for name, op, value in ops:
        if op == SET:
            new[name] = value  # type: ignore[assignment]  # null refused by check_keys
        elif op == DELETE:
            new.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            if not is_list(name):
                raise KafkaError(ErrorCode.INVALID_CONFIG,
                                 f"Can't {_OP_NAMES[op]} to key {name} because its type is "
                                 "not LIST.")
            base = new[name] if name in new else default(name)
            parts = [p for p in base.split(",") if p]
            given = (value or "").split(",")
            if op == APPEND:
                parts += [p for p in dict.fromkeys(given) if p not in parts]
            else:
                parts = [p for p in parts if p not in given]
            new[name] = ",".join(parts)
        else:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"Unknown operations type {op}")
    return new


def _topic_default(key: str) -> str:
    """A topic key's own default (Kafka's LogConfig default, not the broker's setting)."""
    if key in STORED_TOPIC_CONFIGS:
        return STORED_TOPIC_CONFIGS[key][1]
    return KEYS[TOPIC_CONFIG_DEFAULTS[key]].default


def _broker_default(key: str) -> str:
    if key in STORED_BROKER_KEYS:
        return STORED_BROKER_KEYS[key][1] or ""
    return KEYS[key].default


def _broker_list_key(key: str) -> bool:
    if key in ALIASES:
        return False  # Kafka's other names are numbers or a directory, never a LIST
    if key not in KEYS and key not in STORED_BROKER_KEYS:
        raise KafkaError(ErrorCode.INVALID_CONFIG, f"Unknown config name: {key}")
    return is_list_key(key)
