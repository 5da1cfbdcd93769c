"""TxnOffsetCommit (key 28): a transactional producer commits a group's offsets (KIP-98).

v0-v4 (v5 is transaction version 2 only: it implies AddOffsetsToTxn). v2 adds the leader
epoch, v3 the member id, group instance id and generation, checked against the group as a
plain commit is (KIP-447); v4 lets the broker answer TRANSACTION_ABORTABLE, which older
clients get as INVALID_TXN_STATE.

As Kafka 3.6+ (KIP-890 part 1), the group's __consumer_offsets partition must be in the
producer's ongoing transaction (AddOffsetsToTxn) unless the producer's transaction is already
open in that partition's log: asked of the transaction coordinator first, its refusal is the
answer for every partition. The offsets stay pending until the transaction's marker.

Authorization first, as Kafka's: WRITE on the transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED) then READ on the group (GROUP_AUTHORIZATION_FAILED), each
for every partition; then READ on each topic (TOPIC_AUTHORIZATION_FAILED for its partitions, the
others committed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.producer import TxnOffsetCommitResponse

from broker.apis.authorize import allowed
from broker.apis.offset_commit import requested_offsets, split_readable
from broker.group.offset_cache import OffsetAndMetadata
from broker.group.offsets import offset_commit_error
from broker.group.offsets_store import TOPIC
from broker.replica.delayed_result import Completion, chain, completed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 28  # TxnOffsetCommit
VERSIONS = range(0, 5)

Topic = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
Partition = Topic.TxnOffsetCommitResponsePartition
TopicPartition = tuple[str, int]
#: What the check refuses, by partition; None when the offsets may be committed.
Refusal = dict[TopicPartition, ErrorCode] | None
#: From this version the client understands TRANSACTION_ABORTABLE (Kafka's genericError).
ABORTABLE_VERSION = 4


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    version = request.version
    offsets = requested_offsets(req, ctx.clock.wall_ms())
    generation_id = getattr(req, "generation_id", -1)
    member_id = getattr(req, "member_id", "") or ""
    instance_id = getattr(req, "group_instance_id", None)
    denied: dict[TopicPartition, ErrorCode] = {}
    if ctx.authorizer.enabled:
        if not allowed(ctx, request, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                       req.transactional_id):
            return _response({tp: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
                              for tp in offsets}, version)
        if not allowed(ctx, request, AclOperation.READ, ResourceType.GROUP, req.group_id):
            return _response({tp: ErrorCode.GROUP_AUTHORIZATION_FAILED for tp in offsets},
                             version)
        offsets, denied = split_readable(ctx, request, offsets)
        if not offsets:
            return _response(denied, version)
    def commit(refusal: dict[TopicPartition, ErrorCode] | None
               ) -> Completion[TxnOffsetCommitResponse]:
        if refusal is not None:
            return completed(_response({**refusal, **denied}, version))
        result = ctx.groups.commit_transactional_offsets(
            req.group_id, req.producer_id, req.producer_epoch, member_id, instance_id,
            generation_id, offsets)
        return result.then(lambda r: _response({**r, **denied}, version))

    verified = _verify(ctx, req.transactional_id, req.producer_id, req.producer_epoch,
                       req.group_id, offsets, version)
    if isinstance(verified, Completion):  # asked of the coordinator on another broker
        return chain(verified, commit)
    return commit(verified)


def _verify(ctx: ApiContext, transactional_id: str, producer_id: int, producer_epoch: int,
            group_id: str, offsets: dict[TopicPartition, OffsetAndMetadata], version: int
            ) -> Refusal | Completion[Refusal]:
    """The KIP-890 check, as Kafka's handleTxnCommitOffsets makes it: after the unknown
    partitions are answered and the group id is judged, before the group is. None: go on.
    In a cluster whose transaction coordinator for ``transactional_id`` is another broker,
    it is asked there (AddPartitionsToTxn, verify only), answered later."""
    if not group_id:
        return None
    partitions = ctx.replica_manager.partitions
    known = [tp for tp in offsets if tp in partitions]
    if not known:
        return None
    offsets_tp = (TOPIC, ctx.groups.partition_for(group_id))
    offsets_partition = partitions.get(offsets_tp)
    if offsets_partition is not None and not offsets_partition.offline:
        entry = offsets_partition.log.producer_state.last_entry(producer_id)
        if entry is not None and entry.current_txn_first_offset >= 0:
            return None  # the transaction is open there already (Kafka's hasOngoingTransaction)
    remote = ctx.replica_manager.verify_transaction_remote
    pending = (remote(transactional_id, producer_id, producer_epoch, [offsets_tp])
               if remote is not None else None)
    if pending is not None:
        return pending.then(lambda errors: _refusal(
            errors.get(offsets_tp, ErrorCode.NONE), offsets, known, version))
    error = ctx.transactions.verify_partition(transactional_id, producer_id, producer_epoch,
                                              offsets_tp)
    return _refusal(error, offsets, known, version)


def _refusal(error: ErrorCode, offsets: dict[TopicPartition, OffsetAndMetadata],
             known: list[TopicPartition], version: int) -> Refusal:
    """None when verified; else each partition's error (unknown ones stay unknown)."""
    if error == ErrorCode.NONE:
        return None
    error = _client_error(ErrorCode(error), version)
    return {tp: (error if tp in known else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            for tp in offsets}


def _client_error(error: ErrorCode, version: int) -> ErrorCode:
    """A verification refusal as Kafka's AddPartitionsToTxnManager and
    maybeConvertOffsetCommitError hand it to a producer of this request version."""
    if error == ErrorCode.PRODUCER_FENCED:
        error = ErrorCode.INVALID_PRODUCER_EPOCH  # what producers expect to handle here
    elif error == ErrorCode.TRANSACTION_ABORTABLE and version < ABORTABLE_VERSION:
        error = ErrorCode.INVALID_TXN_STATE
    return offset_commit_error(error)


def _response(results: dict[TopicPartition, ErrorCode], version: int
              ) -> TxnOffsetCommitResponse:
    topics: dict[str, list[Partition]] = {}
    for (topic, index), error in results.items():
        if version < 2 and error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            # Producers before 2.0 crash on the loading error (Kafka answers them this).
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        topics.setdefault(topic, []).append(Partition(partition_index=index, error_code=error))
    return TxnOffsetCommitResponse(
        throttle_time_ms=0, topics=[Topic(name=t, partitions=ps) for t, ps in topics.items()])
