"""Write: what a streaming query writes, a batch read gets back byte for byte and in order;
a batch write routes rows by their topic and partition columns."""

from __future__ import annotations

from pathlib import Path

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    confluent_produce,
    create_topic,
    sample_records,
    unique_topic,
)


def _b(v) -> bytes | None:
    return None if v is None else bytes(v)


def read_back(spark, bootstrap: str, topic: str) -> dict[int, list[tuple]]:
    """partition -> [(key, value, headers)] in offset order."""
    rows = (spark.read.format("mini-broker").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("includeHeaders", "true").load()
            .orderBy("partition", "offset").collect())
    out: dict[int, list[tuple]] = {}
    for r in rows:
        headers = tuple((h.key, _b(h.value)) for h in r.headers) if r.headers else ()
        out.setdefault(r.partition, []).append((_b(r.key), _b(r.value), headers))
    return out


def test_streaming_write_then_batch_read_round_trips(spark, broker: BrokerProcess,
                                                     tmp_path: Path) -> None:
    src, dst = unique_topic("wsrc"), unique_topic("wdst")
    create_topic(broker.bootstrap, src, partitions=3)
    create_topic(broker.bootstrap, dst, partitions=3)
    sent = {p: sample_records(15, seed=10 + p) for p in range(3)}
    for p, recs in sent.items():
        confluent_produce(broker.bootstrap, src, recs, partition=p)

    query = (spark.readStream.format("mini-broker")
             .option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", src)
             .option("startingOffsets", "earliest").option("includeHeaders", "true").load()
             .select("key", "value", "headers", "partition")
             .writeStream.format("mini-broker")
             .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", dst)
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(60), "streaming write did not finish"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()

    got = read_back(spark, broker.bootstrap, dst)
    assert got == {p: [(r.key, r.value, r.headers) for r in recs] for p, recs in sent.items()}


def test_batch_write_routes_by_topic_and_partition_columns(spark, broker: BrokerProcess) -> None:
    a, b = unique_topic("wa"), unique_topic("wb")
    create_topic(broker.bootstrap, a, partitions=2)
    create_topic(broker.bootstrap, b, partitions=1)
    rows = [(a if i % 3 else b, f"k{i}", f"v{i}", (i % 2) if i % 3 else None,
             [("n", str(i).encode())]) for i in range(30)]
    df = spark.createDataFrame(
        rows, "topic string, key string, value string, partition int, "
              "headers array<struct<key:string,value:binary>>").repartition(3)
    # Python data sources take only append and overwrite; a topic can only be appended to.
    (df.write.format("mini-broker").mode("append")
     .option("kafka.bootstrap.servers", broker.bootstrap).save())

    want: dict[str, dict[int, set[tuple]]] = {a: {}, b: {}}
    for topic, k, v, part, headers in rows:
        want[topic].setdefault(part or 0, set()).add((k.encode(), v.encode(), tuple(headers)))
    for topic in (a, b):
        got = read_back(spark, broker.bootstrap, topic)
        assert {p: set(recs) for p, recs in got.items()} == want[topic]
