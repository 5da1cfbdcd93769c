"""Produce (key 0): validate, assign offsets and append in arrival order, answer per acks.

acks=0 gets no response; acks=1 answers once appended (after the fsync when the partition's
policy flushes every message); acks=-1 once the high watermark covers the batch. The
ReplicaManager decides and parks; the handler never waits, a parked request answers later.
Transactional batches need the request's transactional id (Kafka answers every partition
TRANSACTIONAL_ID_AUTHORIZATION_FAILED without one); the ReplicaManager then checks each
partition is in the transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.producer import ProduceResponse

from broker.apis.deferred import answer_later
from broker.replica_manager import ProduceResult, ProduceResults
from protocol.errors import ErrorCode
from protocol.record_batch import RECORD_BATCH_OVERHEAD, BatchHeader

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

TopicResponse = ProduceResponse.TopicProduceResponse
PartitionResponse = TopicResponse.PartitionProduceResponse
RecordError = PartitionResponse.BatchIndexAndErrorMessage


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    entries = [
        ((topic.name, p.index), p.records)
        for topic in req.topic_data
        for p in topic.partition_data
    ]
    if req.transactional_id is None and any(_transactional(r) for _, r in entries):
        error = ProduceResult(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        return None if req.acks == 0 else _response({tp: error for tp, _ in entries})
    results = ctx.replica_manager.append_records(entries, request.version, req.acks,
                                                 req.timeout_ms,
                                                 transactional_id=req.transactional_id)
    if req.acks == 0:
        return None
    if isinstance(results, dict):
        return _response(results)
    return answer_later(results, _response)


def _transactional(records: bytes | None) -> bool:
    """Kafka's hasTransactionalRecords: the first batch of the partition is transactional."""
    if not records or len(records) < RECORD_BATCH_OVERHEAD:
        return False
    return BatchHeader(records).is_transactional


def _response(results: ProduceResults) -> ProduceResponse:
    by_topic: dict[str, list[PartitionResponse]] = {}
    for (topic, index), r in results.items():
        by_topic.setdefault(topic, []).append(
            PartitionResponse(
                index=index, error_code=r.error,
                base_offset=r.base_offset if r.error == ErrorCode.NONE else -1,
                log_append_time_ms=r.log_append_time, log_start_offset=r.log_start_offset,
                record_errors=[RecordError(batch_index=i, batch_index_error_message=m)
                               for i, m in r.record_errors],
                error_message=r.message,
            )
        )
    return ProduceResponse(
        responses=[TopicResponse(name=t, partition_responses=ps) for t, ps in by_topic.items()],
        throttle_time_ms=0,
    )
