"""A partition this broker follows (Kafka's makeFollower): not served to clients, parked
requests answered at once, the high watermark the leader's capped by the own log end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.log.config import LogConfig
from broker.log.log import Log
from broker.replica.replica_manager import PartitionFetch
from protocol.errors import ErrorCode
from tests.support.components import Components, build
from tests.support.log_batches import T0, plain
from tests.support.requests import record_batch

TOPIC = "followed"
TP = (TOPIC, 0)
MAX_BYTES = 1 << 20


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    yield c
    await c.close()


def leader_log(tmp_path: Path, batches: int) -> Log:
    log = Log(tmp_path / "leader" / f"{TOPIC}-0", LogConfig(), TOPIC, 0)
    for _ in range(batches):
        log.append(plain(2), T0, leader_epoch=3)
    return log


async def test_becoming_follower_answers_parked_requests_and_refuses_clients(
        parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    rm.broker_id = 0
    rm.make_leader(TP, 1, replicas=[0, 1], isr=[0, 1], partition_epoch=0)
    parked = rm.append_records([(TP, record_batch([b"a"]))], 9, -1, 30_000)
    assert not parked.done()
    consumer = rm.fetch_messages([PartitionFetch(TP, 1, MAX_BYTES)], MAX_BYTES, 1, 30_000)
    assert not consumer.done()
    assert rm.make_follower(TP, 1, 2, [0, 1], [0, 1], 1)
    assert parked.done() and parked.result()[TP].error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert consumer.done()
    assert consumer.result()[0].error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert TP not in rm.partitions and TP in rm.follower_partitions
    produced = rm.append_records([(TP, record_batch([b"b"]))], 9, 1, 0)
    assert produced.result()[TP].error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    fetch = rm.fetch_messages([PartitionFetch(TP, 0, MAX_BYTES)], MAX_BYTES, 0, 0)
    assert fetch.result()[0].error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    # the same state again changes nothing; an older epoch is ignored
    assert not rm.make_follower(TP, 1, 2, [0, 1], [0, 1], 1)
    assert not rm.make_follower(TP, 0, 1, [0, 1], [0, 1], 1)
    assert rm.follower_partitions[TP].leader_id == 1


async def test_follower_high_watermark_and_log_start(parts: Components,
                                                     tmp_path: Path) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    rm.broker_id = 0
    rm.make_follower(TP, 1, 3, [0, 1], [0, 1], 0, partition=rm.partitions[TP])
    p = rm.follower_partitions[TP]
    leader = leader_log(tmp_path, 5)
    assert p.append_as_follower(bytes(leader.read(0, MAX_BYTES, None, True)), T0) is not None
    assert p.log_end_offset == 10
    assert p.update_follower_high_watermark(25)  # the leader's, capped by the own end
    assert p.high_watermark == 10
    assert not p.update_follower_high_watermark(4)  # never back
    assert p.follow_log_start_offset(6)
    assert p.log_start_offset == 6
    assert p.truncate_to(8)
    assert (p.log_end_offset, p.high_watermark) == (8, 8)
    p.truncate_fully_and_start_at(40)
    assert (p.log_start_offset, p.log_end_offset, p.high_watermark) == (40, 40, 40)


async def test_a_follower_left_alone_as_leader_commits_its_whole_log(
        parts: Components, tmp_path: Path) -> None:
    """A sole replica that followed until now (its high watermark below its end, as after a
    restart from the checkpoint) leads with an ISR of one: all it holds is committed."""
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    rm.broker_id = 0
    rm.make_follower(TP, 1, 3, [0, 1], [0, 1], 0, partition=rm.partitions[TP])
    p = rm.follower_partitions[TP]
    leader = leader_log(tmp_path, 5)
    assert p.append_as_follower(bytes(leader.read(0, MAX_BYTES, None, True)), T0) is not None
    assert p.update_follower_high_watermark(4)
    assert (p.log_end_offset, p.high_watermark) == (10, 4)
    taken = rm.remove_follower_partition(TP)
    assert taken is p
    rm.add_partition(p)
    rm.make_leader(TP, 4, replicas=[0], isr=[0], partition_epoch=1)
    assert p.high_watermark == 10
    fetch = rm.fetch_messages([PartitionFetch(TP, 0, MAX_BYTES)], MAX_BYTES, 0, 0)
    assert fetch.result()[0].error == ErrorCode.NONE
    assert fetch.result()[0].high_watermark == 10


@pytest.mark.parametrize("configs", [{}, {"flush.messages": "1"}], ids=["unflushed", "fsynced"])
async def test_a_follower_made_leader_counts_what_it_holds(
        parts: Components, tmp_path: Path, configs: dict[str, str]) -> None:
    """A follower made leader with followers: what it appended as follower counts as its own
    end at once, so a follower fetching at that end moves the high watermark there without
    any new append (a producer retrying only batches the log holds gets them answered)."""
    parts.topics.create_topic(TOPIC, 1, configs)
    rm = parts.replica_manager
    rm.broker_id = 0
    rm.make_follower(TP, 1, 3, [0, 1, 2], [0, 1, 2], 0, partition=rm.partitions[TP])
    p = rm.follower_partitions[TP]
    leader = leader_log(tmp_path, 5)
    info = p.append_as_follower(bytes(leader.read(0, MAX_BYTES, None, True)), T0)
    rm.follower_appended(p, info)
    assert p.update_follower_high_watermark(4)
    for _ in range(200):  # the flush policy (or the dir's writer) makes it durable
        if p.log.recovery_point == 10:
            break
        await asyncio.sleep(0.01)
    rm.remove_follower_partition(TP)
    rm.add_partition(p)
    rm.make_leader(TP, 4, replicas=[0, 2], isr=[0, 2], partition_epoch=1)
    assert p.high_watermark == 4
    follower = p.follower(2)
    assert follower is not None
    assert p.update_follower_fetch_state(follower, 10, 0, p.log_end_offset, -1)
    assert p.high_watermark == 10
