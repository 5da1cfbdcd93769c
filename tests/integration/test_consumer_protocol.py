"""The consumer group protocol (KIP-848) through librdkafka (confluent-kafka) as its users use
it: `group.protocol=consumer`, partitions assigned by the broker's assignor chosen with
`group.remote.assignor`, a synchronous commit after each processed record.

What Kafka guarantees such a group: a partition changes hands only once its owner has revoked
it inside poll(), after committing everything it processed, and the new owner starts at that
committed offset; a member that dies keeps its partitions until its session expires. So across
joins, leaves and crashes every record is processed once, and commit failures (the only other
way to get a duplicate) are recorded and asserted absent.

The broker runs with short sessions and heartbeats (the group.consumer.* overrides, below
Kafka's minimums of 45 s and 5 s), so a crashed member is expelled in seconds. The crashed
member is a process of its own (this module, run with `-m`), killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    ConsumerGroupType,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from tests.conformance.support import Ledger, assert_exactly_once
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, unique_topic, wait_until

ROOT = Path(__file__).resolve().parents[2]
SESSION_MS = 6000
HEARTBEAT_MS = 500
OVERRIDES = {
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": str(SESSION_MS),
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.heartbeat.interval.ms": str(HEARTBEAT_MS),
    # For the classic members: a short first rebalance and sessions as short as ours.
    "group.initial.rebalance.delay.ms": "300",
    "group.min.session.timeout.ms": "1000",
    "offsets.topic.num.partitions": "3",
}
PARTITIONS = 6
PER_PHASE = 20  # records per partition and phase
WAIT = 20.0  # bound of every wait for a rebalance or for records
HOST = "/127.0.0.1"  # a member's host as Kafka reports it (InetAddress.toString())

Expected = dict[tuple[int, int], bytes]
Assignment = frozenset[tuple[str, int]]


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory(OVERRIDES)


# -- clients --------------------------------------------------------------------------------------


def _base(bootstrap: str, errors: list) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "socket.timeout.ms": 10000,
        "error_cb": errors.append,
    }


def member_config(bootstrap: str, group: str, name: str, errors: list, *,
                  assignor: str | None = "uniform", reset: str = "earliest",
                  protocol: str = "consumer") -> dict:
    """A consumer as a KIP-848 user configures it: no session, heartbeat or assignment strategy
    of its own (the broker owns them); a classic member gets Kafka's usual settings."""
    conf = {
        **_base(bootstrap, errors),
        "group.id": group,
        "client.id": name,
        "group.protocol": protocol,
        "enable.auto.commit": False,
        "auto.offset.reset": reset,
        "fetch.wait.max.ms": 100,
    }
    if protocol == "consumer":
        if assignor is not None:
            conf["group.remote.assignor"] = assignor
    else:
        conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 250,
                     "partition.assignment.strategy": "range"})
    return conf


def _admin(bootstrap: str, errors: list) -> AdminClient:
    return AdminClient(_base(bootstrap, errors))


def produce_phase(bootstrap: str, topic: str, phase: str, *, partitions: int = PARTITIONS,
                  count: int = PER_PHASE) -> Expected:
    """`count` records to each partition, valued "phase:partition:n"; {(partition, offset):
    value} of what was acknowledged. Any failure raises."""
    errors: list = []
    producer = Producer({**_base(bootstrap, errors), "acks": "all", "linger.ms": 5,
                         "message.timeout.ms": 20000})
    acked: Expected = {}
    failed: list = []

    def report(err, msg: Message) -> None:
        if err is not None:
            failed.append(err)
        else:
            acked[(msg.partition(), msg.offset())] = msg.value()

    for n in range(count):
        for p in range(partitions):
            producer.produce(topic, value=f"{phase}:{p}:{n}".encode(), partition=p,
                             on_delivery=report)
    remaining = producer.flush(20)
    assert not failed and not remaining and not errors, (failed[:5], remaining, errors)
    assert len(acked) == partitions * count
    return acked


def consume(consumer: Consumer, topics: list[str], stop: Callable[[], bool],
            on_record: Callable[[Message], None], on_assignment: Callable[[Assignment], None],
            on_committed: Callable[[Message], None], commit_failures: list,
            errors: list) -> None:
    """The member's loop: poll, process, commit synchronously. The callbacks only mark a
    change: the assignment is read once poll() has applied it (KIP-848 rebalances are
    incremental, so a callback sees only what moved)."""
    changed = threading.Event()

    def mark(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        changed.set()

    consumer.subscribe(topics, on_assign=mark, on_revoke=mark, on_lost=mark)
    while not stop():
        msg = consumer.poll(0.1)
        if changed.is_set():
            changed.clear()
            on_assignment(frozenset((tp.topic, tp.partition) for tp in consumer.assignment()))
        if msg is None:
            continue
        if msg.error():
            errors.append(str(msg.error()))
            continue
        on_record(msg)
        try:
            consumer.commit(message=msg, asynchronous=False)
        except KafkaException as e:
            commit_failures.append((msg.topic(), msg.partition(), msg.offset(), str(e)))
        else:
            on_committed(msg)


class Member(threading.Thread):
    """One group member in its own thread with its own Consumer."""

    def __init__(self, name: str, bootstrap: str, group: str, topics: list[str],
                 ledger: Ledger, **config) -> None:
        super().__init__(name=name, daemon=True)
        self.topics, self.ledger = topics, ledger
        self.errors: list = []
        self.commit_failures: list = []
        self.assignment: Assignment = frozenset()
        self.topic_rows: list[tuple[str, int, int, bytes]] = []  # (topic, partition, offset, v)
        self.conf = member_config(bootstrap, group, name, self.errors, **config)
        self.member_id = ""
        self._halt = threading.Event()
        self.crash: BaseException | None = None

    @property
    def partitions(self) -> set[int]:
        return {p for _t, p in self.assignment}

    def run(self) -> None:
        try:
            consumer = Consumer(self.conf)
            try:
                consume(consumer, self.topics, self._halt.is_set, self._record,
                        self._assigned(consumer), lambda _m: None, self.commit_failures,
                        self.errors)
            finally:
                consumer.close()  # leaves the group (a heartbeat with epoch -1)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            self.crash = e

    def _assigned(self, consumer: Consumer) -> Callable[[Assignment], None]:
        def update(assignment: Assignment) -> None:
            self.assignment = assignment
            self.member_id = consumer.memberid() or ""
        return update

    def _record(self, msg: Message) -> None:
        self.ledger.add(self.name, msg.partition(), msg.offset(), msg.value())
        self.topic_rows.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))

    def finish(self, timeout: float = WAIT) -> None:
        """Stop polling and close; fails if the member does not get out."""
        self._halt.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not close within {timeout}s"
        self.assignment = frozenset()

    def check(self) -> None:
        """Nothing went wrong in this member."""
        assert self.crash is None, f"{self.name} crashed: {self.crash!r}"
        assert not self.commit_failures, f"{self.name}: commits failed {self.commit_failures}"
        assert not self.errors, f"{self.name}: client errors {self.errors}"


class MemberProcess:
    """A member in a process of its own (this module run with -m), so it can be SIGKILLed.
    It prints JSON lines: its assignment, each record before committing it, each commit."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str,
                 ledger: Ledger) -> None:
        self.name, self.ledger = name, ledger
        self.assignment: Assignment = frozenset()
        self.committed: set[tuple[int, int]] = set()
        self.errors: list[str] = []
        self.lines: list[str] = []
        args = json.dumps({"bootstrap": bootstrap, "group": group, "topic": topic,
                           "name": name})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.test_consumer_protocol", args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    @property
    def partitions(self) -> set[int]:
        return {p for _t, p in self.assignment}

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            if "record" in row:
                p, o, v = row["record"]
                self.ledger.add(self.name, p, o, v.encode())
            elif "committed" in row:
                self.committed.add(tuple(row["committed"]))
            elif "assignment" in row:
                self.assignment = frozenset((t, p) for t, p in row["assignment"])
            elif "error" in row:
                self.errors.append(row["error"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def _member_process_main(spec: str) -> None:
    """The body of a MemberProcess: consume until killed (or two minutes, should the test that
    started it be gone)."""
    args = json.loads(spec)
    lock = threading.Lock()

    def emit(**row) -> None:
        with lock:
            sys.stdout.write(json.dumps(row) + "\n")
            sys.stdout.flush()

    class Errors(list):
        def append(self, e) -> None:
            emit(error=str(e))

    errors = Errors()
    consumer = Consumer(member_config(args["bootstrap"], args["group"], args["name"], errors))
    deadline = time.monotonic() + 120
    consume(consumer, [args["topic"]], lambda: time.monotonic() > deadline,
            lambda m: emit(record=[m.partition(), m.offset(), m.value().decode()]),
            lambda a: emit(assignment=sorted(a)),
            lambda m: emit(committed=[m.partition(), m.offset()]), errors, errors)
    consumer.close()


# -- waits and checks -----------------------------------------------------------------------------


def wait_shares(members: Iterable, sizes: list[int], what: str,
                partitions: int = PARTITIONS) -> None:
    """Until the members' own views of their assignments have these sizes and together cover
    every partition (so each partition is owned by exactly one of them). A timeout reports
    what each member holds and the errors its client saw."""
    members = list(members)
    deadline = time.monotonic() + WAIT
    while True:
        for m in members:
            crash = getattr(m, "crash", None)
            assert crash is None, f"{m.name} crashed: {crash!r}"
            proc = getattr(m, "proc", None)
            assert proc is None or proc.poll() is None, f"{m.name} exited: {m.lines[-20:]}"
        owned = [m.partitions for m in members]
        if (sorted(len(o) for o in owned) == sorted(sizes)
                and set().union(*owned) == set(range(partitions))):
            return
        if time.monotonic() >= deadline:
            state = {m.name: (sorted(m.partitions), m.errors[-5:]) for m in members}
            raise AssertionError(f"{what}: no {sizes} split within {WAIT}s; "
                                 f"member: (partitions, last client errors): {state}")
        time.sleep(0.05)


def committed_offsets(bootstrap: str, group: str) -> dict[int, int]:
    """The group's committed offsets as the AdminClient reads them (OffsetFetch)."""
    errors: list = []
    admin = _admin(bootstrap, errors)
    result = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)], request_timeout=10)[group].result(timeout=15)
    assert not errors, errors
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def describe(bootstrap: str, group: str):
    errors: list = []
    admin = _admin(bootstrap, errors)
    d = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    assert not errors, errors
    return d


def described_with(bootstrap: str, group: str, members: int):
    """The group's description once it has that many members (else None)."""
    d = describe(bootstrap, group)
    return d if len(d.members) == members else None


def listed(bootstrap: str, **filters) -> dict[str, tuple]:
    """group id -> (type, state) from ListGroups, with the AdminClient's filters."""
    errors: list = []
    admin = _admin(bootstrap, errors)
    result = admin.list_consumer_groups(request_timeout=10, **filters).result(timeout=15)
    assert not errors and not result.errors, (errors, result.errors)
    return {g.group_id: (g.type, g.state) for g in result.valid}


def requests_served(broker: BrokerProcess, api: str, version: int | None = None) -> float:
    """minibroker_requests_total of one API (one version, or all), from the broker's
    endpoint."""
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "minibroker_requests_total" and s.labels.get("api") == api
               and version in (None, int(s.labels["version"])))


def stop_all(members: Iterable[Member]) -> None:
    for m in members:
        if m.is_alive():
            m.finish()


# -- tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_group_shares_rebalances_and_resumes(broker: BrokerProcess, assignor: str) -> None:
    """Three members share six partitions 2+2+2; one leaves and the two others take its
    partitions over 3+3 from its committed offsets; a fourth joins and the partitions go back
    to 2+2+2; all stop, and a member with auto.offset.reset=error resumes exactly at the
    committed offsets. Every record processed once."""
    topic, group = unique_topic("kip848"), unique_topic("kip848-g")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    ledger = Ledger()
    expected = produce_phase(broker.bootstrap, topic, "one")
    members = [Member(f"m{i}", broker.bootstrap, group, [topic], ledger, assignor=assignor)
               for i in range(3)]
    try:
        for m in members:
            m.start()
        wait_shares(members, [2, 2, 2], "three members")
        ledger.wait_for(expected, WAIT, "phase one")

        members[2].finish()
        expected |= produce_phase(broker.bootstrap, topic, "two")
        wait_shares(members[:2], [3, 3], "after m2 left")
        ledger.wait_for(expected, WAIT, "phase two")

        late = Member("m3", broker.bootstrap, group, [topic], ledger, assignor=assignor)
        members.append(late)
        late.start()
        expected |= produce_phase(broker.bootstrap, topic, "three")
        wait_shares([members[0], members[1], late], [2, 2, 2], "after m3 joined")
        ledger.wait_for(expected, WAIT, "phase three")
        stop_all(members)

        phase_four = produce_phase(broker.bootstrap, topic, "four")
        expected |= phase_four
        resumer = Member("resumer", broker.bootstrap, group, [topic], ledger,
                         assignor=assignor, reset="error")
        members.append(resumer)
        resumer.start()
        ledger.wait_for(expected, WAIT, "phase four")
        time.sleep(0.5)  # a re-read of anything older would show by now
        stop_all(members)
    finally:
        stop_all(members)
    for m in members:
        m.check()
    rows = ledger.snapshot()
    assert_exactly_once(rows, expected)
    assert sorted((p, o) for m, p, o, _v in rows if m == "resumer") == sorted(phase_four)
    assert committed_offsets(broker.bootstrap, group) == {
        p: 4 * PER_PHASE for p in range(PARTITIONS)}


@pytest.mark.slow
def test_killed_member_expelled_when_its_session_expires(broker: BrokerProcess) -> None:
    """A member SIGKILLed (no leave heartbeat) keeps its partitions until its session times out
    (group.consumer.session.timeout.ms); then the survivors take them over 3+3 from its
    committed offsets."""
    topic, group = unique_topic("kip848-kill"), unique_topic("kip848-kill-g")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    ledger = Ledger()
    survivors = [Member(f"m{i}", broker.bootstrap, group, [topic], ledger) for i in range(2)]
    victim = MemberProcess("victim", broker.bootstrap, group, topic, ledger)
    try:
        for m in survivors:
            m.start()
        wait_shares([*survivors, victim], [2, 2, 2], "three members")
        taken = victim.partitions
        expected = produce_phase(broker.bootstrap, topic, "one")
        ledger.wait_for(expected, WAIT, "phase one")
        victim_read = {(p, o) for m, p, o, _v in ledger.snapshot() if m == "victim"}
        wait_until(lambda: victim_read <= victim.committed, WAIT, "the victim's commits")

        victim.kill()
        killed_at = time.monotonic()
        expected |= produce_phase(broker.bootstrap, topic, "two")
        wait_shares(survivors, [3, 3], "after the kill")
        took_over = time.monotonic() - killed_at
        removals = [(line.get("member"), line.get("reason")) for line in broker.new_log_lines()
                    if line.get("event") == "member removed" and line.get("group") == group]
        ledger.wait_for(expected, WAIT, "phase two")
        time.sleep(0.5)
        d = describe(broker.bootstrap, group)
        assert sorted(m.client_id for m in d.members) == ["m0", "m1"], d.members
    finally:
        victim.kill()
        stop_all(survivors)
    for m in survivors:
        m.check()
    assert not victim.errors, victim.errors
    # Expelled by its session deadline (6 s after its last heartbeat), not sooner: by the time
    # the survivors held its partitions, the only member the group had lost was one whose
    # session timed out (not a rebalance timeout, not a leave).
    assert took_over >= SESSION_MS / 1000 - 2 * HEARTBEAT_MS / 1000 - 1, (
        f"the victim's partitions moved {took_over:.1f}s after the kill")
    assert [reason for _member, reason in removals] == ["session timed out"], removals
    rows = ledger.snapshot()
    assert_exactly_once(rows, expected)
    # The victim read the first phase of its partitions; the survivors took them over at its
    # committed offsets and read the second.
    assert victim_read == {(p, o) for p in taken for o in range(PER_PHASE)}
    moved = {(p, o) for m, p, o, _v in rows if m != "victim" and p in taken}
    assert moved == {(p, o) for p in taken for o in range(PER_PHASE, 2 * PER_PHASE)}


def test_admin_describes_and_lists_consumer_groups(broker: BrokerProcess) -> None:
    """describe_consumer_groups (ConsumerGroupDescribe for a KIP-848 group) shows type
    CONSUMER, Stable, the assignor, each member's client id, host, member id and assignment;
    list_consumer_groups shows the type and filters on it, beside a classic group."""
    topic, group = unique_topic("kip848-admin"), unique_topic("kip848-admin-g")
    classic = unique_topic("kip848-classic-g")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    errors: list = []
    admin = _admin(broker.bootstrap, errors)
    # A classic (Empty) group: offsets committed by the AdminClient, with no member.
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        classic, [TopicPartition(topic, 0, 0)])], request_timeout=10)[classic].result(15)
    ledger = Ledger()
    members = [Member(f"m{i}", broker.bootstrap, group, [topic], ledger) for i in range(2)]
    try:
        for m in members:
            m.start()
        wait_shares(members, [3, 3], "two members")
        d = wait_until(lambda: described_with(broker.bootstrap, group, 2), WAIT,
                       "two described members")
        # librdkafka describes a consumer group with ConsumerGroupDescribe (DescribeGroups
        # would not know its members).
        assert requests_served(broker, "ConsumerGroupDescribe") >= 1
        assert (d.type, d.state, d.partition_assignor, d.is_simple_consumer_group) == (
            ConsumerGroupType.CONSUMER, ConsumerGroupState.STABLE, "uniform", False)
        assert d.coordinator.id == 1
        by_client = {m.client_id: m for m in d.members}
        assert sorted(by_client) == ["m0", "m1"]
        for m in members:
            described = by_client[m.name]
            assert described.host == HOST
            assert described.member_id and described.member_id == m.member_id
            parts = {(tp.topic, tp.partition) for tp in described.assignment.topic_partitions}
            assert parts == m.assignment
            target = {(tp.topic, tp.partition)
                      for tp in described.target_assignment.topic_partitions}
            assert target == parts, "a Stable group's members have their target assignment"

        everything = listed(broker.bootstrap)
        assert everything[group] == (ConsumerGroupType.CONSUMER, ConsumerGroupState.STABLE)
        assert everything[classic] == (ConsumerGroupType.CLASSIC, ConsumerGroupState.EMPTY)
        consumer_only = listed(broker.bootstrap, types={ConsumerGroupType.CONSUMER})
        assert group in consumer_only and classic not in consumer_only
        classic_only = listed(broker.bootstrap, types={ConsumerGroupType.CLASSIC})
        assert classic in classic_only and group not in classic_only
        stable = listed(broker.bootstrap, states={ConsumerGroupState.STABLE})
        assert group in stable and classic not in stable
    finally:
        stop_all(members)
    for m in members:
        m.check()
    assert not errors, errors
    empty = describe(broker.bootstrap, group)
    assert (empty.type, empty.state, empty.members) == (
        ConsumerGroupType.CONSUMER, ConsumerGroupState.EMPTY, [])


def test_classic_member_joins_a_live_consumer_group(broker: BrokerProcess) -> None:
    """As Kafka 4 lets it for rolling upgrades: a classic member's JoinGroup to a consumer group
    with members makes it a member of that group, assigned by the group's assignor through
    JoinGroup/SyncGroup (3+3 with the consumer member); the group stays a consumer group, no
    record is processed twice while partitions move, and when the classic member leaves the
    consumer member takes everything back."""
    topic, group = unique_topic("kip848-mixed"), unique_topic("kip848-mixed-g")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    ledger = Ledger()
    expected = produce_phase(broker.bootstrap, topic, "one")
    modern = Member("modern", broker.bootstrap, group, [topic], ledger)
    classic = Member("classic", broker.bootstrap, group, [topic], ledger, protocol="classic")
    try:
        modern.start()
        wait_shares([modern], [PARTITIONS], "the consumer member alone")
        ledger.wait_for(expected, WAIT, "phase one")
        classic.start()
        wait_shares([modern, classic], [3, 3], "with the classic member")
        theirs = classic.partitions
        expected |= produce_phase(broker.bootstrap, topic, "two")
        ledger.wait_for(expected, WAIT, "phase two")
        d = describe(broker.bootstrap, group)
        assert (d.type, d.state) == (ConsumerGroupType.CONSUMER, ConsumerGroupState.STABLE)
        assert sorted(m.client_id for m in d.members) == ["classic", "modern"]
        classic.finish()
        expected |= produce_phase(broker.bootstrap, topic, "three")
        wait_shares([modern], [PARTITIONS], "after the classic member left")
        ledger.wait_for(expected, WAIT, "phase three")
    finally:
        stop_all([modern, classic])
    modern.check()
    classic.check()
    rows = ledger.snapshot()
    assert_exactly_once(rows, expected)
    # The classic member read the second phase of its partitions, from the consumer member's
    # commits.
    assert sorted((p, o) for m, p, o, _v in rows if m == "classic") == sorted(
        (p, o) for p in theirs for o in range(PER_PHASE, 2 * PER_PHASE))


def test_empty_group_switches_protocol(broker: BrokerProcess) -> None:
    """An empty group takes whichever protocol its next member speaks, keeping its offsets:
    classic, then consumer, then classic again, each resuming at the committed offsets
    (auto.offset.reset=error)."""
    topic, group = unique_topic("kip848-switch"), unique_topic("kip848-switch-g")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    ledger = Ledger()
    expected: Expected = {}
    types = []
    for i, protocol in enumerate(["classic", "consumer", "classic"]):
        phase = produce_phase(broker.bootstrap, topic, f"p{i}", count=5)
        expected |= phase
        m = Member(f"{protocol}{i}", broker.bootstrap, group, [topic], ledger,
                   protocol=protocol, reset="earliest" if i == 0 else "error")
        try:
            m.start()
            ledger.wait_for(expected, WAIT, f"{protocol} member {i}")
            wait_shares([m], [PARTITIONS], f"{protocol} member {i}")
            types.append(describe(broker.bootstrap, group).type)
        finally:
            stop_all([m])
        m.check()
        assert sorted((p, o) for n, p, o, _v in ledger.snapshot() if n == m.name) == sorted(
            phase), f"{m.name} did not resume at the committed offsets"
    assert types == [ConsumerGroupType.CLASSIC, ConsumerGroupType.CONSUMER,
                     ConsumerGroupType.CLASSIC]
    assert_exactly_once(ledger.snapshot(), expected)
    assert committed_offsets(broker.bootstrap, group) == {p: 15 for p in range(PARTITIONS)}


def test_regex_subscription_picks_up_a_new_topic(broker: BrokerProcess) -> None:
    """subscribe(["^prefix.*"]): librdkafka sends the regex to the broker (ConsumerGroupHeartbeat
    v1), which resolves it; a matching topic created later is assigned and read, a topic that
    does not match is not."""
    prefix = unique_topic("kip848re")
    first, later, other = f"{prefix}-a", f"{prefix}-b", unique_topic("kip848-other")
    create_topic(broker.bootstrap, first, 2)
    create_topic(broker.bootstrap, other, 1)
    produce_phase(broker.bootstrap, first, "a", partitions=2, count=5)
    produce_phase(broker.bootstrap, other, "x", partitions=1, count=5)
    ledger = Ledger()
    m = Member("re", broker.bootstrap, unique_topic("kip848-re-g"), [f"^{prefix}.*"],
               ledger)
    try:
        m.start()
        wait_until(lambda: m.assignment == {(first, 0), (first, 1)}, WAIT,
                   "the matching topic assigned")
        create_topic(broker.bootstrap, later, 2)
        produce_phase(broker.bootstrap, later, "b", partitions=2, count=5)
        wait_until(lambda: m.assignment == {(first, p) for p in range(2)} | {
            (later, p) for p in range(2)}, WAIT, f"{later} assigned (have {m.assignment})")
        wait_until(lambda: len(m.topic_rows) >= 20, WAIT, "records of both topics")
        time.sleep(0.3)
    finally:
        stop_all([m])
    m.check()
    assert requests_served(broker, "ConsumerGroupHeartbeat", 1) > 0, "no heartbeat v1"
    got = sorted((t, p, o) for t, p, o, _v in m.topic_rows)
    assert got == sorted((t, p, o) for t in (first, later) for p in range(2) for o in range(5))


if __name__ == "__main__":
    _member_process_main(sys.argv[1])
