"""DeleteRecords through its handler and the ReplicaManager, on the broker's real parts: Kafka's
answers (low watermark, -1 for the high watermark, OFFSET_OUT_OF_RANGE, POLICY_VIOLATION,
INVALID_TOPIC_EXCEPTION for the internal topics), what readers see after, the retention pass
that deletes the segments below the new start, and the start across a restart."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DeleteRecordsRequest

from broker.apis import delete_records, fetch, list_offsets
from broker.replica.replica_manager import PartitionFetch
from protocol import registry
from protocol.errors import ErrorCode
from tests.support.components import Components, build, parse, settle, wire_roundtrip
from tests.support.requests import (
    EARLIEST,
    LATEST,
    fetch_request,
    fetched_values,
    list_offsets_request,
    record_batch,
)

E = ErrorCode
TOPIC = "trimmed"


def test_the_registry_serves_these_versions() -> None:
    spec = registry.APIS[DeleteRecordsRequest.API_KEY]
    assert (spec.min_version, spec.max_version) == (0, 2)


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    c.topics.create_topic(TOPIC, 2, {})
    yield c
    await c.close()


def append(c: Components, n: int, topic: str = TOPIC, partition: int = 0) -> None:
    """``n`` keyed records in one batch, appended as an acks=1 produce would (answered at once
    unless the fsync gates the high watermark)."""
    values = [f"v{i}".encode() for i in range(n)]
    keys = [f"k{i}".encode() for i in range(n)]
    results = c.replica_manager.append_records(
        [((topic, partition), record_batch(values, keys))], 9)
    if isinstance(results, dict):
        assert all(r.error == E.NONE for r in results.values()), results


def request(offsets: list[tuple[str, int, int]], version: int = 2, timeout_ms: int = 30_000):
    by_topic: dict[str, list[Any]] = {}
    for topic, partition, offset in offsets:
        by_topic.setdefault(topic, []).append(
            DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(
                partition_index=partition, offset=offset))
    return DeleteRecordsRequest[version](
        topics=[DeleteRecordsRequest.DeleteRecordsTopic(name=t, partitions=ps)
                for t, ps in by_topic.items()],
        timeout_ms=timeout_ms)


async def call(c: Components, handle: Any, req: Any) -> Any:
    parsed = parse(req)
    out = handle(c.context, parsed)
    if inspect.isawaitable(out):
        task = asyncio.ensure_future(out)
        await settle()
        assert task.done(), "still waiting"
        out = task.result()
    return wire_roundtrip(parsed, out)


async def delete(c: Components, offsets: list[tuple[str, int, int]], version: int = 2
                 ) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (error code, low watermark)} as the client reads them; DeleteRecords
    is never parked on one broker, so the handler must answer at once."""
    parsed = parse(request(offsets, version))
    out = delete_records.handle(c.context, parsed)
    assert out.done(), "parked"
    resp = wire_roundtrip(parsed, out.result())
    return {(t.name, p.partition_index): (p.error_code, p.low_watermark)
            for t in resp.topics for p in t.partitions}


async def earliest_latest(c: Components, partition: int = 0) -> tuple[int, int]:
    got = []
    for ts in (EARLIEST, LATEST):
        resp = await call(c, list_offsets.handle,
                          list_offsets_request(TOPIC, ts, partition=partition))
        [p] = resp.topics[0].partitions
        assert p.error_code == 0
        got.append(p.offset)
    return got[0], got[1]


@pytest.mark.parametrize("version", [0, 1, 2])
async def test_moves_the_low_watermark_and_readers_see_it(parts: Components, version: int) -> None:
    append(parts, 10)
    assert await delete(parts, [(TOPIC, 0, 4)], version) == {(TOPIC, 0): (E.NONE, 4)}
    assert await earliest_latest(parts) == (4, 10)
    resp = await call(parts, fetch.handle, fetch_request([(TOPIC, 0, 0)], max_wait_ms=0))
    [p] = resp.responses[0].partitions
    assert (p.error_code, p.log_start_offset) == (E.OFFSET_OUT_OF_RANGE, 4)
    resp = await call(parts, fetch.handle, fetch_request([(TOPIC, 0, 4)], max_wait_ms=0))
    [p] = resp.responses[0].partitions
    assert p.error_code == 0
    # The first batch holds offsets 0-9: it is served whole, the consumer skips below 4.
    assert [o for o, _ in fetched_values(p.records)] == list(range(10))


async def test_minus_one_means_the_high_watermark(parts: Components) -> None:
    append(parts, 7)
    assert await delete(parts, [(TOPIC, 0, -1), (TOPIC, 1, -1)]) == {
        (TOPIC, 0): (E.NONE, 7), (TOPIC, 1): (E.NONE, 0)}
    assert await earliest_latest(parts) == (7, 7)


async def test_an_offset_at_or_below_the_start_changes_nothing(parts: Components) -> None:
    append(parts, 5)
    assert await delete(parts, [(TOPIC, 0, 3)]) == {(TOPIC, 0): (E.NONE, 3)}
    assert await delete(parts, [(TOPIC, 0, 1)]) == {(TOPIC, 0): (E.NONE, 3)}
    assert await delete(parts, [(TOPIC, 0, 3)]) == {(TOPIC, 0): (E.NONE, 3)}
    assert await earliest_latest(parts) == (3, 5)


async def test_offsets_out_of_range_are_refused(parts: Components) -> None:
    append(parts, 5)
    assert await delete(parts, [(TOPIC, 0, 6), (TOPIC, 1, -2)]) == {
        (TOPIC, 0): (E.OFFSET_OUT_OF_RANGE, -1), (TOPIC, 1): (E.OFFSET_OUT_OF_RANGE, -1)}
    assert await delete(parts, [(TOPIC, 0, 5)]) == {(TOPIC, 0): (E.NONE, 5)}
    assert await earliest_latest(parts) == (5, 5)


async def test_not_past_the_high_watermark_while_the_fsync_gates_it(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {"log.flush.interval.messages": "1"})
    try:
        c.topics.create_topic(TOPIC, 1, {})
        append(c, 4)  # appended, not yet fsynced: the high watermark is still 0
        partition = c.replica_manager.partitions[(TOPIC, 0)]
        assert (partition.high_watermark, partition.log_end_offset) == (0, 4)
        assert await delete(c, [(TOPIC, 0, 2)]) == {(TOPIC, 0): (E.OFFSET_OUT_OF_RANGE, -1)}
        assert await delete(c, [(TOPIC, 0, -1)]) == {(TOPIC, 0): (E.NONE, 0)}
        for _ in range(200):
            if partition.high_watermark == 4:
                break
            await asyncio.sleep(0.01)
        assert await delete(c, [(TOPIC, 0, -1)]) == {(TOPIC, 0): (E.NONE, 4)}
    finally:
        await c.close()


async def test_the_cleanup_policy_must_include_delete(parts: Components) -> None:
    parts.topics.create_topic("compacted", 1, {"cleanup.policy": "compact"})
    parts.topics.create_topic("both", 1, {"cleanup.policy": "compact,delete"})
    append(parts, 3, "compacted")
    append(parts, 3, "both")
    assert await delete(parts, [("compacted", 0, 2), ("both", 0, 2)]) == {
        ("compacted", 0): (E.POLICY_VIOLATION, -1), ("both", 0): (E.NONE, 2)}
    assert parts.replica_manager.partitions[("compacted", 0)].log_start_offset == 0


async def test_unknown_partitions_and_internal_topics(parts: Components) -> None:
    # __consumer_offsets exists (compacted): the internal topic is refused before its policy.
    assert "__consumer_offsets" in parts.metadata.topics
    assert await delete(parts, [("nowhere", 0, 0), (TOPIC, 2, 0), ("__consumer_offsets", 0, 0),
                                ("__transaction_state", 0, 0)]) == {
        ("nowhere", 0): (E.UNKNOWN_TOPIC_OR_PARTITION, -1),
        (TOPIC, 2): (E.UNKNOWN_TOPIC_OR_PARTITION, -1),
        ("__consumer_offsets", 0): (E.INVALID_TOPIC_EXCEPTION, -1),
        ("__transaction_state", 0): (E.UNKNOWN_TOPIC_OR_PARTITION, -1),
    }


async def test_answers_grouped_by_topic_and_a_repeated_partition_once(parts: Components) -> None:
    append(parts, 6)
    append(parts, 6, partition=1)
    parsed = parse(request([(TOPIC, 0, 2), (TOPIC, 1, 3), (TOPIC, 0, 4)]))
    resp = wire_roundtrip(parsed, delete_records.handle(parts.context, parsed).result())
    [t] = resp.topics
    assert [(p.partition_index, p.error_code, p.low_watermark) for p in t.partitions] == [
        (0, 0, 4), (1, 0, 3)]


async def test_an_offline_log_dir_answers_storage_error(parts: Components) -> None:
    append(parts, 3)
    log_dir = str(parts.log_manager.log_dir_of((TOPIC, 0)))
    parts.log_manager.failure_channel.maybe_add_offline_log_dir(log_dir, "test", OSError(5, "EIO"))
    await settle()
    assert await delete(parts, [(TOPIC, 0, 1)]) == {(TOPIC, 0): (E.KAFKA_STORAGE_ERROR, -1)}


async def test_a_fetch_parked_below_the_new_start_answers_at_once(parts: Components) -> None:
    append(parts, 10)
    rm = parts.replica_manager
    parked = rm.fetch_messages([PartitionFetch((TOPIC, 0), 2, 1 << 20)], 1 << 20,
                               min_bytes=1 << 20, max_wait_ms=10_000)
    assert inspect.isawaitable(parked)
    task = asyncio.ensure_future(parked)
    await settle()
    assert not task.done()
    assert rm.delete_records({(TOPIC, 0): 6}, 30_000).result()[(TOPIC, 0)].low_watermark == 6
    await settle()
    assert task.done()
    [result] = task.result()
    assert (result.error, result.log_start_offset) == (E.OFFSET_OUT_OF_RANGE, 6)


async def test_retention_deletes_the_segments_wholly_below_the_start(parts: Components) -> None:
    log = parts.replica_manager.partitions[(TOPIC, 0)].log
    for _ in range(4):
        append(parts, 5)
        log.roll()
    append(parts, 5)
    assert [s.base_offset for s in log.segments] == [0, 5, 10, 15, 20]
    assert await delete(parts, [(TOPIC, 0, 12)]) == {(TOPIC, 0): (E.NONE, 12)}
    assert [s.base_offset for s in log.segments] == [0, 5, 10, 15, 20]  # not yet
    parts.replica_manager.apply_retention()
    # 10-14 holds the start: it stays, and its records below 12 are skipped by readers.
    assert [s.base_offset for s in log.segments] == [10, 15, 20]
    assert log.log_start_offset == 12
    assert await earliest_latest(parts) == (12, 25)


async def test_the_new_start_survives_a_restart(tmp_path: Path) -> None:
    c = build(tmp_path / "logs")
    c.topics.create_topic(TOPIC, 1, {})
    append(c, 8)
    assert await delete(c, [(TOPIC, 0, 5)]) == {(TOPIC, 0): (E.NONE, 5)}
    await c.close()
    c = build(tmp_path / "logs")
    try:
        assert c.replica_manager.partitions[(TOPIC, 0)].log_start_offset == 5
        assert await earliest_latest(c) == (5, 8)
    finally:
        await c.close()
