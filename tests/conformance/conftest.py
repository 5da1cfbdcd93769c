"""Conformance suite: each client used the way its users use it (consumer groups, commits,
the idempotent producer, admin), against a real broker on loopback.

`group_broker` is a broker tuned so that group tests are quick but not different in kind:
the first rebalance waits a little for more members (as Kafka's 3 s default does), the offsets
topic is small, and short sessions are allowed so a dead member is noticed in seconds.
"""

from __future__ import annotations

import pytest

from tests.support.broker import BrokerProcess

GROUP_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "300",
    "group.min.session.timeout.ms": "1000",
    "offsets.topic.num.partitions": "3",
}


@pytest.fixture
def group_broker(broker_factory) -> BrokerProcess:
    return broker_factory(GROUP_OVERRIDES)
