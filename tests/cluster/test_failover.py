"""Failover between three brokers on a real etcd, with confluent-kafka.

Kafka's hard bounce: the leader (or the controller) of an RF 3, min.insync.replicas 2 partition
is crashed and started again, again and again, while an idempotent acks=all producer and a
consumer run; every acknowledged record is read exactly once, in order, at the offset it was
acknowledged at, and the consumer's position never goes back. A divergent suffix: a leader cut
off from its stalled followers takes acks=1 records alone, crashes, a follower is elected
uncleanly and takes other records at the same offsets; the old leader, started again,
truncates its suffix and its log becomes the new leader's. A leader crashed ahead of its
follower with acks=all loses nothing acknowledged, and a new leader commits the records it
copied while its high watermark lagged without waiting for a new append.

The brokers are an EmbeddedCluster (broker.testing.cluster): real brokers on loopback ports
and their own etcd, each broker on its own thread and loop. A kill is a crash (nothing
flushed or checkpointed, no clean-shutdown marker, the registration left to expire, recovery
at the next start) and a pause stalls one broker's loop as SIGSTOP would, but a start takes
milliseconds instead of a new interpreter's seconds, which keeps each test well under a minute.

Consumer group offsets across the death of the group coordinator are not tested here: the
internal topics have one replica (broker.testing.cluster.CLUSTER_DEFAULTS).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker.testing import EmbeddedCluster
from tests.cluster.test_cluster_brokers import eventually
from tests.cluster.test_cluster_faults import RETRIABLE, TOPIC_ALREADY_EXISTS
from tests.cluster.test_replication import batches_in, produce_acked
from tests.support.wire import Wire

pytestmark = pytest.mark.timeout(150)  # a hard stop; the tests aim at well under 60 s

#: Bounces of the hard-bounce test.
BOUNCES = 3

#: The session of the tests that stall followers: longer than a stall (they keep their
#: registration), short enough for a quick election once the leader is crashed.
SESSION_MS = 6000

#: CreateTopics errors retried: RETRIABLE, and a controller that does not see every broker
#: that just registered yet (INVALID_REPLICATION_FACTOR).
CREATE_RETRIABLE = RETRIABLE | {38}

#: As tests/cluster/test_replication.py: short fetch waits and back-offs, small segments,
#: every append fsynced (the high watermark waits for the leader's fsync). Inter-broker
#: requests to a crashed peer give up after 3 s.
SETTINGS = {
    "broker.heartbeat.interval.ms": "500",
    "replica.fetch.wait.max.ms": "200",
    "replica.fetch.backoff.ms": "200",
    "log.segment.bytes": "8192",
    "log.flush.interval.messages": "1",
    "request.timeout.ms": "3000",
}


@contextlib.contextmanager
def cluster_of(tmp_path: Path, session_ms: int, lag_ms: int) -> Iterator[EmbeddedCluster]:
    """A started cluster; crashed at the end (a clean stop of each broker takes seconds)."""
    cluster = EmbeddedCluster(3, tmp_path / "cluster", **SETTINGS, **{
        "broker.session.timeout.ms": str(session_ms),
        "replica.lag.time.max.ms": str(lag_ms)}).start()
    try:
        yield cluster
    finally:
        for b in cluster.brokers:
            b.kill()
        cluster.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    # A session of 4 s: on a loaded machine 2 s lets live brokers' leases lapse now and then.
    with cluster_of(tmp_path, 4000, 2000) as c:
        yield c


def full_isr(cluster: EmbeddedCluster, topic: str) -> int | None:
    """The partition's leader once it has one and its ISR is all three replicas."""
    leader = cluster.leader(topic, 0)
    return leader if leader is not None and len(cluster.isr(topic, 0)) == 3 else None


def leader_epoch(cluster: EmbeddedCluster, topic: str) -> int:
    """The partition's leader epoch as a running broker's Metadata answers it (-1: none)."""
    for b in cluster.brokers:
        if not b.running:
            continue
        wire = Wire(b.port)
        try:
            meta = wire.request(MetadataRequest[9](
                topics=None, allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False), MetadataResponse)
        finally:
            wire.close()
        for t in meta.topics:
            for p in t.partitions:
                if t.name == topic and p.partition_index == 0:
                    return int(p.leader_epoch)
    return -1


def batches(cluster: EmbeddedCluster, node: int, topic: str) -> list[tuple[int, int, int, int]]:
    return batches_in(cluster.broker(node).embedded.data_dir / "logs", topic)


def same_batches(cluster: EmbeddedCluster, topic: str, end: int) -> bool:
    logs = [batches(cluster, b.node_id, topic) for b in cluster.brokers]
    return all(log == logs[0] for log in logs) and bool(logs[0]) and logs[0][-1][1] == end - 1


def create(cluster: EmbeddedCluster, name: str, configs: dict[str, str]) -> int:
    """One partition, three replicas, ``configs``; retried on the retriable errors and on no
    answer (a cluster just started: the client may not know the controller yet); then the
    partition's leader once its ISR is full."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    deadline = time.monotonic() + 40
    tried = False
    while True:
        try:
            admin.create_topics([NewTopic(name, 1, 3, config=configs)], operation_timeout=10,
                                request_timeout=12)[name].result(15)
            break
        except KafkaException as e:
            code = e.args[0].code()
            if tried and code == TOPIC_ALREADY_EXISTS:
                break  # an earlier attempt created it, unanswered
            if code not in CREATE_RETRIABLE or time.monotonic() > deadline:
                raise
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
        tried = True
        time.sleep(0.5)
    return int(eventually(lambda: full_isr(cluster, name), 20))


class Traffic:
    """An idempotent acks=all producer and an assigned consumer, each on its own thread."""

    def __init__(self, servers: str, topic: str) -> None:
        self.servers = servers
        self.topic = topic
        self.acked: list[tuple[int, bytes]] = []
        self.errors: list[str] = []
        self.consumed: list[tuple[int, bytes]] = []
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.read_until = -1  # the consumer stops once it has read this offset
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def _report(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.append((msg.offset(), msg.value()))
        else:
            self.errors.append(str(err))

    def _produce(self) -> None:
        producer = Producer({"bootstrap.servers": self.servers, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 5,
                             "message.timeout.ms": 60000})
        seq = 0
        while not self.stop_producing.is_set():
            if len(producer) < 100:  # bounded in flight while a leader is away
                producer.produce(self.topic, f"{seq:09d}".encode(), partition=0,
                                 on_delivery=self._report)
                seq += 1
            producer.poll(0.01)
        left = producer.flush(30)
        if left:
            self.errors.append(f"{left} records left unanswered")

    def _consume(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.servers,
                             "group.id": f"g-{uuid.uuid4().hex}", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(self.topic, 0, 0)])
        deadline: float | None = None
        try:
            while True:
                if self.stop_consuming.is_set():
                    deadline = deadline or time.monotonic() + 20
                    if (self.consumed and self.consumed[-1][0] >= self.read_until
                            or time.monotonic() > deadline):
                        return
                msg = consumer.poll(0.2)
                if msg is None or msg.error():
                    continue
                offset, value = msg.offset(), msg.value()
                assert offset is not None and value is not None
                self.consumed.append((offset, value))
        finally:
            consumer.close()

    def acked_more(self, count: int, within_s: float) -> None:
        """``count`` more records acknowledged within ``within_s``."""
        before = len(self.acked)
        eventually(lambda: len(self.acked) >= before + count, within_s)

    def finish(self) -> None:
        self.stop_producing.set()
        self.threads[0].join(40)
        offsets = [o for o, _ in self.acked]
        self.read_until = max(offsets) if offsets else -1
        self.stop_consuming.set()
        self.threads[1].join(30)


def check_never_truncated_below_the_high_watermark(caplog: pytest.LogCaptureFixture) -> None:
    """After clean elections no replica cuts its log below its high watermark: every record
    below it is on every ISR member, the new leader's log included (Kafka's guarantee;
    the replica fetcher warns when it does)."""
    below = [r.getMessage()[:300] for r in caplog.records
             if "truncating below the high watermark" in r.getMessage()]
    assert below == []


def check_read_exactly_once(traffic: Traffic) -> None:
    acked, consumed = traffic.acked, traffic.consumed
    offsets = [o for o, _ in acked]
    assert len(set(offsets)) == len(offsets), "one offset acknowledged for two records"
    positions = [o for o, _ in consumed]
    backwards = [(a, b) for a, b in zip(positions, positions[1:], strict=False) if b <= a]
    assert backwards == [], f"the consumer's position went back: {backwards[:5]}"
    at = dict(consumed)
    wrong = [(o, v, at.get(o)) for o, v in acked if at.get(o) != v]
    assert wrong == [], f"acknowledged records not read at their offset: {wrong[:5]}"
    seen = Counter(v for _, v in consumed)
    assert [v for v, n in seen.items() if n > 1] == [], "a record read twice"
    values = [v for _, v in consumed]
    assert values == sorted(values), "records out of the producer's order"


@pytest.mark.parametrize("victim", ["leader", "controller"])
def test_hard_bounce(cluster: EmbeddedCluster, victim: str,
                     caplog: pytest.LogCaptureFixture) -> None:
    topic = f"bounce-{uuid.uuid4().hex[:8]}"
    create(cluster, topic, {"min.insync.replicas": "2"})
    traffic = Traffic(cluster.bootstrap_servers, topic).start()
    try:
        traffic.acked_more(50, 20)
        for _ in range(BOUNCES):
            bounce(cluster, topic, traffic, victim)
        eventually(lambda: full_isr(cluster, topic), 20)
        traffic.acked_more(20, 20)
    finally:
        traffic.finish()
    assert traffic.acked, traffic.errors
    check_read_exactly_once(traffic)
    check_never_truncated_below_the_high_watermark(caplog)


def test_a_rolling_restart_with_controlled_shutdowns(cluster: EmbeddedCluster,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Each broker in turn stopped cleanly (SIGTERM's path: controlled shutdown moves its
    leadership first) and started again, under traffic: acks=all never stalls, no delivery
    fails, and every acknowledged record is read once, in order."""
    topic = f"roll-{uuid.uuid4().hex[:8]}"
    create(cluster, topic, {"min.insync.replicas": "2"})
    traffic = Traffic(cluster.bootstrap_servers, topic).start()
    try:
        traffic.acked_more(50, 20)
        for broker in cluster.brokers:
            eventually(lambda: full_isr(cluster, topic), 20)
            broker.stop()
            assert cluster.leader(topic, 0) not in (None, broker.node_id)
            traffic.acked_more(20, 10)  # acks=all goes on with two
            broker.start()
        eventually(lambda: full_isr(cluster, topic), 20)
        traffic.acked_more(20, 20)
    finally:
        traffic.finish()
    assert traffic.errors == []
    check_read_exactly_once(traffic)
    check_never_truncated_below_the_high_watermark(caplog)


def bounce(cluster: EmbeddedCluster, topic: str, traffic: Traffic, victim: str) -> None:
    """Crash the victim with the ISR full, see acks=all go on without it (within a few
    seconds of the new leader's election: the partition never stalls), start it again."""
    leader = int(eventually(lambda: full_isr(cluster, topic), 20))
    target = leader if victim == "leader" else cluster.wait_for_controller()
    cluster.kill(target)

    def moved() -> bool:
        now = cluster.leader(topic, 0)
        if now is None or now == target:
            return False
        return victim == "leader" or cluster.controller() not in (None, target)

    eventually(moved, 20)
    traffic.acked_more(20, 10)  # acks=all goes on with two
    cluster.broker(target).start()


def produce_one_ack(servers: str, topic: str, values: list[bytes]) -> list[tuple[int, bytes]]:
    """acks=1; (offset, value) of each acknowledged record."""
    producer = Producer({"bootstrap.servers": servers, "acks": "1",
                         "enable.idempotence": False, "linger.ms": 0,
                         "message.timeout.ms": 10000})
    acked: list[tuple[int, bytes]] = []

    def report(err: Any, msg: Any) -> None:
        assert err is None, err
        acked.append((msg.offset(), msg.value()))

    for v in values:
        producer.produce(topic, v, partition=0, on_delivery=report)
    assert producer.flush(15) == 0
    return acked


def test_a_divergent_suffix_is_truncated(tmp_path: Path) -> None:
    # Followers stalled shorter than the session: they keep their registration, only fall
    # out of the ISR (replica.lag.time.max.ms 1 s).
    with cluster_of(tmp_path, SESSION_MS, 1000) as cluster:
        topic = f"div-{uuid.uuid4().hex[:8]}"
        old = create(cluster, topic, {"min.insync.replicas": "1",
                                      "unclean.leader.election.enable": "true"})
        epoch = leader_epoch(cluster, topic)
        first = produce_acked(cluster.bootstrap_servers, topic,
                              [f"common-{i}".encode() for i in range(50)])
        assert sorted(o for o, _ in first) == list(range(50))
        eventually(lambda: same_batches(cluster, topic, 50), 20)

        followers = [b.node_id for b in cluster.brokers if b.node_id != old]
        for f in followers:
            cluster.pause(f, 30)
        try:
            # A fetch a follower sent before its stall may still be answered into its socket:
            # one record, then longer than replica.fetch.wait.max.ms, takes every such answer.
            fence = produce_one_ack(cluster.broker(old).bootstrap_servers, topic, [b"fence"])
            assert [o for o, _ in fence] == [50]
            time.sleep(0.5)
            alone = produce_one_ack(cluster.broker(old).bootstrap_servers, topic,
                                    [f"divergent-{i}".encode() for i in range(20)])
            assert sorted(o for o, _ in alone) == list(range(51, 71))
            eventually(lambda: cluster.isr(topic, 0) == [old], 5)
            cluster.kill(old)
        finally:
            for f in followers:
                cluster.broker(f).resume()

        new = int(eventually(lambda: (n := cluster.leader(topic, 0)) in followers and n, 30))
        assert leader_epoch(cluster, topic) > epoch
        servers = ",".join(cluster.broker(f).bootstrap_servers for f in followers)
        later = produce_acked(servers, topic, [f"new-{i}".encode() for i in range(30)])
        # The new leader's log ended at 50 or 51 (the fence): the old leader's divergent
        # records were never replicated, their offsets are taken by the new ones.
        start = min(o for o, _ in later)
        assert start in (50, 51)
        assert sorted(o for o, _ in later) == list(range(start, start + 30))

        cluster.broker(old).start()
        eventually(lambda: same_batches(cluster, topic, start + 30), 30)
        assert batches(cluster, old, topic) == batches(cluster, new, topic)
        logs = cluster.broker(old).embedded.data_dir / "logs" / f"{topic}-0"
        for path in logs.glob("*.log"):
            assert b"divergent-" not in path.read_bytes(), f"{path} kept the divergent suffix"


def test_acks_all_loses_nothing_when_the_leader_dies_ahead(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """min.insync.replicas 2: one follower stalled (out of the ISR), the leader crashed in
    the middle of acks=all traffic, likely ahead of the other follower; that follower is
    elected (cleanly), the stalled one resumes, the old leader comes back and truncates."""
    with cluster_of(tmp_path, SESSION_MS, 1000) as cluster:
        topic = f"ahead-{uuid.uuid4().hex[:8]}"
        old = create(cluster, topic, {"min.insync.replicas": "2"})
        epoch = leader_epoch(cluster, topic)
        heir, late = [b.node_id for b in cluster.brokers if b.node_id != old]
        traffic = Traffic(cluster.bootstrap_servers, topic).start()
        try:
            traffic.acked_more(50, 20)
            cluster.pause(late, 30)
            try:
                eventually(lambda: sorted(cluster.isr(topic, 0)) == sorted([old, heir]), 5)
                traffic.acked_more(20, 5)  # acks=all with two
                cluster.kill(old)
            finally:
                cluster.broker(late).resume()
            eventually(lambda: cluster.leader(topic, 0) == heir, 30)
            assert leader_epoch(cluster, topic) > epoch
            traffic.acked_more(50, 20)  # the ISR grew back
            cluster.broker(old).start()
            eventually(lambda: full_isr(cluster, topic), 30)
        finally:
            traffic.finish()
        assert traffic.acked, traffic.errors
        check_read_exactly_once(traffic)
        end = max(o for o, _ in traffic.acked) + 1
        eventually(lambda: same_batches(cluster, topic, end), 30)
        check_never_truncated_below_the_high_watermark(caplog)


def test_a_new_leader_commits_what_it_holds_without_new_appends(tmp_path: Path) -> None:
    """Records a follower copied while its high watermark lagged (a stalled ISR member held
    the leader's back) become readable once the new leader's followers have them: the new
    leader counts its own log at once, no new append needed."""
    with cluster_of(tmp_path, SESSION_MS, 30000) as cluster:
        topic = f"held-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1,
                                      replica_assignment=[[1, 2, 3]],
                                      config={"min.insync.replicas": "1"})],
                            operation_timeout=10)[topic].result(30)
        assert eventually(lambda: full_isr(cluster, topic), 20) == 1
        produce_acked(cluster.bootstrap_servers, topic, [f"a-{i}".encode() for i in range(50)])
        eventually(lambda: same_batches(cluster, topic, 50), 20)
        cluster.pause(3, 30)
        try:
            alone = produce_one_ack(cluster.broker(1).bootstrap_servers, topic,
                                    [f"b-{i}".encode() for i in range(20)])
            assert sorted(o for o, _ in alone) == list(range(50, 70))
            eventually(lambda: batches(cluster, 2, topic)[-1][1] == 69, 10)
            cluster.kill(1)  # broker 3, stalled and still in the ISR, held the HW at 50
        finally:
            cluster.broker(3).resume()
        eventually(lambda: cluster.leader(topic, 0) not in (None, 1), 20)
        assert cluster.leader(topic, 0) == 2  # the first live replica of the ISR
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                             "group.id": f"g-{uuid.uuid4().hex}", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        read: list[bytes] = []
        deadline = time.monotonic() + 20
        try:
            while len(read) < 70 and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is not None and not msg.error():
                    read.append(msg.value() or b"")
        finally:
            consumer.close()
        assert len(read) == 70, "records below the new leader's log end were never committed"
        assert read[50:] == [v for _, v in alone]


def registration_epoch(cluster: EmbeddedCluster, node: int) -> int | None:
    """The broker's registration epoch in etcd (None: not registered)."""
    running = cluster.broker(node).broker
    cluster_node = running.cluster if running is not None else None
    registration = cluster_node.membership.registration if cluster_node is not None else None
    return registration.epoch if registration is not None else None


def revoke_registration(cluster: EmbeddedCluster, node: int) -> int:
    """Revoke the lease of broker ``node``'s registration, as etcd expires one that was not
    refreshed in time: the broker hears it at its next refresh. The epoch revoked."""
    broker = cluster.broker(node)
    running = broker.broker
    assert running is not None and running.cluster is not None
    registration = running.cluster.membership.registration
    assert registration is not None and registration.lease is not None
    epoch, lease = registration.epoch, registration.lease.id
    assert epoch is not None
    store = running.cluster.store
    broker._on_loop(lambda: store.revoke_lease(lease))
    return epoch


def test_a_controller_registered_again_leads_its_partition_again(tmp_path: Path) -> None:
    """The controller leads an RF 3, min.insync.replicas 2 partition and loses its
    registration; the other brokers stalled, it registers again and is elected again before
    they act. No controller saw it go, so nothing in etcd changes: it is still the leader,
    in the same leader epoch, with a whole ISR. It stopped serving the partition on the loss
    and must serve it again: acks=all is acknowledged again within seconds."""
    with cluster_of(tmp_path, SESSION_MS, 30000) as cluster:
        topic = f"again-{uuid.uuid4().hex[:8]}"
        controller = cluster.wait_for_controller()
        others = [b.node_id for b in cluster.brokers if b.node_id != controller]
        # A manual assignment names every broker: each must be registered (under load one
        # may still be registering again after a missed refresh).
        cluster.wait_for(lambda: sorted(cluster.registered()) == [1, 2, 3], 30,
                         "every broker registered")
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=-1,
                                      replica_assignment=[[controller, *others]],
                                      config={"min.insync.replicas": "2"})],
                            operation_timeout=10)[topic].result(30)
        assert eventually(lambda: full_isr(cluster, topic), 20) == controller
        produce_acked(cluster.bootstrap_servers, topic, [f"a-{i}".encode() for i in range(10)])
        epoch = leader_epoch(cluster, topic)
        for node in others:  # shorter than their session: they stay registered
            cluster.pause(node, 20)
        try:
            old = revoke_registration(cluster, controller)
            eventually(lambda: (registration_epoch(cluster, controller) or old) > old
                       and cluster.controller() == controller, 3)
        finally:
            for node in others:
                cluster.broker(node).resume()
        acked = produce_acked(cluster.bootstrap_servers, topic,
                              [f"b-{i}".encode() for i in range(10)])
        assert sorted(o for o, _ in acked) == list(range(10, 20))
        assert (cluster.leader(topic, 0), leader_epoch(cluster, topic)) == (controller, epoch)
        assert sorted(cluster.isr(topic, 0)) == sorted([controller, *others])
