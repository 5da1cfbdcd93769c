"""Moving leadership between real broker processes on a real etcd, driven by real clients:
SIGTERM makes the leader's broker hand its partitions over before it exits (controlled
shutdown) while an acks=1 confluent-kafka producer keeps writing; back, the broker is given
its partition again by confluent-kafka's AdminClient.elect_leaders (PREFERRED), a second call
answering ELECTION_NOT_NEEDED, or by the controller's auto rebalance; a single broker answers
ElectLeaders and ControlledShutdown as Kafka's.

Followers do not fetch yet, so the returning broker is taken back into the ISR by a Fetch sent
on its behalf, as a replica, to the partition's leader: the leader's real ISR expansion (a
compare-and-swap of the partition state in etcd) then runs as it will for the broker's own
fetcher. Every broker keeps replica.lag.time.max.ms at its default (30 s), which each test
stays well within, so no ISR shrinks underneath it.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import ElectLeadersRequest, ElectLeadersResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker.cluster.etcd_process import EtcdProcess
from broker.cluster.store import EventType, WatchEvent
from broker.cluster.topic_state import PartitionState, state_key
from broker.interbroker.shutdown import request as shutdown_request
from broker.testing import EmbeddedBroker
from protocol.errors import ErrorCode
from protocol.messages import ControlledShutdownResponse
from tests.cluster.test_cluster_brokers import eventually
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, unique_topic
from tests.support.wire import Wire

pytestmark = pytest.mark.timeout(60, func_only=True)


def overrides(etcd: EtcdProcess, prefix: str, node_id: int, rebalance_s: int | None
              ) -> dict[str, str]:
    return {"node.id": str(node_id), "minibroker.etcd.endpoints": etcd.endpoint,
            "minibroker.etcd.prefix": prefix, "broker.session.timeout.ms": "10000",
            "broker.heartbeat.interval.ms": "1000",
            "controlled.shutdown.retry.backoff.ms": "500",
            "auto.leader.rebalance.enable": "false" if rebalance_s is None else "true",
            "leader.imbalance.check.interval.seconds": str(rebalance_s or 300)}


def start_three(tmp_path: Path, etcd: EtcdProcess, rebalance_s: int | None = None
                ) -> tuple[list[BrokerProcess], str]:
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    brokers: list[BrokerProcess] = []
    try:
        for node_id in (1, 2, 3):
            brokers.append(BrokerProcess(tmp_path / f"b{node_id}", overrides(
                etcd, prefix, node_id, rebalance_s)).start())
    except BaseException:
        kill_all(brokers)
        raise
    return brokers, prefix


def kill_all(brokers: list[BrokerProcess]) -> None:
    for b in brokers:
        if b.proc is not None and b.proc.poll() is None:
            b.kill()


@pytest.fixture
def three(tmp_path: Path, etcd_server: EtcdProcess) -> Iterator[tuple[list[BrokerProcess], str]]:
    brokers, prefix = start_three(tmp_path, etcd_server)
    yield brokers, prefix
    kill_all(brokers)


@pytest.fixture
def three_rebalancing(tmp_path: Path, etcd_server: EtcdProcess
                      ) -> Iterator[tuple[list[BrokerProcess], str]]:
    brokers, prefix = start_three(tmp_path, etcd_server, rebalance_s=1)
    yield brokers, prefix
    kill_all(brokers)


# -- helpers ---------------------------------------------------------------------------------

def metadata(broker: BrokerProcess, topic: str) -> Any:
    wire = Wire(broker.port)
    try:
        return wire.request(MetadataRequest[12](
            topics=[MetadataRequest[12].MetadataRequestTopic(topic_id=None, name=topic)],
            allow_auto_topic_creation=False, include_topic_authorized_operations=False),
            MetadataResponse)
    finally:
        wire.close()


def partition0(broker: BrokerProcess, topic: str) -> Any:
    meta = metadata(broker, topic)
    (t,) = meta.topics
    return t.partitions[0] if t.error_code == 0 and t.partitions else None


def led_by(broker: BrokerProcess, topic: str, leader: int) -> Callable[[], Any]:
    """A check: the partition as ``broker`` describes it once ``leader`` leads it."""
    def check() -> Any:
        p = partition0(broker, topic)
        return p if p is not None and p.leader_id == leader else None
    return check


def node_of(brokers: list[BrokerProcess], node_id: int) -> BrokerProcess:
    return brokers[node_id - 1]


def create_rf3(brokers: list[BrokerProcess], topic: str, leader: int) -> None:
    """One partition on the three brokers, ``leader`` its preferred replica."""
    replicas = [leader] + [i for i in (1, 2, 3) if i != leader]
    admin = AdminClient({"bootstrap.servers": brokers[0].bootstrap})
    new = NewTopic(topic, 1, replica_assignment=[replicas])
    admin.create_topics([new])[topic].result(30)
    eventually(lambda: all((p := partition0(b, topic)) is not None and p.leader_id == leader
                           and sorted(p.isr_nodes) == [1, 2, 3] for b in brokers), 20)


def etcd_events(etcd: EtcdProcess, prefix: str, since: int) -> list[WatchEvent]:
    """Every write under the cluster's prefix after revision ``since`` up to now, in order."""
    from broker.cluster.etcd_store import EtcdStore

    async def read() -> list[WatchEvent]:
        store = EtcdStore(etcd.endpoint, root=prefix, request_timeout=5.0)
        try:
            now = (await store.get_prefix("/")).revision
            events: list[WatchEvent] = []
            async with store.watch("/", start_revision=since + 1, prefix=True) as watch:
                while not events or events[-1].revision < now:
                    events.append(await asyncio.wait_for(anext(watch), 5))
            return events
        finally:
            await store.close()

    return asyncio.run(read())


def etcd_revision_and_epoch(etcd: EtcdProcess, prefix: str, node_id: int) -> tuple[int, int]:
    """The store's revision now and the broker's epoch (its registration's create revision)."""
    from broker.cluster.etcd_store import EtcdStore

    async def read() -> tuple[int, int]:
        store = EtcdStore(etcd.endpoint, root=prefix, request_timeout=5.0)
        try:
            listing = await store.get_prefix("/brokers/ids/")
            kv = next(kv for kv in listing.kvs if kv.key == f"/brokers/ids/{node_id}")
            return listing.revision, kv.create_revision
        finally:
            await store.close()

    return asyncio.run(read())


def handed_over_before_leaving(etcd: EtcdProcess, prefix: str, since: int, topic: str,
                               victim: int) -> PartitionState:
    """The partition's first state written after revision ``since``: naming another leader and an
    ISR without ``victim``, at a revision before ``victim``'s registration was deleted."""
    events = etcd_events(etcd, prefix, since)
    key = state_key(topic, 0)
    moved = next(e for e in events if e.type is EventType.PUT and e.kv.key == key)
    state = PartitionState.from_kv(moved.kv)
    left = next(e for e in events
                if e.type is EventType.DELETE and e.kv.key == f"/brokers/ids/{victim}")
    assert moved.revision < left.revision, "leadership moved only after the broker left"
    assert state.leader not in (victim, -1) and victim not in state.isr, state
    return state


def log_end(records: bytes | None) -> int:
    """The offset after the last record batch of a Fetch answer (0 without records)."""
    data, pos, end = bytes(records or b""), 0, 0
    while pos + 27 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        (last_delta,) = struct.unpack_from(">i", data, pos + 23)
        end = base + last_delta + 1
        pos += 12 + length
    return end


def fetch_as_replica(leader: BrokerProcess, topic_id: uuid.UUID, replica: int,
                     broker_epoch: int, leader_epoch: int) -> None:
    """What the returning broker's fetcher will send: a Fetch v15 as replica ``replica``
    (its broker epoch), first from offset 0 to learn the log end, then at the log end, which
    is what lets the leader take it into the ISR."""
    wire = Wire(leader.port)

    def fetch(offset: int) -> Any:
        part = FetchRequest.FetchTopic.FetchPartition(
            partition=0, current_leader_epoch=leader_epoch, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=0, partition_max_bytes=8 << 20)
        resp = wire.request(FetchRequest[15](
            replica_state=FetchRequest.ReplicaState(replica_id=replica,
                                                    replica_epoch=broker_epoch),
            max_wait_ms=0, min_bytes=0, max_bytes=8 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[FetchRequest.FetchTopic(topic_id=topic_id,
                                                              partitions=[part])],
            forgotten_topics_data=[], rack_id=""), FetchResponse)
        answer = resp.responses[0].partitions[0]
        assert answer.error_code == 0, ErrorCode(answer.error_code)
        return answer

    try:
        fetch(log_end(fetch(0).records))
    finally:
        wire.close()


def rejoin_isr(etcd: EtcdProcess, prefix: str, brokers: list[BrokerProcess], topic: str,
               returning: int) -> Any:
    """The returned broker back in the partition's ISR (see the module's docstring)."""
    other = next(b for b in brokers if int(b.overrides["node.id"]) != returning)
    p = eventually(lambda: partition0(other, topic), 10)
    topic_id = metadata(other, topic).topics[0].topic_id
    _, epoch = etcd_revision_and_epoch(etcd, prefix, returning)
    fetch_as_replica(node_of(brokers, p.leader_id), topic_id, returning, epoch,
                     p.leader_epoch)
    return eventually(lambda: (q := partition0(other, topic)) is not None
                      and returning in q.isr_nodes and q, 10)


class Writer:
    """An acks=1 confluent-kafka producer writing one record every 10 ms on a thread; every
    delivery report kept."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": 1,
                                  "linger.ms": 5, "message.timeout.ms": 30000})
        self.topic = topic
        self.reports: list[tuple[Any, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self.producer.produce(self.topic, f"v{i}".encode(), partition=0,
                                  on_delivery=lambda e, m: self.reports.append((e, m.offset())))
            self.producer.poll(0.01)
            i += 1

    def delivered(self) -> int:
        return sum(1 for e, _ in self.reports if e is None)

    def stop(self) -> list[Any]:
        """Stop, deliver what is queued; the errors reported."""
        self._stop.set()
        self._thread.join(10)
        assert self.producer.flush(30) == 0, "records left undelivered"
        return [e for e, _ in self.reports if e is not None]


def elect_preferred(brokers: list[BrokerProcess], topic: str) -> Any:
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in brokers
                                                        if b.proc and b.proc.poll() is None)})
    tp = TopicPartition(topic, 0)
    # No timeout arguments: confluent-kafka 2.16 fails on them (SystemError in its parsing).
    return admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)[tp]


# -- the tests -------------------------------------------------------------------------------

def test_sigterm_hands_leadership_over_and_preferred_election_gives_it_back(
        three: tuple[list[BrokerProcess], str], etcd_server: EtcdProcess) -> None:
    brokers, prefix = three
    controller = metadata(brokers[0], "x").controller_id
    victim_id = next(i for i in (1, 2, 3) if i != controller)  # asks the controller remotely
    victim = node_of(brokers, victim_id)
    topic = unique_topic("cs")
    create_rf3(brokers, topic, victim_id)
    others = [b for b in brokers if b is not victim]

    writer = Writer(",".join(b.bootstrap for b in brokers), topic)
    eventually(lambda: writer.delivered() > 20, 15)
    since, _ = etcd_revision_and_epoch(etcd_server, prefix, victim_id)
    assert victim.stop() == 0
    state = handed_over_before_leaving(etcd_server, prefix, since, topic, victim_id)
    assert state.leader_epoch == 1
    assert any(line.get("event") == "controlled shutdown succeeded"
               for line in victim.new_log_lines())
    for b in others:
        p = eventually(led_by(b, topic, state.leader), 10)
        assert p.leader_epoch == 1 and victim_id not in p.isr_nodes
    before = writer.delivered()
    eventually(lambda: writer.delivered() > before + 20, 20)  # written to the new leader
    assert writer.stop() == [], "the producer saw an error it does not retry"

    # A broker that is not the controller answers NOT_CONTROLLER for what is named.
    wire = Wire(next(b for b in others if int(b.overrides["node.id"]) != controller).port)
    try:
        resp = wire.request(ElectLeadersRequest[1](
            election_type=0, timeout_ms=5000, topic_partitions=[
                ElectLeadersRequest[1].TopicPartitions(topic=topic, partitions=[0])]),
            ElectLeadersResponse)
    finally:
        wire.close()
    ((result,),) = [r.partition_result for r in resp.replica_election_results]
    assert (resp.error_code, result.error_code) == (0, ErrorCode.NOT_CONTROLLER)

    victim.start()  # back, same port and data dir: a follower, out of the ISR
    rejoined = rejoin_isr(etcd_server, prefix, brokers, topic, victim_id)
    assert rejoined.leader_id == state.leader
    assert elect_preferred(brokers, topic) is None
    for b in brokers:
        eventually(led_by(b, topic, victim_id), 10)
    assert partition0(brokers[0], topic).leader_epoch > state.leader_epoch
    again = elect_preferred(brokers, topic)
    assert isinstance(again, KafkaError)
    assert again.code() == ErrorCode.ELECTION_NOT_NEEDED


def test_the_auto_rebalance_gives_the_controllers_partition_back(
        three_rebalancing: tuple[list[BrokerProcess], str], etcd_server: EtcdProcess) -> None:
    brokers, prefix = three_rebalancing
    controller_id = metadata(brokers[0], "x").controller_id
    victim = node_of(brokers, controller_id)  # the controller moves its own partitions
    topic = unique_topic("rebalance")
    create_rf3(brokers, topic, controller_id)
    since, _ = etcd_revision_and_epoch(etcd_server, prefix, controller_id)
    assert victim.stop() == 0
    state = handed_over_before_leaving(etcd_server, prefix, since, topic, controller_id)
    victim.start()
    rejoin_isr(etcd_server, prefix, brokers, topic, controller_id)
    started = time.monotonic()
    for b in brokers:  # no request: the new controller's check runs every second
        p = eventually(led_by(b, topic, controller_id), 15)
        assert p.leader_epoch > state.leader_epoch
    assert time.monotonic() - started < 15
    assert any(line.get("event") == "leaders moved back to preferred replicas"
               for b in brokers for line in b.new_log_lines())


def test_a_single_broker_answers_elect_leaders_and_controlled_shutdown_as_kafka(
        tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path) as broker:
        topic = unique_topic("single")
        create_topic(broker.bootstrap_servers, topic, 2)
        wire = Wire(broker.port)
        try:
            for version in (0, 1, 2):
                named = ElectLeadersRequest[version].TopicPartitions
                resp = wire.request(ElectLeadersRequest[version](
                    election_type=1, timeout_ms=1000, topic_partitions=[
                        named(topic=topic, partitions=[0, 1, 7]),
                        named(topic="no-such-topic", partitions=[0])]), ElectLeadersResponse)
                got = {(r.topic, p.partition_id): p.error_code
                       for r in resp.replica_election_results for p in r.partition_result}
                assert got == {(topic, 0): ErrorCode.ELECTION_NOT_NEEDED,
                               (topic, 1): ErrorCode.ELECTION_NOT_NEEDED,
                               (topic, 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                               ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
                every = wire.request(ElectLeadersRequest[version](
                    election_type=0, timeout_ms=1000, topic_partitions=None),
                    ElectLeadersResponse)
                assert every.replica_election_results == []  # none needed an election
            for version, broker_id, error in ((3, 1, 0), (2, 5, ErrorCode.BROKER_NOT_AVAILABLE),
                                              (1, 1, 0)):
                shut = wire.request(shutdown_request(version, broker_id, -1),
                                    ControlledShutdownResponse)
                assert (shut.error_code, shut.remaining_partitions) == (error, [])
        finally:
            wire.close()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        tp = TopicPartition(topic, 1)
        outcome = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)[tp]
        assert isinstance(outcome, KafkaError)
        assert outcome.code() == ErrorCode.ELECTION_NOT_NEEDED
