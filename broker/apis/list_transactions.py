"""ListTransactions (key 66): the transactional ids this coordinator knows, filtered by state
names and producer ids (every filter given must match; unknown state names are echoed back),
and from v1 by duration: only transactions running longer than ``duration_filter`` ms. Only the
ids the principal may DESCRIBE are listed (no error), as Kafka answers. In cluster mode, the
ids of the `__transaction_state` partitions this broker leads; COORDINATOR_LOAD_IN_PROGRESS
(nothing listed) while one of them is loading."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import ListTransactionsResponse

from broker.apis.authorize import allowed
from broker.security.acl import AclOperation, ResourceType

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 66  # ListTransactions
VERSIONS = range(0, 2)

State = ListTransactionsResponse.TransactionState


def handle(ctx: ApiContext, request: Request) -> ListTransactionsResponse:
    req = request.body
    result = ctx.transactions.list_transactions(
        req.producer_id_filters, req.state_filters, getattr(req, "duration_filter", -1))
    listed = result.transactions
    if ctx.authorizer.enabled:
        listed = [t for t in listed if allowed(ctx, request, AclOperation.DESCRIBE,
                                               ResourceType.TRANSACTIONAL_ID, t.transactional_id)]
    return ListTransactionsResponse(
        throttle_time_ms=0, error_code=result.error,
        unknown_state_filters=result.unknown_state_filters,
        transaction_states=[State(transactional_id=t.transactional_id, producer_id=t.producer_id,
                                  transaction_state=t.state) for t in listed])
