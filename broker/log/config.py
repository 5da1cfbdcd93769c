"""LogConfig: one log's settings, under Kafka's topic-level names and defaults (the broker's
``log.*`` keys are the defaults of every topic)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from broker.log.validator import TOPIC_CODECS, compression_level_problem, is_compacted

LONG_MAX = 2**63 - 1
CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"


@dataclass(slots=True)
class LogConfig:
    """Per-log settings, Kafka's topic-level names and defaults (server keys ``log.*``)."""

    segment_bytes: int = 1024 * 1024 * 1024  # log.segment.bytes
    roll_ms: int = 7 * 24 * 60 * 60 * 1000  # log.roll.ms (log.roll.hours=168)
    retention_ms: int = 7 * 24 * 60 * 60 * 1000  # log.retention.ms; -1 = unlimited
    retention_bytes: int = -1  # log.retention.bytes; -1 = unlimited
    flush_interval_messages: int = LONG_MAX  # log.flush.interval.messages
    flush_interval_ms: int = LONG_MAX  # log.flush.interval.ms
    index_interval_bytes: int = 4096  # log.index.interval.bytes
    message_timestamp_type: str = CREATE_TIME  # log.message.timestamp.type
    max_message_bytes: int = 1024 * 1024 + 12  # message.max.bytes (1048588)
    cleanup_policy: str = "delete"  # cleanup.policy: "compact" in it makes keys mandatory
    compression_type: str = "producer"  # compression.type
    compression_gzip_level: int = -1  # compression.gzip.level
    compression_lz4_level: int = 9  # compression.lz4.level
    compression_zstd_level: int = 3  # compression.zstd.level
    message_timestamp_before_max_ms: int = LONG_MAX  # log.message.timestamp.before.max.ms
    message_timestamp_after_max_ms: int = LONG_MAX  # log.message.timestamp.after.max.ms
    delete_retention_ms: int = 24 * 60 * 60 * 1000  # log.cleaner.delete.retention.ms
    min_compaction_lag_ms: int = 0  # log.cleaner.min.compaction.lag.ms
    max_compaction_lag_ms: int = LONG_MAX  # log.cleaner.max.compaction.lag.ms
    min_cleanable_dirty_ratio: float = 0.5  # log.cleaner.min.cleanable.ratio
    roll_jitter_ms: int = 0  # log.roll.jitter.ms: most a segment's roll comes early
    max_index_size: int = 10 * 1024 * 1024  # log.index.size.max.bytes: an index's most bytes
    file_delete_delay_ms: int = 60_000  # log.segment.delete.delay.ms
    preallocate: bool = False  # log.preallocate: a new segment's file made segment.bytes long

    @property
    def compact(self) -> bool:
        """``compact`` is among the cleanup policies: the log cleaner compacts this log."""
        return is_compacted(self.cleanup_policy)

    @property
    def delete(self) -> bool:
        """``delete`` is among the cleanup policies: retention deletes old segments."""
        return "delete" in (p.strip().lower() for p in self.cleanup_policy.split(","))

    def __post_init__(self) -> None:
        if self.message_timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
            raise ValueError(
                f"message_timestamp_type must be {CREATE_TIME} or {LOG_APPEND_TIME}, "
                f"got {self.message_timestamp_type!r}"
            )
        if self.segment_bytes < 14:
            raise ValueError(f"segment_bytes must be at least 14, got {self.segment_bytes}")
        if self.index_interval_bytes < 0:
            raise ValueError("index_interval_bytes must be >= 0")
        self._check_validator_settings()

    def _check_validator_settings(self) -> None:
        if self.compression_type not in TOPIC_CODECS:
            raise ValueError(f"compression_type must be one of {', '.join(TOPIC_CODECS)}, "
                             f"got {self.compression_type!r}")
        for key, level in (
            ("compression.gzip.level", self.compression_gzip_level),
            ("compression.lz4.level", self.compression_lz4_level),
            ("compression.zstd.level", self.compression_zstd_level),
        ):
            problem = compression_level_problem(key, level)
            if problem is not None:
                raise ValueError(problem)
        if min(self.message_timestamp_before_max_ms, self.message_timestamp_after_max_ms) < 0:
            raise ValueError("message timestamp bounds must be >= 0")

    def random_segment_jitter(self, rng: Callable[[int], int]) -> int:
        """Kafka's randomSegmentJitter: a new segment's jitter in [0, min(jitter, segment.ms)).

        ``rng(n)`` draws an int in [0, n)."""
        if self.roll_jitter_ms <= 0:
            return 0
        return rng(min(self.roll_jitter_ms, self.roll_ms))

    def with_overrides(self, **changes: object) -> LogConfig:
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_topic_configs(cls, configs: Mapping[str, str]) -> LogConfig:
        """A LogConfig from effective topic configs (Kafka's topic keys, values as strings).

        Keys that are absent keep the defaults above; unknown keys are ignored here (the
        metadata layer refuses them before they are stored).
        """
        changes: dict[str, object] = {}
        for key, (field_name, parse) in _TOPIC_KEYS.items():
            if key in configs:
                changes[field_name] = parse(configs[key])
        return cls(**changes)  # type: ignore[arg-type]


#: Topic config key -> (LogConfig field, parser).
_TOPIC_KEYS: dict[str, tuple[str, Callable[[str], object]]] = {
    "segment.bytes": ("segment_bytes", int),
    "segment.ms": ("roll_ms", int),
    "retention.ms": ("retention_ms", int),
    "retention.bytes": ("retention_bytes", int),
    "flush.messages": ("flush_interval_messages", int),
    "flush.ms": ("flush_interval_ms", int),
    "index.interval.bytes": ("index_interval_bytes", int),
    "message.timestamp.type": ("message_timestamp_type", str),
    "max.message.bytes": ("max_message_bytes", int),
    "cleanup.policy": ("cleanup_policy", str),
    "compression.type": ("compression_type", str),
    "compression.gzip.level": ("compression_gzip_level", int),
    "compression.lz4.level": ("compression_lz4_level", int),
    "compression.zstd.level": ("compression_zstd_level", int),
    "message.timestamp.before.max.ms": ("message_timestamp_before_max_ms", int),
    "message.timestamp.after.max.ms": ("message_timestamp_after_max_ms", int),
    "delete.retention.ms": ("delete_retention_ms", int),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", int),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", int),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", float),
    "segment.jitter.ms": ("roll_jitter_ms", int),
    "segment.index.bytes": ("max_index_size", int),
    "file.delete.delay.ms": ("file_delete_delay_ms", int),
    "preallocate": ("preallocate", lambda v: v.strip().lower() == "true"),
}
