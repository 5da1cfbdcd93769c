"""broker/log: Kafka's on-disk log format (segments, indexes, recovery) and its manager."""

from broker.log.config import LogConfig
from broker.log.log import AppendInfo, Log, OffsetOutOfRangeError, RecordBatchTooLargeError
from broker.log.manager import LogManager
from broker.log.validator import LogValidator

__all__ = [
    "AppendInfo",
    "Log",
    "LogConfig",
    "LogManager",
    "LogValidator",
    "OffsetOutOfRangeError",
    "RecordBatchTooLargeError",
]
