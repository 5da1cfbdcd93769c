"""A calm client beside greedy ones: how long does its Metadata request wait?

    python -m bench.fairness --json [--seconds 10] [--producers 16] [--override key=value]

A fresh broker on an ephemeral 127.0.0.1 port. In a separate process, --producers
confluent-kafka producers (threads) send 1 KiB records as fast as they can (acks=1,
linger.ms 5) to one topic of 8 partitions. Meanwhile this process, on its own connection,
sends one MetadataRequest every 20 ms and times each answer, and scrapes metrics.listener
every 0.5 s, timing each scrape. Prints one JSON object: metadata latency p50/p99/max, scrape
p99/max, the bucket bound of the broker's own p99 for Metadata (parse to send, from its
metrics), and the greedy producers' records/s. Not asserted anywhere: machines differ; the
figures go to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.support.broker import BrokerProcess
from tests.support.wire import Wire

TOPIC = "greedy"


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def _greedy(bootstrap: str, producers: int, seconds: float, counter: multiprocessing.Value
            ) -> None:  # type: ignore[type-arg]
    stop = time.monotonic() + seconds
    value = b"x" * 1024

    def one() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
                      "queue.buffering.max.messages": 100_000})
        sent = 0
        while time.monotonic() < stop:
            try:
                p.produce(TOPIC, value=value)
                sent += 1
            except BufferError:
                p.poll(0.001)
            if sent % 1000 == 0:
                p.poll(0)
        p.flush(10)
        with counter.get_lock():
            counter.value += sent

    threads = [threading.Thread(target=one) for _ in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _broker_metadata_p99_ms(exposition: bytes) -> float:
    """The bucket bound under which 99% of Metadata requests were answered, as the broker
    timed them (parsed to sent): separates the broker's wait from the client's scheduling."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets = []
    for fam in text_string_to_metric_families(exposition.decode()):
        if fam.name == "minibroker_request_total_time_seconds":
            buckets = [(float(s.labels["le"]), s.value) for s in fam.samples
                       if s.name.endswith("_bucket") and s.labels.get("api") == "Metadata"]
    total = max((n for _, n in buckets), default=0)
    for le, n in sorted(buckets):
        if total and n >= 0.99 * total:
            return le * 1000
    return float("nan")


def run(seconds: float, producers: int, overrides: dict[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), overrides).start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic(TOPIC, 8)])[TOPIC].result(10)
            counter = multiprocessing.Value("q", 0)
            load = multiprocessing.Process(target=_greedy,
                                           args=(broker.bootstrap, producers, seconds, counter))
            load.start()
            time.sleep(1.0)  # the producers are up to speed
            wire = Wire(broker.port, timeout=30)
            url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
            meta_ms: list[float] = []
            scrape_ms: list[float] = []
            next_scrape = time.monotonic()
            end = time.monotonic() + seconds - 2
            while time.monotonic() < end:
                t0 = time.perf_counter()
                wire.request(MetadataRequest[9](topics=None, allow_auto_topic_creation=False,
                                                include_cluster_authorized_operations=False,
                                                include_topic_authorized_operations=False),
                             MetadataResponse)
                meta_ms.append((time.perf_counter() - t0) * 1000)
                if time.monotonic() >= next_scrape:
                    t0 = time.perf_counter()
                    urllib.request.urlopen(url, timeout=30).read()
                    scrape_ms.append((time.perf_counter() - t0) * 1000)
                    next_scrape += 0.5
                time.sleep(0.02)
            load.join(seconds + 30)
            broker_side = _broker_metadata_p99_ms(urllib.request.urlopen(url, timeout=30).read())
            return {
                "bench": "fairness", "producers": producers, "seconds": seconds,
                "overrides": overrides, "metadata_requests": len(meta_ms),
                "metadata_p50_ms": round(statistics.median(meta_ms), 2),
                "metadata_p99_ms": round(_pct(meta_ms, 99), 2),
                "metadata_max_ms": round(max(meta_ms), 2),
                "scrapes": len(scrape_ms),
                "scrape_p99_ms": round(_pct(scrape_ms, 99), 2),
                "scrape_max_ms": round(max(scrape_ms), 2),
                "broker_metadata_p99_ms_at_most": broker_side,
                "greedy_records_s": round(counter.value / seconds),
            }
        finally:
            broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--producers", type=int, default=16)
    ap.add_argument("--override", action="append", default=[], metavar="key=value")
    args = ap.parse_args()
    overrides = dict(o.split("=", 1) for o in args.override)
    row = run(args.seconds, args.producers, overrides)
    print(json.dumps(row) if args.json else row, flush=True)


if __name__ == "__main__":
    main()
