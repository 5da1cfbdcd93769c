"""The idempotent producer against a real broker: no gaps, no duplicates, retries after a crash.

1. librdkafka's idempotent producer (acks=all, five requests in flight) over six partitions:
   every partition's offsets are dense and hold each record exactly once, in order.
2. On a raw socket, Kafka's answers: the same batch sent twice is answered with its original
   base offset and not appended again; a sequence gap gets OUT_OF_ORDER_SEQUENCE_NUMBER (45);
   an older epoch gets INVALID_PRODUCER_EPOCH (47).
3. The broker is SIGKILLed while an idempotent producer streams, after a relay in front of it
   kept some answers from the producer, and restarted on the same port: it rebuilds the
   producer state from the log, so the producer's retries of batches that had reached the log
   are recognised (answered as duplicates, each round) and nothing is written twice.
"""

from __future__ import annotations

import time
from collections import defaultdict

from confluent_kafka import KafkaError as CKafkaError
from confluent_kafka import Producer
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    confluent_consume,
    create_topic,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.relay import Relay
from tests.support.wire import Wire

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47


def _idempotent_producer(bootstrap: str, errors: list, extra: dict | None = None) -> Producer:
    def on_error(err: CKafkaError) -> None:
        errors.append(err)

    return Producer({
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "enable.idempotence": True,
        "acks": "all",
        "max.in.flight.requests.per.connection": 5,
        "linger.ms": 5,
        "batch.num.messages": 200,
        "error_cb": on_error,
        **(extra or {}),
    })


def _check_partitions(bootstrap: str, topic: str, sent: dict[int, list[bytes]]) -> None:
    """Each partition holds exactly what was sent to it, in order, at offsets 0..n-1."""
    for partition, values in sent.items():
        assert watermarks(bootstrap, topic, partition) == (0, len(values)), partition
        got = confluent_consume(bootstrap, topic, len(values), partition=partition)
        assert [g.offset for g in got] == list(range(len(values)))
        assert [g.rec.value for g in got] == values


# -- 1. a well-behaved idempotent producer --------------------------------------------------
def test_idempotent_producer_six_partitions(broker: BrokerProcess) -> None:
    topic = unique_topic("idem")
    create_topic(broker.bootstrap, topic, partitions=6)
    errors: list = []
    producer = _idempotent_producer(broker.bootstrap, errors)
    sent: dict[int, list[bytes]] = defaultdict(list)
    offsets: dict[int, list[int]] = defaultdict(list)
    failures: list = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(err)
        else:
            offsets[msg.partition()].append(msg.offset())

    for i in range(20_000):
        p = i % 6
        value = f"record-{i}".encode()
        sent[p].append(value)
        while True:
            try:
                producer.produce(topic, value=value, partition=p, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not failures and not errors, (failures, errors)
    for p, offs in offsets.items():
        assert sorted(offs) == list(range(len(sent[p])))
    _check_partitions(broker.bootstrap, topic, sent)


# -- 2. the broker's answers, on the wire ----------------------------------------------------
def _batch(pid: int, epoch: int, seq: int, n: int, tag: str) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=pid,
        producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20,
    )
    for i in range(n):
        b.append(i, timestamp=int(time.time() * 1000), key=None,
                 value=f"{tag}-{i}".encode(), headers=[])
    return bytes(b.build())


def _produce(wire: Wire, topic: str, records: bytes) -> tuple[int, int]:
    req = ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=5000,
        topic_data=[ProduceRequest.TopicProduceData(
            name=topic,
            partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(
                index=0, records=records)],
        )],
    )
    resp = wire.request(req, ProduceResponse)
    [part] = resp.responses[0].partition_responses
    return part.error_code, part.base_offset


def test_duplicate_gap_and_stale_epoch_on_the_wire(broker: BrokerProcess) -> None:
    topic = unique_topic("wire")
    create_topic(broker.bootstrap, topic)
    wire = Wire(broker.port)
    try:
        init = wire.request(
            InitProducerIdRequest[0](transactional_id=None, transaction_timeout_ms=60000),
            InitProducerIdResponse,
        )
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch + 1  # epoch 1, so 0 is stale

        assert _produce(wire, topic, _batch(pid, epoch, 0, 3, "a")) == (0, 0)
        second = _batch(pid, epoch, 3, 2, "b")
        assert _produce(wire, topic, second) == (0, 3)
        assert watermarks(broker.bootstrap, topic) == (0, 5)
        # the same request again (a retry): the original offset, nothing appended
        assert _produce(wire, topic, second) == (0, 3)
        assert _produce(wire, topic, _batch(pid, epoch, 0, 3, "a")) == (0, 0)
        assert watermarks(broker.bootstrap, topic) == (0, 5)
        # a gap: sequence 6 after 4
        assert _produce(wire, topic, _batch(pid, epoch, 6, 1, "gap"))[0] == (
            OUT_OF_ORDER_SEQUENCE_NUMBER
        )
        # an older epoch is fenced
        assert _produce(wire, topic, _batch(pid, epoch - 1, 5, 1, "old"))[0] == (
            INVALID_PRODUCER_EPOCH
        )
        assert watermarks(broker.bootstrap, topic) == (0, 5)
        assert _produce(wire, topic, _batch(pid, epoch, 5, 1, "c")) == (0, 5)
    finally:
        wire.close()
    got = confluent_consume(broker.bootstrap, topic, 6)
    assert [g.rec.value for g in got] == [b"a-0", b"a-1", b"a-2", b"b-0", b"b-1", b"c-0"]


# -- 3. a crash in the middle of a stream ----------------------------------------------------
def _duplicates_answered(b: BrokerProcess) -> int:
    return sum(1 for line in b.new_log_lines() if line.get("event", "").startswith("duplicate"))


def test_retries_after_a_crash_make_no_duplicates(broker_factory) -> None:
    relay = Relay()  # clients reach the broker through it: its answers can be held back
    b: BrokerProcess = broker_factory({
        "log.flush.interval.messages": "1",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{relay.port}"})
    relay.upstream_port = b.port
    topic = unique_topic("crash")
    partitions = 3
    create_topic(b.bootstrap, topic, partitions=partitions)
    errors: list = []
    producer = _idempotent_producer(
        f"127.0.0.1:{relay.port}", errors,
        {"message.timeout.ms": 60000, "retry.backoff.ms": 20, "reconnect.backoff.ms": 20,
         "reconnect.backoff.max.ms": 100, "linger.ms": 2, "batch.num.messages": 50},
    )
    sent: dict[int, list[bytes]] = defaultdict(list)
    delivered = [0]
    failures: list = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            failures.append(err)
        else:
            delivered[0] += 1

    def burst(n: int) -> None:
        """Queue n records at once: the producer keeps five requests in flight until done."""
        for _ in range(n):
            i = sum(len(v) for v in sent.values())
            p = i % partitions
            value = f"m-{i}".encode()
            sent[p].append(value)
            producer.produce(topic, value=value, partition=p, on_delivery=on_delivery)

    def delivered_at_least(n: int) -> bool:
        producer.poll(0.001)
        return delivered[0] >= n

    rounds = 2
    try:
        for _ in range(rounds):
            target = delivered[0] + 1000
            burst(4000)
            wait_until(lambda t=target: delivered_at_least(t), 30, "deliveries", interval=0)
            # Batches keep being appended, their answers never reach the producer: the crash
            # always falls after an append and before its answer.
            relay.hold_answers()
            wait_until(lambda: relay.held_bytes > 0, 30, "an answer held back")
            b.kill()
            relay.release()
            b.start()  # same port: the producer reconnects and retries what it was not answered
            assert producer.flush(60) == 0
            duplicates = _duplicates_answered(b)
            assert duplicates > 0, "no retry met a batch already in the log"
        assert not failures and not [e for e in errors if e.fatal()], (failures, errors)
        assert delivered[0] == 4000 * rounds
        _check_partitions(b.bootstrap, topic, sent)
    finally:
        relay.close()
