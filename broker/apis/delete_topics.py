"""DeleteTopics (key 20): by name, or by topic id from v6."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DeleteTopicsResponse

from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

Result = DeleteTopicsResponse.DeletableTopicResult


def handle(ctx: ApiContext, request: Request) -> DeleteTopicsResponse:
    req = request.body
    if request.version >= 6:
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    results = []
    for name, topic_id in wanted:
        if name is None:
            info = ctx.topics.metadata.by_id.get(topic_id)
            if info is None:
                results.append(Result(name=None, topic_id=topic_id,
                                      error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                                      error_message="unknown topic id"))
                continue
            name = info.name
        try:
            info = ctx.topics.delete_topic(name)
            results.append(Result(name=name, topic_id=info.topic_id, error_code=0,
                                  error_message=None))
        except KafkaError as exc:
            results.append(Result(name=name, topic_id=topic_id, error_code=exc.error_code,
                                  error_message=str(exc)))
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)
