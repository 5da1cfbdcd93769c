"""The leader's side of replication on a manual clock: a test plays the followers by calling
the replica manager's fetch path with a replica id, and the cluster by answering the ISR
changes the leader proposes (an ``IsrWriter`` that records them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.replica.delayed_result import Completion
from broker.replica.replica_manager import (
    FetchResult,
    PartitionFetch,
    ProduceResults,
    ReplicaManager,
)
from broker.replica.replica_state import IsrFenced, LeaderAndIsrState
from protocol.errors import ErrorCode
from tests.support.components import Components, build, settle
from tests.support.requests import fetched_values, record_batch

TOPIC = "replicated"
TP = (TOPIC, 0)
PRODUCE_VERSION = 9
MAX_BYTES = 1 << 20
LEADER = 0
LAG_MS = 10_000


class RecordingIsrWriter:
    """The cluster's side of AlterPartition, answered by the test."""

    def __init__(self) -> None:
        self.proposals: list[tuple[tuple[str, int], LeaderAndIsrState,
                                   Completion[LeaderAndIsrState]]] = []

    def alter_isr(self, tp: tuple[str, int], proposed: LeaderAndIsrState
                  ) -> Completion[LeaderAndIsrState]:
        done: Completion[LeaderAndIsrState] = Completion()
        self.proposals.append((tp, proposed, done))
        return done

    def commit_last(self) -> LeaderAndIsrState:
        _tp, proposed, done = self.proposals[-1]
        committed = LeaderAndIsrState(proposed.leader_epoch, proposed.isr,
                                      proposed.partition_epoch + 1)
        done.set_result(committed)
        return committed


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    yield c
    await c.close()


def lead(rm: ReplicaManager, replicas: list[int], isr: list[int], *, epoch: int = 1,
         partition_epoch: int = 0, min_isr: int = 1) -> RecordingIsrWriter:
    writer = RecordingIsrWriter()
    rm.broker_id = LEADER
    rm.isr_writer = writer
    rm.replica_lag_time_max_ms = LAG_MS
    rm.partitions[TP].min_insync_replicas = min_isr
    rm.make_leader(TP, epoch, replicas=replicas, isr=isr, partition_epoch=partition_epoch)
    return writer


def produce(c: Components, values: list[bytes], *, acks: int = -1, timeout_ms: int = 30_000
            ) -> Completion[ProduceResults]:
    return c.replica_manager.append_records([(TP, record_batch(values))], PRODUCE_VERSION, acks,
                                            timeout_ms)


def replica_fetch(c: Components, replica_id: int, offset: int, *, min_bytes: int = 0,
                  max_wait_ms: int = 0, epoch: int = -1, broker_epoch: int = -1
                  ) -> Completion[list[FetchResult]]:
    return c.replica_manager.fetch_messages(
        [PartitionFetch(TP, offset, MAX_BYTES, epoch, 0)], MAX_BYTES, min_bytes, max_wait_ms,
        replica_id=replica_id, replica_epoch=broker_epoch)


def fetched(answer: Completion[list[FetchResult]]) -> FetchResult:
    assert answer.done(), "the replica fetch was not answered"
    (result,) = answer.result()
    return result


# -- high watermark ------------------------------------------------------------------------------

async def test_high_watermark_is_the_least_log_end_of_the_isr(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1, 2], [0, 1, 2])
    partition = parts.replica_manager.partitions[TP]
    produce(parts, [b"a", b"b", b"c"], acks=1)
    assert (partition.log_end_offset, partition.high_watermark) == (3, 0)
    first = fetched(replica_fetch(parts, 1, 0))
    assert [v for _, v in fetched_values(first.records)] == [b"a", b"b", b"c"], (
        "a follower reads up to the log end, past the high watermark")
    assert first.high_watermark == 0
    fetched(replica_fetch(parts, 1, 3))
    assert partition.high_watermark == 0, "replica 2 of the ISR has fetched nothing yet"
    fetched(replica_fetch(parts, 2, 2))
    assert partition.high_watermark == 2
    fetched(replica_fetch(parts, 2, 3))
    assert partition.high_watermark == 3
    consumer = parts.replica_manager.fetch_messages([PartitionFetch(TP, 0, MAX_BYTES)],
                                                    MAX_BYTES, 0, 0)
    assert len(fetched_values(fetched(consumer).records)) == 3


async def test_acks_all_completes_when_the_followers_fetch_past_it(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1, 2], [0, 1, 2])
    answer = produce(parts, [b"a", b"b"])
    assert not answer.done(), "acks=all answered before any follower had the batch"
    fetched(replica_fetch(parts, 1, 2))
    assert not answer.done(), "answered with one follower of the ISR short"
    fetched(replica_fetch(parts, 2, 2))
    assert answer.done()
    result = answer.result()[TP]
    assert (result.error, result.base_offset, result.last_offset) == (ErrorCode.NONE, 0, 1)


async def test_acks_all_times_out_while_a_follower_lags(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1], [0, 1])
    answer = produce(parts, [b"a"], timeout_ms=1000)
    await parts.advance(999)
    assert not answer.done()
    await parts.advance(1)
    assert answer.done()
    assert answer.result()[TP].error == ErrorCode.REQUEST_TIMED_OUT


async def test_a_parked_replica_fetch_is_completed_by_an_append(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1], [0, 1])
    parked = replica_fetch(parts, 1, 0, min_bytes=1, max_wait_ms=5000)
    assert not parked.done()
    produce(parts, [b"x"], acks=1)
    result = fetched(parked)
    assert result.error == ErrorCode.NONE
    assert fetched_values(result.records) == [(0, b"x")], "the append itself did not wake it"


# -- who may fetch as a replica -----------------------------------------------------------------

async def test_single_node_refuses_replica_fetches_as_from_an_unknown_replica(
        parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    produce(parts, [b"a"], acks=1)
    assert fetched(replica_fetch(parts, 1, 0)).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert fetched(replica_fetch(parts, 1, 0, epoch=0)).error == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert parts.replica_manager.partitions[TP].high_watermark == 1


async def test_replica_fetch_from_a_broker_not_assigned_is_refused(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1], [0, 1])
    assert fetched(replica_fetch(parts, 7, 0)).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert fetched(replica_fetch(parts, 7, 0, epoch=1)).error == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert fetched(replica_fetch(parts, 1, 0, epoch=0)).error == ErrorCode.FENCED_LEADER_EPOCH


async def test_a_stale_broker_epoch_is_fenced(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    lead(rm, [0, 1], [0, 1])
    rm.broker_epoch_of = {1: 40}.get
    produce(parts, [b"a"], acks=1)
    stale = fetched(replica_fetch(parts, 1, 1, broker_epoch=39))
    assert stale.error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert rm.partitions[TP].high_watermark == 0, "a fenced fetch moved the follower's state"
    assert fetched(replica_fetch(parts, 1, 1, broker_epoch=40)).error == ErrorCode.NONE
    assert rm.partitions[TP].high_watermark == 1


# -- min.insync.replicas -------------------------------------------------------------------------

async def test_acks_all_is_refused_before_the_append_under_min_isr(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1, 2], [0, 1], min_isr=3)
    partition = parts.replica_manager.partitions[TP]
    refused = produce(parts, [b"a"])
    assert refused.done()
    assert refused.result()[TP].error == ErrorCode.NOT_ENOUGH_REPLICAS
    assert partition.log_end_offset == 0, "refused but appended"
    produce(parts, [b"b"], acks=1)  # acks=1 is not gated by the min ISR
    fetched(replica_fetch(parts, 1, 1))
    fetched(replica_fetch(parts, 2, 1))
    assert partition.high_watermark == 0, "the high watermark moved while under min ISR"


async def test_min_isr_is_at_most_the_replication_factor(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1], [0, 1], min_isr=3)
    answer = produce(parts, [b"a"])
    fetched(replica_fetch(parts, 1, 1))
    assert answer.done() and answer.result()[TP].error == ErrorCode.NONE


async def test_enough_replicas_after_append_needs_the_min_isr(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1], [0, 1], min_isr=2)
    partition = parts.replica_manager.partitions[TP]
    produce(parts, [b"a"], acks=1)
    assert partition.check_enough_replicas_reach_offset(1) == (False, ErrorCode.NONE)
    fetched(replica_fetch(parts, 1, 1))
    assert partition.check_enough_replicas_reach_offset(1) == (True, ErrorCode.NONE)
    partition.isr = (0,)  # as if committed while the produce waited
    assert partition.check_enough_replicas_reach_offset(1) == (
        True, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)


# -- ISR shrink and expand ------------------------------------------------------------------------

async def test_a_lagging_follower_is_dropped_after_the_lag_time_once_committed(
        parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    writer = lead(parts.replica_manager, [0, 1, 2], [0, 1, 2])
    partition = parts.replica_manager.partitions[TP]
    answer = produce(parts, [b"a"])
    fetched(replica_fetch(parts, 1, 1))  # replica 1 keeps up, replica 2 never fetches
    await parts.advance(LAG_MS)
    assert writer.proposals == [], "shrunk within replica.lag.time.max.ms"
    await parts.advance(LAG_MS // 2)
    assert [(p.isr, p.partition_epoch) for _, p, _ in writer.proposals] == [((0, 1), 0)]
    assert partition.isr == (0, 1, 2) and not answer.done(), (
        "the shrink was applied before the cluster committed it")
    await parts.advance(LAG_MS)
    assert len(writer.proposals) == 1, "proposed again while one was in flight"
    writer.commit_last()
    assert (partition.isr, partition.partition_epoch) == ((0, 1), 1)
    assert partition.high_watermark == 1
    assert answer.done() and answer.result()[TP].error == ErrorCode.NONE


async def test_a_follower_that_catches_up_joins_the_isr(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    writer = lead(parts.replica_manager, [0, 1, 2], [0, 1])
    partition = parts.replica_manager.partitions[TP]
    produce(parts, [b"a", b"b"], acks=1)
    fetched(replica_fetch(parts, 1, 2))
    assert partition.high_watermark == 2, "a follower outside the ISR held the high watermark"
    fetched(replica_fetch(parts, 2, 1))
    assert writer.proposals == [], "joined below the high watermark"
    fetched(replica_fetch(parts, 2, 2))
    assert [p.isr for _, p, _ in writer.proposals] == [(0, 1, 2)]
    assert partition.maximal_isr == (0, 1, 2) and partition.isr == (0, 1)
    produce(parts, [b"c"], acks=1)
    fetched(replica_fetch(parts, 1, 3))
    assert partition.high_watermark == 2, "the replica joining (maximal ISR) was not waited for"
    writer.commit_last()
    assert partition.isr == (0, 1, 2)
    fetched(replica_fetch(parts, 2, 3))
    assert partition.high_watermark == 3


async def test_a_fenced_isr_change_waits_for_the_clusters_state(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    writer = lead(rm, [0, 1], [0])
    partition = rm.partitions[TP]
    fetched(replica_fetch(parts, 1, 0))
    _tp, _proposed, done = writer.proposals[-1]
    done.set_exception(IsrFenced(ErrorCode.FENCED_LEADER_EPOCH, "newer leader epoch"))
    fetched(replica_fetch(parts, 1, 0))
    assert len(writer.proposals) == 1, "proposed again after a fence, before the new state"
    rm.make_leader(TP, 2, replicas=[0, 1], isr=[0], partition_epoch=3)
    assert partition.partition_epoch == 3
    fetched(replica_fetch(parts, 1, 0))
    assert [(p.isr, p.leader_epoch, p.partition_epoch) for _, p, _ in writer.proposals][-1] == (
        (0, 1), 2, 3)


async def test_a_failed_isr_change_is_proposed_again(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    writer = lead(parts.replica_manager, [0, 1], [0])
    fetched(replica_fetch(parts, 1, 0))
    writer.proposals[-1][2].set_exception(ConnectionError("etcd unreachable"))
    fetched(replica_fetch(parts, 1, 0))
    assert len(writer.proposals) == 2


# -- leadership moving away ----------------------------------------------------------------------

async def test_parked_requests_answer_not_leader_when_leadership_moves(
        parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    lead(rm, [0, 1, 2], [0, 1, 2])
    produced = produce(parts, [b"a"])
    consumer = rm.fetch_messages([PartitionFetch(TP, 0, MAX_BYTES)], MAX_BYTES, 1, 5000)
    follower = replica_fetch(parts, 1, 1, min_bytes=1, max_wait_ms=5000)
    assert not (produced.done() or consumer.done() or follower.done())
    rm.remove_partition(TP, not_leader=True)
    await settle()
    assert produced.result()[TP].error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert fetched(consumer).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert fetched(follower).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    again = produce(parts, [b"b"])
    assert again.result()[TP].error == ErrorCode.NOT_LEADER_OR_FOLLOWER


# -- flush.messages=1 with followers ---------------------------------------------------------------

async def test_acks_1_waits_for_the_leaders_fsync_not_for_the_followers(
        parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {"flush.messages": "1"})
    lead(parts.replica_manager, [0, 1], [0, 1])
    partition = parts.replica_manager.partitions[TP]
    answer = produce(parts, [b"a", b"b"], acks=1)
    result = await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(answer)), 10)
    assert result[TP].error == ErrorCode.NONE
    assert partition.log.recovery_point >= 2, "answered before this replica's fsync"
    assert partition.high_watermark == 0, "the follower has fetched nothing"
    fetched(replica_fetch(parts, 1, 2))
    assert partition.high_watermark == 2


async def test_append_ends_held_above_the_high_watermark_are_bounded(
        parts: Components, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.replica.replica_state import LeaderReplication

    monkeypatch.setattr(LeaderReplication, "MAX_ENDS", 4)
    parts.topics.create_topic(TOPIC, 1, {})
    lead(parts.replica_manager, [0, 1], [0, 1])
    partition = parts.replica_manager.partitions[TP]
    for i in range(10):
        produce(parts, [f"v{i}".encode()], acks=1)
    replication = partition.replication
    assert replication is not None and len(replication.ends) == 4
    fetched(replica_fetch(parts, 1, 7))
    assert partition.high_watermark == 7
    assert partition.hw_bytes > 0, "the bytes at the high watermark were lost with the ends"
    fetched(replica_fetch(parts, 1, 10))
    assert (partition.high_watermark, partition.hw_bytes) == (10, partition.appended_bytes)


async def test_only_a_live_broker_on_its_current_epoch_joins_the_isr(
        parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    epochs: dict[int, int] = {1: 40}
    rm.broker_epoch_of = epochs.get
    writer = lead(rm, [0, 1, 2], [0])
    fetched(replica_fetch(parts, 2, 0, broker_epoch=7))
    assert writer.proposals == [], "a broker the cluster does not have as alive joined"
    epochs[1] = 41
    fetched(replica_fetch(parts, 1, 0, broker_epoch=40))
    assert writer.proposals == [], "stale fetch admitted"
    fetched(replica_fetch(parts, 1, 0, broker_epoch=41))
    assert [p.isr for _, p, _ in writer.proposals] == [(0, 1)]
