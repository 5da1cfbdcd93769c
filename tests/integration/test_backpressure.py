"""Memory stays bounded when 20 producers send as fast as they can.

queued.max.request.bytes caps the request bytes the whole broker holds in flight: past it, the
connection that went over is muted (pause_reading) until responses release bytes, so the data a
client has not been allowed to send yet waits in the kernel socket buffers and in the client,
not in the broker's heap.

For the broker to fall behind at all, its disk is made slow: log.flush.interval.messages=1 (an
acks=1 produce is answered after its fsync) and every fsync of a segment takes 20 ms more (the
fsync tracing of tests/support/fsync_trace.py). Measured on the 2-core dev box: broker RSS
grows by about 6 MiB with the 1 MiB cap, by 24-48 MiB when the cap is lifted (-1), and so would
with a broken MEMORY mute.

Muting is observed from outside: while the broker does not read a connection, the bytes the
client sent pile up in that socket's kernel receive queue (/proc/net/tcp rx_queue). A broker
that reads eagerly keeps them at about 2-3 MiB in total under this load; a muted one lets them
reach tens of MiB.
"""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, unique_topic, watermarks
from tests.support.fsync_trace import trace_fsyncs

PRODUCERS = 20
RECORDS = 300  # per producer
RECORD_SIZE = 10 * 1024
CAP = 1 << 20  # queued.max.request.bytes
RSS_GROWTH_BOUND_MIB = 16
RX_BACKLOG_MUTED = 8 << 20


def _status_mib(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def _rx_backlog(port: int) -> int:
    """Bytes received by the kernel but not yet read by the broker, over its connections."""
    local = f":{port:04X}"
    total = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if fields[1].endswith(local) and fields[3] == "01":  # ESTABLISHED, broker side
                total += int(fields[4].split(":")[1], 16)
    return total


class Monitor:
    def __init__(self, broker: BrokerProcess) -> None:
        assert broker.proc is not None
        self.pid, self.port = broker.proc.pid, broker.port
        self.peak_rss = 0.0
        self.peak_backlog = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_rss = max(self.peak_rss, _status_mib(self.pid, "VmRSS"))
            self.peak_backlog = max(self.peak_backlog, _rx_backlog(self.port))
            time.sleep(0.01)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _produce(bootstrap: str, topic: str, k: int, errors: list) -> None:
    producer = Producer({
        "bootstrap.servers": bootstrap, "broker.address.family": "v4",
        "acks": "1", "enable.idempotence": False, "linger.ms": 5, "batch.size": 65536,
        "max.in.flight.requests.per.connection": 100, "message.timeout.ms": 60000,
        "error_cb": lambda err: errors.append((k, err)),
    })
    filler = bytes([65 + k]) * (RECORD_SIZE - 12)

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append((k, err))

    for i in range(RECORDS):
        value = b"%04d:%06d:" % (k, i) + filler
        while True:
            try:
                producer.produce(topic, value=value, key=b"%d" % i, partition=k,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    remaining = producer.flush(90)
    if remaining:
        errors.append((k, f"{remaining} records undelivered"))


def _consume_all(bootstrap: str, topic: str) -> dict[int, list[int]]:
    """Every record of every partition: partition -> record numbers, in offset order."""
    errors: list = []
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "broker.address.family": "v4",
        "group.id": f"never-joined-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
        "error_cb": errors.append,
    })
    seen: dict[int, list[int]] = {k: [] for k in range(PRODUCERS)}
    try:
        consumer.assign([TopicPartition(topic, k, 0) for k in range(PRODUCERS)])
        deadline = time.monotonic() + 60
        got = 0
        while got < PRODUCERS * RECORDS and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error():
                    errors.append(msg.error())
                    continue
                value = msg.value()
                k, i = int(value[:4]), int(value[5:11])
                assert k == msg.partition(), f"record of producer {k} in partition {k}"
                assert len(value) == RECORD_SIZE
                assert value[12:] == bytes([65 + k]) * (RECORD_SIZE - 12)
                seen[k].append(i)
                got += 1
    finally:
        consumer.close()
    assert not errors, errors[:5]
    return seen


def test_memory_bounded_under_twenty_flooding_producers(
    broker_factory, tmp_path, monkeypatch
) -> None:
    trace_fsyncs(tmp_path, monkeypatch, delay_ms=20)
    b: BrokerProcess = broker_factory({
        "queued.max.request.bytes": str(CAP),
        "log.flush.interval.messages": "1",
    })
    assert b.proc is not None
    topic = unique_topic("flood")
    create_topic(b.bootstrap, topic, partitions=PRODUCERS)
    idle_rss = _status_mib(b.proc.pid, "VmRSS")

    errors: list = []
    threads = [threading.Thread(target=_produce, args=(b.bootstrap, topic, k, errors))
               for k in range(PRODUCERS)]
    started = time.monotonic()
    with Monitor(b) as monitor:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in threads), "a producer never finished"
    hwm = _status_mib(b.proc.pid, "VmHWM")
    growth = max(hwm, monitor.peak_rss) - idle_rss
    print(f"\nbroker RSS idle {idle_rss:.1f} MiB, peak {max(hwm, monitor.peak_rss):.1f} MiB "
          f"(+{growth:.1f}); peak unread backlog in the kernel "
          f"{monitor.peak_backlog / 2**20:.1f} MiB; {PRODUCERS * RECORDS * RECORD_SIZE / 2**20:.0f}"
          f" MiB sent in {elapsed:.1f} s")

    assert not errors, f"producer errors: {errors[:5]}"
    assert b.proc.poll() is None, "broker died"
    assert growth < RSS_GROWTH_BOUND_MIB, (
        f"broker RSS grew by {growth:.1f} MiB with queued.max.request.bytes={CAP}")
    assert monitor.peak_backlog > RX_BACKLOG_MUTED, (
        f"the kernel never held more than {monitor.peak_backlog} unread bytes: "
        "were the connections ever muted?")

    for k in range(PRODUCERS):
        assert watermarks(b.bootstrap, topic, k) == (0, RECORDS), f"partition {k}"
    seen = _consume_all(b.bootstrap, topic)
    for k, numbers in seen.items():
        assert numbers == list(range(RECORDS)), f"producer {k}: records lost or reordered"
