"""The crash loop: an idempotent producer keeps sending while the broker is SIGKILLed 20 times.

Each kill lands at a moment drawn from a seeded random.Random (the seed is printed; set
CRASH_LOOP_SEED to replay a schedule, though thread timing still varies run to run):

* mid-stream: after the producer got some acknowledgements from this incarnation, so requests
  are in flight, some appended and not yet answered;
* right after a restart: while the producer reconnects and retries what the last kill cut off;
* during start-up: at a random time after the spawn (imports, log loading, recovery);
* during recovery: a few ms after the broker logged that it recovers a segment of the topic.

With log.flush.interval.messages=1 an acknowledged record was fsynced, so no kill may lose it,
and the rebuilt producer state must recognise every retry of a batch already in the log. After
a last clean restart every partition is read from offset 0: each acknowledged record is at
exactly its acknowledged offset with its value, no value is stored twice, offsets are dense; on
disk, one producer id and epoch whose sequence numbers follow the offsets without gap or repeat.
A SIGKILL leaves the page cache intact, so this proves the recovery logic, not the fsyncs.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Producer, TopicPartition

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    ClientError,
    assert_idempotent_batches,
    confluent_consumer,
    create_topic,
    disk_batches,
    unique_topic,
    wait_until,
    watermarks,
)

KILLS = 20
PARTITIONS = 3
RATE = 1500  # records/s offered, whether the broker is up or not, while librdkafka queues them
# Records offered and not yet reported, at most: thousands are queued or in flight at every
# kill, and the drain after the last restart stays within its deadline on a slow machine
# (unbounded, a loaded box left a backlog of 100,000 records for the final flush).
BACKLOG = 5000
OVERRIDES = {
    "log.flush.interval.messages": "1",
    # Small segments and frequent checkpoints: kills land around rolls, producer snapshots and
    # recovery points that move, not only in the tail of one segment recovered from 0.
    "log.segment.bytes": "65536",
    "log.flush.offset.checkpoint.interval.ms": "1000",
}


@dataclass
class Deliveries:
    """Every delivery report, in the order the producer thread saw them."""

    acked: list[tuple[str, int, int, bytes]] = field(default_factory=list)
    failed: list[tuple[bytes, object]] = field(default_factory=list)
    errors: list = field(default_factory=list)
    produced: int = 0
    unflushed: int | None = None
    crashed: BaseException | None = None


class ProducerThread(threading.Thread):
    """librdkafka's idempotent producer offering RATE records/s until told to stop, then
    flushing with a deadline, so the thread always ends on its own."""

    def __init__(self, bootstrap: str, topic: str, flush_timeout: float) -> None:
        super().__init__(name="crash-loop-producer", daemon=True)
        self.topic = topic
        self.flush_timeout = flush_timeout
        self.out = Deliveries()
        self.stopping = threading.Event()
        self.producer = Producer({
            "bootstrap.servers": bootstrap,
            "broker.address.family": "v4",
            "enable.idempotence": True,
            "acks": "all",
            "max.in.flight.requests.per.connection": 5,
            "linger.ms": 2,
            "batch.num.messages": 20,  # many small batches in flight when the kill comes
            "message.timeout.ms": 120000,  # never expire a record: the test's own deadlines fail
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 100,
            "reconnect.backoff.ms": 10,
            "reconnect.backoff.max.ms": 100,
            "socket.timeout.ms": 10000,
            "error_cb": self.out.errors.append,
        })

    def _report(self, err, msg) -> None:
        if err is not None:
            self.out.failed.append((msg.value(), err))
        else:
            self.out.acked.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))

    def run(self) -> None:
        start = time.monotonic()
        i = 0
        try:
            while not self.stopping.is_set():
                due = int((time.monotonic() - start) * RATE)
                while i < due and i - self.reported() < BACKLOG:
                    value = f"v{i:07d}-".encode() + b"x" * 40
                    try:
                        self.producer.produce(self.topic, value=value, partition=i % PARTITIONS,
                                              on_delivery=self._report)
                    except BufferError:  # librdkafka's queue is full while the broker is down
                        break
                    i += 1
                    self.out.produced = i
                self.producer.poll(0.005)
        except BaseException as e:  # a fatal producer error: the test stops and reports it
            self.out.crashed = e
        try:  # after a fatal error nothing more will be delivered: do not wait long for it
            self.out.unflushed = self.producer.flush(5 if self.broken else self.flush_timeout)
        except BaseException as e:
            self.out.crashed = self.out.crashed or e

    def reported(self) -> int:
        return len(self.out.acked) + len(self.out.failed)

    @property
    def broken(self) -> bool:
        """Sending more cannot help: the producer raised, or librdkafka gave up for good."""
        return self.out.crashed is not None or any(e.fatal() for e in self.out.errors)

    def acked_count(self) -> int:
        return len(self.out.acked)


def _events_since_start(b: BrokerProcess) -> Counter[str]:
    return Counter(line.get("event", "") for line in b.new_log_lines())


def _describe(events: Counter[str]) -> str:
    keep = ("recover", "truncat", "duplicate", "deleting", "broker started", "loaded logs")
    found = {e: n for e, n in events.items() if any(k in e for k in keep)}
    return ", ".join(f"{e} x{n}" for e, n in sorted(found.items())) or "nothing logged"


def _kill(b: BrokerProcess) -> None:
    """SIGKILL, and make sure it was the kill that ended the broker, not a crash of its own."""
    b.kill()
    assert b.proc is not None
    if b.proc.returncode != -signal.SIGKILL:
        raise AssertionError(f"the broker exited by itself with {b.proc.returncode}; its log "
                             f"ends:\n{b.log_text()[-6000:]}")


def _stage(events: Counter[str]) -> str:
    """How far the start-up got when the kill came, from what the broker had logged."""
    if events["broker started"]:
        return "after start-up"
    if events["loaded logs"]:
        return "after loading logs, before serving"
    if any(e.startswith("recovering") for e in events):
        return "during log recovery"
    if events:
        return "early in start-up"
    return "before the first log line"


def _kill_during_start(
    b: BrokerProcess, delay: float, after: Callable[[dict], bool] | None = None
) -> None:
    """Start the broker in a thread and SIGKILL it `delay` seconds after it was spawned, or
    after it logged a line matching `after`, whichever start-up stage that turns out to be."""
    old = b.proc

    def start() -> None:
        with contextlib.suppress(RuntimeError, TimeoutError):  # killed before it announced
            b.start()

    starter = threading.Thread(target=start, name="crash-loop-start", daemon=True)
    starter.start()
    wait_until(lambda: b.proc is not old, 10, "the broker process to be spawned", 0.001)
    if after is not None:
        wait_until(lambda: any(after(line) for line in b.new_log_lines())
                   or b.proc.poll() is not None, 30, "the start-up line to kill after", 0.001)
    time.sleep(delay)
    _kill(b)
    starter.join(15)
    assert not starter.is_alive(), "BrokerProcess.start did not return after the kill"


def _read_partition(
    bootstrap: str, topic: str, partition: int, high: int, timeout: float = 30
) -> list[tuple[int, bytes]]:
    """(offset, value) of every record below `high`, read from offset 0; holes are not waited
    for: reading ends at the last offset below `high` or at the deadline."""
    errors: list = []
    consumer = confluent_consumer(bootstrap, errors)
    out: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + timeout
        while high and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                errors.append(msg.error())
                continue
            out.append((msg.offset(), msg.value()))
            if msg.offset() >= high - 1:
                break
    finally:
        consumer.close()
    if errors:
        raise ClientError(f"reading {topic}-{partition}: {errors}")
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_twenty_sigkills_under_an_idempotent_producer(broker_factory) -> None:
    seed = int(os.environ.get("CRASH_LOOP_SEED", random.randrange(2**32)))
    print(f"crash loop seed {seed} (CRASH_LOOP_SEED={seed} replays the schedule)")
    rng = random.Random(seed)
    began = time.monotonic()
    b: BrokerProcess = broker_factory(OVERRIDES)
    topic = unique_topic("crash-loop")
    create_topic(b.bootstrap, topic, PARTITIONS)

    # The first kill hits the broker the fixture started; every kind comes up several times.
    kinds = (["mid-stream"] * 7 + ["after-restart"] * 4 + ["during-start"] * 3
             + ["during-recovery"] * 5)
    rng.shuffle(kinds)
    schedule = ["mid-stream", *kinds]
    assert len(schedule) == KILLS

    producer = ProducerThread(b.bootstrap, topic, flush_timeout=30)
    producer.start()
    history: list[str] = []
    stages: Counter[str] = Counter()
    try:
        for n, kind in enumerate(schedule, 1):
            acked_before = producer.acked_count()
            if kind == "during-start":
                delay = rng.uniform(0.0, 0.6)  # a start takes about 0.5 s here
                _kill_during_start(b, delay)
                landed = f"{delay:.2f}s after spawn"
            elif kind == "during-recovery":
                # Right after recovery of one of the topic's segments began: the scan, the index
                # rebuild and the producer state rebuild of a partition take a few ms each, and
                # seeing the line takes a ms or two.
                delay = rng.uniform(0.0, 0.004)
                part = rng.randrange(PARTITIONS)
                _kill_during_start(b, delay, lambda line, p=part: (
                    line.get("event") == "recovering unflushed segment"
                    and f"/{topic}-{p}/" in str(line.get("segment"))))
                landed = f"{delay * 1000:.0f}ms after recovery of partition {part} began"
            else:
                if n > 1:
                    b.start()
                if kind == "after-restart":
                    delay = rng.uniform(0.0, 0.2)
                    time.sleep(delay)
                    _kill(b)
                    landed = f"{delay:.2f}s after start"
                else:
                    want = acked_before + rng.randint(30, 900)
                    wait_until(lambda w=want: producer.acked_count() >= w or producer.broken,
                               20, f"kill {n}: acknowledgements after the restart (seed {seed})",
                               interval=0.002)
                    delay = rng.uniform(0.0, 0.05)
                    time.sleep(delay)
                    _kill(b)
                    landed = f"{producer.acked_count() - acked_before} acks in, +{delay:.2f}s"
            events = _events_since_start(b)
            stages[_stage(events)] += 1
            history.append(f"kill {n:2d} {kind:15s} {landed}, {_stage(events)}; acked "
                           f"{producer.acked_count()} of {producer.out.produced}; log: "
                           f"{_describe(events)}")
            print(history[-1])
            if producer.broken:
                history.append("the producer failed: no more kills, checking what is stored")
                break
            time.sleep(rng.uniform(0.0, 0.3))  # down time: the producer retries into nothing

        b.start()
        print(f"after the last kill: {_describe(_events_since_start(b))}")
        target = producer.acked_count() + 500
        wait_until(lambda: producer.acked_count() >= target or producer.broken, 20,
                   f"acknowledgements after the last restart (seed {seed})", interval=0.01)
    finally:
        producer.stopping.set()
        producer.join(45)
    out = producer.out
    context = f"seed {seed}\n" + "\n".join(history)
    # Whatever the producer went through, the stored log is checked too: a lost or doubled
    # record usually shows up first as a producer error (a sequence the broker no longer knows).
    problems: list[str] = []
    if producer.is_alive():
        problems.append("the producer thread never finished")
    if out.crashed is not None:
        problems.append(f"the producer raised: {out.crashed!r}")
    fatal = [e for e in out.errors if e.fatal()]
    if fatal:
        problems.append(f"fatal producer errors: {fatal}")
    if out.failed:
        problems.append(f"{len(out.failed)} failed deliveries, e.g. {out.failed[:3]}")
    if out.unflushed != 0 or len(out.acked) != out.produced:
        problems.append(f"{len(out.acked)} of {out.produced} records acknowledged "
                        f"({out.unflushed} left in the producer)")

    acked_at: dict[tuple[int, int], bytes] = {}
    where: dict[bytes, tuple[int, int]] = {}
    for t, p, offset, value in list(out.acked):
        assert t == topic
        if value in where:
            problems.append(f"{value!r} acknowledged twice: at {where[value]} and {(p, offset)}")
        where[value] = (p, offset)
        if (p, offset) in acked_at:
            problems.append(f"{p}@{offset} acknowledged for {acked_at[(p, offset)]!r} and "
                            f"{value!r}")
        acked_at[(p, offset)] = value
    acked_in = Counter(p for p, _o in acked_at)

    # A last restart, a clean one; first what it left on disk, then what clients read.
    assert b.stop() == 0
    log_dir = b.data_dir / "logs"
    for p in range(PARTITIONS):
        batches = disk_batches(log_dir, topic, p)
        ids = sorted({(x.producer_id, x.producer_epoch) for x in batches})
        print(f"partition {p}: {len(batches)} batches on disk in "
              f"{len({x.segment for x in batches})} segments, producer ids {ids}")
        try:
            assert_idempotent_batches(log_dir, topic, p, acked_in[p])
        except AssertionError as e:
            problems.append(f"on disk: {e}")
    b.start()
    print(f"clean restart: {_describe(_events_since_start(b))}")

    stored_where: dict[bytes, list[tuple[int, int]]] = {}
    for p in range(PARTITIONS):
        low, high = watermarks(b.bootstrap, topic, p)
        if (low, high) != (0, acked_in[p]):
            problems.append(f"partition {p}: watermarks {(low, high)}, {acked_in[p]} acknowledged")
        got = _read_partition(b.bootstrap, topic, p, high)
        offsets = [o for o, _v in got]
        if offsets != list(range(high)):
            missing = sorted(set(range(high)) - set(offsets))
            problems.append(f"partition {p}: {len(got)} records read below {high}, offsets "
                            f"missing {missing[:20]}")
        stored = dict(got)
        for o, v in got:
            stored_where.setdefault(v, []).append((p, o))
        lost = [(o, v) for (q, o), v in sorted(acked_at.items()) if q == p and stored.get(o) != v]
        if lost:
            o, v = lost[0]
            problems.append(f"partition {p}: {len(lost)} acknowledged records not at their "
                            f"offset, first {v!r} acked at {o}, stored there {stored.get(o)!r}, "
                            f"found at {stored_where.get(v)}")
    twice = {v: w for v, w in stored_where.items() if len(w) > 1}
    if twice:
        v, w = next(iter(twice.items()))
        problems.append(f"{len(twice)} values stored more than once, e.g. {v!r} at {w}")
    unacked = [v for v in stored_where if v not in where]
    if unacked:
        problems.append(f"{len(unacked)} stored values never acknowledged, e.g. {unacked[:3]}")
    duplicates = sum(1 for ln in b.log_text().splitlines() if "duplicate batch" in ln)
    print(f"{len(out.acked)} records acknowledged in {time.monotonic() - began:.1f}s; "
          f"{duplicates} retried batches answered with their original offsets; kills by "
          f"stage: {dict(stages)}")
    if not problems and duplicates == 0:
        problems.append("no retry of an appended batch reached a restarted broker: the kills "
                        "missed what this test is about")
    assert not problems, "\n".join(problems) + "\n" + context
