"""ReplicaManager: produce and fetch answered now or parked, and what completes what is parked.

Built by tests/support/components.py on a manual clock: timeouts happen exactly when the test
advances the clock, and completions happen on the event that should cause them (an append, an
fsync, retention), never on a poll. Fsyncs run on the flusher threads, as in the broker.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.replica.replica_manager import FetchResult, PartitionFetch, ProduceResult
from protocol.errors import ErrorCode
from tests.support.clients import BASE_TS
from tests.support.components import Components, build, settle
from tests.support.requests import fetched_values, record_batch

TOPIC = "events"
TP = (TOPIC, 0)
PRODUCE_VERSION = 9
MAX_BYTES = 1 << 20


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    yield c
    await c.close()


def produce(c: Components, values: list[bytes], *, acks: int = 1, timeout_ms: int = 30_000,
            tp: tuple[str, int] = TP):
    """Records stamped an hour ago (BASE_TS): retention of a minute finds them expired."""
    return c.replica_manager.append_records([(tp, record_batch(values))], PRODUCE_VERSION, acks,
                                            timeout_ms)


def fetch(c: Components, offset: int, *, min_bytes: int = 1, max_wait_ms: int = 5000,
          tp: tuple[str, int] = TP):
    return c.replica_manager.fetch_messages([PartitionFetch(tp, offset, MAX_BYTES)], MAX_BYTES,
                                            min_bytes, max_wait_ms)


async def wait(fut: asyncio.Future, what: str, seconds: float = 10):
    """Await what a flusher thread completes (real time, bounded: a hang fails the test)."""
    try:
        return await asyncio.wait_for(asyncio.shield(fut), seconds)
    except TimeoutError:
        raise AssertionError(f"{what}: not answered within {seconds}s") from None


# -- produce -------------------------------------------------------------------------------------

async def test_acks_1_answers_at_once_with_offsets(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    answer = produce(parts, [b"a", b"b", b"c"])
    assert answer.done(), "acks=1 on a partition not gated by fsync must not wait"
    first = answer.result()
    assert first[TP] == ProduceResult(ErrorCode.NONE, 0, 2, -1, 0)
    answer = produce(parts, [b"d"])
    assert answer.done()
    second = answer.result()
    assert (second[TP].error, second[TP].base_offset, second[TP].last_offset) == (
        ErrorCode.NONE, 3, 3)
    assert parts.replica_manager.partitions[TP].high_watermark == 4
    answer = produce(parts, [b"x"], tp=("nowhere", 0))
    assert answer.done()
    unknown = answer.result()
    assert unknown[("nowhere", 0)].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_acks_all_on_an_fsync_gated_partition_answers_after_the_flush(
        parts: Components) -> None:
    """flush.messages=1: the high watermark (and so acks=-1) waits for the covering fsync."""
    parts.topics.create_topic(TOPIC, 1, {"flush.messages": "1"})
    partition = parts.replica_manager.partitions[TP]
    assert partition.hw_gated_by_flush
    answer = produce(parts, [b"a", b"b", b"c"], acks=-1)
    assert not isinstance(answer, dict), "acks=-1 answered before any fsync could run"
    fut = asyncio.ensure_future(answer)
    at_answer: list[tuple[int, int]] = []
    fut.add_done_callback(
        lambda _f: at_answer.append((partition.log.recovery_point, partition.high_watermark)))
    assert not fut.done() and partition.high_watermark == 0
    results = await wait(fut, "acks=-1 produce on a flush-gated partition")
    assert results[TP].error == ErrorCode.NONE
    assert (results[TP].base_offset, results[TP].last_offset) == (0, 2)
    assert at_answer == [(3, 3)], "answered before the fsync covered the batch"


async def test_acks_all_times_out_while_the_high_watermark_stands_still(
        parts: Components) -> None:
    """Both flusher threads stuck (a slow disk): the gated high watermark cannot move, so a
    parked acks=-1 produce answers REQUEST_TIMED_OUT at its timeout, not before."""
    parts.topics.create_topic(TOPIC, 1, {"flush.messages": "1"})
    rm = parts.replica_manager
    partition = rm.partitions[TP]
    gate = threading.Event()
    executor = rm._flush_executor
    stuck = [asyncio.wrap_future(executor.submit(gate.wait))
             for _ in range(executor._max_workers)]
    try:
        answer = produce(parts, [b"a", b"b"], acks=-1, timeout_ms=1000)
        assert not isinstance(answer, dict)
        fut = asyncio.ensure_future(answer)
        await settle()  # the flush task starts and queues behind the stuck threads
        await parts.advance(999)
        assert not fut.done(), "timed out before timeout_ms"
        await parts.advance(1)
        assert fut.done(), "not answered at timeout_ms"
        result = fut.result()[TP]
        assert result.error == ErrorCode.REQUEST_TIMED_OUT
        assert partition.high_watermark == 0
    finally:
        gate.set()
        await asyncio.gather(*stuck)
    await rm.flush_all()  # the fsync, late, still moves the high watermark
    assert partition.high_watermark == 2
    late = produce(parts, [b"c"], acks=-1, timeout_ms=1000)
    assert (await wait(asyncio.ensure_future(late), "produce after the disk recovered")
            )[TP].error == ErrorCode.NONE


# -- fetch: the long poll ----------------------------------------------------------------------

async def test_parked_fetch_completes_when_appends_reach_min_bytes(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    one_batch = len(record_batch([b"first"]))
    parked = fetch(parts, 0, min_bytes=one_batch + 1, max_wait_ms=5000)
    assert not isinstance(parked, list), "an empty partition answered a min_bytes fetch"
    fut = asyncio.ensure_future(parked)
    produce(parts, [b"first"])
    await settle()
    assert not fut.done(), "completed below min_bytes"
    produce(parts, [b"second"])
    await settle()
    assert fut.done(), "min_bytes readable, the fetch still waits"
    [result] = fut.result()
    assert (result.error, result.high_watermark) == (ErrorCode.NONE, 2)
    assert fetched_values(result.records) == [(0, b"first"), (1, b"second")]
    assert parts.clock.time() == 0  # completed by the appends, not by time


async def test_parked_fetch_expires_empty_at_max_wait(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    produce(parts, [b"old"])
    parked = fetch(parts, 1, min_bytes=1, max_wait_ms=500)
    assert not isinstance(parked, list)
    fut = asyncio.ensure_future(parked)
    await parts.advance(499)
    assert not fut.done(), "expired before max_wait_ms"
    await parts.advance(1)
    assert fut.done(), "not answered at max_wait_ms"
    assert fut.result() == [FetchResult(ErrorCode.NONE, b"", 1, 0, 1)]


async def test_retention_past_a_parked_fetch_answers_offset_out_of_range(
        parts: Components) -> None:
    """A fetch parked at an offset that retention then deletes must not wait out its max_wait:
    the offset will never be readable again."""
    parts.topics.create_topic(TOPIC, 1, {"retention.ms": "60000"})
    assert parts.wall_ms() - BASE_TS > 60_000  # retention compares the wall clock with the records'
    produce(parts, [b"a", b"b", b"c"])
    parked = fetch(parts, 0, min_bytes=MAX_BYTES, max_wait_ms=30_000)  # data, below min_bytes
    assert not isinstance(parked, list)
    fut = asyncio.ensure_future(parked)
    await settle()
    assert not fut.done()
    parts.replica_manager.apply_retention()
    await settle()
    assert fut.done(), "retention moved the log start past the fetch; it still waits"
    [result] = fut.result()
    assert result.error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (result.log_start_offset, result.high_watermark) == (3, 3)


async def test_a_parked_answer_that_fails_to_compute_carries_the_exception(
        parts: Components) -> None:
    """The DelayedResult bridge: the log read at completion raises (the log was closed under
    the parked fetch), and the awaitable fails with it instead of never resolving."""
    parts.topics.create_topic(TOPIC, 1, {})
    produce(parts, [b"a"])
    parked = fetch(parts, 0, min_bytes=MAX_BYTES, max_wait_ms=1000)
    assert not isinstance(parked, list)
    fut = asyncio.ensure_future(parked)
    parts.replica_manager.partitions[TP].log.close()
    await parts.advance(1000)
    assert fut.done(), "a failing completion left the request hanging"
    assert isinstance(fut.exception(), Exception)


async def test_negative_partition_max_bytes_answers_that_partition_with_an_error(
        parts: Components) -> None:
    """A fuzzed Fetch once raised inside the segment read; Kafka answers the partition with
    UNKNOWN_SERVER_ERROR (LocalLog.read refuses a negative size) and the request goes on."""
    parts.topics.create_topic("neg", 1, {})
    [result] = parts.replica_manager.read_from_log(
        [PartitionFetch(("neg", 0), 0, -2)], max_bytes=1 << 20)
    assert result.error == ErrorCode.UNKNOWN_SERVER_ERROR
