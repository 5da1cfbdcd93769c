"""InitProducerId (key 22): a producer id and epoch for an idempotent or transactional producer.

Without a transactional id any broker hands out a new id (from v3 a producer may present its
current id and epoch to have the epoch bumped, KIP-360, which resets its sequence numbers). With
one, the transaction coordinator answers: the id's producer id at its next epoch, which fences
every older instance. Before v4 a client does not know PRODUCER_FENCED and is told
INVALID_PRODUCER_EPOCH instead, as Kafka's KafkaApis does.

Authorization, checked first: a transactional producer needs WRITE on its transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED); an idempotent one IDEMPOTENT_WRITE on the cluster or
WRITE on some topic (CLUSTER_AUTHORIZATION_FAILED), as Kafka 3+ allows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.producer import InitProducerIdResponse

from broker.apis.authorize import allowed, allowed_any, cluster_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request
    from broker.txn import InitProducerIdResult

API_KEY = 22  # InitProducerId
VERSIONS = range(0, 6)

_MAX_EPOCH = 32767
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    pid = getattr(req, "producer_id", NO_PRODUCER_ID)
    epoch = getattr(req, "producer_epoch", NO_PRODUCER_EPOCH)
    if ctx.authorizer.enabled:
        denied = _denied(ctx, request, req.transactional_id)
        if denied is not None:
            return _answer(denied, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    if req.transactional_id is None:
        if pid >= 0 and 0 <= epoch < _MAX_EPOCH - 1:
            return _answer(ErrorCode.NONE, pid, epoch + 1)
        try:
            return _answer(ErrorCode.NONE, ctx.producer_ids.generate(), 0)
        except KafkaError as e:  # no producer id block at hand yet: the client retries
            return _answer(ErrorCode(e.error_code), NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    if (pid == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
        return _answer(ErrorCode.INVALID_REQUEST, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    expected = (pid, epoch) if pid != NO_PRODUCER_ID else None
    result = ctx.transactions.init_producer_id(req.transactional_id, req.transaction_timeout_ms,
                                               expected)

    def build(r: InitProducerIdResult) -> InitProducerIdResponse:
        error = r.error
        if error == ErrorCode.PRODUCER_FENCED and request.version < 4:
            error = ErrorCode.INVALID_PRODUCER_EPOCH
        return _answer(error, r.producer_id, r.producer_epoch)

    return result.then(build)


def _denied(ctx: ApiContext, request: Request, tid: str | None) -> ErrorCode | None:
    if tid is not None:
        if allowed(ctx, request, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            return None
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if cluster_allowed(ctx, request, AclOperation.IDEMPOTENT_WRITE,
                       log_if_denied=False) or allowed_any(
            ctx, request, AclOperation.WRITE, ResourceType.TOPIC):
        return None
    return ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def _answer(error: ErrorCode, pid: int, epoch: int) -> InitProducerIdResponse:
    return InitProducerIdResponse(throttle_time_ms=0, error_code=error, producer_id=pid,
                                  producer_epoch=epoch)
