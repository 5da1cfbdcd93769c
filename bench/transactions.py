"""What a transaction costs: commits per second by transaction size, and throughput beside
the plain idempotent producer.

    python -m bench.transactions --json [--seconds 8] [--quick] [--override key=value]

A fresh broker on an ephemeral 127.0.0.1 port with a temporary data dir. librdkafka's
transactional producer (confluent-kafka, acks=all) runs begin / produce N records / commit in
a loop for --seconds, for N = 1, 10 and 100 (100-byte values, one partition): one JSON line
each with transactions/s and records/s. Then, for --seconds each, the same producer streaming
transactions of 1000 records and the idempotent producer (no transaction) streaming the same
records: one JSON line with both records/s and their ratio (transactional / idempotent), which
is the price of the AddPartitionsToTxn, EndTxn and marker round trips. `--quick` runs each
phase for a fraction of a second (a smoke test). Not asserted anywhere: machines differ.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess

SIZES = (1, 10, 100)
STREAM_TXN_RECORDS = 1000
VALUE = b"v" * 100
# Small internal topics: the broker starts in a second; nothing measured depends on them.
BROKER_OVERRIDES = {
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "4",
}


def _producer(bootstrap: str, transactional_id: str | None) -> Producer:
    conf = {
        "bootstrap.servers": bootstrap,
        "broker.address.family": "v4",
        "acks": "all",
        "linger.ms": 5,
        "enable.idempotence": True,
        "queue.buffering.max.messages": 200_000,
    }
    if transactional_id:
        conf["transactional.id"] = transactional_id
    return Producer(conf)


def _failures() -> tuple[list, object]:
    failed: list = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failed.append(err)

    return failed, on_delivery


def _produce(producer: Producer, topic: str, on_delivery) -> None:
    while True:
        try:
            producer.produce(topic, value=VALUE, partition=0, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.001)


def transactions(bootstrap: str, topic: str, size: int, seconds: float) -> dict:
    """begin / `size` records / commit, as many times as fit in `seconds`."""
    producer = _producer(bootstrap, f"bench-txn-{size}-{time.time_ns()}")
    producer.init_transactions(30)
    failed, on_delivery = _failures()
    count = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        producer.begin_transaction()
        for _ in range(size):
            _produce(producer, topic, on_delivery)
        producer.commit_transaction(30)
        count += 1
    elapsed = time.perf_counter() - start
    producer.flush(10)
    if failed:
        raise KafkaException(failed[0])
    return {"bench": "transactions", "records_per_txn": size, "transactions": count,
            "seconds": round(elapsed, 3), "txn_per_s": round(count / elapsed, 1),
            "records_per_s": round(count * size / elapsed, 1),
            "commit_ms_avg": round(elapsed * 1000 / count, 3)}


def stream(bootstrap: str, topic: str, seconds: float, transactional: bool) -> dict:
    """Records as fast as the producer takes them for `seconds`, then everything delivered:
    in transactions of STREAM_TXN_RECORDS, or idempotent without transactions."""
    producer = _producer(bootstrap, f"bench-stream-{time.time_ns()}" if transactional else None)
    if transactional:
        producer.init_transactions(30)
    failed, on_delivery = _failures()
    sent = 0
    start = time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        if transactional:
            producer.begin_transaction()
        for _ in range(STREAM_TXN_RECORDS):
            _produce(producer, topic, on_delivery)
        sent += STREAM_TXN_RECORDS
        if transactional:
            producer.commit_transaction(30)
        else:
            producer.poll(0)
    left = producer.flush(60)
    elapsed = time.perf_counter() - start
    if failed or left:
        raise RuntimeError(f"stream: {len(failed)} failed ({failed[:1]}), {left} undelivered")
    return {"records": sent, "seconds": round(elapsed, 3),
            "records_per_s": round(sent / elapsed, 1)}


def run(seconds: float, overrides: dict[str, str], emit: Callable[[dict], None]) -> list[dict]:
    """Every phase on one fresh broker; each row is emitted as soon as it is measured."""
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), {**BROKER_OVERRIDES, **overrides}).start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap,
                                 "broker.address.family": "v4"})
            topics = [f"bench-txn-{n}" for n in SIZES] + ["bench-stream-txn",
                                                          "bench-stream-idem"]
            for f in admin.create_topics([NewTopic(t, 1) for t in topics]).values():
                f.result(10)
            for n in SIZES:
                rows.append(transactions(broker.bootstrap, f"bench-txn-{n}", n, seconds))
                emit(rows[-1])
            txn = stream(broker.bootstrap, "bench-stream-txn", seconds, transactional=True)
            idem = stream(broker.bootstrap, "bench-stream-idem", seconds, transactional=False)
            rows.append({
                "bench": "throughput", "records_per_txn": STREAM_TXN_RECORDS,
                "value_bytes": len(VALUE), "seconds": seconds,
                "transactional_records_per_s": txn["records_per_s"],
                "idempotent_records_per_s": idem["records_per_s"],
                "ratio": round(txn["records_per_s"] / idem["records_per_s"], 4),
            })
            emit(rows[-1])
        finally:
            broker.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    ap.add_argument("--quick", action="store_true", help="0.5 s phases: a smoke test")
    ap.add_argument("--override", action="append", default=[], metavar="key=value")
    args = ap.parse_args()
    run(0.5 if args.quick else args.seconds, dict(o.split("=", 1) for o in args.override),
        lambda row: print(json.dumps(row) if args.json else row, flush=True))


if __name__ == "__main__":
    main()
