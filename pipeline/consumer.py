"""Executor side of every read: one offset range of one partition, fetched by librdkafka.

Why confluent-kafka: it is librdkafka underneath, the fastest Python Kafka client by far (fetch,
decompression and record parsing happen in C on a background thread, prefetching the next fetch
while Python turns the last one into rows), and it is the client this project already tests the
broker against. The consumer is assigned to the range, never joins a group and never commits:
Spark's checkpoint, not Kafka, remembers progress, which is what makes a restart exact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline.offsets import consumer_config, report_data_loss
from pipeline.options import SourceOptions
from pipeline.schema import kafka_schema

# Kafka's own ids, which Spark's timestampType column carries (librdkafka numbers them 1 and 2).
_TIMESTAMP_TYPE = {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}
_BATCH = 5000
_METADATA_TIMEOUT_S = 30.0


@dataclass
class OffsetRange(InputPartition):
    """One Spark task: records [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow layout Spark checks batches against (it converts with the same function)."""
    return to_arrow_schema(kafka_schema(include_headers), timezone="UTC")


def to_record_batch(msgs: list[Message], schema: pa.Schema) -> pa.RecordBatch:
    """Column lists straight into Arrow: much cheaper than Spark converting a tuple per row."""
    keys, values, offsets, ts_us, ts_types, headers = [], [], [], [], [], []
    for msg in msgs:
        ts_type, ts = msg.timestamp()
        keys.append(msg.key())
        values.append(msg.value())
        offsets.append(msg.offset())
        known = ts_type in _TIMESTAMP_TYPE
        ts_us.append(ts * 1000 if known else None)
        ts_types.append(_TIMESTAMP_TYPE[ts_type] if known else -1)
        # Spark's Kafka source gives null, not an empty array, for a record without headers.
        headers.append(msg.headers() or None)
    n = len(msgs)
    columns = [keys, values, [msgs[0].topic()] * n, [msgs[0].partition()] * n, offsets, ts_us,
               ts_types, headers][:len(schema)]  # headers only when the schema has them
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)],
        schema=schema)


def _start_within_log(consumer: Consumer, opts: SourceOptions, rng: OffsetRange,
                      start: int) -> int:
    """Where reading can begin: `start`, or the log start if retention got there first."""
    tp = TopicPartition(rng.topic, rng.partition)
    low, _high = consumer.get_watermark_offsets(tp, timeout=_METADATA_TIMEOUT_S, cached=False)
    if start < low:
        report_data_loss(opts, f"{rng.topic}-{rng.partition}: offsets {start} to "
                               f"{min(low, rng.end) - 1} were deleted (log start is now {low})")
        return low
    return start


def read_range(opts: SourceOptions, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Records [start, end) as Arrow batches, in offset order; raises if no progress within
    pollTimeoutMs.

    Offsets may have gaps (transaction markers, compaction): the range is done when the
    consumer's position reaches `end`, not when `end - start` records were seen.
    """
    if rng.end <= rng.start:
        return
    consumer = Consumer({**consumer_config(opts), "fetch.wait.max.ms": 100})
    try:
        nxt = _start_within_log(consumer, opts, rng, rng.start)
        if nxt >= rng.end:
            return
        tp = TopicPartition(rng.topic, rng.partition, nxt)
        consumer.assign([tp])
        schema = arrow_schema(opts.include_headers)
        timeout_s = opts.poll_timeout_ms / 1000
        deadline = time.monotonic() + timeout_s
        while nxt < rng.end:
            msgs = consumer.consume(num_messages=min(_BATCH, rng.end - nxt), timeout=0.5)
            rows: list[Message] = []
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        # Retention deleted what we were about to read, mid-range.
                        nxt = _start_within_log(consumer, opts, rng, nxt)
                        consumer.assign([TopicPartition(rng.topic, rng.partition, nxt)])
                        break
                    raise KafkaException(err)
                if msg.offset() >= rng.end:
                    nxt = rng.end
                    break
                rows.append(msg)
                nxt = msg.offset() + 1
            if rows:
                yield to_record_batch(rows, schema)
            if msgs:
                deadline = time.monotonic() + timeout_s
                continue
            position = consumer.position([TopicPartition(rng.topic, rng.partition)])[0].offset
            if position >= rng.end:
                break  # only markers or compacted-away offsets were left
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{rng.topic}-{rng.partition}: no record at offset {nxt} within "
                    f"kafkaConsumer.pollTimeoutMs={opts.poll_timeout_ms} (range ends at {rng.end})")
    finally:
        consumer.close()
