"""aiokafka as its users use it: an idempotent AIOKafkaProducer, and a consumer group of two
that commits after processing each batch; both consumers stop (leaving the group), records
arrive meanwhile, and two restarted consumers resume exactly at the committed offsets.

Processing is synchronous right after getmany(), and the rebalance listener commits what was
processed before partitions are given up, so Kafka's guarantee here is exact: nothing re-read,
nothing skipped.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.conformance.support import assert_exactly_once
from tests.support.broker import BrokerProcess
from tests.support.clients import unique_topic

PARTITIONS = 4
PER_PARTITION = 50


class Member:
    def __init__(self, name: str, bootstrap: str, group: str, topic: str,
                 rows: list[tuple[str, int, int, bytes]]) -> None:
        self.name, self.topic, self.rows = name, topic, rows
        self.processed: dict[TopicPartition, int] = {}  # next offset to process
        self.commit_failures: list[Exception] = []
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, client_id=name,
            enable_auto_commit=False, auto_offset_reset="earliest",
            session_timeout_ms=6000, heartbeat_interval_ms=250, fetch_max_wait_ms=100,
            request_timeout_ms=15000,
        )
        member = self

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked) -> None:
                await member.commit({tp: o for tp, o in member.processed.items()
                                     if tp in revoked})

            async def on_partitions_assigned(self, assigned) -> None:
                pass

        self.listener = Listener()

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.subscribe([self.topic], listener=self.listener)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if not offsets:
            return
        try:
            await self.consumer.commit(dict(offsets))
        except Exception as e:  # noqa: BLE001 - asserted absent by the test
            self.commit_failures.append(e)

    async def poll_once(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=200)
        for tp, msgs in batches.items():
            for m in msgs:
                self.rows.append((self.name, m.partition, m.offset, m.value))
                self.processed[tp] = m.offset + 1
        if batches:
            await self.commit({tp: self.processed[tp] for tp in batches})

    async def stop(self) -> None:
        await self.consumer.stop()


async def _consume_all(members: list[Member], rows: list, want: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(rows) < want:
        assert time.monotonic() < deadline, f"{len(rows)} of {want} records in {timeout}s"
        await asyncio.gather(*(m.poll_once() for m in members))
    # A little longer: anything beyond `want` would be a re-read.
    for _ in range(3):
        await asyncio.gather(*(m.poll_once() for m in members))


async def _produce(producer: AIOKafkaProducer, topic: str, phase: str, start: int
                   ) -> dict[tuple[int, int], bytes]:
    """PER_PARTITION records to each partition from `start`; {(partition, offset): value}."""
    sent = []
    for n in range(start, start + PER_PARTITION):
        for p in range(PARTITIONS):
            value = f"{phase}:{p}:{n}".encode()
            fut = await producer.send(topic, key=f"k{n}".encode(), value=value, partition=p)
            sent.append((fut, p, n, value))
    out = {}
    for fut, p, n, value in sent:
        md = await fut
        assert (md.partition, md.offset) == (p, n), f"{value!r} stored at {md}"
        out[(p, n)] = value
    return out


async def _wait_assigned(members: list[Member], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        parts = [m.consumer.assignment() for m in members]
        if all(parts) and sum(len(p) for p in parts) == PARTITIONS:
            assert set().union(*parts) == {TopicPartition(members[0].topic, p)
                                           for p in range(PARTITIONS)}
            return
        assert time.monotonic() < deadline, f"group never assigned both members: {parts}"
        await asyncio.gather(*(m.poll_once() for m in members))


async def test_producer_and_group_resume_after_restart(group_broker: BrokerProcess) -> None:
    b = group_broker
    topic, group = unique_topic("aio"), unique_topic("aio-g")
    async with asyncio.timeout(120):
        admin = AIOKafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=15000)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        finally:
            await admin.close()

        producer = AIOKafkaProducer(bootstrap_servers=b.bootstrap, enable_idempotence=True,
                                    acks="all", linger_ms=5, request_timeout_ms=15000)
        await producer.start()
        try:
            rows: list[tuple[str, int, int, bytes]] = []
            members = [Member(f"aio-{i}", b.bootstrap, group, topic, rows) for i in range(2)]
            await asyncio.gather(*(m.start() for m in members))
            try:
                await _wait_assigned(members, 30)
                first = await _produce(producer, topic, "one", 0)
                await _consume_all(members, rows, len(first), 30)
                assert_exactly_once(rows, first)
                assert {r[0] for r in rows} == {m.name for m in members}, "both consume"
                for m in members:
                    for tp in m.consumer.assignment():
                        assert await m.consumer.committed(tp) == PER_PARTITION, tp
            finally:
                await asyncio.gather(*(m.stop() for m in members))  # LeaveGroup
            for m in members:
                assert not m.commit_failures, (m.name, m.commit_failures)

            # Records arrive while nobody is consuming; restarted members resume.
            second = await _produce(producer, topic, "two", PER_PARTITION)
        finally:
            await producer.stop()

        rows2: list[tuple[str, int, int, bytes]] = []
        again = [Member(f"aio-again-{i}", b.bootstrap, group, topic, rows2) for i in range(2)]
        await asyncio.gather(*(m.start() for m in again))
        try:
            await _consume_all(again, rows2, len(second), 30)
            assert_exactly_once(rows2, second)  # no re-reads of phase one, no gaps
            for p in range(PARTITIONS):
                offsets = sorted(o for _m, pp, o, _v in rows2 if pp == p)
                assert offsets[0] == PER_PARTITION, f"partition {p} resumed at {offsets[0]}"
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            committed = [await again[0].consumer.committed(tp) for tp in tps]
            assert committed == [2 * PER_PARTITION] * PARTITIONS, committed
        finally:
            await asyncio.gather(*(m.stop() for m in again))
        for m in again:
            assert not m.commit_failures, (m.name, m.commit_failures)
