"""Per-minute page counts over the clickstream, with a watermark, to Parquet and to a topic.

Read this as the example of the data source in a real job:
- `format("mini-broker")` with the same options as Spark's Kafka source;
- JSON parsed with from_json (malformed records become nulls and are dropped, never fail the
  job);
- event time from the JSON, a watermark so state for old minutes is dropped and append mode can
  emit each minute once, when it is final;
- one query, two sinks: foreachBatch writes each micro-batch to Parquet and to a topic, so
  the topic is read once and the state kept once. Parquet is exactly-once (a replayed batch
  overwrites its own `batch=<id>` directory); the topic is at-least-once, like any Kafka sink.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from pipeline.jobs.clickstream import HEARTBEAT

EVENT_SCHEMA = "user STRING, page STRING, action STRING, ts LONG"
RESULT_COLUMNS = ("minute", "page", "clicks")


def page_counts(spark: SparkSession, bootstrap: str, topic: str, watermark: str = "1 minute",
                **source_options: str) -> DataFrame:
    """The streaming aggregate: (minute, page, clicks), emitted once each minute is closed."""
    reader = (spark.readStream.format("mini-broker")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic)
              .option("startingOffsets", "earliest"))
    for key, value in source_options.items():
        reader = reader.option(key, value)
    events = (reader.load()
              .select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
              .select("e.*")
              .where(F.col("page").isNotNull() & F.col("ts").isNotNull())
              .withColumn("event_time", F.timestamp_millis("ts"))
              .withWatermark("event_time", watermark))
    # Heartbeats must reach the watermark, so they are not filtered out before it: Spark's
    # optimizer would push such a filter below withWatermark. They count as zero clicks instead,
    # and their group is dropped after the aggregate.
    clicks = F.count(F.when(F.col("action") != HEARTBEAT, True))
    return (events.groupBy(F.window("event_time", "1 minute"), "page")
            .agg(clicks.alias("clicks"))
            .where(F.col("clicks") > 0)
            .select(F.col("window.start").alias("minute"), "page", "clicks"))


def _as_record(counts: DataFrame) -> list[Column]:
    """Key by page; the value is the row as JSON (what a downstream consumer reads)."""
    return [F.col("page").alias("key"),
            F.to_json(F.struct(F.date_format("minute", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("minute"),
                               "page", "clicks")).alias("value")]


def read_parquet(spark: SparkSession, parquet_dir: Path) -> DataFrame:
    """The Parquet sink's rows, without the batch directories' column."""
    return spark.read.parquet(str(parquet_dir)).select(*RESULT_COLUMNS)


def start(counts: DataFrame, bootstrap: str, out_topic: str, parquet_dir: Path,
          checkpoint_dir: Path, available_now: bool = True) -> StreamingQuery:
    """Start the query; `available_now` processes what is in the topic now, then stops."""

    def write_both(batch: DataFrame, batch_id: int) -> None:
        batch.persist()  # two writes of one micro-batch: compute it once
        try:
            if batch.isEmpty():
                return  # no minute closed in this batch
            batch.write.mode("overwrite").parquet(str(parquet_dir / f"batch={batch_id}"))
            (batch.select(*_as_record(batch)).write.format("mini-broker").mode("append")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", out_topic).save())
        finally:
            batch.unpersist()

    trigger = {"availableNow": True} if available_now else {"processingTime": "5 seconds"}
    return (counts.writeStream.queryName("page_counts").foreachBatch(write_both)
            .option("checkpointLocation", str(checkpoint_dir))
            .outputMode("append").trigger(**trigger).start())
