"""WriteTxnMarkers (key 27): end-transaction markers written on a coordinator's behalf (Kafka's
brokers send it to partition leaders; the admin client's abortTransaction sends it too).

Each marker is appended to its partitions with acks=all through the ReplicaManager; an unknown
partition is UNKNOWN_TOPIC_OR_PARTITION without an append, and in cluster mode a partition the
cluster has but another broker leads is NOT_LEADER_OR_FOLLOWER (the coordinator then finds
the new leader), as Kafka's appendRecords answers. Once markers on `__consumer_offsets`
are written the group coordinator materializes (or drops) the producer's pending offsets, as
Kafka's handleWriteTxnMarkersRequest does; if that fails those partitions answer
UNKNOWN_SERVER_ERROR. Needs ALTER or CLUSTER_ACTION on the cluster: without either every
partition answers CLUSTER_AUTHORIZATION_FAILED and no marker is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
from kafka.protocol.producer import WriteTxnMarkersResponse

from broker.apis.authorize import cluster_allowed
from broker.replica.delayed_result import Completion, all_of, completed
from broker.security.acl import AclOperation
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 27  # WriteTxnMarkers
VERSIONS = range(0, 2)

logger = structlog.get_logger("broker.txn")

MarkerResult = WriteTxnMarkersResponse.WritableTxnMarkerResult
TopicResult = MarkerResult.WritableTxnMarkerTopicResult
PartitionResult = TopicResult.WritableTxnMarkerPartitionResult
TopicPartition = tuple[str, int]
OFFSETS_TOPIC = "__consumer_offsets"
REQUEST_TIMEOUT_MS = 30_000  # Kafka's request.timeout.ms bounds the append


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    markers = request.body.markers
    if not (cluster_allowed(ctx, request, AclOperation.ALTER, log_if_denied=False)
            or cluster_allowed(ctx, request, AclOperation.CLUSTER_ACTION)):
        denied = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return WriteTxnMarkersResponse(markers=[
            MarkerResult(producer_id=m.producer_id, topics=_topics(
                {(t.name, p): denied for t in m.topics for p in t.partition_indexes}))
            for m in markers])
    if not markers:
        return WriteTxnMarkersResponse(markers=[])
    return all_of([_write(ctx, m) for m in markers]).then(
        lambda written: WriteTxnMarkersResponse(markers=[
            MarkerResult(producer_id=m.producer_id, topics=_topics(errors))
            for m, errors in zip(markers, written, strict=True)]))


def _write(ctx: ApiContext, marker) -> Completion[dict[TopicPartition, ErrorCode]]:  # type: ignore[no-untyped-def]
    """One marker's partitions and their errors, once its appends are committed."""
    tps = [(t.name, p) for t in marker.topics for p in t.partition_indexes]
    served = ctx.replica_manager.partitions
    led_elsewhere = (set() if ctx.cluster is None
                     else ctx.cluster.not_led((tp for tp in tps if tp not in served), served))
    errors = {tp: (ErrorCode.NOT_LEADER_OR_FOLLOWER if tp in led_elsewhere
                   else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
              for tp in tps if tp not in served}
    known = [tp for tp in tps if tp not in errors]
    if not known:
        return completed(errors)
    commit = bool(marker.transaction_result)
    written = ctx.replica_manager.write_txn_markers(
        marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, commit, known,
        REQUEST_TIMEOUT_MS)

    def appended(outcome: dict[TopicPartition, ErrorCode]) -> dict[TopicPartition, ErrorCode]:
        results = {**errors, **outcome}
        offsets = [tp for tp, e in results.items() if tp[0] == OFFSETS_TOPIC and e == 0]
        if offsets:
            try:
                ctx.groups.handle_txn_completion(  # type: ignore[attr-defined]
                    marker.producer_id, [p for _t, p in offsets], commit)
            except Exception:
                logger.exception("offsets not materialized after markers",
                                 producer_id=marker.producer_id)
                results.update({tp: ErrorCode.UNKNOWN_SERVER_ERROR for tp in offsets})
        return results

    return written.then(appended)


def _topics(errors: dict[TopicPartition, ErrorCode]) -> list:
    topics: dict[str, list] = {}
    for (topic, index), error in errors.items():
        topics.setdefault(topic, []).append(PartitionResult(partition_index=index,
                                                            error_code=error))
    return [TopicResult(name=t, partitions=ps) for t, ps in topics.items()]
