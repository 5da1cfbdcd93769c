"""EndTxn (key 26): commit or abort the producer's transaction.

Answered once PrepareCommit or PrepareAbort is durable in `__transaction_state`; the markers are
written after the answer (the coordinator completes the transaction on its own). Served v0-v4:
v5 means transaction version 2 (an epoch bump per transaction), which this broker does not
advertise. Before v2 PRODUCER_FENCED is answered as INVALID_PRODUCER_EPOCH, as Kafka does.
Needs WRITE on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, nothing ended).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.producer import EndTxnResponse

from broker.apis.authorize import allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 26  # EndTxn
VERSIONS = range(0, 5)


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    if not allowed(ctx, request, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                   req.transactional_id):
        return _answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)

    def build(error: ErrorCode) -> EndTxnResponse:
        if error == ErrorCode.PRODUCER_FENCED and request.version < 2:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return _answer(error)

    result = ctx.transactions.end_txn(req.transactional_id, req.producer_id, req.producer_epoch,
                                      req.committed)
    return result.then(build)


def _answer(error: ErrorCode) -> EndTxnResponse:
    return EndTxnResponse(throttle_time_ms=0, error_code=error)
