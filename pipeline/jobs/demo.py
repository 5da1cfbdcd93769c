"""The pipeline end to end on one machine: broker, clickstream, streaming job, result table.

    python -m pipeline.jobs.demo                      # starts a broker of its own
    python -m pipeline.jobs.demo --bootstrap HOST:PORT  # or uses yours

The job runs with Trigger.AvailableNow: it reads everything the generator produced, closes
every minute (the generator's heartbeat moves the watermark), writes both sinks, and stops;
the table printed is read back from the Parquet sink and checked against the counts the
generator computes from its seed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.jobs import clickstream, page_counts

WATERMARK_MS = 60_000


@dataclass
class DemoResult:
    in_topic: str
    out_topic: str
    table: DataFrame  # the Parquet sink, read back
    counts: Counter[tuple[int, str]]  # (minute ms, page) -> clicks, from Parquet
    topic_counts: Counter[tuple[int, str]]  # the same, from the output topic
    expected: Counter[tuple[int, str]]  # from the generator's seed, in plain Python

    @property
    def ok(self) -> bool:
        return self.counts == self.expected == self.topic_counts


def create_topics(bootstrap: str, partitions: dict[str, int], timeout_s: float = 30.0) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=1)
                                   for t, n in partitions.items()], operation_timeout=timeout_s)
    for f in futures.values():
        f.result(timeout=timeout_s)


def _topic_counts(spark: SparkSession, bootstrap: str, topic: str) -> Counter[tuple[int, str]]:
    rows = (spark.read.format("mini-broker").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).load()
            .select(F.col("value").cast("string").alias("json")).collect())
    out: Counter[tuple[int, str]] = Counter()
    for row in rows:
        doc = json.loads(row.json)
        minute = int(datetime.fromisoformat(doc["minute"]).timestamp()) * 1000
        out[(minute, doc["page"])] += doc["clicks"]
    return out


def run(spark: SparkSession, bootstrap: str, workdir: Path, seed: int = 7, events: int = 2000,
        minutes: int = 10, start_ms: int | None = None, timeout_s: float = 300.0) -> DemoResult:
    """Generate, produce, run the job to completion, and collect both sinks' results."""
    run_id = uuid.uuid4().hex[:8]
    in_topic, out_topic = f"clicks-{run_id}", f"page-counts-{run_id}"
    create_topics(bootstrap, {in_topic: 3, out_topic: 1})
    start_ms = clickstream.default_start_ms(minutes) if start_ms is None else start_ms
    clicks = clickstream.generate(seed, events, start_ms, minutes)
    clickstream.produce(bootstrap, in_topic, [*clicks, clickstream.heartbeat(clicks, WATERMARK_MS)])

    counts = page_counts.page_counts(spark, bootstrap, in_topic, f"{WATERMARK_MS // 1000} seconds")
    parquet_dir = workdir / f"page_counts-{run_id}"
    query = page_counts.start(counts, bootstrap, out_topic, parquet_dir,
                              workdir / f"checkpoint-{run_id}")
    try:
        if not query.awaitTermination(timeout_s):
            raise TimeoutError(f"the job did not finish in {timeout_s}s")
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"the job failed: {query.exception()}")

    table = page_counts.read_parquet(spark, parquet_dir).orderBy("minute", "page")
    got = Counter({(r.ms, r.page): r.clicks
                   for r in table.select(F.unix_millis("minute").alias("ms"), "page", "clicks")
                   .collect()})
    return DemoResult(in_topic, out_topic, table, got, _topic_counts(spark, bootstrap, out_topic),
                      clickstream.expected_counts(clicks))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="mini-broker + PySpark clickstream demo")
    ap.add_argument("--bootstrap", help="use this broker instead of starting one")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--workdir", type=Path, help="Parquet output and checkpoints (default: temp)")
    args = ap.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pipeline-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    broker = None
    if args.bootstrap is None:
        from pipeline.jobs.session import ROOT

        sys.path.insert(0, ROOT)  # the broker helper lives in the checkout's tests/
        from tests.support.broker import BrokerProcess

        broker = BrokerProcess(workdir / "broker").start()
        print(f"started mini-broker on {broker.bootstrap} (data in {broker.data_dir})")
    bootstrap = args.bootstrap or broker.bootstrap  # type: ignore[union-attr]
    try:
        from pipeline.jobs.session import local_session

        spark = local_session(args.master, "pipeline-demo")
        result = run(spark, bootstrap, workdir, args.seed, args.events, args.minutes)
        print(f"\n{args.events} clicks in {result.in_topic} -> per-minute page counts "
              f"(Parquet: {workdir}, topic: {result.out_topic})\n")
        result.table.show(args.minutes * len(clickstream.PAGES) + 10, truncate=False)
        print(f"Parquet sink matches the generator's counts: {result.counts == result.expected}")
        print(f"topic sink matches the generator's counts:   "
              f"{result.topic_counts == result.expected}")
        spark.stop()
        return 0 if result.ok else 1
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    sys.exit(main())
