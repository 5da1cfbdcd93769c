"""Batch read: every byte that was produced comes back, with its offset and timestamp, and the
offset options select exactly the ranges Spark's Kafka source would."""

from __future__ import annotations

import json

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    confluent_produce,
    create_topic,
    numbered,
    sample_records,
    unique_topic,
)

CODECS = ("none", "lz4", "zstd")


def load(spark, bootstrap: str, **options: str):
    reader = spark.read.format("mini-broker").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def collect(df) -> list:
    """Rows with the timestamp as epoch milliseconds: exact, whatever the local time zone."""
    from pyspark.sql import functions as F

    return df.withColumn("ts_ms", F.unix_millis("timestamp")).collect()


def _b(v) -> bytes | None:
    return None if v is None else bytes(v)


def test_batch_read_equals_what_was_produced(spark, broker: BrokerProcess) -> None:
    topic = unique_topic("batch")
    create_topic(broker.bootstrap, topic, partitions=3)
    sent = {}
    for p in range(3):
        # Null keys and values, empty ones, binary and duplicate and null-valued headers, a
        # 48 KB value; a different codec per partition.
        recs = sample_records(20 + 5 * p, seed=p)
        offsets = confluent_produce(broker.bootstrap, topic, recs, partition=p,
                                    compression=CODECS[p])
        sent.update({(p, off): rec for off, rec in zip(offsets, recs, strict=True)})

    df = load(spark, broker.bootstrap, subscribe=topic, includeHeaders="true")
    assert df.rdd.getNumPartitions() == 3, "one Spark partition per topic-partition range"
    rows = collect(df)

    got = {(r.partition, r.offset): r for r in rows}
    assert len(rows) == len(got) == len(sent)
    assert set(got) == set(sent)
    for (p, off), rec in sent.items():
        row = got[(p, off)]
        where = f"partition {p} offset {off}"
        assert row.topic == topic
        assert _b(row.key) == rec.key, where
        assert _b(row.value) == rec.value, where
        headers = tuple((h.key, _b(h.value)) for h in row.headers) if row.headers else ()
        assert headers == rec.headers, where
        if not rec.headers:
            assert row.headers is None, "no headers reads as null, as in Spark's Kafka source"
        assert row.ts_ms == rec.timestamp, where
        assert row.timestampType == 0, where  # CreateTime

    assert "headers" not in load(spark, broker.bootstrap, subscribe=topic).columns


def test_offset_options_and_subscription_strategies(spark, broker: BrokerProcess) -> None:
    tag = unique_topic("ranges")
    a, b = f"{tag}-a", f"{tag}-b"
    create_topic(broker.bootstrap, a, partitions=3)
    create_topic(broker.bootstrap, b, partitions=1, config={"message.timestamp.type":
                                                               "LogAppendTime"})
    for p in range(3):
        confluent_produce(broker.bootstrap, a, numbered(10, f"a{p}"), partition=p)
    confluent_produce(broker.bootstrap, b, numbered(4, "b"))

    # assign + explicit offsets, with -2/-1 sentinels; unnamed partitions use the defaults.
    df = load(spark, broker.bootstrap, assign=json.dumps({a: [0, 2]}),
              startingOffsets=json.dumps({a: {"0": 3, "2": -2}}),
              endingOffsets=json.dumps({a: {"0": 7}}))
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(3, 7)] + [(2, o) for o in range(10)]
    assert df.rdd.getNumPartitions() == 2

    # subscribePattern finds both topics; LogAppendTime is reported as Kafka's type 1.
    df = load(spark, broker.bootstrap, subscribePattern=f"{tag}-.*")
    counts = {(r.topic, r.timestampType): r["count"]
              for r in df.groupBy("topic", "timestampType").count().collect()}
    assert counts == {(a, 0): 30, (b, 1): 4}

    # An empty range and an unknown topic read as empty, not as an error.
    assert load(spark, broker.bootstrap, subscribe=b, startingOffsets=json.dumps({b: {"0": 4}})
                ).count() == 0
    assert load(spark, broker.bootstrap, subscribe=unique_topic("absent")).count() == 0
