"""PySpark data source for Kafka-wire clusters (format "mini-broker") and example jobs.

    from pipeline import register
    register(spark)
    spark.read.format("mini-broker").option("kafka.bootstrap.servers", ...).load()

PySpark is imported lazily, so the clickstream generator runs without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FORMAT", "MiniBrokerDataSource", "register"]

FORMAT = "mini-broker"


def register(spark: SparkSession) -> None:
    """Make format("mini-broker") known to this session (Python data sources are per session)."""
    from pipeline.datasource import MiniBrokerDataSource

    spark.dataSource.register(MiniBrokerDataSource)


def __getattr__(name: str) -> Any:
    if name == "MiniBrokerDataSource":
        from pipeline.datasource import MiniBrokerDataSource

        return MiniBrokerDataSource
    raise AttributeError(name)
