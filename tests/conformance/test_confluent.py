"""confluent-kafka (librdkafka) as its users use it: the idempotent producer, a consumer group
that commits synchronously after processing, and the AdminClient.

What Kafka guarantees a group whose members commit each record synchronously after processing
it, and whose rebalances go through the revoke callback (confluent-kafka always serves them
from poll(), in the member's own thread): every record is processed, and none twice, because
when a partition changes hands everything its old owner processed is already committed and
the new owner starts at that committed offset. A duplicate needs a failed commit, so commit
failures are recorded and asserted absent too.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
)
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from tests.conformance.support import Ledger, assert_exactly_once
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    assert_idempotent_batches,
    create_topic,
    unique_topic,
    wait_until,
    watermarks,
)

PARTITIONS = 6
PER_PARTITION = 100


def _base(bootstrap: str, errors: list) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "socket.timeout.ms": 10000,
        "error_cb": errors.append,
    }


def _admin(bootstrap: str, errors: list) -> AdminClient:
    return AdminClient(_base(bootstrap, errors))


class IdempotentProducer:
    """enable.idempotence with acks=all and five requests in flight, as Kafka's defaults."""

    def __init__(self, bootstrap: str) -> None:
        self.errors: list = []
        self.producer = Producer({
            **_base(bootstrap, self.errors),
            "enable.idempotence": True,
            "acks": "all",
            "max.in.flight.requests.per.connection": 5,
            "linger.ms": 5,
            "batch.num.messages": 20,  # many small batches, so several are in flight at once
            "message.timeout.ms": 30000,
        })

    def send(self, topic: str, phase: str, start: int) -> dict[tuple[int, int], bytes]:
        """PER_PARTITION records to each partition; returns {(partition, offset): value}."""
        acked: dict[tuple[int, int], bytes] = {}
        failed: list = []

        def report(err, msg) -> None:
            if err is not None:
                failed.append(err)
            else:
                acked[(msg.partition(), msg.offset())] = msg.value()

        for i in range(PARTITIONS * PER_PARTITION):
            p = i % PARTITIONS
            n = start + i // PARTITIONS
            self.producer.produce(topic, key=f"k{p}-{n}".encode(),
                                  value=f"{phase}:{p}:{n}".encode(), partition=p,
                                  on_delivery=report)
            self.producer.poll(0)
        remaining = self.producer.flush(30)
        assert not failed and not remaining, f"delivery failed: {failed[:5]}, {remaining} left"
        assert not self.errors, f"producer errors: {self.errors}"
        for p in range(PARTITIONS):
            got = sorted(o for (pp, o) in acked if pp == p)
            assert got == list(range(start, start + PER_PARTITION)), f"partition {p}: {got}"
            for o in got:
                assert acked[(p, o)] == f"{phase}:{p}:{o}".encode(), "record stored out of order"
        return acked

    def close(self) -> None:
        assert self.producer.flush(10) == 0


class Member(threading.Thread):
    """One group member in its own thread: poll, process (record it), commit synchronously."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str, ledger: Ledger,
                 deadline: float) -> None:
        super().__init__(name=name, daemon=True)
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.ledger, self.deadline = ledger, deadline
        self.errors: list = []
        self.commit_failures: list = []
        self.assignment: set[int] = set()
        self.assignments: list[set[int]] = []
        self.processed = 0
        self.leave_after: int | None = None  # leave the group once this many are processed
        self.stop = threading.Event()
        self.left = threading.Event()
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            self.crash = e
        finally:
            self.left.set()

    def _run(self) -> None:
        consumer = Consumer({
            **_base(self.bootstrap, self.errors),
            "group.id": self.group,
            "client.id": self.name,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 250,
            "partition.assignment.strategy": "range",
            "fetch.wait.max.ms": 100,
        })

        def on_assign(_c, parts) -> None:
            self.assignment = {tp.partition for tp in parts}
            self.assignments.append(set(self.assignment))

        def on_revoke(_c, _parts) -> None:
            self.assignment = set()

        consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                if self.leave_after is not None and self.processed >= self.leave_after:
                    break
                msg = consumer.poll(0.1)
                if msg is None:
                    continue
                if msg.error():
                    self.errors.append(msg.error())
                    continue
                self.ledger.add(self.name, msg.partition(), msg.offset(), msg.value())
                self.processed += 1
                try:
                    consumer.commit(message=msg, asynchronous=False)
                except KafkaException as e:
                    self.commit_failures.append((msg.partition(), msg.offset(), e))
        finally:
            consumer.close()  # commits nothing more (auto commit is off), sends LeaveGroup


def _describe_group(admin: AdminClient, group: str):
    return admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)


def _group_assignment(admin: AdminClient, group: str) -> dict[str, set[int]] | None:
    """client id -> partitions, once the group is Stable (else None)."""
    d = _describe_group(admin, group)
    if d.state != ConsumerGroupState.STABLE:
        return None
    return {m.client_id: {tp.partition for tp in m.assignment.topic_partitions}
            for m in d.members}


def test_idempotent_producer_and_group_of_three(group_broker: BrokerProcess) -> None:
    b = group_broker
    topic, group = unique_topic("cf-group"), unique_topic("cf-g")
    admin_errors: list = []
    admin = _admin(b.bootstrap, admin_errors)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)],
                        operation_timeout=10)[topic].result(timeout=20)

    producer = IdempotentProducer(b.bootstrap)
    expected = producer.send(topic, "one", 0)

    ledger = Ledger()
    deadline = time.monotonic() + 120
    members = [Member(f"member-{i}", b.bootstrap, group, topic, ledger, deadline)
               for i in range(3)]
    for m in members:
        m.start()
    try:
        # -- three members, nobody fails: every record exactly once -------------------------
        ledger.wait_for(expected, 45, "phase one")
        final = wait_until(
            lambda: (a := _group_assignment(admin, group)) and len(a) == 3 and a,
            30, "a stable group of three")
        assert sorted(len(ps) for ps in final.values()) == [2, 2, 2], final
        assert set().union(*final.values()) == set(range(PARTITIONS)), final
        for m in members:
            assert m.assignment == final[m.name], (m.name, m.assignment, final)
        assert_exactly_once(ledger.snapshot(), expected)

        # -- one member leaves halfway through the next batch: the rest take over -----------
        leaver, stayers = members[2], members[:2]
        before_leave = len(ledger.snapshot())
        leaver.leave_after = leaver.processed + 30
        expected2 = producer.send(topic, "two", PER_PARTITION)
        assert leaver.left.wait(30), "the leaving member never left"
        assert leaver.crash is None, leaver.crash
        ledger.wait_for(expected2, 45, "phase two")
        final2 = wait_until(
            lambda: (a := _group_assignment(admin, group)) and len(a) == 2 and a,
            30, "a stable group of two")
        assert sorted(len(ps) for ps in final2.values()) == [3, 3], final2
        assert set(final2) == {m.name for m in stayers}, final2

        rows = ledger.snapshot()
        assert_exactly_once(rows, {**expected, **expected2})
        # The leaver's partitions continue exactly after what it processed (= committed).
        phase2 = rows[before_leave:]
        for p in final[leaver.name]:
            by_leaver = [o for m, pp, o, _v in phase2 if pp == p and m == leaver.name]
            by_others = [o for m, pp, o, _v in phase2 if pp == p and m != leaver.name]
            resume = max(by_leaver) + 1 if by_leaver else PER_PARTITION
            assert by_others and min(by_others) == resume, (p, by_leaver, by_others)
        assert leaver.processed == leaver.leave_after

        # Committed offsets, as the AdminClient reports them: the end of every partition.
        req = [ConsumerGroupTopicPartitions(group)]
        listed = admin.list_consumer_group_offsets(req, request_timeout=10)[group].result(15)
        committed = {tp.partition: tp.offset for tp in listed.topic_partitions
                     if tp.topic == topic}
        assert committed == dict.fromkeys(range(PARTITIONS), 2 * PER_PARTITION), committed
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            m.join(30)
        producer.close()
    assert not any(m.is_alive() for m in members), "a member thread did not finish"
    for m in members:
        assert m.crash is None, f"{m.name}: {m.crash!r}"
        assert not m.commit_failures, f"{m.name}: failed commits {m.commit_failures[:5]}"
        assert not [e for e in m.errors if e.code() != KafkaError._TRANSPORT], m.errors
    for p in range(PARTITIONS):
        assert watermarks(b.bootstrap, topic, p) == (0, 2 * PER_PARTITION)
        assert_idempotent_batches(b.data_dir / "logs", topic, p, 2 * PER_PARTITION)

    # Everyone left: the group is Empty, keeps its offsets, and can be deleted.
    d = _describe_group(admin, group)
    assert d.state == ConsumerGroupState.EMPTY and not d.members, (d.state, d.members)
    listing = admin.list_consumer_groups(request_timeout=10).result(15)
    assert not listing.errors, listing.errors
    states = {g.group_id: g.state for g in listing.valid}
    assert states.get(group) == ConsumerGroupState.EMPTY, states
    admin.delete_consumer_groups([group], request_timeout=10)[group].result(15)
    listing = admin.list_consumer_groups(request_timeout=10).result(15)
    assert group not in {g.group_id for g in listing.valid}
    assert not admin_errors, admin_errors


def test_admin_topics(broker: BrokerProcess) -> None:
    errors: list = []
    admin = _admin(broker.bootstrap, errors)
    one, four = unique_topic("cf-admin-one"), unique_topic("cf-admin-four")
    futures = admin.create_topics(
        [NewTopic(one, 1, 1), NewTopic(four, 4, 1, config={"retention.ms": "3600000"})],
        operation_timeout=10, request_timeout=15)
    for f in futures.values():
        assert f.result(timeout=20) is None

    # A second create of the same name is refused with TOPIC_ALREADY_EXISTS.
    again = admin.create_topics([NewTopic(one, 1, 1)], request_timeout=15)[one]
    err = again.exception(timeout=20)
    assert isinstance(err, KafkaException), err
    assert err.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS, err

    meta = admin.list_topics(timeout=10)
    assert len(meta.topics[one].partitions) == 1 and len(meta.topics[four].partitions) == 4
    assert list(meta.brokers) and meta.topics[four].error is None

    described = admin.describe_topics(TopicCollection([one, four]), request_timeout=10)
    d = described[four].result(timeout=15)
    assert d.name == four and not d.is_internal
    assert [p.id for p in d.partitions] == [0, 1, 2, 3]
    broker_ids = {n.id for n in [p.leader for p in d.partitions]}
    assert broker_ids == set(meta.brokers), (broker_ids, meta.brokers)
    assert len(described[one].result(timeout=15).partitions) == 1

    res = ConfigResource(ResourceType.TOPIC, four)
    configs = admin.describe_configs([res], request_timeout=10)[res].result(timeout=15)
    assert configs["retention.ms"].value == "3600000"

    admin.create_partitions([NewPartitions(four, 6)], request_timeout=10)[four].result(15)
    wait_until(lambda: len(admin.list_topics(four, timeout=10).topics[four].partitions) == 6,
               10, "six partitions")

    for f in admin.delete_topics([one, four], operation_timeout=10, request_timeout=15).values():
        assert f.result(timeout=20) is None
    wait_until(lambda: not {one, four} & set(admin.list_topics(timeout=10).topics),
               10, "deleted topics gone from metadata")
    gone = admin.describe_topics(TopicCollection([one]), request_timeout=10)[one]
    err = gone.exception(timeout=15)
    assert isinstance(err, KafkaException)
    assert err.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, err
    assert not errors, errors


def test_static_member_restart_keeps_assignment(group_broker: BrokerProcess) -> None:
    """Static membership (group.instance.id, KIP-345): a member that restarts within its session
    timeout gets its old assignment back and the group does not rebalance, so the other member
    keeps its partitions untouched (librdkafka sends no LeaveGroup for a static member)."""
    b = group_broker
    topic, group = unique_topic("cf-static"), unique_topic("cf-static-g")
    create_topic(b.bootstrap, topic, 4)
    errors: list = []
    admin = _admin(b.bootstrap, errors)
    events: dict[str, list[tuple[str, list[int]]]] = {}

    def static(instance: str) -> Consumer:
        consumer = Consumer({
            **_base(b.bootstrap, errors), "group.id": group, "group.instance.id": instance,
            "client.id": instance, "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000, "heartbeat.interval.ms": 250, "fetch.wait.max.ms": 100,
        })
        log = events.setdefault(instance, [])
        consumer.subscribe(
            [topic],
            on_assign=lambda _c, ps: log.append(("assign", sorted(p.partition for p in ps))),
            on_revoke=lambda _c, ps: log.append(("revoke", sorted(p.partition for p in ps))))
        return consumer

    def poll_all(consumers: list[Consumer], seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for c in consumers:
                msg = c.poll(0.02)
                if msg is not None and not msg.error():
                    c.commit(message=msg, asynchronous=False)

    stay, restart = static("static-a"), static("static-b")
    restarted = None
    try:
        wait_until(lambda: poll_all([stay, restart], 0.2) or
                   _group_assignment(admin, group) and len(_group_assignment(admin, group)) == 2,
                   30, "a stable group of two static members")
        before = _group_assignment(admin, group)
        assert before is not None and sorted(len(v) for v in before.values()) == [2, 2], before
        restart.close()  # a static member leaves no LeaveGroup behind
        restart = None
        d = _describe_group(admin, group)
        assert d.state == ConsumerGroupState.STABLE and len(d.members) == 2, (d.state, d.members)

        seen = len(events["static-b"])
        restarted = static("static-b")
        wait_until(lambda: poll_all([stay, restarted], 0.2) or
                   any(kind == "assign" for kind, _ps in events["static-b"][seen:]),
                   15, "the restarted static member's assignment")
        poll_all([stay, restarted], 1.0)  # a rebalance, if any, would show up by now
        after = _group_assignment(admin, group)
        assert after == before, f"assignment changed: {before} -> {after}"
        assert events["static-b"][-1] == ("assign", sorted(before["static-b"])), events
        assert events["static-a"] == [("assign", sorted(before["static-a"]))], (
            f"the member that stayed was rebalanced: {events['static-a']}")
    finally:
        for c in (stay, restart, restarted):
            if c is not None:
                c.close()
    assert not [e for e in errors if e.code() != KafkaError._TRANSPORT], errors
