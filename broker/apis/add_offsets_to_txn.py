"""AddOffsetsToTxn (key 25): the group's `__consumer_offsets` partition joins the transaction, so
its TxnOffsetCommit becomes visible (or not) with the transaction's marker. Before v2
PRODUCER_FENCED is answered as INVALID_PRODUCER_EPOCH, as Kafka's KafkaApis does. Needs WRITE on
the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then READ on the group
(GROUP_AUTHORIZATION_FAILED); refused, nothing joins the transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.producer import AddOffsetsToTxnResponse

from broker.apis.authorize import allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 25  # AddOffsetsToTxn
VERSIONS = range(0, 5)


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    if not allowed(ctx, request, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                   req.transactional_id):
        return _answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not allowed(ctx, request, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return _answer(ErrorCode.GROUP_AUTHORIZATION_FAILED)

    def build(error: ErrorCode) -> AddOffsetsToTxnResponse:
        if error == ErrorCode.PRODUCER_FENCED and request.version < 2:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return _answer(error)

    result = ctx.transactions.add_offsets(req.transactional_id, req.producer_id,
                                          req.producer_epoch, req.group_id)
    return result.then(build)


def _answer(error: ErrorCode) -> AddOffsetsToTxnResponse:
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=error)
