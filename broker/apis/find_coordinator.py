"""FindCoordinator (key 10): this broker coordinates every group (v0-v3 one key, v4+ a batch).

Transactions are not served, so a transactional key (key_type 1) gets
COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import FindCoordinatorResponse

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

GROUP = 0


def handle(ctx: ApiContext, request: Request) -> FindCoordinatorResponse:
    req = request.body
    key_type = getattr(req, "key_type", GROUP)
    host, port = (ctx.node.host, ctx.node.port)
    if key_type == GROUP:
        error, node, message = ErrorCode.NONE, ctx.node.node_id, None
    else:
        error, node, message = ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "no transactions"
        host, port = "", -1
    if request.version >= 4:
        coordinators = [
            FindCoordinatorResponse.Coordinator(key=key, node_id=node, host=host, port=port,
                                                error_code=error, error_message=message)
            for key in req.coordinator_keys
        ]
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=error, error_message=message,
                                   node_id=node, host=host, port=port)
