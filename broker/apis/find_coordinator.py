"""FindCoordinator (key 10): this broker coordinates every group and every transactional id (v0-v3
one key, v4+ a batch).

A transactional key creates `__transaction_state` on first use, as Kafka's auto topic creation
does for it; the topic is local here, so the answer names this node at once instead of a
COORDINATOR_NOT_AVAILABLE to retry. Key types other than group (0) and transaction (1) are an
INVALID_REQUEST (no share coordinator is served).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import FindCoordinatorResponse

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

GROUP = 0
TRANSACTION = 1


def handle(ctx: ApiContext, request: Request) -> FindCoordinatorResponse:
    req = request.body
    key_type = getattr(req, "key_type", GROUP)
    error, message = _coordinator(ctx, key_type)
    node, host, port = ctx.node.node_id, ctx.node.host, ctx.node.port
    if error != ErrorCode.NONE:
        node, host, port = -1, "", -1
    if request.version >= 4:
        coordinators = [
            FindCoordinatorResponse.Coordinator(key=key, node_id=node, host=host, port=port,
                                                error_code=error, error_message=message)
            for key in req.coordinator_keys
        ]
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=error, error_message=message,
                                   node_id=node, host=host, port=port)


def _coordinator(ctx: ApiContext, key_type: int) -> tuple[ErrorCode, str | None]:
    if key_type == GROUP:
        return ErrorCode.NONE, None
    if key_type != TRANSACTION:
        return ErrorCode.INVALID_REQUEST, f"unknown coordinator type {key_type}"
    if ctx.transactions is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, "no transaction coordinator"
    ctx.transactions.ensure_topic()
    return ErrorCode.NONE, None
