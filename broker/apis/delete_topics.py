"""DeleteTopics (key 20): by name, or by topic id from v6.

Authorization as Kafka's controller (ControllerApis.deleteTopics): DELETE on the cluster
allows every topic; otherwise a topic needs DELETE on it, and what a refusal reveals depends on
DESCRIBE: a topic named but not describable is TOPIC_AUTHORIZATION_FAILED whether it exists or
not; a topic given by id keeps its name in the refusal only when describable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import DeleteTopicsResponse

from broker.apis import cluster_admin
from broker.apis.authorize import MESSAGES, allowed, cluster_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 20  # DeleteTopics
VERSIONS = range(1, 7)

Result = DeleteTopicsResponse.DeletableTopicResult
DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED


def handle(ctx: ApiContext, request: Request) -> Any:
    req = request.body
    if request.version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    # None: everything may be deleted (the authorizer is off, or DELETE on the cluster).
    check = ctx.authorizer.enabled and not cluster_allowed(ctx, request, AclOperation.DELETE,
                                                           log_if_denied=False)
    if ctx.cluster is not None:
        return _cluster(ctx, request, wanted, check)
    store = ctx.topics.metadata
    results = []
    for name, topic_id in wanted:
        by_id = name is None
        if by_id:
            info = store.by_id.get(topic_id)
            if info is None:
                results.append(Result(name=None, topic_id=topic_id,
                                      error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                                      error_message="unknown topic id"))
                continue
            name = info.name
        if check:
            refusal = _refusal(ctx, request, name, topic_id, by_id,
                               name in ctx.topics.metadata.topics)
            if refusal is not None:
                results.append(refusal)
                continue
        try:
            info = ctx.topics.delete_topic(name)
            results.append(Result(name=name, topic_id=info.topic_id, error_code=0,
                                  error_message=None))
        except KafkaError as exc:
            results.append(Result(name=name, topic_id=topic_id, error_code=exc.error_code,
                                  error_message=str(exc)))
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)


def _cluster(ctx: ApiContext, request: Request, wanted: list[tuple[Any, Any]], check: bool
             ) -> Any:
    """Cluster mode: the controller deletes them (NOT_CONTROLLER elsewhere)."""
    cluster = ctx.cluster
    assert cluster is not None
    done: list[Any] = []
    names: list[str] = []
    for name, topic_id in wanted:
        by_id = name is None
        if by_id:
            name = cluster_admin.delete_topic_name(cluster, topic_id)
            if name is None:
                done.append(Result(name=None, topic_id=topic_id,
                                   error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                                   error_message="unknown topic id"))
                continue
        if check:
            refusal = _refusal(ctx, request, name, topic_id, by_id,
                               cluster.cache.topic(name) is not None)
            if refusal is not None:
                done.append(refusal)
                continue
        names.append(name)
    return cluster_admin.delete_topics(cluster, names, done)


def _refusal(ctx: ApiContext, request: Request, name: str, topic_id: object, by_id: bool,
             exists: bool) -> Result | None:
    """TOPIC_AUTHORIZATION_FAILED as the controller answers it, or None to go on (an unknown
    name the principal may describe goes on, to be answered UNKNOWN_TOPIC_OR_PARTITION)."""
    describable = allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC, name)
    if by_id:
        if allowed(ctx, request, AclOperation.DELETE, ResourceType.TOPIC, name):
            return None
        return Result(name=name if describable else None, topic_id=topic_id,
                      error_code=DENIED, error_message=MESSAGES[DENIED])
    if describable and (not exists or allowed(
            ctx, request, AclOperation.DELETE, ResourceType.TOPIC, name)):
        return None
    return Result(name=name, topic_id=topic_id, error_code=DENIED, error_message=MESSAGES[DENIED])
