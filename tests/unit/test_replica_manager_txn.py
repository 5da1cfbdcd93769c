"""The ReplicaManager's side of transactions: markers written with acks=all, the last stable
offset bounding read_committed fetches and ListOffsets, aborted transactions listed with what
was read, a parked read_committed fetch answered when a marker moves the LSO, and Kafka's
verification of a transactional produce (a partition not in the transaction is refused).

Built by tests/support/components.py on a manual clock; the transaction coordinator is stood in
for by the verifier callable the server would wire, so these tests see only the ReplicaManager.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.replica.replica_manager import READ_COMMITTED, PartitionFetch
from protocol.errors import ErrorCode
from tests.support.clients import BASE_TS
from tests.support.components import Components, build, settle
from tests.support.requests import fetched_values, record_batch

TOPIC = "payments"
TP = (TOPIC, 0)
PRODUCE_VERSION = 9
MAX_BYTES = 1 << 20
PID, EPOCH = 4000, 0


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    c.topics.create_topic(TOPIC, 1, {})
    yield c
    await c.close()


def txn_batch(values: list[bytes], seq: int, pid: int = PID, epoch: int = EPOCH) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, True, pid, epoch, seq, 16 << 20)
    for i, value in enumerate(values):
        builder.append(i, BASE_TS + i, None, value, [])
    return bytes(builder.build())


def produce(c: Components, records: bytes, *, txn_id: str | None = None, acks: int = 1,
            version: int = PRODUCE_VERSION):
    answer = c.replica_manager.append_records([(TP, records)], version, acks, 30_000,
                                              transactional_id=txn_id)
    assert answer.done(), "acks=1 on an ungated partition answers at once"
    return answer.result()[TP]


async def marker(c: Components, commit: bool, pid: int = PID, epoch: int = EPOCH
                 ) -> dict[tuple[str, int], ErrorCode]:
    fut = c.replica_manager.write_txn_markers(pid, epoch, 0, commit, [TP], 5000)
    return await asyncio.wait_for(asyncio.ensure_future(fut), 10)


def fetch(c: Components, offset: int, *, committed: bool, min_bytes: int = 1,
          max_wait_ms: int = 0):
    return c.replica_manager.fetch_messages(
        [PartitionFetch(TP, offset, MAX_BYTES)], MAX_BYTES, min_bytes, max_wait_ms,
        isolation_level=READ_COMMITTED if committed else 0)


async def test_read_committed_stops_at_the_open_transaction_and_lists_aborted_ones(
        parts: Components) -> None:
    assert produce(parts, record_batch([b"plain"])).error == ErrorCode.NONE  # offset 0
    assert produce(parts, txn_batch([b"t1", b"t2"], 0)).base_offset == 1      # 1-2, open
    partition = parts.replica_manager.partitions[TP]
    assert (partition.high_watermark, partition.last_stable_offset) == (3, 1)

    [r] = fetch(parts, 0, committed=True).result()
    assert [v for _, v in fetched_values(r.records)] == [b"plain"]
    assert (r.high_watermark, r.last_stable_offset, r.aborted) == (3, 1, [])
    [u] = fetch(parts, 0, committed=False).result()
    assert [v for _, v in fetched_values(u.records)] == [b"plain", b"t1", b"t2"]
    assert u.aborted is None, "read_uncommitted answers a null list, as Kafka does"

    assert await marker(parts, commit=False) == {TP: ErrorCode.NONE}          # ABORT at 3
    assert partition.last_stable_offset == partition.high_watermark == 4
    assert parts.replica_manager.markers_written == 1
    [r] = fetch(parts, 0, committed=True).result()
    assert [(a.producer_id, a.first_offset) for a in r.aborted] == [(PID, 1)]
    # The consumer drops the aborted records itself; a read past them lists nothing.
    [after] = fetch(parts, 4, committed=True).result()
    assert after.records == b"" and after.aborted == []


async def test_a_committed_transaction_lists_no_aborted_transactions(
        parts: Components) -> None:
    produce(parts, txn_batch([b"a"], 0))
    assert await marker(parts, commit=True) == {TP: ErrorCode.NONE}
    [r] = fetch(parts, 0, committed=True).result()
    assert [v for _, v in fetched_values(r.records)] == [b"a"]
    assert r.aborted == [] and r.last_stable_offset == 2


async def test_a_parked_read_committed_fetch_answers_when_the_marker_moves_the_lso(
        parts: Components) -> None:
    produce(parts, txn_batch([b"held"], 0))
    parked = fetch(parts, 0, committed=True, max_wait_ms=5000)
    assert not parked.done(), "nothing is stable yet: the fetch parks"
    produce(parts, txn_batch([b"more"], 1))  # the high watermark moves, the LSO does not
    await settle()
    assert not parked.done(), "data above the LSO must not complete a read_committed fetch"
    await marker(parts, commit=True)
    await settle()
    assert parked.done(), "the COMMIT marker moved the LSO: the fetch answers now"
    [r] = parked.result()
    assert [v for _, v in fetched_values(r.records)] == [b"held", b"more"]


async def test_list_offsets_latest_is_the_lso_for_read_committed(parts: Components) -> None:
    from broker.apis import list_offsets
    from tests.support.components import parse
    from tests.support.requests import list_offsets_request

    produce(parts, record_batch([b"x"]))
    produce(parts, txn_batch([b"y"], 0))
    for isolation, expected in ((0, 2), (1, 1)):
        req = list_offsets_request(TOPIC, -1, version=8)
        req.isolation_level = isolation
        resp = list_offsets.handle(parts.context, parse(req))
        [topic] = resp.topics
        [p] = topic.partitions
        assert (p.error_code, p.offset) == (0, expected), f"isolation {isolation}"


async def test_transactional_produce_to_a_partition_not_in_the_transaction_is_refused(
        parts: Components) -> None:
    asked: list[tuple[str, int, int, tuple[str, int]]] = []
    # What the coordinator answers (Kafka's verify): not in the transaction, fenced, busy.
    answers = {"ok": ErrorCode.NONE, "missing": ErrorCode.TRANSACTION_ABORTABLE,
               "zombie": ErrorCode.PRODUCER_FENCED, "busy": ErrorCode.CONCURRENT_TRANSACTIONS}

    def verify(txn_id: str, pid: int, epoch: int, tp: tuple[str, int]) -> ErrorCode:
        asked.append((txn_id, pid, epoch, tp))
        return answers[txn_id]

    parts.replica_manager.verify_transaction = verify  # stands in for the coordinator
    missing = produce(parts, txn_batch([b"a"], 0), txn_id="missing")  # Produce v9
    assert missing.error == ErrorCode.INVALID_TXN_STATE
    assert missing.message == "Partition was not added to the transaction"
    missing_v11 = produce(parts, txn_batch([b"a"], 0), txn_id="missing", version=11)
    assert missing_v11.error == ErrorCode.TRANSACTION_ABORTABLE, "known to clients from v11"
    zombie = produce(parts, txn_batch([b"a"], 0), txn_id="zombie")
    assert zombie.error == ErrorCode.INVALID_PRODUCER_EPOCH, "what producers expect when fenced"
    busy = produce(parts, txn_batch([b"a"], 0), txn_id="busy")
    assert busy.error == ErrorCode.NOT_ENOUGH_REPLICAS, "retriable for every client version"
    assert parts.replica_manager.partitions[TP].log_end_offset == 0, "nothing appended"
    assert produce(parts, txn_batch([b"a"], 0), txn_id="ok").error == ErrorCode.NONE
    assert len(asked) == 5
    # Its transaction is open in the partition now: the next batch needs no verification.
    assert produce(parts, txn_batch([b"b"], 1), txn_id="ok").error == ErrorCode.NONE
    assert len(asked) == 5
    # A plain (non-transactional) produce is never verified.
    produce(parts, record_batch([b"p"]), txn_id="missing")
    assert len(asked) == 5


async def test_markers_answer_per_partition_and_wait_for_the_fsync_when_gated(
        tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    try:
        c.topics.create_topic(TOPIC, 1, {"flush.messages": "1"})
        res = c.replica_manager.append_records([(TP, txn_batch([b"d"], 0))], PRODUCE_VERSION,
                                               -1, 30_000)
        assert not res.done()
        await asyncio.wait_for(asyncio.ensure_future(res), 10)
        p = c.replica_manager.partitions[TP]
        fut = c.replica_manager.write_txn_markers(PID, EPOCH, 0, True,
                                                  [TP, ("gone", 0)], 5000)
        # Appended, not yet fsynced: the transaction stays unstable until the high watermark
        # passes its marker (Kafka's unreplicated transactions).
        assert (p.log_end_offset, p.high_watermark, p.last_stable_offset) == (2, 1, 0)
        errors = await asyncio.wait_for(asyncio.ensure_future(fut), 10)
        assert errors == {TP: ErrorCode.NONE, ("gone", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
        assert p.high_watermark == 2 and p.log.recovery_point >= 2, "answered once durable"
        assert p.last_stable_offset == 2
    finally:
        await c.close()


async def test_a_marker_from_a_fenced_epoch_is_refused(parts: Components) -> None:
    produce(parts, txn_batch([b"a"], 0, epoch=3))
    errors = await marker(parts, commit=True, epoch=2)
    assert errors == {TP: ErrorCode.INVALID_PRODUCER_EPOCH}
    assert parts.replica_manager.partitions[TP].last_stable_offset == 0, "still open"
