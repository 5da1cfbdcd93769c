"""AlterConfigs (key 33, v0-2): replace the whole override set of a topic or broker resource.

Kafka's legacy API: the configs sent become the resource's overrides and every override not
sent is deleted. Each resource succeeds or fails alone; the checks and their error codes are
Kafka's (the broker's preprocessing, then the controller's): a resource named twice, a key
named twice or a null value are INVALID_REQUEST; the rest is TopicAdmin's and
DynamicBrokerConfig's. Authorization after the broker's preprocessing (a broker resource's
change is validated first), as the controller checks it: ALTER_CONFIGS on the topic
(TOPIC_AUTHORIZATION_FAILED) or on the cluster for a broker (CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import AlterConfigsResponse

from broker.apis.authorize import MESSAGES, allowed, cluster_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 33  # AlterConfigs
VERSIONS = range(0, 3)

TOPIC, BROKER = 2, 4


def handle(ctx: ApiContext, request: Request) -> Any:
    body = request.body
    return ctx.topics.shared.answer(answer(AlterConfigsResponse, body.resources,
                                           lambda res: _alter(ctx, request, res,
                                                              body.validate_only)))


def _alter(ctx: ApiContext, request: Request, res: Any, validate_only: bool) -> None:
    check_keys([c.name for c in res.configs], [c.name for c in res.configs if c.value is None])
    configs = {c.name: c.value for c in res.configs}
    if res.resource_type == TOPIC:
        check_alter_allowed(ctx, request, res)
        ctx.topics.alter_topic_configs(res.resource_name, configs, validate_only)
    elif res.resource_type == BROKER:
        if not broker_alter_allowed(ctx, request):
            ctx.topics.dynamic.alter(res.resource_name, configs, True)  # its errors come first
            check_alter_allowed(ctx, request, res)
        ctx.topics.dynamic.alter(res.resource_name, configs, validate_only)
    else:
        raise KafkaError(ErrorCode.INVALID_REQUEST,
                         f"Unknown resource type {res.resource_type}")


def answer(response_type: Any, resources: Iterable[Any], alter: Callable[[Any], None]) -> Any:
    """Both APIs' response: ``alter`` runs per resource, in the request's order, and its
    KafkaError is that resource's answer; a resource named twice fails both times without
    being applied, as Kafka's preprocessing answers it."""
    resources = list(resources)
    seen = Counter((r.resource_type, r.resource_name) for r in resources)
    item = response_type.AlterConfigsResourceResponse
    out = []
    for res in resources:
        code, message = ErrorCode.NONE, None
        if seen[(res.resource_type, res.resource_name)] > 1:
            code, message = ErrorCode.INVALID_REQUEST, "Each resource must appear at most once."
        else:
            try:
                alter(res)
            except KafkaError as exc:
                code, message = exc.error_code, str(exc)
        out.append(item(error_code=code, error_message=message,
                        resource_type=res.resource_type, resource_name=res.resource_name))
    return response_type(throttle_time_ms=0, responses=out)


def broker_alter_allowed(ctx: ApiContext, request: Request) -> bool:
    return cluster_allowed(ctx, request, AclOperation.ALTER_CONFIGS)


def check_alter_allowed(ctx: ApiContext, request: Request, res: Any) -> None:
    """ALTER_CONFIGS on the resource, or its authorization error (ControllerApis's)."""
    if res.resource_type == TOPIC:
        if allowed(ctx, request, AclOperation.ALTER_CONFIGS, ResourceType.TOPIC,
                   res.resource_name):
            return
        error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    elif broker_alter_allowed(ctx, request):
        return
    else:
        error = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    raise KafkaError(error, MESSAGES[error])


def check_keys(names: list[str], null_values: list[str]) -> None:
    """Kafka's preprocessing of one resource: no key twice, no null where a value is due."""
    if len(set(names)) != len(names):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    if null_values:
        raise KafkaError(ErrorCode.INVALID_REQUEST,
                         "Null value not supported for : " + ", ".join(null_values))
