"""CreatePartitions (key 37): grow a topic's partition count.

Each topic needs ALTER (TOPIC_AUTHORIZATION_FAILED, listed first and never grown), as Kafka's
controller checks it. In cluster mode the controller grows them (broker/apis/cluster_admin.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import CreatePartitionsResponse

from broker.apis import cluster_admin
from broker.apis.authorize import filter_allowed
from broker.apis.create_topics import EXCESSIVE_BATCH, MAX_RECORDS_PER_USER_OP
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 37  # CreatePartitions
VERSIONS = range(0, 4)

Result = CreatePartitionsResponse.CreatePartitionsTopicResult


def handle(ctx: ApiContext, request: Request) -> Any:
    req = request.body
    topics = list(req.topics)
    refused: list[Result] = []
    if ctx.authorizer.enabled:
        alterable = filter_allowed(ctx, request, AclOperation.ALTER, ResourceType.TOPIC,
                                   (t.name for t in topics))
        refused = [Result(name=t.name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                          error_message=None) for t in topics if t.name not in alterable]
        topics = [t for t in topics if t.name in alterable]
    if ctx.cluster is not None:  # the controller grows them (NOT_CONTROLLER elsewhere)
        return cluster_admin.create_partitions(ctx.cluster, topics, req.validate_only, refused)
    new_partitions = 0
    for t in topics:
        info = ctx.topics.metadata.topics.get(t.name)
        new_partitions += max(t.count - (info.partitions if info else 0), 0)
    if new_partitions > MAX_RECORDS_PER_USER_OP:
        return CreatePartitionsResponse(throttle_time_ms=0, results=refused + [
            Result(name=t.name, error_code=ErrorCode.POLICY_VIOLATION,
                   error_message=EXCESSIVE_BATCH) for t in topics])
    results = refused
    for t in topics:
        try:
            info = ctx.topics.metadata.topics.get(t.name)
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {t.name}")
            if t.count <= info.partitions:
                raise KafkaError(ErrorCode.INVALID_PARTITIONS,
                                 f"topic has {info.partitions} partitions; asked for {t.count}")
            if not req.validate_only:
                ctx.topics.add_partitions(t.name, t.count)
            results.append(Result(name=t.name, error_code=0, error_message=None))
        except KafkaError as exc:
            results.append(Result(name=t.name, error_code=exc.error_code, error_message=str(exc)))
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)
