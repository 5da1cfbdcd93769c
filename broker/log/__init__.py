"""broker/log: Kafka's on-disk log format (segments, indexes, recovery) and its manager."""

from broker.log.log import (
    AppendInfo,
    Log,
    LogConfig,
    OffsetOutOfRangeError,
    RecordBatchTooLargeError,
)
from broker.log.manager import LogManager

__all__ = [
    "AppendInfo",
    "Log",
    "LogConfig",
    "LogManager",
    "OffsetOutOfRangeError",
    "RecordBatchTooLargeError",
]
