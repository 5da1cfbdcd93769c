"""A lone consumer in a group, with the broker's defaults, is assigned as soon as Kafka would.

The most common group there is: one consumer, session.timeout.ms=6000, subscribing on a broker
whose group.initial.rebalance.delay.ms is the default 3000. Kafka answers its JoinGroup once
the delay has passed (~3 s) and the consumer reads at once. Extending the delay for the lone
member itself (to ~6 s), or expiring a member while its JoinGroup is parked, makes the consumer
late, or never assigned at all. For each client library the broker's own counters are read at
the moment the assignment arrives: one rebalance of the group, and one expiration in the join
purgatory (the initial delay running out once, not extended to a second).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.broker import BrokerProcess
from tests.support.clients import Rec, confluent_produce, create_topic, unique_topic

SESSION_MS = 6000
INITIAL_DELAY_S = 3.0  # the broker's default group.initial.rebalance.delay.ms
DEADLINE_S = 10.0  # how long a consumer is given to be assigned and read
VALUE = b"the only record"


@dataclass(frozen=True)
class Counts:
    """The broker's counters that tell how a group's first assignment came about."""

    rebalances: int  # rebalances the group started (classic join phases)
    join_expirations: int  # join-purgatory operations ended by their deadline (broker-wide)


Probe = Callable[[], Counts]


def broker_counts(metrics_port: int, group: str) -> Counts:
    """Scrape the broker's metrics endpoint for the group's rebalances and the join
    purgatory's expirations."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    rebalances = expirations = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "minibroker_group_rebalances_total" and s.labels.get("group") == group:
                rebalances += s.value
            elif (s.name == "minibroker_purgatory_completed_operations_total"
                  and s.labels == {"purgatory": "join", "by": "expiration"}):
                expirations += s.value
    return Counts(int(rebalances), int(expirations))


@dataclass
class Outcome:
    """What one consumer saw: seconds from subscribe to assignment, the broker's counters
    when the assignment arrived, and what it read."""

    assigned_after: float | None = None
    at_assignment: Counts | None = None
    assigned: set[tuple[str, int]] = field(default_factory=set)
    values: list[bytes] = field(default_factory=list)
    errors: list[object] = field(default_factory=list)

    def done(self) -> bool:
        return self.assigned_after is not None and bool(self.values)


@pytest.fixture(scope="module")
def default_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker with nothing overridden that touches groups."""
    broker = BrokerProcess(Path(tmp_path_factory.mktemp("lone-consumer"))).start()
    yield broker
    if broker.proc is not None and broker.proc.poll() is None:
        broker.kill()


def consume_confluent(bootstrap: str, topic: str, group: str, probe: Probe) -> Outcome:
    from confluent_kafka import Consumer

    out = Outcome()
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "broker.address.family": "v4",
        "group.id": group, "session.timeout.ms": SESSION_MS, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "fetch.wait.max.ms": 100, "error_cb": out.errors.append,
    })
    started = time.monotonic()

    def on_assign(_consumer, partitions) -> None:
        out.assigned_after = time.monotonic() - started
        out.at_assignment = probe()
        out.assigned = {(p.topic, p.partition) for p in partitions}

    consumer.subscribe([topic], on_assign=on_assign)
    try:
        while not out.done() and time.monotonic() - started < DEADLINE_S:
            msg = consumer.poll(0.05)
            if msg is None:
                continue
            if msg.error():
                out.errors.append(msg.error())
            else:
                out.values.append(msg.value())
    finally:
        consumer.close()
    return out


def consume_kafka_python(bootstrap: str, topic: str, group: str, probe: Probe) -> Outcome:
    from kafka import ConsumerRebalanceListener, KafkaConsumer

    out = Outcome()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=SESSION_MS,
        auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=100,
        request_timeout_ms=15000)
    # kafka-python rejoins when the topic's metadata arrives after its first assignment (its
    # metadata snapshot changed), a second rebalance of its own making on a slow machine: the
    # topic's metadata is fetched before it subscribes.
    assert consumer.partitions_for_topic(topic) == {0}
    started = time.monotonic()

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked) -> None:
            pass

        def on_partitions_assigned(self, assigned) -> None:
            out.assigned_after = time.monotonic() - started
            out.at_assignment = probe()
            out.assigned = {(p.topic, p.partition) for p in assigned}

    consumer.subscribe([topic], listener=Listener())
    try:
        while not out.done() and time.monotonic() - started < DEADLINE_S:
            for records in consumer.poll(timeout_ms=50).values():
                out.values.extend(r.value for r in records)
    finally:
        consumer.close(autocommit=False)
    return out


def consume_aiokafka(bootstrap: str, topic: str, group: str, probe: Probe) -> Outcome:
    return asyncio.run(_consume_aiokafka(bootstrap, topic, group, probe))


async def _consume_aiokafka(bootstrap: str, topic: str, group: str, probe: Probe) -> Outcome:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener

    out = Outcome()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=SESSION_MS,
        auto_offset_reset="earliest", enable_auto_commit=False, fetch_max_wait_ms=100,
        request_timeout_ms=15000)
    await consumer.start()
    started = time.monotonic()

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked) -> None:
            pass

        async def on_partitions_assigned(self, assigned) -> None:
            out.assigned_after = time.monotonic() - started
            out.at_assignment = probe()
            out.assigned = {(p.topic, p.partition) for p in assigned}

    consumer.subscribe([topic], listener=Listener())
    try:
        while not out.done() and (left := DEADLINE_S - (time.monotonic() - started)) > 0:
            # getmany waits for an assignment whatever its timeout: bound it ourselves.
            try:
                batches = await asyncio.wait_for(consumer.getmany(timeout_ms=50), left)
            except TimeoutError:
                break
            for records in batches.values():
                out.values.extend(r.value for r in records)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    return out


CONSUMERS: dict[str, Callable[[str, str, str, Probe], Outcome]] = {
    "confluent": consume_confluent,
    "kafka-python": consume_kafka_python,
    "aiokafka": consume_aiokafka,
}


@pytest.mark.slow
@pytest.mark.parametrize("client", list(CONSUMERS))
def test_lone_consumer_is_assigned_after_one_initial_delay(
        default_broker: BrokerProcess, client: str) -> None:
    bootstrap = default_broker.bootstrap
    topic, group = unique_topic("lone"), unique_topic("lone-group")
    create_topic(bootstrap, topic)
    confluent_produce(bootstrap, topic, [Rec(b"key", VALUE)])

    port = default_broker.metrics_port
    assert port is not None, "the broker's metrics endpoint is off"
    before = broker_counts(port, group)

    out = CONSUMERS[client](bootstrap, topic, group, lambda: broker_counts(port, group))

    assert out.assigned_after is not None, (
        f"{client}: a lone consumer with session.timeout.ms={SESSION_MS} was never assigned "
        f"in {DEADLINE_S}s (errors: {out.errors})")
    assert out.assigned == {(topic, 0)}
    assert out.assigned_after >= INITIAL_DELAY_S, (
        f"{client}: assigned {out.assigned_after:.2f}s after subscribe; Kafka assigns once "
        f"the {INITIAL_DELAY_S}s initial delay has passed")
    # One rebalance, ended by one initial delay: a delay extended for the lone member itself
    # expires twice, a member expired while its JoinGroup was parked rebalances again.
    assert out.at_assignment is not None
    assert out.at_assignment.rebalances - before.rebalances == 1, (
        f"{client}: {out.at_assignment.rebalances - before.rebalances} rebalances of the group "
        f"before its lone member was assigned")
    assert out.at_assignment.join_expirations - before.join_expirations == 1, (
        f"{client}: the initial delay ran out "
        f"{out.at_assignment.join_expirations - before.join_expirations} times before the "
        f"lone member was assigned")
    assert out.values == [VALUE], f"{client}: read {out.values} (errors: {out.errors})"
