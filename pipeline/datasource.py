"""The `mini-broker` format: Spark's Kafka connector, in Python, for any Kafka-wire cluster.

Spark pickles this object to the driver's planner process and to executors, so it carries only
its options; each role (batch reader, stream reader, writers) parses and validates them when
Spark asks for it, which puts option errors on the driver at query start.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pipeline import FORMAT
from pipeline.options import OptionError, SinkOptions, SourceOptions
from pipeline.reader import MiniBrokerReader
from pipeline.schema import kafka_schema
from pipeline.stream_reader import MiniBrokerStreamReader
from pipeline.writer import MiniBrokerStreamWriter, MiniBrokerWriter


class MiniBrokerDataSource(DataSource):
    """Read and write Kafka topics: batch and Structured Streaming."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        include = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return kafka_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return MiniBrokerReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MiniBrokerStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("a topic is append-only: use mode('append')")
        return MiniBrokerWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return MiniBrokerStreamWriter(SinkOptions.parse(self.options), schema)
