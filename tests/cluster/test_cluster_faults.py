"""Three real broker processes in cluster mode on a real etcd: the leader hints of Produce and
Fetch, CreatePartitions with a manual assignment, topic auto-creation through the controller,
and faults: the active controller SIGKILLed, and etcd itself killed under a producer and a
consumer (confluent-kafka) and restarted on the same ports and data dir.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
)
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker.cluster.etcd_process import EtcdProcess
from tests.cluster.test_cluster_brokers import eventually, metadata, partitions_of
from tests.support.broker import BrokerProcess
from tests.support.requests import produce_request, record_batch
from tests.support.wire import Wire
from tools.cluster_run import INTERNAL_TOPICS_ONE_REPLICA

SESSION_MS = 2000
NOT_LEADER, LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC = 6, 5, 3
INVALID_REPLICA_ASSIGNMENT, NOT_CONTROLLER, REQUEST_TIMED_OUT = 39, 41, 7


def overrides(etcd: EtcdProcess, prefix: str, node_id: int, session_ms: int = SESSION_MS
              ) -> dict[str, str]:
    return {"node.id": str(node_id), "minibroker.etcd.endpoints": etcd.endpoint,
            "minibroker.etcd.prefix": prefix, "broker.session.timeout.ms": str(session_ms),
            "broker.heartbeat.interval.ms": "500", "num.partitions": "2",
            "log.flush.interval.messages": "1", **INTERNAL_TOPICS_ONE_REPLICA}


def start_three(tmp_path: Path, etcd: EtcdProcess, session_ms: int = SESSION_MS
                ) -> list[BrokerProcess]:
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    brokers: list[BrokerProcess] = []
    try:
        for node_id in (1, 2, 3):
            brokers.append(BrokerProcess(tmp_path / f"b{node_id}",
                                         overrides(etcd, prefix, node_id, session_ms)).start())
    except BaseException:
        stop_all(brokers)
        raise
    return brokers


def stop_all(brokers: list[BrokerProcess]) -> None:
    for b in brokers:
        if b.proc is not None and b.proc.poll() is None:
            b.kill()


@pytest.fixture
def three(tmp_path: Path, etcd_server: EtcdProcess) -> Iterator[list[BrokerProcess]]:
    brokers = start_three(tmp_path, etcd_server)
    yield brokers
    stop_all(brokers)


def node_id(broker: BrokerProcess) -> int:
    return int(broker.overrides["node.id"])


def bootstrap(brokers: list[BrokerProcess]) -> str:
    return ",".join(b.bootstrap for b in brokers)


def all_led(broker: BrokerProcess, topic: str, count: int) -> dict[int, Any] | None:
    meta = metadata(broker)
    if topic not in {t.name for t in meta.topics}:
        return None
    parts = partitions_of(meta, topic)
    return parts if len(parts) == count and all(
        p.leader_id != -1 and p.error_code == 0 for p in parts.values()) else None


RETRIABLE = {NOT_CONTROLLER, REQUEST_TIMED_OUT}
# librdkafka's own error for a request in flight to a broker it dropped because a Metadata
# answer left that broker out (one that is registering again after its session expired):
# the Java admin client retries a request whose connection went the same way.
CLIENT_RETRIABLE = {KafkaError._DESTROY_BROKER}
TOPIC_ALREADY_EXISTS = 36


def admin_create(servers: str, name: str, partitions: int, within_s: float = 60) -> None:
    """CreateTopics through confluent-kafka's admin client, asked again on the retriable
    errors Kafka's Java admin client retries (librdkafka returns them); a topic that exists
    after a retry was created by an earlier try whose answer said otherwise. Each try has a
    client of its own: librdkafka keeps the controller it learnt (a NOT_CONTROLLER answer
    does not refresh it; a client that learnt none while the brokers registered again after
    an etcd outage waited out two 30 s tries), where Java's admin client asks again."""
    deadline = time.monotonic() + within_s
    tries = 0
    while True:
        tries += 1
        admin = AdminClient({"bootstrap.servers": servers})
        try:
            admin.create_topics([NewTopic(name, partitions, 1)],
                                operation_timeout=10)[name].result(30)
            return
        except TimeoutError:  # no answer in time (the controller waiting on etcd): again
            if time.monotonic() > deadline:
                raise
        except KafkaException as e:
            code = e.args[0].code()
            if code == TOPIC_ALREADY_EXISTS and tries > 1:
                return
            if (code not in RETRIABLE | CLIENT_RETRIABLE
                    and not e.args[0].retriable()):
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"{e.args[0]} after {tries} tries; the controller by "
                                     f"broker: {controllers_seen(servers)}") from e
        time.sleep(0.5)


def controllers_seen(servers: str) -> dict[int, Any]:
    """The controller id each broker's Metadata names (for a failure)."""
    seen: dict[int, Any] = {}
    for address in servers.split(","):
        port = int(address.rpartition(":")[2])
        try:
            wire = Wire(port, timeout=5)
            try:
                seen[port] = wire.request(MetadataRequest[12](
                    topics=[], allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False), MetadataResponse).controller_id
            finally:
                wire.close()
        except OSError as e:
            seen[port] = repr(e)
    return seen


def create_topic(brokers: list[BrokerProcess], name: str, partitions: int) -> dict[int, Any]:
    admin_create(bootstrap(brokers), name, partitions)
    return eventually(lambda: all_led(brokers[0], name, partitions), 20)


def metadata_for(broker: BrokerProcess, names: list[str], auto_create: bool) -> Any:
    wire = Wire(broker.port)
    try:
        return wire.request(MetadataRequest[12](
            topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name=n) for n in names],
            allow_auto_topic_creation=auto_create, include_topic_authorized_operations=False),
            MetadataResponse)
    finally:
        wire.close()


# -- the wire: leader hints, manual partitions, auto-creation ---------------------------------

def test_leader_hints_manual_partitions_and_auto_creation(three: list[BrokerProcess]) -> None:
    create_topic(three, "hints", 3)
    [topic] = metadata_for(three[0], ["hints"], auto_create=False).topics  # v12: the id
    by_id = {node_id(b): b for b in three}

    def leader_now() -> tuple[int, int]:
        p = partitions_of(metadata(three[0]), "hints")[0]
        return p.leader_id, p.leader_epoch

    def stable(ask: Any) -> tuple[tuple[int, int], Any]:
        """``ask()``'s answer with the leader it must name: asked again when leadership
        moved meanwhile (a session lapse on a loaded machine)."""
        for _ in range(10):
            before = leader_now()
            answer = ask(before[0])
            if leader_now() == before:
                return before, answer
        raise AssertionError("leadership kept moving")

    def produce_to_other(leader: int, version: int = 11) -> ProduceAnswer:
        other = next(b for b in three if node_id(b) != leader)
        wire = Wire(other.port)
        try:
            wire.send(produce_request("hints", record_batch([b"x"]), partition=0,
                                      version=version))
            return ProduceAnswer(wire.read_frame(), version)
        finally:
            wire.close()

    def fetch_from_other(leader: int) -> Any:
        other = next(b for b in three if node_id(b) != leader)
        wire = Wire(other.port)
        try:
            return wire.request(FetchRequest[16](
                max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[FetchRequest.FetchTopic(
                    topic_id=topic.topic_id, partitions=[FetchRequest.FetchTopic.FetchPartition(
                        partition=0, current_leader_epoch=-1, fetch_offset=0,
                        last_fetched_epoch=-1, log_start_offset=-1,
                        partition_max_bytes=1 << 20)])],
                forgotten_topics_data=[], rack_id=""), FetchResponse)
        finally:
            wire.close()

    # Produce v11 to a broker that does not lead the partition: the leader and its endpoint.
    (leader, epoch), answer = stable(produce_to_other)
    assert answer.error == NOT_LEADER
    assert answer.current_leader == (leader, epoch)
    assert answer.endpoints == [(leader, "127.0.0.1", by_id[leader].port)]
    # Before v10 the fields do not exist: the same refusal without them.
    old = produce_to_other(leader_now()[0], version=9)
    assert old.error == NOT_LEADER and old.current_leader is None and old.endpoints == []

    # Fetch v16 (topic ids): the same hints.
    (leader, epoch), got = stable(fetch_from_other)
    [p] = got.responses[0].partitions
    assert p.error_code == NOT_LEADER
    assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (leader, epoch)
    assert [(n.node_id, n.port) for n in got.node_endpoints] == [(leader, by_id[leader].port)]

    check_manual_create_partitions(three)
    check_auto_creation(three)


class ProduceAnswer:
    """The single partition of a Produce answer with its leader hints."""

    def __init__(self, frame: bytes, version: int) -> None:
        from kafka.protocol.producer import ProduceResponse

        resp = ProduceResponse.decode(frame, version=version, header=True)
        [t] = resp.responses
        [p] = t.partition_responses
        self.error = p.error_code
        leader = getattr(p, "current_leader", None)
        self.current_leader = (None if leader is None or leader.leader_id == -1
                               else (leader.leader_id, leader.leader_epoch))
        self.endpoints = [(n.node_id, n.host, n.port)
                          for n in (getattr(resp, "node_endpoints", None) or [])]


def create_partitions(broker: BrokerProcess, topic: str, count: int,
                      assignments: list[list[int]] | None, validate_only: bool = False
                      ) -> tuple[int, str | None]:
    wire = Wire(broker.port)
    try:
        t = CreatePartitionsRequest.CreatePartitionsTopic
        a = t.CreatePartitionsAssignment
        req = CreatePartitionsRequest[3](
            topics=[t(name=topic, count=count, assignments=None if assignments is None else [
                a(broker_ids=ids) for ids in assignments])],
            timeout_ms=10000, validate_only=validate_only)
        [result] = wire.request(req, CreatePartitionsResponse).results
        return result.error_code, result.error_message
    finally:
        wire.close()


def controller_of(brokers: list[BrokerProcess]) -> BrokerProcess:
    return eventually(lambda: next((b for b in brokers
                                    if node_id(b) == metadata(brokers[0]).controller_id),
                                   None), 20)


def on_controller(brokers: list[BrokerProcess], topic: str, count: int,
                  assignments: list[list[int]] | None, validate_only: bool = False
                  ) -> tuple[int, str | None]:
    """CreatePartitions on the controller, asked again where it moved meanwhile."""
    for _ in range(10):
        answer = create_partitions(controller_of(brokers), topic, count, assignments,
                                   validate_only)
        if answer[0] != NOT_CONTROLLER:
            return answer
        time.sleep(0.5)
    raise AssertionError("the controller kept moving")


def check_manual_create_partitions(three: list[BrokerProcess]) -> None:
    refused = {
        "unknown broker": (5, [[2], [9]]),
        "too few assignments": (5, [[2]]),
        "a duplicate": (4, [[2, 2]]),
        "another replication factor": (4, [[1, 2]]),
    }
    for what, (count, assignments) in refused.items():
        error, message = on_controller(three, "hints", count, assignments)
        assert error == INVALID_REPLICA_ASSIGNMENT, (what, error, message)
    assert on_controller(three, "hints", 5, [[2], [3]], validate_only=True)[0] == 0
    assert len(partitions_of(metadata(three[0]), "hints")) == 3  # validated, not written
    assert on_controller(three, "hints", 5, [[2], [3]]) == (0, None)
    grown = eventually(lambda: all_led(three[0], "hints", 5), 20)
    assert (grown[3].replica_nodes, grown[4].replica_nodes) == ([2], [3])
    # Each new partition led by its only replica (in a later epoch if its broker bounced).
    assert (grown[3].leader_id, grown[4].leader_id) == (2, 3)
    other = next(b for b in three if b is not controller_of(three))
    assert create_partitions(other, "hints", 6, [[1]])[0] == NOT_CONTROLLER


def check_auto_creation(three: list[BrokerProcess]) -> None:
    controller = controller_of(three)
    other = next(b for b in three if b is not controller)
    # Not allowed by the request: unknown, and not created.
    [t] = metadata_for(other, ["never"], auto_create=False).topics
    assert t.error_code == UNKNOWN_TOPIC
    for broker, name in ((other, "auto-elsewhere"), (controller, "auto-on-controller")):
        [t] = metadata_for(broker, [name], auto_create=True).topics
        assert t.error_code == LEADER_NOT_AVAILABLE, (name, t)

        def created(broker: BrokerProcess = broker, name: str = name) -> Any:
            [t] = metadata_for(broker, [name], auto_create=True).topics
            return t if t.error_code == 0 and len(t.partitions) == 2 and all(
                p.leader_id in (1, 2, 3) for p in t.partitions) else None

        eventually(created, 20)
    [t] = metadata_for(other, ["never"], auto_create=False).topics
    assert t.error_code == UNKNOWN_TOPIC
    # A name Kafka refuses, and more replicas than brokers: refused at once.
    [t] = metadata_for(other, ["bad/name"], auto_create=True).topics
    assert t.error_code == 17  # INVALID_TOPIC_EXCEPTION
    # A producer writing to a new topic has it created (librdkafka asks with auto-creation).
    producer = Producer({"bootstrap.servers": bootstrap(three), "acks": "all",
                         "message.timeout.ms": 30000})
    errors: list[Any] = []
    producer.produce("auto-by-producer", b"v", b"k",
                     on_delivery=lambda e, m: errors.append(e) if e else None)
    assert producer.flush(30) == 0 and errors == []


# -- the active controller SIGKILLed ----------------------------------------------------------

def test_a_killed_controller_is_replaced_within_the_session_timeout(
        three: list[BrokerProcess]) -> None:
    create_topic(three, "before", 1)
    controller_id = metadata(three[0]).controller_id
    victim = next(b for b in three if node_id(b) == controller_id)
    survivors = [b for b in three if b is not victim]
    killed_at = time.monotonic()
    victim.kill()

    def new_controller() -> int | None:
        ids = {metadata(b).controller_id for b in survivors}
        (only,) = ids if len(ids) == 1 else (None,)
        return only if only in {node_id(b) for b in survivors} else None

    took_over = eventually(new_controller, SESSION_MS / 1000 + 5, step_s=0.05)
    elapsed = time.monotonic() - killed_at
    assert elapsed < SESSION_MS / 1000 + 1, elapsed
    assert took_over != controller_id
    # Topic creation works again, through any survivor.
    admin_create(survivors[0].bootstrap, "after", 2)
    parts = eventually(lambda: all_led(survivors[1], "after", 2), 20)
    assert {p.leader_id for p in parts.values()} <= {node_id(b) for b in survivors}


# -- etcd killed under load ---------------------------------------------------------------------

class Load:
    """A confluent-kafka producer (acks=all) and an assign() consumer on their own threads,
    recording what was acknowledged and what was read, with the time of each."""

    def __init__(self, servers: str, topic: str, partitions: int) -> None:
        self.servers, self.topic, self.partitions = servers, topic, partitions
        self.acked: list[tuple[float, bytes]] = []
        self.failed: list[Any] = []
        self.consumed: list[tuple[float, bytes]] = []
        self.consumer_errors: list[Any] = []
        self.stop = threading.Event()
        self.produced = threading.Event()  # stopped, every record acknowledged or failed
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def _produce(self) -> None:
        producer = Producer({"bootstrap.servers": self.servers, "acks": "all",
                             "message.timeout.ms": 120000, "linger.ms": 5})

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self.failed.append(err)
            else:
                self.acked.append((time.monotonic(), msg.value()))

        i = 0
        while not self.stop.is_set():
            producer.produce(self.topic, f"v{i}".encode(), f"k{i}".encode(),
                             on_delivery=delivered)
            producer.poll(0.02)
            i += 1
        try:
            assert producer.flush(120) == 0
        finally:
            self.produced.set()

    def _consume(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.servers, "group.id": "unused",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
        try:
            while not (self.produced.is_set() and self.caught_up()):
                m = consumer.poll(0.2)
                if m is None:
                    if self.produced.is_set() and time.monotonic() > self.drain_deadline:
                        return
                    continue
                if m.error():
                    self.consumer_errors.append(m.error())
                    continue
                self.consumed.append((time.monotonic(), m.value() or b""))
        finally:
            consumer.close()

    drain_deadline = float("inf")

    def caught_up(self) -> bool:
        """Every acknowledged value read (by value: retries may have written some twice)."""
        return {v for _, v in self.acked} <= {v for _, v in self.consumed}

    def finish(self) -> None:
        if self.stop.is_set():
            return
        self.drain_deadline = time.monotonic() + 180
        self.stop.set()
        for t in self.threads:
            t.join(150)


OUTAGE_SESSION_MS = 5000  # shorter than the outage; long enough for a loaded machine


def test_brokers_serve_through_an_etcd_outage(tmp_path: Path, own_etcd: EtcdProcess) -> None:
    brokers = start_three(tmp_path, own_etcd, OUTAGE_SESSION_MS)
    load: Load | None = None
    try:
        create_topic(brokers, "load", 3)
        load = Load(bootstrap(brokers), "load", 3).start()
        eventually(lambda: len(load.acked) > 50 and len(load.consumed) > 50, 30)

        own_etcd.kill()
        down_at = time.monotonic()
        refusals: set[int] = set()
        while time.monotonic() - down_at < 11:
            # What needs etcd answers a retriable error; every broker keeps running.
            for b in brokers:
                assert b.proc is not None and b.proc.poll() is None, b.log_text()[-3000:]
            refusals.add(try_create_topic(brokers[int(time.monotonic()) % 3], "during"))
            [t] = metadata_for(brokers[0], ["auto-during"], auto_create=True).topics
            assert t.error_code == LEADER_NOT_AVAILABLE
            time.sleep(1)
        past_session = down_at + OUTAGE_SESSION_MS / 1000 + 0.5
        acked_during = [v for at, v in load.acked if past_session < at < down_at + 10]
        consumed_during = [v for at, v in load.consumed if past_session < at < down_at + 10]
        assert refusals <= {NOT_CONTROLLER, REQUEST_TIMED_OUT}, refusals
        # Past the session timeout the brokers still lead what they led.
        assert acked_during and consumed_during, (len(acked_during), len(consumed_during))

        own_etcd.start()
        back_at = time.monotonic()
        admin_create(bootstrap(brokers), "after-outage", 1, within_s=60)
        eventually(lambda: all_led(brokers[0], "after-outage", 1), 30)
        [t] = metadata_for(brokers[1], ["auto-during"], auto_create=True).topics
        assert t.error_code in (0, LEADER_NOT_AVAILABLE)
        assert time.monotonic() - back_at < 90
        eventually(lambda: len([1 for at, _ in load.acked if at > time.monotonic() - 1]) > 0,
                   30)
        load.finish()
        assert load.failed == [], load.failed[:5]
        acked = {v for _, v in load.acked}
        # Read again from the start: everything acknowledged is in the logs.
        stored = read_everything(bootstrap(brokers), "load", 3)
        assert acked - stored == set(), sorted(acked - stored)[:10]
        missed = acked - {v for _, v in load.consumed}
        assert missed == set(), (len(missed), len(load.consumed), len(load.acked),
                                 load.consumer_errors[:5])
    finally:
        if load is not None:
            load.finish()
        stop_all(brokers)


def high_watermark(consumer: Consumer, tp: TopicPartition, within_s: float = 60) -> int:
    """The partition's high watermark, asked again while its leader moves: a broker that
    re-registered after the outage has its partitions offline for a moment before the
    controller gives them back in a new leader epoch (Kafka's onBrokerFailure, then
    onBrokerStartup), and librdkafka's watermark query does not retry that by itself."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=10)[1])
        except KafkaException as e:
            error = e.args[0]
            retriable = error.retriable() or error.code() in (
                KafkaError._UNKNOWN_PARTITION, KafkaError.NOT_LEADER_FOR_PARTITION,
                KafkaError.LEADER_NOT_AVAILABLE)
            if not retriable or time.monotonic() > deadline:
                raise AssertionError(f"{error}; the client sees {client_view(consumer, tp)}"
                                     ) from e
        time.sleep(0.5)


def client_view(consumer: Consumer, tp: TopicPartition) -> str:
    """The partition and the brokers as librdkafka's metadata has them (for a failure)."""
    try:
        md = consumer.list_topics(tp.topic, timeout=5)
    except KafkaException as e:
        return f"no metadata ({e})"
    topic = md.topics.get(tp.topic)
    part = None if topic is None else topic.partitions.get(tp.partition)
    where = ("no such topic" if topic is None else f"topic error {topic.error}" if part is None
             else f"leader {part.leader}, replicas {part.replicas}, isr {part.isrs}, "
                  f"error {part.error}")
    return f"{where}; brokers {sorted(md.brokers)} (answered by {md.orig_broker_id})"


def read_everything(servers: str, topic: str, partitions: int) -> set[bytes]:
    """Every value of the topic, read from offset 0 up to each partition's high watermark."""
    consumer = Consumer({"bootstrap.servers": servers, "group.id": "unused",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        ends = {p: high_watermark(consumer, TopicPartition(topic, p))
                for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        values: set[bytes] = set()
        reached = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 60
        while len(reached) < partitions and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is None or m.error():
                continue
            value, offset, partition = m.value(), m.offset(), m.partition()
            assert value is not None and offset is not None and partition is not None
            values.add(value)
            if offset + 1 >= ends[partition]:
                reached.add(partition)
        assert len(reached) == partitions, (ends, reached)
        return values
    finally:
        consumer.close()


def try_create_topic(broker: BrokerProcess, name: str) -> int:
    """A raw CreateTopics: the topic's error code."""
    wire = Wire(broker.port, timeout=30)
    try:
        topic = CreateTopicsRequest.CreatableTopic
        req = CreateTopicsRequest[7](timeout_ms=5000, validate_only=False, topics=[topic(
            name=name, num_partitions=1, replication_factor=1, configs=[], assignments=[])])
        [result] = wire.request(req, CreateTopicsResponse).topics
        return int(result.error_code)
    finally:
        wire.close()
