"""Write: each Spark task produces its rows and flushes before it reports success.

acks=all and idempotence are forced on: a task counts as committed only once the broker has
every record durably, and librdkafka's internal retries cannot duplicate or reorder within a
partition. A task that Spark retries produces its rows again (at-least-once, as with Spark's
Kafka sink); readers that need exactly-once deduplicate downstream.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Producer
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from pipeline.options import OptionError, SinkOptions

logger = logging.getLogger(__name__)

_COLUMNS = ("topic", "key", "value", "partition", "headers")


@dataclass
class WriteCounts(WriterCommitMessage):
    """What one task wrote; the driver adds them up in commit()."""

    records: int = 0
    bytes: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)


def _as_bytes(v: object) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    if isinstance(v, str):
        return v.encode()
    raise TypeError(f"key and value must be string or binary, got {type(v).__name__}")


def validate_schema(schema: StructType, opts: SinkOptions) -> dict[str, int]:
    """Column positions by name; fails on the driver, before any task starts."""
    names = [f.name.lower() for f in schema.fields]
    if "value" not in names:
        raise OptionError("the DataFrame needs a value column (string or binary)")
    if opts.topic is None and "topic" not in names:
        raise OptionError("set the topic option or give the DataFrame a topic column")
    return {c: names.index(c) for c in _COLUMNS if c in names}


def produce_rows(opts: SinkOptions, columns: dict[str, int], rows: Iterator[Row]) -> WriteCounts:
    """Produce every row and wait for every acknowledgement; raise on the first failure."""
    config = {"linger.ms": 5, **opts.client, "acks": "all", "enable.idempotence": True}
    producer = Producer(config)
    failures: list[KafkaError] = []
    counts = WriteCounts()

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(err)

    ti, ki, vi, pi, hi = (columns.get(c) for c in _COLUMNS)
    for row in rows:
        topic = opts.topic or (row[ti] if ti is not None else None)
        if not topic:
            raise ValueError("row has a null topic and no topic option is set")
        value = _as_bytes(row[vi])
        key = _as_bytes(row[ki]) if ki is not None else None
        kwargs: dict[str, object] = {"value": value, "key": key, "on_delivery": on_delivery}
        if pi is not None and row[pi] is not None:
            kwargs["partition"] = int(row[pi])
        if hi is not None and row[hi]:
            kwargs["headers"] = [(h[0], _as_bytes(h[1])) for h in row[hi]]
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)  # local queue full: let deliveries drain it
        producer.poll(0)
        if failures:
            raise RuntimeError(f"produce to {topic} failed: {failures[0]}")
        counts.records += 1
        counts.bytes += len(value or b"") + len(key or b"")
        counts.per_topic[topic] = counts.per_topic.get(topic, 0) + 1
    # librdkafka reports every message within delivery.timeout.ms; wait a little past that.
    deadline = time.monotonic() + int(config.get("delivery.timeout.ms", 300_000)) / 1000 + 10
    while producer.flush(1.0) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError("records still unacknowledged after delivery.timeout.ms")
    if failures:
        raise RuntimeError(f"{len(failures)} records failed: {failures[0]}")
    return counts


def _total(messages: list[WriterCommitMessage | None]) -> WriteCounts:
    total = WriteCounts()
    for m in messages:
        if isinstance(m, WriteCounts):
            total.records += m.records
            total.bytes += m.bytes
            for t, n in m.per_topic.items():
                total.per_topic[t] = total.per_topic.get(t, 0) + n
    return total


class MiniBrokerWriter(DataSourceWriter):
    """Batch write (`df.write.format("mini-broker")`); topics are append-only."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.columns = validate_schema(schema, opts)
        self.last_commit: WriteCounts | None = None

    def write(self, iterator: Iterator[Row]) -> WriteCounts:
        return produce_rows(self.opts, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.last_commit = _total(messages)
        logger.info("wrote %d records (%s)", self.last_commit.records, self.last_commit.per_topic)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        logger.warning("write aborted after %d acknowledged records (they stay in the log)",
                    _total(messages).records)


class MiniBrokerStreamWriter(DataSourceStreamWriter):
    """Streaming write: the same per-task produce-and-flush, once per micro-batch."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.columns = validate_schema(schema, opts)

    def write(self, iterator: Iterator[Row]) -> WriteCounts:
        return produce_rows(self.opts, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = _total(messages)
        logger.info("batch %d: wrote %d records (%s)", batchId, total.records, total.per_topic)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        logger.warning("batch %d aborted after %d acknowledged records (they stay in the log)",
                    batchId, _total(messages).records)
