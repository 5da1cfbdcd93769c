"""Streaming read: the checkpoint makes restarts exact, new partitions are picked up,
maxOffsetsPerTrigger bounds every micro-batch, and deleted data obeys failOnDataLoss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
    wait_until,
    watermarks,
)

QUERY_TIMEOUT_S = 60


def run_available_now(spark, bootstrap: str, checkpoint: Path, **options: str):
    """One Trigger.AvailableNow run; returns (rows, rows per non-empty micro-batch).

    foreachBatch rather than the memory sink: only a sink that can recover from a checkpoint
    lets a second run continue the first.
    """
    reader = (spark.readStream.format("mini-broker")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("startingOffsets", "earliest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    batches: list[list] = []
    query = (reader.load().select("topic", "partition", "offset", "value")
             .writeStream.foreachBatch(lambda df, _id: batches.append(df.collect()))
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(QUERY_TIMEOUT_S), "availableNow query did not finish"
    finally:
        query.stop()
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return [r for b in batches for r in b], [len(b) for b in batches if b]


def _keys(rows) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in rows)


def test_available_now_twice_reads_each_record_once(spark, broker: BrokerProcess,
                                                    tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = unique_topic("stream")
    create_topic(broker.bootstrap, topic, partitions=3)
    for p in range(3):
        confluent_produce(broker.bootstrap, topic, numbered(10, f"first{p}"), partition=p)

    first, _ = run_available_now(spark, broker.bootstrap, tmp_path / "cp", subscribe=topic)
    assert _keys(first) == [(p, o) for p in range(3) for o in range(10)]

    # More records, and a partition that did not exist when the query first ran.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(timeout=20)
    for p in range(4):
        confluent_produce(broker.bootstrap, topic, numbered(5, f"second{p}"), partition=p)

    second, _ = run_available_now(spark, broker.bootstrap, tmp_path / "cp", subscribe=topic)
    assert _keys(second) == ([(p, o) for p in range(3) for o in range(10, 15)]
                             + [(3, o) for o in range(5)])
    assert {bytes(r.value).decode().split("-")[0] for r in second} == {
        f"second{p}" for p in range(4)}

    third, _ = run_available_now(spark, broker.bootstrap, tmp_path / "cp", subscribe=topic)
    assert third == [], "nothing new: a restart reads nothing twice"


def test_max_offsets_per_trigger_bounds_each_batch(spark, broker: BrokerProcess,
                                                   tmp_path: Path) -> None:
    topic = unique_topic("rate")
    create_topic(broker.bootstrap, topic, partitions=3)
    sizes = (25, 10, 5)  # uneven backlogs: the limit is shared in proportion
    for p, n in enumerate(sizes):
        confluent_produce(broker.bootstrap, topic, numbered(n, f"r{p}"), partition=p)

    rows, batches = run_available_now(spark, broker.bootstrap, tmp_path / "cp", subscribe=topic,
                                      maxOffsetsPerTrigger="7")
    assert _keys(rows) == [(p, o) for p, n in enumerate(sizes) for o in range(n)]
    assert sum(batches) == sum(sizes)
    assert max(batches) <= 7, f"a micro-batch exceeded maxOffsetsPerTrigger: {batches}"
    assert len(batches) == -(-sum(sizes) // 7), f"batches not filled to the limit: {batches}"


def test_data_deleted_below_log_start_follows_fail_on_data_loss(spark, broker_factory,
                                                                tmp_path: Path) -> None:
    broker = broker_factory({"log.retention.check.interval.ms": "200"})
    topic = unique_topic("loss")
    create_topic(broker.bootstrap, topic, config={"segment.bytes": "1024",
                                                  "retention.bytes": "1024"})
    records = numbered(60, "x" * 40)
    confluent_produce(broker.bootstrap, topic, records, one_batch_each=True)
    wait_until(lambda: watermarks(broker.bootstrap, topic)[0] > 0,
               timeout=20, interval=0.2, what="retention to move the log start")
    # Retention deletes a segment per pass: the log start is final once ten passes (2 s) have
    # left it where it was; reading before then races the next deletion.
    seen: list[tuple[int, int]] = []

    def settled() -> tuple[int, int] | None:
        seen.append(watermarks(broker.bootstrap, topic))
        recent = seen[-5:]
        return recent[0] if len(recent) == 5 and len(set(recent)) == 1 else None

    low, high = wait_until(settled, timeout=30, interval=0.5, what="retention to finish")
    assert 0 < low < high == len(records)
    from_zero = json.dumps({topic: {"0": 0}})

    def batch(fail: str):
        return (spark.read.format("mini-broker").option("kafka.bootstrap.servers", broker.bootstrap)
                .option("subscribe", topic).option("startingOffsets", from_zero)
                .option("failOnDataLoss", fail).load())

    with pytest.raises(Exception, match="failOnDataLoss"):
        batch("true").collect()
    assert sorted(r.offset for r in batch("false").collect()) == list(range(low, high))

    with pytest.raises(Exception, match="were deleted"):
        run_available_now(spark, broker.bootstrap, tmp_path / "cp-fail", subscribe=topic,
                          startingOffsets=from_zero)
    rows, _ = run_available_now(spark, broker.bootstrap, tmp_path / "cp-skip", subscribe=topic,
                                startingOffsets=from_zero, failOnDataLoss="false")
    assert _keys(rows) == [(0, o) for o in range(low, high)]
