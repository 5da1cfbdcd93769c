"""CreateTopics (key 19).

Authorization as Kafka's controller (ControllerApis.createTopics): CREATE on the cluster, or
else on each topic; a topic refused is answered TOPIC_AUTHORIZATION_FAILED after the others and
never created. In cluster mode the controller creates them (broker/apis/cluster_admin.py). A
topic created without DESCRIBE_CONFIGS on it is answered without its configs,
partition count or replication factor, its topic_config_error_code TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import CreateTopicsResponse

from broker.apis import cluster_admin
from broker.apis.authorize import cluster_allowed, filter_allowed
from broker.cluster.placement import PlacementError, validate_manual_assignment
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 19  # CreateTopics
VERSIONS = range(2, 8)

Result = CreateTopicsResponse.CreatableTopicResult
ConfigResult = Result.CreatableTopicConfigs


# Kafka's controller bounds the records one request may create (QuorumController's
# MAX_RECORDS_PER_USER_OP): a topic is one record, each partition and config one more; over it
# every topic of the request is refused, so one request cannot stall the broker.
MAX_RECORDS_PER_USER_OP = 10_000
EXCESSIVE_BATCH = "Unable to perform excessively large batch operation."


def handle(ctx: ApiContext, request: Request) -> Any:
    req = request.body
    topics = list(req.topics)
    refused: list[Result] = []
    describable: set[str] | None = None  # None: every topic (the authorizer is off)
    if ctx.authorizer.enabled:
        names = [t.name for t in topics]
        creatable = (set(names) if cluster_allowed(ctx, request, AclOperation.CREATE,
                                                   log_if_denied=False) else
                     filter_allowed(ctx, request, AclOperation.CREATE, ResourceType.TOPIC, names))
        describable = filter_allowed(ctx, request, AclOperation.DESCRIBE_CONFIGS,
                                     ResourceType.TOPIC, names, log_if_denied=False)
        refused = [Result(name=n, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                          error_message="Authorization failed.", num_partitions=-1,
                          replication_factor=-1, configs=None)
                   for n in dict.fromkeys(names) if n not in creatable]
        topics = [t for t in topics if t.name in creatable]
    if _records(ctx, topics) > MAX_RECORDS_PER_USER_OP:
        return CreateTopicsResponse(throttle_time_ms=0, topics=[
            Result(name=t.name, error_code=ErrorCode.POLICY_VIOLATION,
                   error_message=EXCESSIVE_BATCH, num_partitions=-1, replication_factor=-1,
                   configs=None) for t in topics] + refused)
    if ctx.cluster is not None:  # the controller creates them (NOT_CONTROLLER elsewhere)
        return cluster_admin.create_topics(ctx, ctx.cluster, topics, req.validate_only,
                                           refused, describable)
    results = []
    for t in topics:
        configs = {c.name: c.value for c in t.configs}
        try:
            partitions = _partition_count(ctx, t)
            if req.validate_only:
                ctx.topics.check_new_topic(t.name, partitions, configs)
                info = None
            else:
                info = ctx.topics.create_topic(t.name, partitions, configs)
        except KafkaError as exc:
            results.append(Result(name=t.name, error_code=exc.error_code, error_message=str(exc),
                                  num_partitions=-1, replication_factor=-1, configs=None))
            continue
        if describable is not None and t.name not in describable:
            results.append(Result(name=t.name, topic_id=info.topic_id if info else None,
                                  error_code=0, error_message=None,
                                  topic_config_error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                  num_partitions=-1, replication_factor=-1, configs=[]))
            continue
        effective = ctx.topics.topic_config(info)
        results.append(Result(
            name=t.name, topic_id=info.topic_id if info else None, error_code=0,
            error_message=None, num_partitions=partitions, replication_factor=1,
            configs=[ConfigResult(name=k, value=v, read_only=False,
                                  config_source=1 if k in configs else 5, is_sensitive=False)
                     for k, v in effective.items()],
        ))
    return CreateTopicsResponse(throttle_time_ms=0, topics=results + refused)


def _records(ctx: ApiContext, topics: Any) -> int:
    total = 0
    for t in topics:
        partitions = (len(t.assignments) if t.assignments else
                      ctx.config["num.partitions"] if t.num_partitions == -1 else t.num_partitions)
        total += 1 + max(partitions, 0) + len(t.configs)
    return total


def _partition_count(ctx: ApiContext, t: Any) -> int:
    if t.assignments:
        return _manual_assignment(t, ctx.node.node_id)
    rf = (ctx.config["default.replication.factor"] if t.replication_factor == -1
          else t.replication_factor)
    if rf <= 0:
        raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR,
                         "Replication factor must be larger than 0, or -1 to use the default "
                         "value.")
    if rf > 1:  # Kafka's placement words, this broker the only one available
        raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR,
                         f"Replication factor: {rf} larger than available brokers: 1.")
    return ctx.config["num.partitions"] if t.num_partitions == -1 else t.num_partitions


def _manual_assignment(t: Any, node_id: int) -> int:
    """Kafka's checks on a manual assignment (ReplicationControlManager.createTopic), in its
    order and words; this broker is the only one registered. Returns the partition count."""
    cluster_admin.check_manual_shape(t)
    try:
        placed = validate_manual_assignment(
            ((a.partition_index, list(a.broker_ids)) for a in t.assignments), {node_id})
    except PlacementError as e:
        raise KafkaError(e.error_code, e.message) from None
    return len(placed)
