"""aiokafka as its users use it: an idempotent AIOKafkaProducer, and a consumer group of two
that commits after processing each batch; both consumers stop (leaving the group), records
arrive meanwhile, and two restarted consumers resume exactly at the committed offsets.

Processing is synchronous right after getmany(), and the rebalance listener commits what was
processed before partitions are given up, so Kafka's guarantee here is exact: nothing re-read,
nothing skipped.

AIOKafkaAdminClient as its users call it: create (and validate-only create) topics, list and
describe topics and the cluster, describe topic and broker configs, list and describe consumer
groups and their offsets, delete topics.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.conformance.support import assert_exactly_once
from tests.support.broker import BrokerProcess
from tests.support.clients import unique_topic

PARTITIONS = 4
PER_PARTITION = 50
# Kafka's error codes and DescribeConfigs config sources, as the admin client reports them.
NONE, UNKNOWN_TOPIC_OR_PARTITION, TOPIC_ALREADY_EXISTS = 0, 3, 36
TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5


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


def _topic_errors(response) -> dict[str, int]:
    """CreateTopics / DeleteTopics answer: {topic: error code}."""
    obj = response.to_object()
    rows = obj.get("topic_errors") or obj.get("topic_error_codes") or []
    return {r["topic"]: r["error_code"] for r in rows}


async def _describe_group(admin: AIOKafkaAdminClient, group: str) -> dict:
    """One group per call: aiokafka 0.14.0 decodes a DescribeGroups v3 answer with the v2
    schema (no authorized_operations), so a second group in one answer is read misaligned."""
    (response,) = await admin.describe_consumer_groups([group])
    (described,) = response.to_object()["groups"]
    return described


async def _configs(admin: AIOKafkaAdminClient, resource: ConfigResource) -> dict[str, dict]:
    (response,) = await admin.describe_configs([resource])
    (res,) = response.to_object()["resources"]
    assert res["error_code"] == NONE, res
    return {e["config_names"]: e for e in res["config_entries"]}


async def test_admin_client_topics_configs_groups(group_broker: BrokerProcess) -> None:
    b = group_broker
    plain, compacted, dry = unique_topic("aio-adm"), unique_topic("aio-cmp"), unique_topic("dry")
    group = unique_topic("aio-adm-g")
    async with asyncio.timeout(60):
        admin = AIOKafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=15000)
        await admin.start()
        try:
            await _admin_topics_and_configs(admin, b, plain, compacted, dry)
            await _admin_groups(admin, b.bootstrap, plain, group)

            deleted = await admin.delete_topics([plain, compacted])
            assert _topic_errors(deleted) == {plain: NONE, compacted: NONE}
            listed = await admin.list_topics()
            assert plain not in listed and compacted not in listed, listed
            again = await admin.delete_topics([plain])
            assert _topic_errors(again) == {plain: UNKNOWN_TOPIC_OR_PARTITION}
        finally:
            await admin.close()


async def _admin_topics_and_configs(admin: AIOKafkaAdminClient, b: BrokerProcess, plain: str,
                                    compacted: str, dry: str) -> None:
    created = await admin.create_topics([
        NewTopic(plain, 3, 1),
        NewTopic(compacted, 1, 1, topic_configs={"cleanup.policy": "compact",
                                                 "retention.ms": "123456"}),
    ])
    assert _topic_errors(created) == {plain: NONE, compacted: NONE}
    twice = await admin.create_topics([NewTopic(plain, 3, 1)])
    assert _topic_errors(twice) == {plain: TOPIC_ALREADY_EXISTS}
    validated = await admin.create_topics([NewTopic(dry, 2, 1)], validate_only=True)
    assert _topic_errors(validated) == {dry: NONE}

    listed = await admin.list_topics()
    assert {plain, compacted} <= set(listed) and dry not in listed, listed
    cluster = await admin.describe_cluster()
    (node,) = cluster["brokers"]
    assert (node["host"], node["port"]) == ("127.0.0.1", b.port), cluster
    assert cluster["controller_id"] == node["node_id"]
    described = {t["topic"]: t for t in await admin.describe_topics([plain, compacted])}
    for topic, count in ((plain, 3), (compacted, 1)):
        t = described[topic]
        assert t["error_code"] == NONE and t["is_internal"] is False, t
        parts = sorted(t["partitions"], key=lambda p: p["partition"])
        assert [p["partition"] for p in parts] == list(range(count)), parts
        assert all(p["error_code"] == NONE and p["leader"] == node["node_id"]
                   and p["replicas"] == [node["node_id"]] for p in parts), parts

    topic_configs = await _configs(admin, ConfigResource(ConfigResourceType.TOPIC, compacted))
    assert topic_configs["cleanup.policy"]["config_value"] == "compact"
    assert topic_configs["retention.ms"]["config_value"] == "123456"
    assert {topic_configs[k]["config_source"] for k in ("cleanup.policy", "retention.ms")} == {
        TOPIC_CONFIG}
    assert topic_configs["segment.bytes"]["config_source"] == DEFAULT_CONFIG
    defaults = await _configs(admin, ConfigResource(ConfigResourceType.TOPIC, plain))
    assert defaults["cleanup.policy"]["config_value"] == "delete"
    assert defaults["cleanup.policy"]["config_source"] == DEFAULT_CONFIG

    broker_configs = await _configs(admin, ConfigResource(
        ConfigResourceType.BROKER, str(node["node_id"]), {"log.retention.ms": None}))
    assert list(broker_configs) == ["log.retention.ms"], broker_configs
    # Kafka's log.retention.ms has no default of its own (null): log.retention.hours' 168
    # applies, which DescribeConfigs shows as the key's DEFAULT_CONFIG synonym.
    assert broker_configs["log.retention.ms"]["config_value"] is None
    assert broker_configs["log.retention.ms"]["config_source"] == DEFAULT_CONFIG


async def _admin_groups(admin: AIOKafkaAdminClient, bootstrap: str, topic: str,
                        group: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(9):
            await producer.send_and_wait(topic, f"v{i}".encode(), partition=i % 3)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, client_id="aio-admin-member",
        enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100,
        session_timeout_ms=6000, heartbeat_interval_ms=250)
    await consumer.start()
    try:
        got = 0
        while got < 9:
            got += sum(len(v) for v in (await consumer.getmany(timeout_ms=200)).values())
        await consumer.commit()

        assert (group, "consumer") in await admin.list_consumer_groups()
        stable = await _describe_group(admin, group)
        assert stable["error_code"] == NONE, stable
        assert (stable["state"], stable["protocol_type"], stable["protocol"]) == (
            "Stable", "consumer", "roundrobin"), stable
        (member,) = stable["members"]
        assert member["client_id"] == "aio-admin-member", member
        assert member["member_id"].startswith("aio-admin-member-"), member
        assert topic.encode() in member["member_assignment"], member
        offsets = await admin.list_consumer_group_offsets(group)
        assert {tp.partition: om.offset for tp, om in offsets.items() if tp.topic == topic} == {
            0: 3, 1: 3, 2: 3}, offsets
    finally:
        await consumer.stop()  # LeaveGroup
    empty = await _describe_group(admin, group)
    assert (empty["error_code"], empty["state"], empty["members"]) == (NONE, "Empty", []), empty
    assert (await _describe_group(admin, f"{group}-unknown"))["state"] == "Dead"
