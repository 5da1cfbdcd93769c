"""Topic keys the replica manager applies: file.delete.delay.ms (retention's and the
cleaner's ``.deleted`` files removed by the timer once the delay has passed) and
min.insync.replicas (Kafka 4's effective min ISR, capped at the replication factor: one
replica here)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.log.cleaner import CleanerConfig, LogCleaner
from protocol.errors import ErrorCode
from tests.support.components import Components, build, settle
from tests.unit.test_log_cleaner import batch as cleaner_batch
from tests.unit.test_log_cleaner import kv
from tests.unit.test_replica_manager import PRODUCE_VERSION, TOPIC, TP, produce, wait


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    yield c
    await c.close()


def _deleted_files(c: Components) -> list[str]:
    d = c.replica_manager.partitions[TP].log.dir
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".deleted"))


async def test_retention_files_go_when_file_delete_delay_passes(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {"retention.ms": "60000", "segment.bytes": "200",
                                         "file.delete.delay.ms": "5000"})
    for value in (b"a" * 60, b"b" * 60):
        await settle()
        assert produce(parts, [value]).result()[TP].error == ErrorCode.NONE
    log = parts.replica_manager.partitions[TP].log
    assert log.num_segments == 2
    parts.replica_manager.apply_retention()  # records an hour old: both segments expire
    assert log.log_start_offset == 2
    assert _deleted_files(parts), "retention's segments are renamed .deleted first"
    await parts.advance(4999)
    assert log.pending_deletes == 2 and _deleted_files(parts)
    await parts.advance(1)
    assert log.pending_deletes == 0 and _deleted_files(parts) == []


async def test_acks_all_with_min_insync_above_the_replicas_is_appended(
        parts: Components) -> None:
    """Kafka 4 compares the ISR with min(min.insync.replicas, replication factor): with one
    replica, min.insync.replicas=2 never refuses an acks=all produce."""
    parts.topics.create_topic(TOPIC, 1, {"min.insync.replicas": "2"})
    answer = await wait(produce(parts, [b"x"], acks=-1), "acks=all produce")
    assert answer[TP].error == ErrorCode.NONE and answer[TP].base_offset == 0


async def test_cleaned_out_segments_go_when_file_delete_delay_passes(parts: Components) -> None:
    """The cleaner's swapped-out segments take retention's path: renamed .deleted, removed by
    the timer once file.delete.delay.ms has passed, not at the swap."""
    parts.topics.create_topic(TOPIC, 1, {"cleanup.policy": "compact", "segment.bytes": "200",
                                         "min.cleanable.dirty.ratio": "0.01",
                                         "file.delete.delay.ms": "5000"})
    for i in range(8):
        await settle()
        answer = parts.replica_manager.append_records(
            [(TP, bytes(cleaner_batch([kv(f"k{i % 2}", f"value-{i}" * 8)])))],
            PRODUCE_VERSION, 1, 30_000).result()
        assert answer[TP].error == ErrorCode.NONE
    log = parts.replica_manager.partitions[TP].log
    assert log.num_segments > 2
    assert LogCleaner(CleanerConfig(), parts.log_manager).clean_once(
        parts.clock.wall_ms() + 1000)
    assert log.pending_deletes > 0 and _deleted_files(parts), "renamed .deleted, not removed"
    await parts.advance(4999)
    assert _deleted_files(parts)
    await parts.advance(1)
    assert log.pending_deletes == 0 and _deleted_files(parts) == []
