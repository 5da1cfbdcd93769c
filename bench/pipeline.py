"""Seed 004's experiment: serial vs pipelined request processing, side by side in one run.

    python -m bench.pipeline --json [--records N] [--record-size 65536]
    python -m bench.pipeline --json --scenario longpoll [--seconds 10]

`produce`: the broker starts twice (serial, then pipelined) with log.flush.interval.messages=1,
so every batch is fsynced before its ack, as in the seed; one confluent-kafka producer
(acks=all, batch.size 1 MiB, linger.ms 1, max.in.flight 5) sends N records to one partition.
Send latency is the time from produce() to the delivery report.
`longpoll`: end-to-end produce-to-consume latency at 1,000 records/s with fetch.wait.max.ms 500,
which only a DelayedFetch completed by the append event can make small.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)


def run_produce(mode: str, records: int, size: int, rate: int, extra: dict[str, str]) -> dict:
    """rate 0: as fast as the producer can (throughput); else records/s (latency at a load)."""
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), {
            "request.processing.mode": mode, "log.flush.interval.messages": "1", **extra,
        }).start()
        try:
            _create_topic(broker.bootstrap, "bench")
            producer = Producer({
                "bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 1,
                "batch.size": 1 << 20, "max.in.flight.requests.per.connection": 5,
                "message.max.bytes": 1 << 21, "queue.buffering.max.kbytes": 1 << 20,
            })
            payload = os.urandom(size)
            latencies: list[float] = []
            errors = 0

            def report(err, _msg, sent=0.0):  # type: ignore[no-untyped-def]
                nonlocal errors
                if err is not None:
                    errors += 1
                latencies.append((time.perf_counter() - sent) * 1000)

            start = time.perf_counter()
            for i in range(records):
                if rate:
                    target = start + i / rate
                    while (now := time.perf_counter()) < target:
                        producer.poll(min(target - now, 0.001))
                sent = time.perf_counter()
                while True:
                    try:
                        producer.produce("bench", payload,
                                         on_delivery=lambda e, m, s=sent: report(e, m, s))
                        break
                    except BufferError:
                        producer.poll(0.01)
                producer.poll(0)
            producer.flush(120)
            elapsed = time.perf_counter() - start
        finally:
            broker.stop()
    return {
        "scenario": "produce", "mode": mode, "records": records, "record_size": size,
        "target_rate": rate,
        "errors": errors, "seconds": round(elapsed, 3),
        "mb_per_s": round(records * size / elapsed / 1e6, 2),
        **{f"p{k}_ms": round(_pct(latencies, v), 2)
           for k, v in (("50", 50), ("95", 95), ("99", 99), ("999", 99.9))},
    }


def run_longpoll(mode: str, seconds: float, rate: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), {"request.processing.mode": mode}).start()
        try:
            _create_topic(broker.bootstrap, "lp")
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench",
                                 "fetch.wait.max.ms": 500, "fetch.min.bytes": 1,
                                 "enable.auto.commit": False})
            consumer.assign([TopicPartition("lp", 0, 0)])
            producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1,
                                 "linger.ms": 0})
            latencies: list[float] = []
            stop = threading.Event()

            def consume() -> None:
                while not stop.is_set():
                    msg = consumer.poll(0.2)
                    if msg is not None and msg.error() is None:
                        sent = float(msg.value().decode())
                        latencies.append((time.perf_counter() - sent) * 1000)

            t = threading.Thread(target=consume)
            t.start()
            time.sleep(1.0)  # consumer connected and parked
            n = int(seconds * rate)
            begin = time.perf_counter()
            for i in range(n):
                target = begin + i / rate
                while (now := time.perf_counter()) < target:
                    time.sleep(min(target - now, 0.001))
                producer.produce("lp", str(time.perf_counter()).encode())
                producer.poll(0)
            producer.flush(10)
            time.sleep(1.0)
            stop.set()
            t.join()
            consumer.close()
        finally:
            broker.stop()
    return {
        "scenario": "longpoll", "mode": mode, "records": n, "received": len(latencies),
        "p50_ms": round(_pct(latencies, 50), 2), "p99_ms": round(_pct(latencies, 99), 2),
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--scenario", choices=["produce", "longpoll"], default="produce")
    ap.add_argument("--modes", default="serial,pipelined")
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--record-size", type=int, default=65536)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=0,
                    help="records/s (produce: 0 = unthrottled; longpoll: default 1000)")
    ap.add_argument("--override", action="append", default=[], metavar="key=value")
    args = ap.parse_args()
    extra = dict(o.split("=", 1) for o in args.override)
    for mode in args.modes.split(","):
        if args.scenario == "produce":
            row = run_produce(mode, args.records, args.record_size, args.rate, extra)
        else:
            row = run_longpoll(mode, args.seconds, args.rate or 1000)
        print(json.dumps(row) if args.json else row, flush=True)


if __name__ == "__main__":
    main()
