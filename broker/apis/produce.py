"""Produce (key 0): validate, assign offsets and append in arrival order, answer per acks.

acks=0 gets no response; acks=1 answers once appended (after the fsync when the partition's
policy flushes every message); acks=-1 once the high watermark covers the batch. The
ReplicaManager decides and parks; the handler never waits, a parked request answers later.
Transactional batches need the request's transactional id (Kafka answers every partition
TRANSACTIONAL_ID_AUTHORIZATION_FAILED without one, or without WRITE on it); the ReplicaManager
then checks each partition is in the transaction. With ACLs on, each topic needs WRITE
(TOPIC_AUTHORIZATION_FAILED for its partitions, nothing appended); with them off the only
cost is one attribute test. In cluster mode a partition of the cluster this broker does not
lead answers NOT_LEADER_OR_FOLLOWER; from v10 such a partition names its current leader
(CurrentLeader) and the answer lists the leaders' endpoints (NodeEndpoints), as Kafka does.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from kafka.protocol.producer import ProduceResponse

from broker.apis.authorize import allowed, filter_allowed
from broker.apis.current_leader import (
    PRODUCE_CURRENT_LEADER_VERSION,
    PRODUCE_LEADER_ERRORS,
    current_leaders,
)
from broker.replica.replica_manager import ProduceResult, ProduceResults
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode
from protocol.record_batch import RECORD_BATCH_OVERHEAD, BatchHeader
from protocol.templates import SinglePartitionProduceResponse

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 0  # Produce
VERSIONS = range(3, 12)
# Advertised from v0 as Kafka 4 does (librdkafka before 2.x otherwise refuses to compress);
# v0-v2 requests are still refused.
ADVERTISED_VERSIONS = range(0, 12)

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
    tid = req.transactional_id
    if ctx.authorizer.enabled:
        if any(_transactional(r) for _, r in entries) and (tid is None or not allowed(
                ctx, request, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, tid)):
            return _refuse_all(entries, req.acks)
        writable = filter_allowed(ctx, request, AclOperation.WRITE, ResourceType.TOPIC,
                                  (t.name for t in req.topic_data))
        denied = {tp: ProduceResult(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                  for tp, _ in entries if tp[0] not in writable}
        if denied:
            entries = [(tp, r) for tp, r in entries if tp not in denied]
            if not entries:
                return None if req.acks == 0 else _response(denied)
    else:
        if tid is None and any(_transactional(r) for _, r in entries):
            return _refuse_all(entries, req.acks)
        denied = {}
    if ctx.cluster is not None:
        not_led = ctx.cluster.not_led((tp for tp, _ in entries), ctx.replica_manager.partitions)
        if not_led:
            denied = {**denied, **{tp: ProduceResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                                   for tp in not_led}}
            entries = [(tp, r) for tp, r in entries if tp not in not_led]
            if not entries:
                return None if req.acks == 0 else _answer(ctx, request, denied)
    results = ctx.replica_manager.append_records(entries, request.version, req.acks,
                                                 req.timeout_ms, transactional_id=tid)
    if req.acks == 0:
        return None
    if denied:
        return results.then(lambda r: _answer(ctx, request, {**r, **denied}))
    if ctx.cluster is not None and request.version >= PRODUCE_CURRENT_LEADER_VERSION:
        # Leadership may move while the request waits: the answer may need the new leader.
        return results.then(partial(_answer, ctx, request))
    return results.then(_response)


def _answer(ctx: ApiContext, request: Request, results: ProduceResults
            ) -> ProduceResponse | SinglePartitionProduceResponse:
    """The answer; from v10 a partition refused NOT_LEADER_OR_FOLLOWER names its current
    leader and the answer carries the leaders' endpoints (Kafka's handleProduceRequest)."""
    if request.version < PRODUCE_CURRENT_LEADER_VERSION:
        return _response(results)
    refused = [tp for tp, r in results.items() if r.error in PRODUCE_LEADER_ERRORS]
    if not refused:
        return _response(results)
    found = current_leaders(ctx, request, refused)
    response = _full_response(results)
    for topic in response.responses:
        for p in topic.partition_responses:
            leader = found.leaders.get((topic.name, p.index))
            if leader is not None:
                p.current_leader = PartitionResponse.LeaderIdAndEpoch(
                    leader_id=leader[0], leader_epoch=leader[1])
    response.node_endpoints = [
        ProduceResponse.NodeEndpoint(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack)
        for e in found.endpoints]
    return response


def _refuse_all(entries: list, acks: int) -> ProduceResponse | None:
    """Kafka's error response: every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
    error = ProduceResult(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    return None if acks == 0 else _response({tp: error for tp, _ in entries})


def _transactional(records: bytes | None) -> bool:
    """Kafka's hasTransactionalRecords: the first batch of the partition is transactional."""
    if not records or len(records) < RECORD_BATCH_OVERHEAD:
        return False
    return BatchHeader(records).is_transactional


def _response(results: ProduceResults) -> ProduceResponse | SinglePartitionProduceResponse:
    if len(results) == 1:  # the common case, packed from a fixed layout
        (((topic, index), r),) = results.items()
        if not r.record_errors and r.message is None:
            return SinglePartitionProduceResponse(
                topic, index, r.error, r.base_offset if r.error == ErrorCode.NONE else -1,
                r.log_append_time, r.log_start_offset)
    return _full_response(results)


def _full_response(results: ProduceResults) -> ProduceResponse:
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
