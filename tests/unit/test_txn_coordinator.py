"""The transaction coordinator on a manual clock: Kafka's state machine, step by step.

Each step checks the transactional id's state and the record it wrote to `__transaction_state`
(Kafka's TransactionLogValue v0 layout), as Kafka's TransactionCoordinator, TransactionMetadata
and TransactionStateManager define them: InitProducerId bumps the epoch and fences an older
instance (aborting its open transaction, CONCURRENT_TRANSACTIONS meanwhile), a write in flight
makes every other request CONCURRENT_TRANSACTIONS, EndTxn answers once Prepare* is durable and
writes Complete* after the markers, a transaction is aborted at exactly start + its timeout, and
a restart rebuilds every id from the log and finishes a PrepareCommit.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.coordinator.records import read_records
from broker.replica.delayed_result import Completion
from broker.txn.state_log import (
    TOPIC,
    key_bytes,
    partition_for,
    read_key,
    read_value,
    value_bytes,
)
from broker.txn.transaction_metadata import (
    IllegalTransitionError,
    TransactionMetadata,
    TransactionState,
)
from protocol.errors import ErrorCode
from protocol.record_batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    BatchHeader,
    read_end_txn_marker,
)
from tests.support.components import Components, build, settle

S = TransactionState
E = ErrorCode
TID = "txn-a"
DATA = "orders"
TIMEOUT_MS = 60_000
OVERRIDES = {"offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "3",
             "transaction.max.timeout.ms": "900000"}


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic(DATA, 2, {})
    yield c
    await c.close()


async def result(value: Completion[Any]) -> Any:
    """An answer now, or the Completion's once the loop has run the callbacks of committed
    writes."""
    if not value.done():
        await settle()
        assert value.done(), "still waiting"
    return value.result()


def now(value: Completion[Any]) -> Any:
    """An answer known at once."""
    assert value.done(), "waiting"
    return value.result()


def state_records(c: Components, tid: str = TID) -> list[TransactionMetadata | None]:
    """Every record of ``tid`` in its `__transaction_state` partition, decoded, oldest first."""
    partition = c.replica_manager.partitions[(TOPIC, c.transactions.partition_for(tid))]
    return [read_value(tid, v) for k, v in read_records(partition, partition.log_end_offset)
            if k is not None and read_key(k) == tid]


def summary(md: TransactionMetadata | None) -> tuple | None:
    if md is None:
        return None
    return (md.state.kafka_name, md.producer_id, md.producer_epoch, md.txn_timeout_ms,
            sorted(md.topic_partitions), md.txn_start_timestamp)


def markers(c: Components, tp: tuple[str, int]) -> list[tuple[int, int, int]]:
    """(producer id, control type, coordinator epoch) of each marker in a data partition."""
    p = c.replica_manager.partitions[tp]
    data = bytes(p.log.read(0, 1 << 20, p.log_end_offset, True))
    found = []
    pos = 0
    while pos < len(data):
        header = BatchHeader(data, pos)
        if header.is_control:
            found.append((header.producer_id, *read_end_txn_marker(data, pos)))
        pos += header.size_in_bytes
    return found


async def init(c: Components, tid: str = TID, timeout_ms: int = TIMEOUT_MS,
               expected: tuple[int, int] | None = None) -> tuple[ErrorCode, int, int]:
    r = await result(c.transactions.init_producer_id(tid, timeout_ms, expected))
    return r.error, r.producer_id, r.producer_epoch


async def add(c: Components, pid: int, epoch: int, *tps: tuple[str, int],
              tid: str = TID) -> ErrorCode:
    return await result(c.transactions.add_partitions(tid, pid, epoch, tps))


async def end(c: Components, pid: int, epoch: int, commit: bool, tid: str = TID) -> ErrorCode:
    return await result(c.transactions.end_txn(tid, pid, epoch, commit))


def md(c: Components, tid: str = TID) -> TransactionMetadata:
    return c.transactions.transactions[tid]


# -- the log's layout -----------------------------------------------------------------------------

def test_partition_for_is_kafkas_abs_of_string_hashcode() -> None:
    """Utils.abs(String.hashCode) % partitions: a negative hash is negated, MIN_VALUE is 0."""
    assert partition_for("", 50) == 0
    assert partition_for("a", 50) == 97 % 50
    assert partition_for("my-transactional-id", 50) == 959806496 % 50  # hash -959806496
    assert partition_for("polygenelubricants", 50) == 0  # hash Integer.MIN_VALUE


def test_key_and_value_use_kafkas_v0_layout() -> None:
    assert key_bytes("tx") == b"\x00\x00\x00\x02tx"
    m = TransactionMetadata("tx", 7, 3, 1000, S.EMPTY, 0, topic_partitions=set())
    transit = m.prepare_add_partitions({("t", 1), ("t", 0), ("u", 5)}, 123)
    raw = value_bytes(transit)
    expected = (struct.pack(">hqhib", 0, 7, 3, 1000, 1) + struct.pack(">i", 2)
                + b"\x00\x01t" + struct.pack(">iii", 2, 0, 1)
                + b"\x00\x01u" + struct.pack(">ii", 1, 5) + struct.pack(">qq", 123, 123))
    assert raw == expected
    back = read_value("tx", raw)
    assert summary(back) == ("Ongoing", 7, 3, 1000, [("t", 0), ("t", 1), ("u", 5)], 123)
    empty = TransactionMetadata("tx", 7, -1, 1000, S.EMPTY, 0).prepare_increment_producer_epoch(
        1000, None, 5)
    assert value_bytes(empty)[17:21] == b"\xff\xff\xff\xff"  # Empty: a null partition list


def test_transitions_follow_kafkas_valid_previous_states() -> None:
    m = TransactionMetadata("tx", 1, 0, 1000, S.EMPTY, 0)
    with pytest.raises(IllegalTransitionError):
        m.prepare_abort_or_commit(S.PREPARE_COMMIT, 1)  # Empty -> PrepareCommit
    t = m.prepare_add_partitions({("t", 0)}, 1)
    with pytest.raises(IllegalTransitionError):
        m.prepare_add_partitions({("t", 1)}, 2)  # one pending transition at a time
    m.complete_transition(t)
    assert (m.state, m.pending_state, m.txn_start_timestamp) == (S.ONGOING, None, 1)
    with pytest.raises(IllegalTransitionError):
        m.prepare_dead()  # an open transaction never expires


# -- InitProducerId -------------------------------------------------------------------------------

async def test_init_creates_the_topic_and_writes_empty_at_epoch_0(parts: Components) -> None:
    assert TOPIC not in parts.topics.metadata.topics  # created on first need, as Kafka does
    error, pid, epoch = await init(parts)
    assert (error, epoch) == (E.NONE, 0)
    assert parts.topics.metadata.topics[TOPIC].partitions == 3
    assert parts.topics.metadata.topics[TOPIC].configs["cleanup.policy"] == "compact"
    assert summary(md(parts)) == ("Empty", pid, 0, TIMEOUT_MS, [], -1)
    assert [summary(r) for r in state_records(parts)] == [("Empty", pid, 0, TIMEOUT_MS, [], -1)]
    # again: the epoch is bumped (the older instance is fenced), the producer id kept
    assert await init(parts) == (E.NONE, pid, 1)
    assert [summary(r)[2] for r in state_records(parts)] == [0, 1]  # type: ignore[index]


async def test_init_refuses_bad_ids_and_timeouts(parts: Components) -> None:
    assert (await init(parts, tid=""))[0] == E.INVALID_REQUEST
    assert (await init(parts, timeout_ms=0))[0] == E.INVALID_TRANSACTION_TIMEOUT
    assert (await init(parts, timeout_ms=900_001))[0] == E.INVALID_TRANSACTION_TIMEOUT
    assert (await init(parts, timeout_ms=900_000))[0] == E.NONE


async def test_concurrent_transactions_while_a_write_is_in_flight(parts: Components) -> None:
    _, pid, epoch = await init(parts)
    pending = parts.transactions.add_partitions(TID, pid, epoch, [(DATA, 0)])
    assert isinstance(pending, Completion) and not pending.done()
    assert md(parts).pending_state == S.ONGOING and md(parts).state == S.EMPTY
    assert now(parts.transactions.add_partitions(TID, pid, epoch, [(DATA, 1)])) == \
        E.CONCURRENT_TRANSACTIONS
    assert (await init(parts))[0] == E.CONCURRENT_TRANSACTIONS
    assert now(parts.transactions.end_txn(TID, pid, epoch, True)) == E.CONCURRENT_TRANSACTIONS
    assert await result(pending) == E.NONE
    assert md(parts).state == S.ONGOING and md(parts).pending_state is None


async def test_kip_360_bump_with_the_producer_id_and_epoch_given(parts: Components) -> None:
    _, pid, _ = await init(parts)
    assert await init(parts, expected=(pid, 0)) == (E.NONE, pid, 1)
    assert md(parts).last_producer_epoch == 0
    # a retry of that bump (its answer was lost) gets the same epoch back
    assert await init(parts, expected=(pid, 0)) == (E.NONE, pid, 1)
    # a fenced instance presenting an old epoch is refused
    await init(parts)  # epoch 2, last epoch -1
    assert (await init(parts, expected=(pid, 0)))[0] == E.PRODUCER_FENCED
    assert (await init(parts, expected=(pid + 100, 2)))[0] == E.PRODUCER_FENCED


async def test_an_exhausted_epoch_gets_a_new_producer_id(parts: Components) -> None:
    _, pid, _ = await init(parts)
    md(parts).producer_epoch = 32766  # Short.MaxValue - 1: exhausted
    error, new_pid, epoch = await init(parts)
    assert (error, epoch) == (E.NONE, 0) and new_pid != pid
    assert md(parts).previous_producer_id == pid
    assert summary(state_records(parts)[-1])[:3] == ("Empty", new_pid, 0)  # type: ignore[index]


async def test_init_fences_and_aborts_the_previous_instances_transaction(
        parts: Components) -> None:
    _, pid, _ = await init(parts)
    assert await add(parts, pid, 0, (DATA, 0)) == E.NONE
    # a new instance: the open transaction is aborted first, at a fenced epoch
    assert (await init(parts))[0] == E.CONCURRENT_TRANSACTIONS
    await settle()
    assert summary(md(parts)) == ("CompleteAbort", pid, 1, TIMEOUT_MS, [],
                                  md(parts).txn_start_timestamp)
    assert [summary(r)[0] for r in state_records(parts)] == [  # type: ignore[index]
        "Empty", "Ongoing", "PrepareAbort", "CompleteAbort"]
    assert state_records(parts)[2].producer_epoch == 1  # type: ignore[union-attr]
    assert markers(parts, (DATA, 0)) == [(pid, CONTROL_ABORT, 0)]
    # the old instance is fenced; the new one retries and gets epoch 2
    assert await add(parts, pid, 0, (DATA, 1)) == E.PRODUCER_FENCED
    assert await end(parts, pid, 0, True) == E.PRODUCER_FENCED
    assert await init(parts) == (E.NONE, pid, 2)


# -- a transaction, start to end ------------------------------------------------------------------

async def test_commit_writes_prepare_markers_then_complete(parts: Components) -> None:
    completed: list[tuple[int, list[int], bool]] = []
    parts.transactions._on_offsets_markers = lambda p, ps, c: completed.append((p, ps, c))
    _, pid, epoch = await init(parts)
    start = parts.wall_ms()
    assert await add(parts, pid, epoch, (DATA, 0), (DATA, 1)) == E.NONE
    assert await add(parts, pid, epoch, (DATA, 0)) == E.NONE  # already in: answered at once
    assert await result(parts.transactions.add_offsets(TID, pid, epoch, "group")) == E.NONE
    offsets_tp = ("__consumer_offsets", parts.offsets_store.partition_for("group"))
    assert summary(md(parts)) == ("Ongoing", pid, 0, TIMEOUT_MS,
                                  sorted([(DATA, 0), (DATA, 1), offsets_tp]), start)
    assert parts.transactions.verify_partition(TID, pid, epoch, (DATA, 1)) == E.NONE
    fut = parts.transactions.end_txn(TID, pid, epoch, True)
    assert isinstance(fut, Completion)
    assert await result(fut) == E.NONE
    await settle()
    assert md(parts).state == S.COMPLETE_COMMIT and not md(parts).topic_partitions
    assert [summary(r)[0] for r in state_records(parts)] == [  # type: ignore[index]
        "Empty", "Ongoing", "Ongoing", "PrepareCommit", "CompleteCommit"]
    prepare = state_records(parts)[3]
    assert sorted(prepare.topic_partitions) == sorted([(DATA, 0), (DATA, 1), offsets_tp])  # type: ignore[union-attr]
    for tp in [(DATA, 0), (DATA, 1), offsets_tp]:
        assert markers(parts, tp) == [(pid, CONTROL_COMMIT, 0)]
    assert parts.replica_manager.markers_written == 3
    assert completed == [(pid, [offsets_tp[1]], True)]
    # a retried commit is answered as done; an abort now is not valid
    assert await end(parts, pid, epoch, True) == E.NONE
    assert await end(parts, pid, epoch, False) == E.INVALID_TXN_STATE
    # the next transaction starts from CompleteCommit
    assert await add(parts, pid, epoch, (DATA, 1)) == E.NONE
    assert md(parts).state == S.ONGOING


async def test_end_txn_errors(parts: Components) -> None:
    _, pid, epoch = await init(parts)
    assert await end(parts, pid, epoch, True) == E.INVALID_TXN_STATE  # Empty
    assert await end(parts, pid + 1, epoch, True) == E.INVALID_PRODUCER_ID_MAPPING
    assert await end(parts, pid, epoch, True, tid="unknown") == E.INVALID_PRODUCER_ID_MAPPING
    assert await end(parts, pid, epoch, True, tid="") == E.INVALID_REQUEST
    await add(parts, pid, epoch, (DATA, 0))
    assert await end(parts, pid, epoch + 1, True) == E.PRODUCER_FENCED
    fut = parts.transactions.end_txn(TID, pid, epoch, False)
    # while PrepareAbort is written, and while its markers are: a retry waits
    assert now(parts.transactions.end_txn(TID, pid, epoch, False)) == E.CONCURRENT_TRANSACTIONS
    assert await result(fut) == E.NONE
    await settle()
    assert md(parts).state == S.COMPLETE_ABORT


async def test_verify_partition_is_kip_890s_check(parts: Components) -> None:
    tx = parts.transactions
    assert tx.verify_partition(TID, 1, 0, (DATA, 0)) == E.INVALID_PRODUCER_ID_MAPPING
    _, pid, epoch = await init(parts)
    assert tx.verify_partition(TID, pid, epoch, (DATA, 0)) == E.TRANSACTION_ABORTABLE
    await add(parts, pid, epoch, (DATA, 0))
    assert tx.verify_partition(TID, pid, epoch, (DATA, 0)) == E.NONE
    assert tx.verify_partition(TID, pid, epoch, (DATA, 1)) == E.TRANSACTION_ABORTABLE
    assert tx.verify_partition(TID, pid, epoch + 1, (DATA, 0)) == E.PRODUCER_FENCED
    assert tx.verify_partition(TID, pid + 1, epoch, (DATA, 0)) == E.INVALID_PRODUCER_ID_MAPPING
    assert tx.verify_partition("", pid, epoch, (DATA, 0)) == E.INVALID_REQUEST


async def test_a_deleted_topics_partition_is_dropped_from_the_transaction(
        parts: Components) -> None:
    parts.topics.create_topic("doomed", 1, {})
    _, pid, epoch = await init(parts)
    await add(parts, pid, epoch, (DATA, 0), ("doomed", 0))
    parts.topics.delete_topic("doomed")
    assert await end(parts, pid, epoch, True) == E.NONE
    await settle()
    assert md(parts).state == S.COMPLETE_COMMIT
    assert markers(parts, (DATA, 0)) == [(pid, CONTROL_COMMIT, 0)]


async def test_a_retriable_marker_error_is_retried_after_the_backoff(parts: Components) -> None:
    rm = parts.replica_manager
    real = rm.write_txn_markers
    calls: list[list[tuple[str, int]]] = []

    def flaky(pid: int, epoch: int, coord: int, commit: bool, tps: list, timeout: int):  # type: ignore[no-untyped-def]
        """The first write reaches (DATA, 0) only; (DATA, 1) answers NOT_ENOUGH_REPLICAS."""
        calls.append(list(tps))
        if len(calls) > 1:
            return real(pid, epoch, coord, commit, tps, timeout)
        real(pid, epoch, coord, commit, [(DATA, 0)], timeout)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result({(DATA, 0): E.NONE, (DATA, 1): E.NOT_ENOUGH_REPLICAS})
        return fut

    rm.write_txn_markers = flaky  # type: ignore[method-assign]
    _, pid, epoch = await init(parts)
    await add(parts, pid, epoch, (DATA, 0), (DATA, 1))
    assert await end(parts, pid, epoch, True) == E.NONE
    await settle()
    assert calls == [[(DATA, 0), (DATA, 1)]]
    assert md(parts).state == S.PREPARE_COMMIT and md(parts).topic_partitions == {(DATA, 1)}
    await parts.advance(99)
    assert len(calls) == 1
    await parts.advance(1)
    assert calls[1] == [(DATA, 1)]
    await settle()
    assert md(parts).state == S.COMPLETE_COMMIT


# -- deadlines ------------------------------------------------------------------------------------

async def test_a_transaction_is_aborted_at_exactly_its_timeout(parts: Components) -> None:
    timeout = 10_000
    _, pid, epoch = await init(parts, timeout_ms=timeout)
    await parts.advance(500)
    assert await add(parts, pid, epoch, (DATA, 0)) == E.NONE
    await parts.advance(2000)
    assert await add(parts, pid, epoch, (DATA, 1)) == E.NONE  # does not move the start
    await parts.advance(timeout - 2000 - 1)
    assert md(parts).state == S.ONGOING, "aborted before start + transaction.timeout.ms"
    await parts.advance(1)
    await settle()
    assert summary(md(parts))[:3] == ("CompleteAbort", pid, 1)  # type: ignore[index]
    assert parts.transactions.timed_out == 1
    assert [summary(r)[:3] for r in state_records(parts)][-2:] == [  # type: ignore[index]
        ("PrepareAbort", pid, 1), ("CompleteAbort", pid, 1)]
    assert markers(parts, (DATA, 0)) == [(pid, CONTROL_ABORT, 0)]
    # the producer is fenced
    assert await end(parts, pid, epoch, True) == E.PRODUCER_FENCED


async def test_a_transaction_ended_in_time_is_not_aborted(parts: Components) -> None:
    _, pid, epoch = await init(parts, timeout_ms=1000)
    await add(parts, pid, epoch, (DATA, 0))
    await parts.advance(999)
    assert await end(parts, pid, epoch, True) == E.NONE
    await parts.advance(5000)
    assert md(parts).state == S.COMPLETE_COMMIT and parts.transactions.timed_out == 0


async def test_an_idle_transactional_id_expires(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {**OVERRIDES, "transactional.id.expiration.ms": "5000"})
    try:
        _, pid, epoch = await init(c)
        await c.advance(4999)
        assert TID in c.transactions.transactions
        await c.advance(1)
        await settle()
        assert TID not in c.transactions.transactions and c.transactions.expired_ids == 1
        assert state_records(c)[-1] is None  # the tombstone
        assert (await init(c))[0] == E.NONE  # a new producer id, epoch 0
        assert md(c).producer_id != pid
    finally:
        await c.close()


# -- restart --------------------------------------------------------------------------------------

async def test_restart_rebuilds_ids_and_completes_a_prepare_commit(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = build(logs, OVERRIDES)
    first.topics.create_topic(DATA, 2, {})
    _, pid, epoch = await init(first)
    _, pid_b, _ = await init(first, tid="txn-b", timeout_ms=30_000)
    await add(first, pid_b, 0, (DATA, 1), tid="txn-b")
    await add(first, pid, epoch, (DATA, 0))
    # PrepareCommit is durable, but the markers never get written before the crash
    first.replica_manager.write_txn_markers = (  # type: ignore[method-assign]
        lambda *a: asyncio.get_running_loop().create_future())
    assert await end(first, pid, epoch, True) == E.NONE
    assert md(first).state == S.PREPARE_COMMIT
    await first.close()

    second = build(logs, OVERRIDES)
    try:
        await settle()
        tx = second.transactions
        assert summary(tx.transactions[TID])[:3] == ("CompleteCommit", pid, 0)  # type: ignore[index]
        assert markers(second, (DATA, 0)) == [(pid, CONTROL_COMMIT, 0)]
        assert [summary(r)[0] for r in state_records(second)][-2:] == [  # type: ignore[index]
            "PrepareCommit", "CompleteCommit"]
        b = tx.transactions["txn-b"]
        assert (b.state, b.producer_id, b.topic_partitions) == (S.ONGOING, pid_b, {(DATA, 1)})
        # the loaded Ongoing transaction keeps its deadline: start + 30 s
        await second.advance(30_000 - (second.wall_ms() - b.txn_start_timestamp) - 1)
        assert b.state == S.ONGOING
        await second.advance(1)
        await settle()
        assert b.state == S.COMPLETE_ABORT and b.producer_epoch == 1
    finally:
        await second.close()


# -- DescribeTransactions, ListTransactions -------------------------------------------------------

async def test_describe_and_list(parts: Components) -> None:
    tx = parts.transactions
    _, pid, epoch = await init(parts)
    _, pid_b, _ = await init(parts, tid="txn-b")
    await add(parts, pid, epoch, (DATA, 1), (DATA, 0))
    start = md(parts).txn_start_timestamp
    d = tx.describe(TID)
    assert (d.error, d.state, d.timeout_ms, d.start_time_ms, d.producer_id, d.producer_epoch,
            d.partitions) == (E.NONE, "Ongoing", TIMEOUT_MS, start, pid, 0,
                              [(DATA, 0), (DATA, 1)])
    assert tx.describe("nope").error == E.TRANSACTIONAL_ID_NOT_FOUND
    assert tx.describe("").error == E.INVALID_REQUEST
    listed = tx.list_transactions()
    assert sorted((t.transactional_id, t.producer_id, t.state) for t in listed.transactions) == [
        (TID, pid, "Ongoing"), ("txn-b", pid_b, "Empty")]
    only = tx.list_transactions(states=["Ongoing", "Bogus"])
    assert [t.transactional_id for t in only.transactions] == [TID]
    assert only.unknown_state_filters == ["Bogus"]
    assert [t.transactional_id for t in tx.list_transactions(producer_ids=[pid_b]).transactions
            ] == ["txn-b"]
    await parts.advance(1000)
    # running longer than 1000 ms: not yet (1000 is not longer); Empty has no start, so listed
    assert sorted(t.transactional_id for t in tx.list_transactions(duration_ms=1000).transactions
                  ) == ["txn-b"]
    assert sorted(t.transactional_id for t in tx.list_transactions(duration_ms=999).transactions
                  ) == [TID, "txn-b"]
