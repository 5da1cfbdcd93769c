"""Transactions as their users see them: confluent-kafka, aiokafka and kafka-python transactional
producers and read_committed / read_uncommitted consumers against a real broker on loopback.

For each client: a committed transaction is read back in order; an aborted one is never seen
by read_committed consumers and is seen by read_uncommitted ones; a second producer with the
same transactional.id fences the first (its commit fails with the client's fenced
error); consume-transform-produce commits the group's offsets with the transaction and only
then (an aborted one leaves them as they were); a read_committed consumer stops at an open
transaction (the last stable offset) and goes on once it commits; a transaction left open past
its transaction.timeout.ms is aborted by the broker. Last, a smoke run of bench.transactions.

Every client call has a deadline: kafka-python's commit_transaction and abort_transaction wait
without one, so they run through `_bounded`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ["confluent", "aiokafka", "kafka-python"]
# Small internal topics and no wait for more members: the broker starts and groups form fast.
TXN_OVERRIDES = {
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
}
WAIT = 20.0  # seconds any one client step may take
TXN_TIMEOUT_MS = 10_000  # transaction.timeout.ms of every producer but the expiring one

Row = tuple[int, int, bytes]  # (partition, offset, value)


def _bounded(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """Run a blocking client call with a deadline (in a daemon thread, which is abandoned if the
    call never returns): a broker that never answers fails the test instead of hanging it."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the caller below
            out["error"] = e

    t = threading.Thread(target=run, name=f"bounded-{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise AssertionError(f"{what}: no answer within {timeout}s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


# -- transactional producers -------------------------------------------------------------------


class ConfluentTxn:
    """librdkafka's transactional producer."""

    def __init__(self, bootstrap: str, txn_id: str, timeout_ms: int = TXN_TIMEOUT_MS) -> None:
        from confluent_kafka import Producer

        self.errors: list = []
        self.failed: list = []
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "broker.address.family": "v4",
            "transactional.id": txn_id,
            "transaction.timeout.ms": timeout_ms,
            "acks": "all",
            "linger.ms": 5,
            "socket.timeout.ms": min(10000, timeout_ms),  # librdkafka: at most the txn timeout
            "error_cb": self.errors.append,
        })

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.failed.append(err)

    def init(self) -> None:
        self.producer.init_transactions(WAIT)

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, topic: str, partition: int, value: bytes) -> None:
        self.producer.produce(topic, value=value, key=value, partition=partition,
                              on_delivery=self._delivered)
        self.producer.poll(0)

    def flush(self) -> None:
        from confluent_kafka import KafkaException

        left = self.producer.flush(WAIT)
        if self.failed:
            raise KafkaException(self.failed[0])
        assert left == 0, f"{left} records not delivered in {WAIT}s"

    def commit(self) -> None:
        self.producer.commit_transaction(WAIT)

    def abort(self) -> None:
        self.producer.abort_transaction(WAIT)

    def send_offsets(self, offsets: dict[tuple[str, int], int], reader: Reader) -> None:
        from confluent_kafka import TopicPartition

        self.producer.send_offsets_to_transaction(
            [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
            reader.consumer.consumer_group_metadata(), WAIT)

    def close(self) -> None:
        self.producer.flush(0)

    @staticmethod
    def is_fenced(e: BaseException) -> bool:
        from confluent_kafka import KafkaError, KafkaException

        if not isinstance(e, KafkaException) or not isinstance(e.args[0], KafkaError):
            return False
        return e.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED)


class AioTxn:
    """aiokafka's transactional producer, driven from this thread on a loop of its own."""

    def __init__(self, bootstrap: str, txn_id: str, timeout_ms: int = TXN_TIMEOUT_MS) -> None:
        from aiokafka import AIOKafkaProducer

        self.loop = asyncio.new_event_loop()
        self.futures: list[asyncio.Future] = []

        async def make() -> AIOKafkaProducer:
            return AIOKafkaProducer(
                bootstrap_servers=bootstrap, transactional_id=txn_id,
                transaction_timeout_ms=timeout_ms, linger_ms=5, request_timeout_ms=10000)

        self.producer = self._run(make())

    def _run(self, coro) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, WAIT))

    def init(self) -> None:
        self._run(self.producer.start())  # start() waits for the producer id (InitProducerId)

    def begin(self) -> None:
        self._run(self.producer.begin_transaction())

    def send(self, topic: str, partition: int, value: bytes) -> None:
        self.futures.append(self._run(self.producer.send(topic, value=value, key=value,
                                                         partition=partition)))

    def flush(self) -> None:
        futures, self.futures = self.futures, []
        for f in futures:
            self._run(f)

    def commit(self) -> None:
        self.flush()
        self._run(self.producer.commit_transaction())

    def abort(self) -> None:
        self.futures = []
        self._run(self.producer.abort_transaction())

    def send_offsets(self, offsets: dict[tuple[str, int], int], reader: Reader) -> None:
        from aiokafka import TopicPartition

        self._run(self.producer.send_offsets_to_transaction(
            {TopicPartition(t, p): o for (t, p), o in offsets.items()}, reader.group))

    def close(self) -> None:
        try:
            self.loop.run_until_complete(asyncio.wait_for(self.producer.stop(), 5))
        except BaseException:  # a fenced producer's sender has failed; closing is best effort
            pass
        finally:
            self.loop.close()

    @staticmethod
    def is_fenced(e: BaseException) -> bool:
        from aiokafka.errors import ProducerFenced

        return isinstance(e, ProducerFenced)


class KafkaPythonTxn:
    """kafka-python's transactional producer."""

    def __init__(self, bootstrap: str, txn_id: str, timeout_ms: int = TXN_TIMEOUT_MS) -> None:
        from kafka import KafkaProducer

        self.futures: list = []
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=txn_id,
            transaction_timeout_ms=timeout_ms, acks="all", linger_ms=5,
            request_timeout_ms=10000, max_block_ms=int(WAIT * 1000))

    def init(self) -> None:
        _bounded(self.producer.init_transactions, WAIT + 5, "kafka-python init_transactions")

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, topic: str, partition: int, value: bytes) -> None:
        self.futures.append(self.producer.send(topic, value=value, key=value,
                                               partition=partition))

    def flush(self) -> None:
        futures, self.futures = self.futures, []
        self.producer.flush(WAIT)
        for f in futures:
            f.get(timeout=WAIT)

    def commit(self) -> None:
        self.futures = []
        _bounded(self.producer.commit_transaction, WAIT, "kafka-python commit_transaction")

    def abort(self) -> None:
        self.futures = []
        _bounded(self.producer.abort_transaction, WAIT, "kafka-python abort_transaction")

    def send_offsets(self, offsets: dict[tuple[str, int], int], reader: Reader) -> None:
        from kafka import OffsetAndMetadata, TopicPartition

        _bounded(lambda: self.producer.send_offsets_to_transaction(
            {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()},
            reader.consumer.group_metadata()), WAIT, "kafka-python send_offsets_to_transaction")

    def close(self) -> None:
        try:
            _bounded(lambda: self.producer.close(timeout=3), 10, "kafka-python close")
        except BaseException:  # a fenced producer may fail to close cleanly; best effort
            pass

    @staticmethod
    def is_fenced(e: BaseException) -> bool:
        from kafka.errors import ProducerFencedError

        return isinstance(e, ProducerFencedError)


PRODUCERS: dict[str, type] = {"confluent": ConfluentTxn, "aiokafka": AioTxn,
                              "kafka-python": KafkaPythonTxn}


# -- consumers ---------------------------------------------------------------------------------


class Reader:
    """A consumer of one client at one isolation level: assign() from offset 0 of the given
    partitions, or subscribe() in `group` (consume-transform-produce). Polls return rows."""

    def __init__(self, client: str, bootstrap: str, isolation: str, *,
                 assign: list[tuple[str, int]] | None = None,
                 subscribe: list[str] | None = None, group: str | None = None) -> None:
        self.client = client
        self.group = group or f"never-joined-{uuid.uuid4().hex[:8]}"
        self.loop: asyncio.AbstractEventLoop | None = None
        if client == "confluent":
            from confluent_kafka import Consumer, TopicPartition

            self.errors: list = []
            self.consumer = Consumer({
                "bootstrap.servers": bootstrap, "broker.address.family": "v4",
                "group.id": self.group, "isolation.level": isolation,
                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                "enable.partition.eof": False, "fetch.wait.max.ms": 100,
                "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                "error_cb": self.errors.append,
            })
            if assign is not None:
                self.consumer.assign([TopicPartition(t, p, 0) for t, p in assign])
            else:
                self.consumer.subscribe(subscribe)
        elif client == "aiokafka":
            from aiokafka import AIOKafkaConsumer, TopicPartition

            self.loop = asyncio.new_event_loop()

            async def make() -> AIOKafkaConsumer:
                c = AIOKafkaConsumer(
                    bootstrap_servers=bootstrap, group_id=group, isolation_level=isolation,
                    enable_auto_commit=False, auto_offset_reset="earliest",
                    fetch_max_wait_ms=100, request_timeout_ms=10000,
                    session_timeout_ms=6000, heartbeat_interval_ms=300)
                await c.start()
                if assign is not None:
                    tps = [TopicPartition(t, p) for t, p in assign]
                    c.assign(tps)
                    for tp in tps:
                        c.seek(tp, 0)
                else:
                    c.subscribe(subscribe)
                return c

            self.consumer = self._run(make())
        else:
            from kafka import KafkaConsumer, TopicPartition

            self.consumer = KafkaConsumer(
                bootstrap_servers=bootstrap, group_id=group, isolation_level=isolation,
                enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                request_timeout_ms=10000, session_timeout_ms=6000, heartbeat_interval_ms=300)
            if assign is not None:
                tps = [TopicPartition(t, p) for t, p in assign]
                self.consumer.assign(tps)
                for tp in tps:
                    self.consumer.seek(tp, 0)
            else:
                self.consumer.subscribe(subscribe)

    def _run(self, coro) -> Any:
        assert self.loop is not None
        return self.loop.run_until_complete(asyncio.wait_for(coro, WAIT))

    def poll(self, timeout: float = 0.2) -> list[Row]:
        if self.client == "confluent":
            rows = []
            for msg in self.consumer.consume(500, timeout):
                if msg.error():
                    self.errors.append(msg.error())
                    continue
                rows.append((msg.partition(), msg.offset(), msg.value()))
            assert not [e for e in self.errors if e.fatal()], self.errors
            return rows
        if self.client == "aiokafka":
            got = self._run(self.consumer.getmany(timeout_ms=int(timeout * 1000)))
        else:
            got = self.consumer.poll(timeout_ms=int(timeout * 1000))
        return sorted(((tp.partition, m.offset, m.value) for tp, ms in got.items() for m in ms),
                      key=lambda r: (r[0], r[1]))

    def close(self) -> None:
        if self.client == "confluent":
            self.consumer.close()
        elif self.client == "aiokafka":
            assert self.loop is not None
            try:
                self.loop.run_until_complete(asyncio.wait_for(self.consumer.stop(), 10))
            finally:
                self.loop.close()
        else:
            self.consumer.close(autocommit=False)


def read_until(reader: Reader, done: Callable[[list[Row]], bool], timeout: float,
               what: str) -> list[Row]:
    """Poll until `done(rows so far)`; fail with what was read after `timeout` seconds."""
    rows: list[Row] = []
    deadline = time.monotonic() + timeout
    while not done(rows):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {len(rows)} rows after {timeout}s: {rows[:20]}")
        rows += reader.poll(0.2)
    return rows


def read_for(reader: Reader, seconds: float) -> list[Row]:
    """Everything a consumer returns in `seconds`: for what must NOT show up in that time."""
    rows: list[Row] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows += reader.poll(0.1)
    return rows


def values(rows: list[Row], partition: int | None = None) -> list[bytes]:
    return [v for p, _o, v in rows if partition is None or p == partition]


def has_all(wanted: list[bytes]) -> Callable[[list[Row]], bool]:
    return lambda rows: set(wanted) <= set(values(rows))


def vals(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def _end_offset(bootstrap: str, topic: str, partition: int, isolation: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                  "group.id": "never-joined", "isolation.level": isolation})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10,
                                       cached=False)[1]
    finally:
        c.close()


def stable_end(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The end offset a read_committed consumer sees (ListOffsets latest with isolation level
    read_committed: the last stable offset)."""
    return _end_offset(bootstrap, topic, partition, "read_committed")


def high_watermark(bootstrap: str, topic: str, partition: int = 0) -> int:
    """ListOffsets latest with read_uncommitted: the high watermark. (librdkafka's default
    isolation level is read_committed, so tests.support.clients.watermarks gives the last
    stable offset.)"""
    return _end_offset(bootstrap, topic, partition, "read_uncommitted")


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch, not requiring stable: a pending
    transactional commit reads as the offset before it); -1001 where none."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                  "group.id": group, "isolation.level": "read_uncommitted",
                  "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=WAIT)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in got}


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("txn-broker"), TXN_OVERRIDES).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.kill()


@pytest.fixture
def made(txn_broker: BrokerProcess) -> Iterator[Callable[..., Any]]:
    """Build producers and readers; every one is closed at the end of the test."""
    opened: list[Any] = []

    def make(kind: str, client: str, *args: Any, **kwargs: Any) -> Any:
        if kind == "producer":
            obj = PRODUCERS[client](txn_broker.bootstrap, *args, **kwargs)
        else:
            obj = Reader(client, txn_broker.bootstrap, *args, **kwargs)
        opened.append(obj)
        return obj

    yield make
    for obj in reversed(opened):
        try:
            obj.close()
        except Exception:  # closing after a failure must not hide the failure
            pass


def _txn_id(client: str) -> str:
    return f"txn-{client}-{uuid.uuid4().hex[:8]}"


# -- commit, abort, isolation levels ----------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("client", CLIENTS)
def test_commit_is_read_in_order(txn_broker: BrokerProcess, made, client: str) -> None:
    """One transaction over two partitions: after commit a read_committed consumer of the same
    client reads every record, in send order, and each partition's end is one past the commit
    marker (the control record takes an offset the consumer never returns)."""
    topic = unique_topic("txn-commit")
    create_topic(txn_broker.bootstrap, topic, partitions=2)
    producer = made("producer", client, _txn_id(client))
    producer.init()
    producer.begin()
    sent = {p: vals(f"c{p}", 10) for p in range(2)}
    for i in range(10):
        for p in range(2):
            producer.send(topic, p, sent[p][i])
    producer.commit()

    reader = made("reader", client, "read_committed", assign=[(topic, 0), (topic, 1)])
    rows = read_until(reader, has_all(sent[0] + sent[1]), WAIT, "read_committed after commit")
    for p in range(2):
        assert values(rows, p) == sent[p], f"partition {p}"
        assert [o for q, o, _v in rows if q == p] == list(range(10)), f"partition {p}"
        assert high_watermark(txn_broker.bootstrap, topic, p) == 11
        assert stable_end(txn_broker.bootstrap, topic, p) == 11


@pytest.mark.timeout(90)
@pytest.mark.parametrize("client", CLIENTS)
def test_aborted_records_only_read_uncommitted(txn_broker: BrokerProcess, made,
                                               client: str) -> None:
    """Committed, aborted, committed: read_committed consumers of the same client see the two
    committed transactions in order and nothing of the aborted one; read_uncommitted ones see
    all three, in order."""
    topic = unique_topic("txn-abort")
    create_topic(txn_broker.bootstrap, topic)
    producer = made("producer", client, _txn_id(client))
    producer.init()
    first, aborted, last = vals("first", 5), vals("aborted", 5), vals("last", 5)
    for batch, end in ((first, producer.commit), (aborted, None), (last, producer.commit)):
        producer.begin()
        for v in batch:
            producer.send(topic, 0, v)
        if end is None:
            producer.flush()  # the aborted records are in the log, not only in the client
            producer.abort()
        else:
            end()
    # 15 records and 3 markers
    assert high_watermark(txn_broker.bootstrap, topic) == 18

    committed_reader = made("reader", client, "read_committed", assign=[(topic, 0)])
    rows = read_until(committed_reader, has_all(last), WAIT, "read_committed")
    assert values(rows) == first + last
    uncommitted_reader = made("reader", client, "read_uncommitted", assign=[(topic, 0)])
    rows = read_until(uncommitted_reader, has_all(last), WAIT, "read_uncommitted")
    assert values(rows) == first + aborted + last
    offsets = [o for _p, o, _v in rows]
    assert offsets == sorted(offsets) and len(set(offsets)) == 15


# -- fencing ----------------------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("client", CLIENTS)
def test_zombie_is_fenced(txn_broker: BrokerProcess, made, client: str) -> None:
    """A second producer with the same transactional.id: its initialisation aborts the first
    one's open transaction and fences it, so the first one's commit fails with the client's
    fenced error; the new one's transaction commits, the zombie's records are never
    read_committed."""
    topic = unique_topic("txn-fence")
    create_topic(txn_broker.bootstrap, topic)
    txn_id = _txn_id(client)
    zombie = made("producer", client, txn_id)
    zombie.init()
    zombie.begin()
    for v in vals("zombie", 3):
        zombie.send(topic, 0, v)
    zombie.flush()

    fresh = made("producer", client, txn_id)
    fresh.init()  # bumps the epoch; the zombie's open transaction is aborted

    with pytest.raises(Exception) as caught:  # EndTxn with the old epoch
        zombie.commit()
    assert zombie.is_fenced(caught.value), f"not the fenced error: {caught.value!r}"

    fresh.begin()
    for v in vals("fresh", 3):
        fresh.send(topic, 0, v)
    fresh.commit()
    reader = made("reader", client, "read_committed", assign=[(topic, 0)])
    rows = read_until(reader, has_all(vals("fresh", 3)), WAIT, "read_committed")
    assert values(rows) == vals("fresh", 3)


# -- consume-transform-produce ----------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("client", CLIENTS)
def test_consume_transform_produce(txn_broker: BrokerProcess, made, client: str) -> None:
    """A consumer in a group reads the input, the producer writes the transformed records and
    sends the consumer's positions to the transaction: the group's committed offsets appear
    only when it commits. A second round is aborted: the offsets stay where the first round
    left them and its output is never read_committed."""
    bootstrap = txn_broker.bootstrap
    source, sink = unique_topic("ctp-in"), unique_topic("ctp-out")
    group = f"{source}-g"
    create_topic(bootstrap, source, partitions=2)
    create_topic(bootstrap, sink)
    for p in range(2):
        confluent_produce(bootstrap, source, numbered(5, f"in{p}"), partition=p)

    consumer = made("reader", client, "read_committed", subscribe=[source], group=group)
    producer = made("producer", client, _txn_id(client))
    producer.init()

    def one_round(expected: int) -> dict[tuple[str, int], int]:
        rows = read_until(consumer, lambda r: len(r) >= expected, WAIT, "the input")
        assert len(rows) == expected, rows
        producer.begin()
        for _p, _o, v in rows:
            producer.send(sink, 0, v.upper())
        return {(source, p): max(o for q, o, _v in rows if q == p) + 1
                for p in {p for p, _o, _v in rows}}

    positions = one_round(10)
    assert positions == {(source, 0): 5, (source, 1): 5}
    producer.send_offsets(positions, consumer)
    producer.flush()
    assert committed(bootstrap, group, source, 2) == {0: -1001, 1: -1001}, "before commit"
    producer.commit()
    wait_until(lambda: committed(bootstrap, group, source, 2) == {0: 5, 1: 5}, WAIT,
               "the transaction's offsets after commit")

    for p in range(2):
        confluent_produce(bootstrap, source, numbered(3, f"more{p}"), partition=p)
    positions = one_round(6)
    assert positions == {(source, 0): 8, (source, 1): 8}
    producer.send_offsets(positions, consumer)
    producer.flush()
    producer.abort()
    assert committed(bootstrap, group, source, 2) == {0: 5, 1: 5}, "after abort"

    producer.begin()
    producer.send(sink, 0, b"END")
    producer.commit()
    reader = made("reader", "confluent", "read_committed", assign=[(sink, 0)])
    out = read_until(reader, has_all([b"END"]), WAIT, "the output")
    expected = [v.upper() for p in range(2) for v in values_of(numbered(5, f"in{p}"))]
    assert sorted(values(out)[:-1]) == sorted(expected) and values(out)[-1] == b"END"
    assert committed(bootstrap, group, source, 2) == {0: 5, 1: 5}


def values_of(records) -> list[bytes]:
    return [r.value for r in records]


# -- the last stable offset -------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("client", CLIENTS)
def test_read_committed_waits_for_open_transaction(txn_broker: BrokerProcess, made,
                                                   client: str) -> None:
    """Plain records, then an open transaction, then more plain records from another producer:
    a read_committed consumer (of each client) gets the first plain records and then nothing,
    since the last stable offset stays at the transaction's first offset; once the transaction
    commits it gets the rest, in offset order."""
    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-lso")
    create_topic(bootstrap, topic)
    confluent_produce(bootstrap, topic, numbered(3, "before"))
    producer = made("producer", "confluent", _txn_id("lso"))
    producer.init()
    producer.begin()
    for v in vals("open", 4):
        producer.send(topic, 0, v)
    producer.flush()
    confluent_produce(bootstrap, topic, numbered(2, "after"))
    assert high_watermark(bootstrap, topic) == 9
    assert stable_end(bootstrap, topic) == 3

    reader = made("reader", client, "read_committed", assign=[(topic, 0)])
    before = values_of(numbered(3, "before"))
    rows = read_until(reader, has_all(before), WAIT, "records before the open transaction")
    rows += read_for(reader, 1.5)
    assert values(rows) == before, "read past the last stable offset"

    producer.commit()
    after = values_of(numbered(2, "after"))
    rows += read_until(reader, has_all(after), WAIT, "records once the transaction committed")
    assert values(rows) == before + vals("open", 4) + after
    assert [o for _p, o, _v in rows] == list(range(9))
    assert stable_end(bootstrap, topic) == 10


# -- transaction timeout ----------------------------------------------------------------------


@pytest.mark.timeout(90)
@pytest.mark.parametrize("client", CLIENTS)
def test_transaction_timeout_aborts(txn_broker: BrokerProcess, made, client: str) -> None:
    """A transaction left open past its transaction.timeout.ms (3 s) is aborted by the broker:
    the last stable offset moves past it, a read_committed consumer never sees its records and
    reads what another producer committed after it, and the abandoned producer's late commit
    fails fenced (its epoch was bumped by the abort)."""
    bootstrap = txn_broker.bootstrap
    topic = unique_topic("txn-expire")
    create_topic(bootstrap, topic)
    stale = made("producer", client, _txn_id(client), timeout_ms=3000)
    stale.init()
    stale.begin()
    for v in vals("expired", 4):
        stale.send(topic, 0, v)
    stale.flush()
    started = time.monotonic()
    assert stable_end(bootstrap, topic) == 0

    other = made("producer", "confluent", _txn_id("other"))
    other.init()
    other.begin()
    for v in vals("kept", 3):
        other.send(topic, 0, v)
    other.commit()
    assert stable_end(bootstrap, topic) == 0, "the open transaction holds the last stable offset"

    # 4 expired records, 3 kept, 2 markers: the abort marker lands after "kept"'s commit marker.
    wait_until(lambda: stable_end(bootstrap, topic) == 9, 15, "the broker to abort the expired "
               "transaction (last stable offset at the end)", interval=0.2)
    assert time.monotonic() - started >= 2.0, "aborted before its timeout"
    reader = made("reader", client, "read_committed", assign=[(topic, 0)])
    rows = read_until(reader, has_all(vals("kept", 3)), WAIT, "read_committed")
    assert values(rows) == vals("kept", 3)

    with pytest.raises(Exception) as caught:  # EndTxn with the epoch before the abort's bump
        stale.commit()
    assert stale.is_fenced(caught.value), f"not the fenced error: {caught.value!r}"
    assert stable_end(bootstrap, topic) == high_watermark(bootstrap, topic)
    rows += read_for(reader, 0.5)
    assert values(rows) == vals("kept", 3)


# -- the benchmark's smoke run ------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_bench_transactions_quick() -> None:
    """`python -m bench.transactions --json --quick` prints one JSON object per line: a row per
    transaction size with transactions/s, and the throughput comparison with idempotent
    produce."""
    proc = subprocess.run([sys.executable, "-m", "bench.transactions", "--json", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    by_kind: dict[str, list[dict]] = {}
    for row in rows:
        by_kind.setdefault(row["bench"], []).append(row)
    sizes = [r["records_per_txn"] for r in by_kind["transactions"]]
    assert sizes == [1, 10, 100], rows
    for r in by_kind["transactions"]:
        assert r["transactions"] > 0 and r["txn_per_s"] > 0 and r["records_per_s"] > 0, r
    [ratio] = by_kind["throughput"]
    assert ratio["transactional_records_per_s"] > 0 and ratio["idempotent_records_per_s"] > 0
    assert ratio["ratio"] == pytest.approx(
        ratio["transactional_records_per_s"] / ratio["idempotent_records_per_s"], rel=1e-3)
