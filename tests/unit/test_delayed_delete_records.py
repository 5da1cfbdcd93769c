"""DeleteRecords on a partition led with followers, on a manual clock: the answer waits until
every live follower's log start (reported in its fetches) reached the offset, as Kafka's
DelayedDeleteRecords; REQUEST_TIMED_OUT at the timeout; NOT_LEADER_OR_FOLLOWER when the
partition is led elsewhere meanwhile; a follower on a broker that is not alive holds nothing
back. The test plays the followers by calling the replica manager's fetch path with a
replica id, and the DeleteRecords handler is called as the request channel would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kafka.protocol.admin import DeleteRecordsRequest

from broker.apis import delete_records
from broker.replica.delayed_result import Completion
from broker.replica.replica_manager import DeleteRecordsResult, PartitionFetch, ReplicaManager
from protocol.errors import ErrorCode
from tests.support.components import Components, build, parse, wire_roundtrip
from tests.support.requests import record_batch

TOPIC = "trimmed"
TP = (TOPIC, 0)
LEADER, FOLLOWER_A, FOLLOWER_B = 0, 1, 2
TIMEOUT_MS = 30_000


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    c.topics.create_topic(TOPIC, 1, {})
    rm = c.replica_manager
    rm.broker_id = LEADER
    rm.make_leader(TP, 1, replicas=[LEADER, FOLLOWER_A, FOLLOWER_B],
                   isr=[LEADER, FOLLOWER_A, FOLLOWER_B], partition_epoch=0)
    answer = rm.append_records([(TP, record_batch([b"%d" % i for i in range(10)]))], 9, 1, 0)
    assert answer.result()[TP].error == ErrorCode.NONE
    for follower in (FOLLOWER_A, FOLLOWER_B):
        fetch(rm, follower, 10, log_start=0)
    assert rm.partitions[TP].high_watermark == 10
    yield c
    await c.close()


def fetch(rm: ReplicaManager, follower: int, offset: int, log_start: int) -> None:
    """A follower's fetch at ``offset`` reporting its log start offset."""
    answer = rm.fetch_messages([PartitionFetch(TP, offset, 1 << 20, -1, log_start)], 1 << 20,
                               0, 0, replica_id=follower)
    assert answer.result()[0].error == ErrorCode.NONE


def delete(rm: ReplicaManager, offset: int) -> Completion[dict]:
    return rm.delete_records({TP: offset}, TIMEOUT_MS)


def answer(done: Completion[dict]) -> tuple[ErrorCode, int]:
    assert done.done(), "still parked"
    result: DeleteRecordsResult = done.result()[TP]
    return result.error, result.low_watermark


async def test_the_answer_waits_for_every_follower_to_move_its_log_start(
        parts: Components) -> None:
    rm = parts.replica_manager
    done = delete(rm, 4)
    assert not done.done(), "answered before the followers dropped the records"
    assert rm.partitions[TP].log_start_offset == 4, "the leader moves its own start at once"
    fetch(rm, FOLLOWER_A, 10, log_start=4)
    assert not done.done(), "one follower still holds records below 4"
    assert rm.partitions[TP].low_watermark == 0
    fetch(rm, FOLLOWER_B, 10, log_start=4)
    assert answer(done) == (ErrorCode.NONE, 4)


async def test_the_high_watermark_as_the_offset(parts: Components) -> None:
    rm = parts.replica_manager
    done = delete(rm, -1)
    fetch(rm, FOLLOWER_A, 10, log_start=10)
    fetch(rm, FOLLOWER_B, 10, log_start=10)
    assert answer(done) == (ErrorCode.NONE, 10)


async def test_a_follower_that_never_follows_times_the_request_out(parts: Components) -> None:
    rm = parts.replica_manager
    done = delete(rm, 4)
    fetch(rm, FOLLOWER_A, 10, log_start=4)
    await parts.advance(TIMEOUT_MS - 1)
    assert not done.done()
    await parts.advance(1)
    assert answer(done) == (ErrorCode.REQUEST_TIMED_OUT, 0)


async def test_leadership_moving_away_answers_not_leader(parts: Components) -> None:
    rm = parts.replica_manager
    done = delete(rm, 4)
    rm.make_follower(TP, FOLLOWER_A, 2, [LEADER, FOLLOWER_A, FOLLOWER_B],
                     [LEADER, FOLLOWER_A, FOLLOWER_B], 1)
    assert answer(done) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)


async def test_a_follower_on_a_broker_not_alive_holds_nothing_back(parts: Components) -> None:
    rm = parts.replica_manager
    alive = {LEADER: 1, FOLLOWER_A: 1}  # FOLLOWER_B's broker lost its registration
    rm.partitions[TP].replication.broker_epoch_of = alive.get  # type: ignore[union-attr]
    done = delete(rm, 4)
    assert not done.done()
    fetch(rm, FOLLOWER_A, 10, log_start=4)
    assert answer(done) == (ErrorCode.NONE, 4)


async def test_the_handler_answers_when_the_followers_followed(parts: Components) -> None:
    rm = parts.replica_manager
    req = DeleteRecordsRequest[2](timeout_ms=TIMEOUT_MS, topics=[
        DeleteRecordsRequest.DeleteRecordsTopic(name=TOPIC, partitions=[
            DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(
                partition_index=0, offset=6)])])
    parsed = parse(req)
    out = delete_records.handle(parts.context, parsed)
    assert not out.done()
    fetch(rm, FOLLOWER_A, 10, log_start=6)
    fetch(rm, FOLLOWER_B, 10, log_start=6)
    assert out.done()
    resp = wire_roundtrip(parsed, out.result())
    [p] = resp.topics[0].partitions
    assert (p.error_code, p.low_watermark) == (ErrorCode.NONE, 6)
