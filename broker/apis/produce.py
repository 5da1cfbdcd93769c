"""Produce (key 0): validate, assign offsets and append in arrival order, answer per acks.

acks=0 gets no response; acks=1 answers once appended (after the fsync when the partition's
policy flushes every message); acks=-1 parks a DelayedProduce until the high watermark covers
the batch. The handler never waits: a parked request answers later through its future.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.producer import ProduceResponse

from broker.delayed_produce import DelayedProduce
from broker.replica_manager import ProduceResult, TopicPartition
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.network.request import Request
    from broker.server import Broker

TopicResponse = ProduceResponse.TopicProduceResponse
PartitionResponse = TopicResponse.PartitionProduceResponse
RecordError = PartitionResponse.BatchIndexAndErrorMessage


def handle(broker: Broker, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    entries = [
        ((topic.name, p.index), p.records)
        for topic in req.topic_data
        for p in topic.partition_data
    ]
    rm = broker.rm
    if req.acks not in (0, 1, -1):
        results = {tp: ProduceResult(ErrorCode.INVALID_REQUIRED_ACKS) for tp, _ in entries}
    else:
        results = rm.append_records(entries, request.version)
    if req.acks == 0:
        return None

    def respond(res: dict[TopicPartition, ProduceResult]) -> ProduceResponse:
        return _response(res)

    waits = req.acks == -1 or any(
        (p := rm.partitions.get(tp)) is not None and p.hw_gated_by_flush for tp in results
    )
    if not waits:
        return _response(results)
    op = DelayedProduce(req.timeout_ms, rm, results, respond)
    rm.produce_purgatory.try_complete_else_watch(op, list(results))
    return op.future


def _response(results: dict[TopicPartition, ProduceResult]) -> ProduceResponse:
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
