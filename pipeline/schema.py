"""The row shape of Spark's Kafka source, column for column, so queries port unchanged."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADER = StructType([StructField("key", StringType(), False),
                     StructField("value", BinaryType(), True)])


def kafka_schema(include_headers: bool) -> StructType:
    """key, value, topic, partition, offset, timestamp, timestampType (and headers)."""
    fields = [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
        StructField("timestampType", IntegerType(), True),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(HEADER, True), True))
    return StructType(fields)
