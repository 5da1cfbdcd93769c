"""CreateTopics (key 19)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import CreateTopicsResponse

from broker.metadata import validate_topic_configs, validate_topic_name
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

Result = CreateTopicsResponse.CreatableTopicResult
ConfigResult = Result.CreatableTopicConfigs


def handle(ctx: ApiContext, request: Request) -> CreateTopicsResponse:
    req = request.body
    results = []
    for t in req.topics:
        configs = {c.name: c.value for c in t.configs}
        partitions = ctx.config["num.partitions"] if t.num_partitions == -1 else t.num_partitions
        try:
            if t.assignments:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "manual replica assignment")
            if t.replication_factor not in (-1, 1):
                raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR,
                                 "replication factor must be 1: this cluster has one broker")
            if req.validate_only:
                validate_topic_name(t.name)
                validate_topic_configs(configs)
                if t.name in ctx.topics.metadata.topics:
                    raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"{t.name} exists")
                if partitions < 1:
                    raise KafkaError(ErrorCode.INVALID_PARTITIONS, "partitions < 1")
                info = None
            else:
                info = ctx.topics.create_topic(t.name, partitions, configs)
        except KafkaError as exc:
            results.append(Result(name=t.name, error_code=exc.error_code, error_message=str(exc),
                                  num_partitions=-1, replication_factor=-1, configs=None))
            continue
        effective = ctx.topics.topic_config(info)
        results.append(Result(
            name=t.name, topic_id=info.topic_id if info else None, error_code=0,
            error_message=None, num_partitions=partitions, replication_factor=1,
            configs=[ConfigResult(name=k, value=v, read_only=False,
                                  config_source=1 if k in configs else 5, is_sensitive=False)
                     for k, v in effective.items()],
        ))
    return CreateTopicsResponse(throttle_time_ms=0, topics=results)
