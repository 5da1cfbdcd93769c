"""InitProducerId (key 22): a producer id and epoch for the idempotent producer.

Transactions are not served: a transactional id is refused. From v3 a producer may present its
current id and epoch to have the epoch bumped (KIP-360), which resets its sequence numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.producer import InitProducerIdResponse

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

_MAX_EPOCH = 32767


def handle(ctx: ApiContext, request: Request) -> InitProducerIdResponse:
    req = request.body
    if req.transactional_id is not None:
        return _answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
    pid = getattr(req, "producer_id", -1)
    epoch = getattr(req, "producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < _MAX_EPOCH - 1:
        return _answer(ErrorCode.NONE, pid, epoch + 1)
    return _answer(ErrorCode.NONE, ctx.producer_ids.generate(), 0)


def _answer(error: ErrorCode, pid: int, epoch: int) -> InitProducerIdResponse:
    return InitProducerIdResponse(throttle_time_ms=0, error_code=error, producer_id=pid,
                                  producer_epoch=epoch)
