"""Crash safety of what clients rely on: committed offsets and the idempotent producer's
sequence numbers survive a SIGKILL of the broker (log.flush.interval.messages=1, so whatever
was acknowledged was on disk).

* A group commits, the broker is SIGKILLed with the member still in the group, restarted on the
  same port: OffsetFetch answers exactly what was committed and the group resumes there.
* An idempotent producer (librdkafka) keeps sending while the broker is SIGKILLed and restarted
  twice; its retries straddle the restarts, and every record is stored exactly once, in order.
* The deterministic form of that retry, on the wire: a batch acknowledged before the crash and
  sent again after the restart (as a producer does when the response was lost) is answered
  with its original offset and not appended again; the next sequence number is accepted.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import Counter

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer
from confluent_kafka.admin import AdminClient
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.record.memory_records import MemoryRecordsBuilder

from tests.conformance.conftest import GROUP_OVERRIDES
from tests.conformance.support import Ledger, assert_exactly_once
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    BASE_TS,
    Rec,
    confluent_consume,
    confluent_produce,
    create_topic,
    unique_topic,
    wait_until,
    watermarks,
)

DURABLE = {**GROUP_OVERRIDES, "log.flush.interval.messages": "1"}


def _committed(bootstrap: str, group: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    req = [ConsumerGroupTopicPartitions(group)]
    listed = admin.list_consumer_group_offsets(req, request_timeout=10)[group].result(15)
    return {tp.partition: tp.offset for tp in listed.topic_partitions}


def _member(bootstrap: str, group: str, name: str) -> Consumer:
    return Consumer({
        "bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": group,
        "client.id": name, "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 250, "fetch.wait.max.ms": 100,
        "socket.timeout.ms": 10000,
    })


def _consume(consumer: Consumer, name: str, ledger: Ledger, count: int, timeout: float) -> None:
    """Process `count` records, committing each synchronously after processing it."""
    deadline = time.monotonic() + timeout
    done = 0
    while done < count:
        assert time.monotonic() < deadline, f"{name}: {done} of {count} records in {timeout}s"
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        ledger.add(name, msg.partition(), msg.offset(), msg.value())
        consumer.commit(message=msg, asynchronous=False)
        done += 1


def test_group_resumes_at_committed_offsets_after_sigkill(broker_factory) -> None:
    b: BrokerProcess = broker_factory(DURABLE)
    topic, group = unique_topic("crash-g"), unique_topic("crash-grp")
    create_topic(b.bootstrap, topic, 3)
    expected: dict[tuple[int, int], bytes] = {}
    for p in range(3):
        values = [f"{p}:{i}".encode() for i in range(30)]
        confluent_produce(b.bootstrap, topic, [Rec(None, v) for v in values], partition=p)
        expected.update({(p, i): v for i, v in enumerate(values)})

    ledger = Ledger()
    first = _member(b.bootstrap, group, "before-crash")
    first.subscribe([topic])
    try:
        _consume(first, "before-crash", ledger, 40, 30)
        processed: dict[int, int] = {}
        for _m, p, o, _v in ledger.snapshot():
            processed[p] = max(processed.get(p, 0), o + 1)
        committed = _committed(b.bootstrap, group)
        assert {p: o for p, o in committed.items() if o >= 0} == processed, committed

        b.kill()  # the member is still in the group, its offsets committed a moment ago
        b.start()
        after = _committed(b.bootstrap, group)
        assert {p: o for p, o in after.items() if o >= 0} == processed, (after, processed)
    finally:
        first.close()  # leaves the group (the restarted coordinator must know the member)

    second = _member(b.bootstrap, group, "after-crash")
    second.subscribe([topic])
    try:
        _consume(second, "after-crash", ledger, 90 - 40, 30)
        extra = second.poll(0.5)
        assert extra is None, f"re-read after the last record: {extra.partition()}@{extra.offset()}"
    finally:
        second.close()
    rows = ledger.snapshot()
    assert_exactly_once(rows, expected)
    for p in range(3):
        resumed = min((o for m, pp, o, _v in rows if pp == p and m == "after-crash"),
                      default=None)
        assert resumed == processed.get(p, 0) or (resumed is None and processed.get(p) == 30)
    assert _committed(b.bootstrap, group) == dict.fromkeys(range(3), 30)


def test_idempotent_producer_retries_straddle_restarts(broker_factory) -> None:
    b: BrokerProcess = broker_factory(DURABLE)
    topic = unique_topic("crash-idem")
    partitions, total = 3, 3000
    create_topic(b.bootstrap, topic, partitions)
    errors: list = []
    producer = Producer({
        "bootstrap.servers": b.bootstrap, "broker.address.family": "v4",
        "enable.idempotence": True, "acks": "all", "max.in.flight.requests.per.connection": 5,
        "linger.ms": 2, "batch.num.messages": 10, "message.timeout.ms": 60000,
        "retry.backoff.ms": 50, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200,
        "socket.timeout.ms": 10000, "error_cb": errors.append,
    })
    acked: Counter[int] = Counter()
    failed: list = []

    def report(err, msg) -> None:
        if err is not None:
            failed.append(err)
        else:
            acked[msg.partition()] += 1

    remaining: list[int] = []

    def produce() -> None:
        """About three seconds of records, so both crashes land mid-stream; then flush."""
        for i in range(total):
            producer.produce(topic, value=f"r{i}".encode(), partition=i % partitions,
                             on_delivery=report)
            if i % 10 == 9:
                producer.poll(0.01)
        remaining.append(producer.flush(60))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        for round_ in range(2):
            wait_until(lambda r=round_: sum(acked.values()) > (r + 1) * total // 4, 30,
                       "acknowledgements before the crash", interval=0.005)
            b.kill()
            time.sleep(0.3)
            b.start()
    finally:
        thread.join(90)
    assert not thread.is_alive(), "the producer thread never finished"
    assert not failed and remaining == [0], f"failed: {failed[:5]}, undelivered {remaining}"
    fatal = [e for e in errors if e.fatal()]
    assert not fatal, f"fatal producer errors: {fatal}"

    dedup_lines = [ln for ln in b.log_text().splitlines() if "duplicate batch" in ln]
    print(f"duplicate batches answered after restarts: {len(dedup_lines)}")
    for p in range(partitions):
        want = [f"r{i}".encode() for i in range(p, total, partitions)]
        assert watermarks(b.bootstrap, topic, p) == (0, len(want)), (
            f"partition {p}: {watermarks(b.bootstrap, topic, p)[1]} stored, {len(want)} sent")
        got = [g.rec.value for g in confluent_consume(b.bootstrap, topic, len(want),
                                                      partition=p)]
        dups = [v for v, n in Counter(got).items() if n > 1]
        assert not dups, f"partition {p}: {len(dups)} records stored twice, e.g. {dups[:5]}"
        assert got == want, f"partition {p}: stored out of order or with gaps"


# -- the retry on the wire ----------------------------------------------------------------


class _Wire:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation = 0

    def call(self, request, response_cls):
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id="restart-test")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))
        (size,) = struct.unpack(">i", self._read(4))
        return response_cls.decode(self._read(size), version=request.API_VERSION, header=True)

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def _batch(pid: int, epoch: int, seq: int, n: int) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20,
                                   producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(n):
        builder.append(BASE_TS + seq + i, None, f"seq{seq + i}".encode(), [])
    builder.close()
    return bytes(builder.buffer())


def _produce(wire: _Wire, topic: str, records: bytes) -> tuple[int, int]:
    req = ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=10000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])
    resp = wire.call(req, ProduceResponse)
    [t] = resp.responses
    [part] = t.partition_responses
    return part.error_code, part.base_offset


def test_retried_batch_after_sigkill_is_not_appended_twice(broker_factory) -> None:
    b: BrokerProcess = broker_factory(DURABLE)
    topic = unique_topic("crash-wire")
    create_topic(b.bootstrap, topic, 1)
    wire = _Wire(b.port)
    try:
        init = wire.call(InitProducerIdRequest[4](
            transactional_id=None, transaction_timeout_ms=60000, producer_id=-1,
            producer_epoch=-1), InitProducerIdResponse)
        assert init.error_code == 0, init
        pid, epoch = init.producer_id, init.producer_epoch
        assert pid >= 0
        batches = [_batch(pid, epoch, seq, 5) for seq in (0, 5, 10)]
        assert _produce(wire, topic, batches[0]) == (0, 0)
        assert _produce(wire, topic, batches[1]) == (0, 5)
        # Before the crash a retry is already answered from the producer state.
        assert _produce(wire, topic, batches[1]) == (0, 5)
    finally:
        wire.close()

    b.kill()
    b.start()
    wire = _Wire(b.port)
    try:
        # The response to the second batch was "lost": the producer sends it again.
        assert _produce(wire, topic, batches[1]) == (0, 5), "duplicate after restart"
        assert _produce(wire, topic, batches[0]) == (0, 0), "older duplicate after restart"
        assert watermarks(b.bootstrap, topic) == (0, 10), "a retried batch was appended again"
        assert _produce(wire, topic, batches[2]) == (0, 10), "next sequence after restart"
    finally:
        wire.close()
    got = [g.rec.value for g in confluent_consume(b.bootstrap, topic, 15)]
    assert got == [f"seq{i}".encode() for i in range(15)]
    assert watermarks(b.bootstrap, topic) == (0, 15)
