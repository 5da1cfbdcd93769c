"""The leader's divergence check of a fetch that carries its LastFetchedEpoch (Fetch v12+), as
Kafka's Partition.readRecords: a test plays the follower (and a consumer) through the replica
manager's fetch path, on a log whose epoch cache holds epoch 0 from offset 0 and epoch 2 from
offset 2 (leader epoch 2, log end 5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.replica.delayed_result import Completion
from broker.replica.replica_manager import FetchResult, PartitionFetch, ReplicaManager
from protocol.errors import ErrorCode
from tests.support.components import Components, build
from tests.support.requests import fetched_values, record_batch

TOPIC = "diverging"
TP = (TOPIC, 0)
MAX_BYTES = 1 << 20
LEADER, FOLLOWER = 0, 1


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    yield c
    await c.close()


def _produce(rm: ReplicaManager, values: list[bytes]) -> None:
    rm.append_records([(TP, record_batch(values))], 9, 1, 0)


def _lead(rm: ReplicaManager, epoch: int) -> None:
    rm.broker_id = LEADER
    rm.make_leader(TP, epoch, replicas=[LEADER, FOLLOWER], isr=[LEADER, FOLLOWER],
                   partition_epoch=0)


def _two_epochs(c: Components) -> ReplicaManager:
    """Offsets 0-1 written in epoch 0 (a single broker), 2-4 in epoch 2."""
    c.topics.create_topic(TOPIC, 1, {})
    rm = c.replica_manager
    _produce(rm, [b"a", b"b"])
    _lead(rm, 2)
    _produce(rm, [b"c", b"d", b"e"])
    return rm


def _fetch(rm: ReplicaManager, offset: int, last_fetched_epoch: int, *, replica_id: int = FOLLOWER,
           min_bytes: int = 0, max_wait_ms: int = 0) -> Completion[list[FetchResult]]:
    return rm.fetch_messages(
        [PartitionFetch(TP, offset, MAX_BYTES, 2, 0, last_fetched_epoch)], MAX_BYTES,
        min_bytes, max_wait_ms, replica_id=replica_id)


def _one(answer: Completion[list[FetchResult]]) -> FetchResult:
    assert answer.done(), "not answered at once"
    (result,) = answer.result()
    return result


async def test_a_follower_that_did_not_diverge_reads(parts: Components) -> None:
    rm = _two_epochs(parts)
    at_epoch_end = _one(_fetch(rm, 2, 0))
    assert (at_epoch_end.error, at_epoch_end.diverging_epoch) == (ErrorCode.NONE, None)
    assert [v for _, v in fetched_values(at_epoch_end.records)] == [b"c", b"d", b"e"]
    at_end = _one(_fetch(rm, 5, 2))
    assert (at_end.error, at_end.diverging_epoch, at_end.records) == (ErrorCode.NONE, None, b"")


async def test_a_follower_past_its_epochs_end_is_told_where_it_ends(parts: Components) -> None:
    rm = _two_epochs(parts)
    partition = rm.partitions[TP]
    result = _one(_fetch(rm, 4, 0))
    assert result.error == ErrorCode.NONE
    assert result.diverging_epoch == (0, 2), "epoch 0 ends at offset 2 on the leader"
    assert result.records == b"", "a diverged fetcher was sent records"
    assert result.high_watermark == partition.high_watermark
    follower = partition.follower(FOLLOWER)
    assert follower is not None and follower.log_end_offset == -1, (
        "a diverged fetch moved the follower's state")
    assert _one(_fetch(rm, 6, 2)).diverging_epoch == (2, 5), "past the leader's log end"


async def test_an_epoch_the_leader_never_had_names_the_epoch_before_it(
        parts: Components) -> None:
    rm = _two_epochs(parts)
    result = _one(_fetch(rm, 3, 1))
    assert (result.error, result.diverging_epoch, result.records) == (
        ErrorCode.NONE, (0, 2), b"")


async def test_an_epoch_newer_than_every_known_one_is_out_of_range(parts: Components) -> None:
    rm = _two_epochs(parts)
    result = _one(_fetch(rm, 5, 3))
    assert (result.error, result.diverging_epoch) == (ErrorCode.OFFSET_OUT_OF_RANGE, None)
    assert result.high_watermark == rm.partitions[TP].high_watermark


async def test_an_epoch_older_than_the_earliest_ends_at_the_earliest_start(
        parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    _lead(rm, 2)  # epoch 2 from offset 0: the cache's only entry
    _produce(rm, [b"a", b"b", b"c"])
    assert rm.partitions[TP].log.earliest_epoch_entry() == (2, 0)
    assert _one(_fetch(rm, 0, 1)).diverging_epoch is None, "epoch 1 ends at 0, fetch at 0"
    assert _one(_fetch(rm, 2, 1)).diverging_epoch == (1, 0)


async def test_below_the_log_start_is_out_of_range_even_when_diverged(
        parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    _produce(rm, [b"a", b"b", b"c", b"d"])
    assert rm.delete_records({TP: 3}, 0).result()[TP].error == ErrorCode.NONE
    _lead(rm, 2)
    assert _one(_fetch(rm, 1, 0)).error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert _one(_fetch(rm, 3, 0)).diverging_epoch is None


async def test_a_consumer_with_a_last_fetched_epoch_is_checked_too(parts: Components) -> None:
    rm = _two_epochs(parts)
    consumer = _one(_fetch(rm, 4, 0, replica_id=-1))
    assert (consumer.error, consumer.diverging_epoch, consumer.records) == (
        ErrorCode.NONE, (0, 2), b"")
    without = _one(rm.fetch_messages([PartitionFetch(TP, 4, MAX_BYTES)], MAX_BYTES, 0, 0))
    assert without.diverging_epoch is None, "LastFetchedEpoch -1 is not checked"


async def test_a_diverged_fetch_is_answered_at_once_not_parked(parts: Components) -> None:
    rm = _two_epochs(parts)
    answer = _fetch(rm, 4, 0, min_bytes=1, max_wait_ms=5000)
    assert _one(answer).diverging_epoch == (0, 2)
    parked = _fetch(rm, 5, 2, min_bytes=1, max_wait_ms=5000)
    assert not parked.done(), "a fetch that did not diverge parks as before"
    _produce(rm, [b"f"])
    assert [v for _, v in fetched_values(_one(parked).records)] == [b"f"]
