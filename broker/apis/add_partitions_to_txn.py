"""AddPartitionsToTxn (key 24): partitions join a producer's transaction before it writes to them.

v0-v3 come from clients: one transactional id. v4+ (KIP-890) come from brokers: a batch of
transactions, each of which may be ``verify_only`` (is the partition already in the
transaction?). As Kafka's KafkaApis: an unknown partition fails the whole transaction
(UNKNOWN_TOPIC_OR_PARTITION for it, OPERATION_NOT_ATTEMPTED for the others), a client may not add
an internal topic's partition itself (TOPIC_AUTHORIZATION_FAILED: offsets join through
AddOffsetsToTxn), and before v2 PRODUCER_FENCED is answered as INVALID_PRODUCER_EPOCH.

Authorization as Kafka's: v4+ comes from brokers and needs CLUSTER_ACTION on the cluster (the
whole request CLUSTER_AUTHORIZATION_FAILED); v0-v3 need WRITE on the transactional id (every
partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and WRITE on each topic (a refused topic's
partitions TOPIC_AUTHORIZATION_FAILED, failing the transaction as an unknown partition does).
In a cluster a partition is known when the cluster has it, whichever broker leads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.producer import AddPartitionsToTxnResponse

from broker.apis.authorize import allowed, cluster_allowed, filter_allowed
from broker.replica.delayed_result import Completion, all_of, completed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 24  # AddPartitionsToTxn
VERSIONS = range(0, 6)

TopicResult = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
PartitionResult = TopicResult.AddPartitionsToTxnPartitionResult
TxnResult = AddPartitionsToTxnResponse.AddPartitionsToTxnResult
TopicPartition = tuple[str, int]
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    version = request.version
    if version >= 4 and not cluster_allowed(ctx, request, AclOperation.CLUSTER_ACTION):
        return AddPartitionsToTxnResponse(throttle_time_ms=0,
                                          error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                          results_by_transaction=[])
    if version < 4:
        txns = [(req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                 req.v3_and_below_producer_epoch, False, req.v3_and_below_topics)]
    else:
        txns = [(t.transactional_id, t.producer_id, t.producer_epoch, t.verify_only, t.topics)
                for t in req.transactions]
    ids = [t[0] for t in txns]
    pending = [_one(ctx, request, version, *t) for t in txns]
    return all_of(pending).then(
        lambda results: _response(version, list(zip(ids, results, strict=True))))


def _one(ctx: ApiContext, request: Request, version: int, tid: str, pid: int, epoch: int,
         verify_only: bool, topics: list) -> Completion[dict[TopicPartition, ErrorCode]]:
    """One transaction's partitions and their errors (now, or once its log write commits)."""
    tps = [(t.name, p) for t in topics for p in t.partitions]
    writable: set[str] | None = None  # None: every topic (from a broker, or ACLs off)
    if version < 4 and ctx.authorizer.enabled:
        if not allowed(ctx, request, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            return completed({tp: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for tp in tps})
        writable = filter_allowed(ctx, request, AclOperation.WRITE, ResourceType.TOPIC,
                                  (t for t, _p in tps if t not in INTERNAL_TOPICS))
    failed: dict[TopicPartition, ErrorCode] = {}
    served = ctx.replica_manager.partitions
    # In a cluster a partition led by another broker exists too (Kafka: the metadata cache).
    elsewhere = ctx.cluster.not_led(tps, served) if ctx.cluster is not None else set()
    for tp in tps:
        if version < 4 and (tp[0] in INTERNAL_TOPICS
                            or (writable is not None and tp[0] not in writable)):
            failed[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif tp not in served and tp not in elsewhere:
            failed[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if failed:
        return completed({tp: failed.get(tp, ErrorCode.OPERATION_NOT_ATTEMPTED) for tp in tps})
    if verify_only:
        return completed(ctx.transactions.verify_partitions(tid, pid, epoch, tps))

    def per_partition(error: ErrorCode) -> dict[TopicPartition, ErrorCode]:
        if error == ErrorCode.PRODUCER_FENCED and version < 2:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return {tp: error for tp in tps}

    return ctx.transactions.add_partitions(tid, pid, epoch, tps).then(per_partition)


def _topic_results(errors: dict[TopicPartition, ErrorCode]) -> list:
    topics: dict[str, list] = {}
    for (topic, index), error in errors.items():
        topics.setdefault(topic, []).append(
            PartitionResult(partition_index=index, partition_error_code=error))
    return [TopicResult(name=t, results_by_partition=ps) for t, ps in topics.items()]


def _response(version: int, results: list[tuple[str, dict[TopicPartition, ErrorCode]]]
              ) -> AddPartitionsToTxnResponse:
    if version < 4:
        [(_tid, errors)] = results
        return AddPartitionsToTxnResponse(throttle_time_ms=0,
                                          results_by_topic_v3_and_below=_topic_results(errors))
    return AddPartitionsToTxnResponse(
        throttle_time_ms=0, error_code=ErrorCode.NONE,
        results_by_transaction=[TxnResult(transactional_id=tid, topic_results=_topic_results(e))
                                for tid, e in results])
