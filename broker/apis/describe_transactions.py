"""DescribeTransactions (key 65): each transactional id's state as its coordinator knows it.

As Kafka: an unknown (or expiring) id is TRANSACTIONAL_ID_NOT_FOUND, an empty one
INVALID_REQUEST; the partitions are those still waiting for a marker while the transaction ends.
Each id needs DESCRIBE (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and only the topics the principal
may DESCRIBE are listed, as Kafka answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeTransactionsResponse

from broker.apis.authorize import allowed, filter_allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 65  # DescribeTransactions
VERSIONS = range(0, 1)

State = DescribeTransactionsResponse.TransactionState
Topic = State.TopicData


def handle(ctx: ApiContext, request: Request) -> DescribeTransactionsResponse:
    states = []
    on = ctx.authorizer.enabled
    for tid in request.body.transactional_ids:
        if on and not allowed(ctx, request, AclOperation.DESCRIBE,
                              ResourceType.TRANSACTIONAL_ID, tid):
            states.append(_state(tid, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "", 0, 0,
                                 0, 0, {}))
            continue
        d = ctx.transactions.describe(tid)
        topics: dict[str, list[int]] = {}
        for topic, index in d.partitions:
            topics.setdefault(topic, []).append(index)
        if on and topics:
            described = filter_allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.TOPIC,
                                       topics)
            topics = {t: ps for t, ps in topics.items() if t in described}
        states.append(_state(tid, d.error, d.state, d.timeout_ms, d.start_time_ms,
                             d.producer_id, d.producer_epoch, topics))
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=states)


def _state(tid: str, error: ErrorCode, state: str, timeout_ms: int, start_ms: int, pid: int,
           epoch: int, topics: dict[str, list[int]]) -> State:
    return State(error_code=error, transactional_id=tid, transaction_state=state,
                 transaction_timeout_ms=timeout_ms, transaction_start_time_ms=start_ms,
                 producer_id=pid, producer_epoch=epoch,
                 topics=[Topic(topic=t, partitions=ps) for t, ps in topics.items()])
