"""The workload: producers and consumers on one topic while faults come and go, then a drain.

Producers are confluent-kafka's idempotent producers (acks=all), each sending unique values
(``<producer>-<n>``) round robin over the partitions at a fixed rate, until the duration or
the record budget is spent (and, given a fault count, those faults are over). With
``transactional`` each sends transactions of ``txn_size`` records and aborts some on purpose
(``abort_ratio``). A producer that meets a fatal error is replaced by a new one (a new name
in the history: ``p0``, ``p0.1`` ...). Consumers are assigned every partition from the
beginning and read until the producers stop. The faults are healed, then a fresh consumer
reads every partition to its end (``drained`` when it got there before
``drain_timeout_s``). Everything any client saw is the history that ``analysis.analyse``
reads.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from bench.consistency.analysis import Analysis, analyse
from bench.consistency.faults import FaultEvent, FaultSchedule, FaultTarget
from bench.consistency.history import Assign, History, Outcome, Poll, Record, Send

TXN_OP_DEADLINE_S = 30.0


@dataclass
class Workload:
    """The knobs of one run (the CLI's flags)."""

    topic: str = ""  # empty: a fresh name
    partitions: int = 3
    replication_factor: int = 1
    min_insync_replicas: int | None = None  # the topic's; None: the broker's
    producers: int = 2
    consumers: int = 2
    duration_s: float = 20.0
    records: int = 20_000  # at most, all producers together
    rate: float = 200.0  # records/s per producer
    transactional: bool = False
    txn_size: int = 10
    abort_ratio: float = 0.1
    faults: Sequence[str] = ()
    fault_interval_s: float = 5.0
    fault_duration_s: float = 2.0
    fault_count: int | None = None  # faults in all; producing lasts until they are healed
    drain_timeout_s: float = 30.0
    seed: int = 0


@dataclass
class ClientError:
    at_s: float
    source: str
    error: str


@dataclass
class Result:
    workload: Workload
    history: History
    analysis: Analysis
    faults: list[FaultEvent]
    errors: list[ClientError]
    seconds: float
    topic: str


@dataclass
class _Run:
    """What the threads of one run share: the clock, the stop signal, the error list."""

    bootstrap: str
    topic: str
    workload: Workload
    origin: float = field(default_factory=time.monotonic)
    stopping: threading.Event = field(default_factory=threading.Event)
    faults_done: threading.Event = field(default_factory=threading.Event)
    errors: list[ClientError] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.origin

    def error(self, source: str, error: object) -> None:
        self.errors.append(ClientError(round(self.now(), 3), source, str(error)))

    def client_conf(self) -> dict[str, Any]:
        # librdkafka's own log lines off: errors reach the history through error_cb
        return {"bootstrap.servers": self.bootstrap, "broker.address.family": "v4",
                "log_level": 0,
                "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500}


class ProducerThread(threading.Thread):
    """One producer's sends, in the order it produced them."""

    def __init__(self, run: _Run, index: int, quota: int) -> None:
        super().__init__(name=f"consistency-p{index}", daemon=True)
        self.run_, self.index, self.quota = run, index, quota
        self.sends: list[Send] = []
        self.txns: dict[tuple[str, int], Outcome] = {}
        self.generation = 0
        self.name_ = f"p{index}"
        self.rng = random.Random(run.workload.seed * 1000 + index)
        self.producer: Any = self._new_producer()  # None once the thread is done
        self.started = time.monotonic()
        self.count = 0

    def _new_producer(self) -> Producer:
        w = self.run_.workload
        conf = {**self.run_.client_conf(), "enable.idempotence": True, "acks": "all",
                "linger.ms": 5, "message.timeout.ms": 60000, "retry.backoff.ms": 50,
                "error_cb": lambda e: self.run_.error(self.name_, e)}
        if w.transactional:
            conf["transactional.id"] = f"{self.run_.topic}-p{self.index}"
            conf["transaction.timeout.ms"] = 60000  # no less than message.timeout.ms
        producer = Producer(conf)
        if w.transactional:
            producer.init_transactions(TXN_OP_DEADLINE_S)
        return producer

    def _replace(self, why: object) -> None:
        """A fatal error: what the old producer still holds is left unanswered."""
        self.run_.error(self.name_, f"replacing the producer: {why}")
        try:
            self.producer.flush(1)
        except KafkaException:
            pass
        self.generation += 1
        self.name_ = f"p{self.index}.{self.generation}"
        deadline = time.monotonic() + TXN_OP_DEADLINE_S
        while True:
            try:
                self.producer = self._new_producer()
                return
            except KafkaException as e:
                if time.monotonic() > deadline:
                    raise
                self.run_.error(self.name_, e)
                time.sleep(0.5)

    def _more(self) -> bool:
        w = self.run_.workload
        return (not self.run_.stopping.is_set() and self.count < self.quota
                and (time.monotonic() - self.started < w.duration_s
                     or not self.run_.faults_done.is_set()))

    def _send_one(self, txn: int | None) -> None:
        """Wait for the rate, then produce the next value (the queue full: serve and retry)."""
        w = self.run_.workload
        while self.count >= (time.monotonic() - self.started) * w.rate:
            self.producer.poll(0.005)
        value = f"{self.name_}-{self.count}"
        partition = (self.count + self.index) % w.partitions
        at = len(self.sends)
        self.sends.append(Send(self.name_, value, partition, sent_s=self.run_.now(), txn=txn))

        def delivered(err: KafkaError | None, msg: Any) -> None:
            offset = msg.offset() if err is None and msg.offset() >= 0 else None
            self.sends[at] = Send(self.sends[at].producer, value, partition, offset,
                                  None if err is None else err.name(), self.sends[at].sent_s,
                                  self.run_.now(), txn)
            if err is not None:
                self.run_.error(self.sends[at].producer, err)

        while True:
            try:
                self.producer.produce(self.run_.topic, value.encode(), partition=partition,
                                      on_delivery=delivered)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.count += 1
        self.producer.poll(0)

    def run(self) -> None:
        try:
            if self.run_.workload.transactional:
                self._run_transactions()
            else:
                while self._more():
                    try:
                        self._send_one(None)
                    except KafkaException as e:
                        self._replace(e)
        except Exception as e:  # the thread ends; what it recorded stays in the history
            self.run_.error(self.name_, f"producer thread ended: {e!r}")
        finally:
            try:
                self.producer.flush(60)
            except KafkaException as e:
                self.run_.error(self.name_, e)
            self.producer = None  # destroyed now, not reconnecting after the run

    # -- transactions ----------------------------------------------------------------------------

    def _run_transactions(self) -> None:
        w = self.run_.workload
        txn = 0
        while self._more():
            key = (self.name_, txn)
            self.txns[key] = Outcome.UNKNOWN
            try:
                self.producer.begin_transaction()
                for _ in range(w.txn_size):
                    self._send_one(txn)
                if self.rng.random() < w.abort_ratio:
                    self.txns[key] = self._finish(self.producer.abort_transaction,
                                                  Outcome.ABORTED)
                else:
                    self.txns[key] = self._finish(self.producer.commit_transaction,
                                                  Outcome.COMMITTED)
            except KafkaException as e:
                self.txns[key] = self._after_error(e)
            if self.txns[key] is Outcome.UNKNOWN:
                self._replace(f"transaction {txn} of {key[0]} ended unknown")
            txn += 1

    def _finish(self, end: Callable[[float], None], outcome: Outcome) -> Outcome:
        """Commit or abort, retrying what librdkafka calls retriable."""
        deadline = time.monotonic() + TXN_OP_DEADLINE_S
        while True:
            try:
                end(TXN_OP_DEADLINE_S)
                return outcome
            except KafkaException as e:
                err = e.args[0]
                if not err.retriable() or time.monotonic() > deadline:
                    raise
                self.run_.error(self.name_, err)

    def _after_error(self, e: KafkaException) -> Outcome:
        err = e.args[0]
        self.run_.error(self.name_, err)
        if err.txn_requires_abort():
            try:
                return self._finish(self.producer.abort_transaction, Outcome.ABORTED)
            except KafkaException as again:
                self.run_.error(self.name_, again.args[0])
        return Outcome.UNKNOWN


class ConsumerThread(threading.Thread):
    """A consumer assigned every partition from the beginning, polling until told to stop
    (or, for the drain, until every partition's end)."""

    def __init__(self, run: _Run, name: str, drain: bool = False) -> None:
        super().__init__(name=f"consistency-{name}", daemon=True)
        self.run_, self.name_, self.drain = run, name, drain
        self.reads: list[Poll | Assign] = []
        self.drained = False
        committed = run.workload.transactional
        self.consumer = Consumer({
            **run.client_conf(), "group.id": f"{run.topic}-{name}", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
            "enable.partition.eof": drain,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "error_cb": lambda e: run.error(name, e)})

    def run(self) -> None:
        partitions = range(self.run_.workload.partitions)
        try:
            self.consumer.assign([TopicPartition(self.run_.topic, p, OFFSET_BEGINNING)
                                  for p in partitions])
            self.reads.append(Assign(self.name_, tuple(partitions), self.run_.now()))
            if self.drain:
                self._drain()
            else:
                while not self.run_.stopping.is_set():
                    self._poll()
        except Exception as e:
            self.run_.error(self.name_, f"consumer thread ended: {e!r}")
        finally:
            self.consumer.close()

    def _poll(self) -> list[Any]:
        """One poll recorded; returns the partition-EOF events it met."""
        records, eofs = [], []
        committed = self.run_.workload.transactional
        for m in self.consumer.consume(500, 0.2):
            err = m.error()
            partition, offset, value = m.partition(), m.offset(), m.value()
            if err is None and partition is not None and offset is not None:
                records.append(Record(partition, offset, (value or b"").decode()))
            elif err is not None and err.code() == KafkaError._PARTITION_EOF:
                eofs.append(m)
            else:
                self.run_.error(self.name_, err)
        if records:
            self.reads.append(Poll(self.name_, tuple(records), self.run_.now(), committed))
        return eofs

    def _drain(self) -> None:
        """Read until every partition's position reaches the high watermark it had when the
        drain began (read past it at an end-of-partition event), or the deadline."""
        w = self.run_.workload
        deadline = time.monotonic() + w.drain_timeout_s
        ends = self._high_watermarks(deadline)
        done: set[int] = set()
        while ends is not None and len(done) < w.partitions and time.monotonic() < deadline:
            for eof in self._poll():
                if eof.offset() >= ends[eof.partition()]:
                    done.add(eof.partition())
        self.drained = ends is not None and len(done) == w.partitions

    def _high_watermarks(self, deadline: float) -> dict[int, int] | None:
        while time.monotonic() < deadline:
            try:
                return {p: self.consumer.get_watermark_offsets(
                    TopicPartition(self.run_.topic, p), timeout=5, cached=False)[1]
                    for p in range(self.run_.workload.partitions)}
            except KafkaException as e:
                self.run_.error(self.name_, e.args[0])
                time.sleep(0.5)
        return None


def create_topic(bootstrap: str, workload: Workload, topic: str, timeout_s: float = 30) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    config = ({} if workload.min_insync_replicas is None
              else {"min.insync.replicas": str(workload.min_insync_replicas)})
    new = NewTopic(topic, workload.partitions, workload.replication_factor, config=config)
    for future in admin.create_topics([new], request_timeout=timeout_s).values():
        future.result(timeout_s)


def run_check(target: FaultTarget, workload: Workload | None = None) -> Result:
    """Run ``workload`` against ``target`` under its faults, then analyse the history.

    ``target`` is any ``FaultTarget`` (bench.consistency.faults): a broker process, an
    embedded broker, an embedded cluster (whose faults aim at ``workload.topic``: name it),
    a bare bootstrap address (no faults), or another cluster's wrapper."""
    w = workload or Workload()
    topic = w.topic or f"consistency-{uuid.uuid4().hex[:8]}"
    run = _Run(target.bootstrap_servers, topic, w)
    schedule = FaultSchedule(target, w.faults, w.fault_interval_s, w.fault_duration_s,
                             run.origin, w.seed, w.fault_count)  # refuses faults it can't do
    create_topic(target.bootstrap_servers, w, topic)
    if w.fault_count is not None and w.faults:
        run.faults_done = schedule.done
    else:  # the faults go on as long as the producers do
        run.faults_done.set()
    producers = [ProducerThread(run, i, w.records // w.producers + (i < w.records % w.producers))
                 for i in range(w.producers)]
    consumers = [ConsumerThread(run, f"c{i}") for i in range(w.consumers)]
    for t in [*consumers, *producers]:
        t.start()
    schedule.start()
    try:
        for p in producers:
            p.join()  # bounded: the duration, the faults' count, then a 60 s flush
    finally:
        schedule.stop()
        run.stopping.set()
        for c in consumers:
            c.join(30)
    drain = ConsumerThread(run, "drain", drain=True)
    drain.start()
    drain.join(w.drain_timeout_s + 30)
    history = History(
        sends=[s for p in producers for s in p.sends],
        reads=[e for c in [*consumers, drain] for e in c.reads],
        txns={k: v for p in producers for k, v in p.txns.items()},
        drained=drain.drained)
    return Result(w, history, analyse(history), schedule.events, run.errors, run.now(), topic)
