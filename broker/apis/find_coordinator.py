"""FindCoordinator (key 10): this broker coordinates every group and every transactional id (v0-v3
one key, v4+ a batch).

A group key creates `__consumer_offsets` and a transactional key `__transaction_state` on first
use, as Kafka's auto topic creation does for them; the topic is local here, so the answer names
this node at once instead of a COORDINATOR_NOT_AVAILABLE to retry. Key types other than group
(0) and transaction (1) are an INVALID_REQUEST (no share coordinator is served). With ACLs on,
each key needs DESCRIBE on its group (GROUP_AUTHORIZATION_FAILED) or transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED), checked first, as Kafka's getCoordinator does. The node
answered is this listener's advertised endpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import FindCoordinatorResponse

from broker.apis.authorize import MESSAGES, allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 10  # FindCoordinator
VERSIONS = range(0, 6)

GROUP = 0
TRANSACTION = 1


def handle(ctx: ApiContext, request: Request) -> FindCoordinatorResponse:
    req = request.body
    key_type = getattr(req, "key_type", GROUP)
    host, port = ctx.node.address(request.connection.session.listener)
    node = ctx.node.node_id
    if request.version >= 4:
        coordinators = []
        for key in req.coordinator_keys:
            error, message = _coordinator(ctx, request, key_type, key)
            found = error == ErrorCode.NONE
            coordinators.append(FindCoordinatorResponse.Coordinator(
                key=key, node_id=node if found else -1, host=host if found else "",
                port=port if found else -1, error_code=error, error_message=message))
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    error, message = _coordinator(ctx, request, key_type, req.key)
    if error != ErrorCode.NONE:
        return FindCoordinatorResponse(throttle_time_ms=0, error_code=error,
                                       error_message=message, node_id=-1, host="", port=-1)
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=error, error_message=message,
                                   node_id=node, host=host, port=port)


def _denied(ctx: ApiContext, request: Request, key_type: int, key: str) -> ErrorCode | None:
    if key_type == GROUP and not allowed(ctx, request, AclOperation.DESCRIBE,
                                         ResourceType.GROUP, key):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED
    if key_type == TRANSACTION and not allowed(ctx, request, AclOperation.DESCRIBE,
                                               ResourceType.TRANSACTIONAL_ID, key):
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return None


def _coordinator(ctx: ApiContext, request: Request, key_type: int, key: str
                 ) -> tuple[ErrorCode, str | None]:
    if ctx.authorizer.enabled and (denied := _denied(ctx, request, key_type, key)) is not None:
        # Before v4 Kafka's error response carries the error's own message; v4+ none.
        return denied, MESSAGES[denied] if request.version < 4 else None
    if key_type == GROUP:
        ctx.groups.store.ensure_topic()
        return ErrorCode.NONE, None
    if key_type != TRANSACTION:
        return ErrorCode.INVALID_REQUEST, f"unknown coordinator type {key_type}"
    ctx.transactions.ensure_topic()
    return ErrorCode.NONE, None
