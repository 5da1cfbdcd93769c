"""kafka-python as its users use it: KafkaAdminClient for topics and groups, an idempotent
KafkaProducer, and a KafkaConsumer in a group that subscribes, stops partway through with its
progress committed, and on reopening resumes exactly there (nothing re-read, nothing skipped).
"""

from __future__ import annotations

import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import TopicAlreadyExistsError

from tests.conformance.support import assert_exactly_once
from tests.support.broker import BrokerProcess
from tests.support.clients import unique_topic, wait_until

PARTITIONS = 3
PER_PARTITION = 20


def _produce(bootstrap: str, topic: str, phase: str, start: int) -> dict[tuple[int, int], bytes]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                             linger_ms=5, request_timeout_ms=15000, max_block_ms=20000)
    try:
        sent = []
        for n in range(start, start + PER_PARTITION):
            for p in range(PARTITIONS):
                value = f"{phase}:{p}:{n}".encode()
                sent.append((producer.send(topic, key=f"k{n}".encode(), value=value,
                                           partition=p), p, n, value))
        producer.flush(20)
        out = {}
        for fut, p, n, value in sent:
            md = fut.get(timeout=20)
            assert (md.partition, md.offset) == (p, n), f"{value!r} stored at {md}"
            out[(p, n)] = value
        return out
    finally:
        producer.close(timeout=5)


def _consumer(bootstrap: str, group: str, topic: str) -> KafkaConsumer:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, client_id=f"{group}-member",
        enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=5,
        session_timeout_ms=6000, heartbeat_interval_ms=250, fetch_max_wait_ms=100,
        request_timeout_ms=15000,
    )
    consumer.subscribe([topic])
    return consumer


def _consume(consumer: KafkaConsumer, rows: list, stop_at: int, timeout: float) -> None:
    """Poll, process (append), commit synchronously; stop once `stop_at` rows exist."""
    deadline = time.monotonic() + timeout
    while len(rows) < stop_at:
        assert time.monotonic() < deadline, f"{len(rows)} of {stop_at} records in {timeout}s"
        batches = consumer.poll(timeout_ms=200)
        for msgs in batches.values():
            rows.extend(("kp", m.partition, m.offset, m.value) for m in msgs)
        if batches:
            consumer.commit()  # positions = just past every record returned, i.e. processed


def test_admin_producer_and_group_resume(group_broker: BrokerProcess) -> None:
    b = group_broker
    topic, other, group = unique_topic("kp"), unique_topic("kp-other"), unique_topic("kp-g")
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=15000)
    try:
        admin.create_topics({topic: {"num_partitions": PARTITIONS, "replication_factor": 1},
                             other: {"num_partitions": 1, "replication_factor": 1,
                                     "configs": {"retention.ms": "3600000"}}},
                            timeout_ms=10000)
        try:
            admin.create_topics({other: {"num_partitions": 1, "replication_factor": 1}})
            raise AssertionError("creating an existing topic must fail")
        except TopicAlreadyExistsError:
            pass
        assert {topic, other} <= set(admin.list_topics())
        described = {t["name"]: t for t in admin.describe_topics([topic, other])}
        assert sorted(p["partition_index"] for p in described[topic]["partitions"]) == [0, 1, 2]
        assert described[other]["error_code"] == 0 and not described[other]["is_internal"]

        expected = _produce(b.bootstrap, topic, "one", 0)

        rows: list[tuple[str, int, int, bytes]] = []
        consumer = _consumer(b.bootstrap, group, topic)
        try:
            _consume(consumer, rows, 25, 30)
            assert consumer.assignment() == {TopicPartition(topic, p) for p in range(PARTITIONS)}

            listed = {g["group_id"]: g for g in admin.list_groups()}
            assert listed[group]["protocol_type"] == "consumer", listed
            desc = admin.describe_groups([group])[group]
            assert desc["group_state"] == "Stable", desc
            (member,) = desc["members"]
            assert member["client_id"] == f"{group}-member", member
            committed = admin.list_group_offsets({group: None})[group]
            processed = {}
            for _n, p, o, _v in rows:
                processed[p] = max(processed.get(p, -1), o + 1)
            # commit() commits every assigned partition's position: an untouched one's is 0.
            got = {tp.partition: om.offset for tp, om in committed.items()}
            assert got == {p: processed.get(p, 0) for p in got} and set(processed) <= set(got)
        finally:
            consumer.close(autocommit=False)  # leaves the group
        first_session = list(rows)

        more = _produce(b.bootstrap, topic, "two", PER_PARTITION)
        wait_until(lambda: admin.describe_groups([group])[group]["group_state"] == "Empty",
                   10, "the group to be empty after close")

        # Reopen: exactly the records not processed before, the new ones included.
        rows2: list[tuple[str, int, int, bytes]] = []
        want = len(expected) + len(more) - len(first_session)
        consumer = _consumer(b.bootstrap, group, topic)
        try:
            _consume(consumer, rows2, want, 30)
            extra = consumer.poll(timeout_ms=500)  # anything now is a re-read
            assert not any(extra.values()), extra
        finally:
            consumer.close(autocommit=False)
        assert_exactly_once(first_session + rows2, {**expected, **more})
        for p in range(PARTITIONS):
            resumed = min(o for _n, pp, o, _v in rows2 if pp == p)
            assert resumed == processed.get(p, 0), (p, resumed, processed)

        committed = admin.list_group_offsets({group: None})[group]
        assert {tp.partition: om.offset for tp, om in committed.items()} == dict.fromkeys(
            range(PARTITIONS), 2 * PER_PARTITION)
        deleted = dict(admin.delete_groups([group]))
        assert getattr(deleted[group], "errno", 0) == 0, deleted
        assert group not in {g["group_id"] for g in admin.list_groups()}
        admin.delete_topics([topic, other], timeout_ms=10000)
        wait_until(lambda: not {topic, other} & set(admin.list_topics()), 10, "topics deleted")
    finally:
        admin.close()
