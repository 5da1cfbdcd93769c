"""Batches built by kafka-python as a (transactional) idempotent producer sends them, and a
Log in a test's directory: shared by the producer-state and log-transaction tests."""

from __future__ import annotations

from pathlib import Path

from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.log.config import LogConfig
from broker.log.log import Log

T0 = 1_700_000_000_000


def producer_batch(
    pid: int, epoch: int, seq: int, n: int, *, transactional: bool = False, ts: int = T0,
    size: int = 20,
) -> bytearray:
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=transactional,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    for i in range(n):
        b.append(i, timestamp=ts + i, key=f"k{seq}-{i}".encode(), value=b"v" * size, headers=[])
    return bytearray(b.build())


def plain(n: int = 2) -> bytearray:
    """A batch with no producer id."""
    return producer_batch(-1, -1, -1, n)


def new_log(tmp_path: Path, cfg: LogConfig | None = None) -> Log:
    return Log(tmp_path / "topic-0", cfg or LogConfig(), "topic", 0)
