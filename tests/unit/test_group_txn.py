"""Offsets committed inside a transaction (KIP-98, KIP-447), in the classic group coordinator.

Kafka's rules (GroupMetadataManager.storeOffsets with a producer id, GroupMetadata's pending
transactional offsets, handleTxnCompletion, loadGroupsAndOffsets, GroupCoordinator
.handleTxnCommitOffsets, KafkaApis.handleOffsetFetchRequest): a TxnOffsetCommit is written at
once to __consumer_offsets as one transactional batch of the producer, but the group's
committed offsets change only when the transaction's marker is written, and only on COMMIT.
Meanwhile OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT. A restart rebuilds
the same state from the log's batches and markers; an undecided transaction stays pending.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.producer import TxnOffsetCommitRequest
from kafka.record.memory_records import MemoryRecords

from broker.apis import offset_fetch, txn_offset_commit
from broker.group.classic_group import GroupState
from broker.group.offset_cache import OffsetAndMetadata
from broker.group.offsets_store import TOPIC as OFFSETS_TOPIC
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode
from protocol.record_batch import iter_batches
from protocol.registry import APIS
from tests.support.components import Components, build, parse, settle, wire_roundtrip

GROUP = "txn-group"
TOPIC = "orders"
PID, EPOCH = 4000, 0
OVERRIDES = {"offsets.topic.num.partitions": "3"}
TS = 1_700_000_000_000


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic(TOPIC, 3, {})
    yield c
    await c.close()


def test_the_registry_serves_txn_offset_commit_0_to_4() -> None:
    """v5 means transaction version 2 (it implies AddOffsetsToTxn): not served."""
    spec = APIS[TxnOffsetCommitRequest.API_KEY]
    assert (spec.min_version, spec.max_version) == (0, 4)


def om(offset: int, metadata: str = "") -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, -1, metadata, TS)


async def txn_commit(c: Components, offsets: dict[tuple[str, int], OffsetAndMetadata], *,
                     pid: int = PID, epoch: int = EPOCH, group: str = GROUP, member: str = "",
                     instance: str | None = None, generation: int = -1
                     ) -> dict[tuple[str, int], ErrorCode]:
    fut = c.coordinator.commit_transactional_offsets(group, pid, epoch, member, instance,
                                                     generation, offsets)
    await settle()
    assert fut.done(), "a transactional offset commit was not answered once in the log"
    return fut.result()


async def plain_commit(c: Components, offsets: dict[tuple[str, int], OffsetAndMetadata],
                       group: str = GROUP) -> None:
    fut = c.coordinator.commit_offsets(group, "", None, -1, offsets)
    assert isinstance(fut, Completion)
    await settle()
    assert set(fut.result().values()) == {ErrorCode.NONE}


async def end_txn(c: Components, commit: bool, *, pid: int = PID, epoch: int = EPOCH,
                  group: str = GROUP) -> None:
    """What the transaction coordinator does at EndTxn: the marker into the group's offsets
    partition, durable, then the group coordinator told."""
    partition = c.coordinator.partition_for(group)
    written = await c.replica_manager.write_txn_markers(
        pid, epoch, 0, commit, [(OFFSETS_TOPIC, partition)], 5000)
    assert written == {(OFFSETS_TOPIC, partition): ErrorCode.NONE}
    c.coordinator.handle_txn_completion(pid, [partition], commit)


def fetch(c: Components, partitions: list[tuple[str, int]] | None, require_stable: bool,
          group: str = GROUP) -> dict[tuple[str, int], Any]:
    return c.coordinator.fetch_offsets(group, partitions, require_stable)


def offsets_batches(c: Components, group: str = GROUP) -> list[tuple[Any, list[Any]]]:
    """(header, records) of every batch in the group's __consumer_offsets partition."""
    partition = c.replica_manager.partitions[(OFFSETS_TOPIC, c.coordinator.partition_for(group))]
    data = bytes(partition.log.read(0, 1 << 20, partition.log_end_offset, True))
    out = []
    for pos, header in iter_batches(data):
        records = []
        if not header.is_control:
            batch = MemoryRecords(data[pos:pos + header.size_in_bytes]).next_batch()
            records = list(batch)
        out.append((header, records))
    return out


TP0, TP1, TP2 = (TOPIC, 0), (TOPIC, 1), (TOPIC, 2)


# -- pending until the marker ------------------------------------------------------------------

async def test_transactional_commit_is_invisible_until_the_commit_marker(
        parts: Components) -> None:
    assert await txn_commit(parts, {TP0: om(10, "a"), TP1: om(20)}) == {
        TP0: ErrorCode.NONE, TP1: ErrorCode.NONE}
    group = parts.coordinator.groups.classic(GROUP)
    assert group.state == GroupState.EMPTY, "a TxnOffsetCommit to no group creates it Empty"
    assert fetch(parts, [TP0, TP1], False) == {TP0: None, TP1: None}
    assert fetch(parts, None, False) == {}
    assert fetch(parts, [TP0, TP1, TP2], True) == {
        TP0: ErrorCode.UNSTABLE_OFFSET_COMMIT, TP1: ErrorCode.UNSTABLE_OFFSET_COMMIT, TP2: None}

    await end_txn(parts, commit=True)
    assert fetch(parts, [TP0, TP1, TP2], True) == {TP0: om(10, "a"), TP1: om(20), TP2: None}
    assert fetch(parts, None, True) == {TP0: om(10, "a"), TP1: om(20)}
    assert GROUP not in parts.coordinator.offsets.open_transactions_by_group
    assert PID not in parts.coordinator.offsets.pending_transactional_offsets


async def test_abort_marker_drops_the_pending_offsets(parts: Components) -> None:
    await plain_commit(parts, {TP0: om(5)})
    assert await txn_commit(parts, {TP0: om(10), TP1: om(20)}) == {
        TP0: ErrorCode.NONE, TP1: ErrorCode.NONE}
    assert fetch(parts, [TP0, TP1], False) == {TP0: om(5), TP1: None}
    await end_txn(parts, commit=False)
    assert fetch(parts, [TP0, TP1], True) == {TP0: om(5), TP1: None}
    assert GROUP not in parts.coordinator.offsets.open_transactions_by_group


async def test_completion_touches_only_that_producer_and_that_offsets_partition(
        parts: Components) -> None:
    other = "another-group"
    assert parts.coordinator.partition_for(other) != parts.coordinator.partition_for(GROUP)
    await txn_commit(parts, {TP0: om(1)})
    await txn_commit(parts, {TP0: om(2)}, group=other)
    await txn_commit(parts, {TP1: om(3)}, pid=PID + 1)
    # The marker reached GROUP's partition only: the other group's offsets stay pending.
    await end_txn(parts, commit=True)
    assert fetch(parts, [TP0, TP1], True) == {TP0: om(1), TP1: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    assert fetch(parts, [TP0], True, group=other) == {TP0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    await end_txn(parts, commit=True, group=other)
    assert fetch(parts, [TP0], True, group=other) == {TP0: om(2)}
    await end_txn(parts, commit=True, pid=PID + 1)
    assert fetch(parts, [TP1], True) == {TP1: om(3)}


async def test_a_later_plain_commit_wins_over_an_earlier_transactional_one(
        parts: Components) -> None:
    """Kafka compares the log offsets of the two records, not the order of completion."""
    await txn_commit(parts, {TP0: om(10), TP1: om(11)})
    await plain_commit(parts, {TP0: om(99)})
    await end_txn(parts, commit=True)
    assert fetch(parts, [TP0, TP1], True) == {TP0: om(99), TP1: om(11)}
    # And a plain commit written before the transactional one loses to it.
    await plain_commit(parts, {TP2: om(1)})
    await txn_commit(parts, {TP2: om(2)})
    await end_txn(parts, commit=True)
    assert fetch(parts, [TP2], True) == {TP2: om(2)}


async def test_the_offsets_are_one_transactional_batch_of_the_producer(
        parts: Components) -> None:
    await txn_commit(parts, {TP0: om(10), TP1: om(20), TP2: om(30)}, pid=PID, epoch=3)
    [(header, records)] = offsets_batches(parts)
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID, 3, -1)
    assert len(records) == 3 == header.record_count
    await end_txn(parts, commit=True, epoch=3)
    batches = offsets_batches(parts)
    assert len(batches) == 2 and batches[1][0].is_control
    assert batches[1][0].producer_id == PID


async def test_a_plain_commit_on_its_way_to_the_log_is_unstable_too(parts: Components) -> None:
    """Kafka's hasPendingOffsetCommitsForTopicPartition counts plain commits not yet in the
    log as well: require_stable never answers an offset about to change."""
    await plain_commit(parts, {TP0: om(1)})
    fut = parts.coordinator.commit_offsets(GROUP, "", None, -1, {TP0: om(2)})
    assert isinstance(fut, Completion) and not fut.done()
    assert fetch(parts, [TP0], True) == {TP0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    assert fetch(parts, [TP0], False) == {TP0: om(1)}
    await settle()
    assert fut.result() == {TP0: ErrorCode.NONE}
    assert fetch(parts, [TP0], True) == {TP0: om(2)}


# -- require_stable on the wire ------------------------------------------------------------------

async def test_offset_fetch_requires_stable_from_v7(parts: Components) -> None:
    await plain_commit(parts, {TP1: om(7, "m")})
    await txn_commit(parts, {TP0: om(10)})

    def ask(request: Any) -> Any:
        req = parse(request)
        return wire_roundtrip(req, offset_fetch.handle(parts.context, req))

    def rows(topics: Any) -> list[tuple[int, int, int]]:
        return sorted((p.partition_index, p.committed_offset, p.error_code)
                      for t in topics for p in t.partitions)

    topic = OffsetFetchRequest.OffsetFetchRequestTopic
    wanted = [topic(name=TOPIC, partition_indexes=[0, 1])]
    v7 = ask(OffsetFetchRequest[7](group_id=GROUP, topics=wanted, require_stable=True))
    assert v7.error_code == 0
    assert rows(v7.topics) == [(0, -1, ErrorCode.UNSTABLE_OFFSET_COMMIT), (1, 7, 0)]
    unstable_ok = ask(OffsetFetchRequest[7](group_id=GROUP, topics=wanted, require_stable=False))
    assert rows(unstable_ok.topics) == [(0, -1, 0), (1, 7, 0)]
    v6 = ask(OffsetFetchRequest[6](group_id=GROUP, topics=wanted))
    assert rows(v6.topics) == [(0, -1, 0), (1, 7, 0)]

    group = OffsetFetchRequest.OffsetFetchRequestGroup
    v8 = ask(OffsetFetchRequest[8](groups=[group(group_id=GROUP, topics=[
        group.OffsetFetchRequestTopics(name=TOPIC, partition_indexes=[0, 1])])],
        require_stable=True))
    [g] = v8.groups
    assert g.error_code == 0
    assert rows(g.topics) == [(0, -1, ErrorCode.UNSTABLE_OFFSET_COMMIT), (1, 7, 0)]

    await end_txn(parts, commit=True)
    v7 = ask(OffsetFetchRequest[7](group_id=GROUP, topics=wanted, require_stable=True))
    assert rows(v7.topics) == [(0, 10, 0), (1, 7, 0)]


# -- restart -----------------------------------------------------------------------------------

async def test_restart_resolves_transactional_offsets_by_the_markers_in_the_log(
        tmp_path: Path) -> None:
    """Committed, aborted and undecided transactions, and a plain commit written after a
    transactional one that commits later: a fresh coordinator reads the same state back."""
    committed, aborted, undecided = 5000, 6000, 7000
    c = build(tmp_path / "logs", OVERRIDES)
    try:
        c.topics.create_topic(TOPIC, 3, {})
        await plain_commit(c, {TP2: om(1)})
        await txn_commit(c, {TP0: om(10), TP1: om(11)}, pid=committed)
        await txn_commit(c, {TP1: om(66), TP2: om(66)}, pid=aborted)
        await plain_commit(c, {TP1: om(50)})  # later in the log than `committed`'s TP1
        await txn_commit(c, {TP2: om(77)}, pid=undecided)
        await end_txn(c, commit=True, pid=committed)
        await end_txn(c, commit=False, pid=aborted)
        before = fetch(c, [TP0, TP1, TP2], True)
        assert before == {TP0: om(10), TP1: om(50), TP2: ErrorCode.UNSTABLE_OFFSET_COMMIT}
        assert fetch(c, [TP2], False) == {TP2: om(1)}
    finally:
        await c.close()

    fresh = build(tmp_path / "logs", OVERRIDES)
    try:
        assert fetch(fresh, [TP0, TP1, TP2], True) == before
        assert fetch(fresh, None, False) == {TP0: om(10), TP1: om(50), TP2: om(1)}
        assert fresh.coordinator.groups.classic(GROUP) is not None
        assert set(fresh.coordinator.offsets.pending_transactional_offsets) == {undecided}
        assert fresh.coordinator.offsets.open_transactions_by_group == {GROUP: {undecided}}
        # The transaction coordinator completes it after the restart.
        await end_txn(fresh, commit=True, pid=undecided)
        assert fetch(fresh, [TP2], True) == {TP2: om(77)}
    finally:
        await fresh.close()

    again = build(tmp_path / "logs", OVERRIDES)
    try:
        assert fetch(again, None, True) == {TP0: om(10), TP1: om(50), TP2: om(77)}
        assert GROUP not in again.coordinator.offsets.open_transactions_by_group
    finally:
        await again.close()


async def test_restart_with_only_aborted_offsets_leaves_no_offsets(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", OVERRIDES)
    try:
        c.topics.create_topic(TOPIC, 3, {})
        await txn_commit(c, {TP0: om(10)})
        await end_txn(c, commit=False)
    finally:
        await c.close()
    fresh = build(tmp_path / "logs", OVERRIDES)
    try:
        assert fetch(fresh, [TP0], True) == {TP0: None}
        assert GROUP not in fresh.coordinator.groups
    finally:
        await fresh.close()


# -- expiry and deletion -----------------------------------------------------------------------

async def test_expiry_keeps_a_group_whose_transactional_offsets_are_pending(
        parts: Components) -> None:
    """Kafka's removeExpiredOffsets only looks at committed offsets, and an Empty group dies
    only without offsets, pending transactional ones included (hasOffsets)."""
    parts.coordinator.config = dataclasses.replace(parts.coordinator.config,
                                                   offsets_retention_ms=0)
    await txn_commit(parts, {TP0: om(10)})
    parts.coordinator.expire_offsets()
    await settle()
    assert GROUP in parts.coordinator.groups
    assert fetch(parts, [TP0], True) == {TP0: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    await end_txn(parts, commit=False)
    parts.coordinator.expire_offsets()
    await settle()
    assert GROUP not in parts.coordinator.groups, "an Empty group with no offsets outlived it"


async def test_deleting_the_group_drops_its_pending_offsets(parts: Components) -> None:
    await plain_commit(parts, {TP0: om(1)})
    await txn_commit(parts, {TP0: om(10)})
    deleted = parts.coordinator.delete_groups([GROUP])
    if not deleted.done():
        await settle()
    assert deleted.result() == {GROUP: ErrorCode.NONE}
    await end_txn(parts, commit=True)  # the marker finds no group: nothing comes back
    assert fetch(parts, [TP0], True) == {TP0: None}


# -- the TxnOffsetCommit request -----------------------------------------------------------------

def txn_request(version: int, offsets: dict[tuple[str, int], int], *, group: str = GROUP,
                member: str = "", instance: str | None = None, generation: int = -1,
                pid: int = PID, epoch: int = EPOCH) -> Any:
    topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    by_topic: dict[str, list[Any]] = {}
    for (name, index), offset in offsets.items():
        fields: dict[str, Any] = dict(partition_index=index, committed_offset=offset,
                                      committed_metadata="m")
        if version >= 2:
            fields["committed_leader_epoch"] = 4
        by_topic.setdefault(name, []).append(topic.TxnOffsetCommitRequestPartition(**fields))
    body: dict[str, Any] = dict(transactional_id="tx", group_id=group, producer_id=pid,
                                producer_epoch=epoch,
                                topics=[topic(name=n, partitions=ps) for n, ps in by_topic.items()])
    if version >= 3:
        body.update(generation_id=generation, member_id=member, group_instance_id=instance)
    return TxnOffsetCommitRequest[version](**body)


async def send(c: Components, request: Any, transactions: Any = None
               ) -> dict[tuple[str, int], int]:
    """The request through the handler; the transaction coordinator's check is ``transactions``
    (by default one that finds every partition in the transaction)."""
    req = parse(request)
    ctx = dataclasses.replace(c.context, transactions=transactions or FakeTransactions(0))
    out = txn_offset_commit.handle(ctx, req)
    if isinstance(out, Completion):
        if not out.done():
            await settle()
        out = out.result()
    resp = wire_roundtrip(req, out)
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


async def stable_member(c: Components, instance: str | None = None) -> str:
    """A group of one member, Stable in generation 1."""
    joined = c.coordinator.join_group(GROUP, "", instance, False, "client", "127.0.0.1", 30_000,
                                      10_000, "consumer", [("range", b"sub")])
    assert isinstance(joined, Completion)
    await c.advance(3000)
    member = joined.result().member_id
    synced = c.coordinator.sync_group(GROUP, 1, member, instance, "consumer", "range",
                                      {member: b"assignment"})
    await settle()
    assert synced.result() == (ErrorCode.NONE, b"assignment")  # type: ignore[union-attr]
    assert c.coordinator.groups.classic(GROUP).state == GroupState.STABLE
    return member


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
async def test_txn_offset_commit_request_all_versions(parts: Components, version: int) -> None:
    errors = await send(parts, txn_request(version, {TP0: 10, ("no-such-topic", 0): 1,
                                                     (TOPIC, 9): 1}))
    assert errors == {TP0: 0, ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                      (TOPIC, 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    await end_txn(parts, commit=True)
    epoch = 4 if version >= 2 else -1
    stored = fetch(parts, [TP0], True)[TP0]
    assert (stored.offset, stored.leader_epoch, stored.metadata) == (10, epoch, "m")


async def test_member_and_generation_are_checked_from_v3(parts: Components) -> None:
    """KIP-447: v3 carries the consumer's group metadata and the coordinator checks it as
    Kafka's validateOffsetCommit does; before v3 there is nothing to check."""
    member = await stable_member(parts, instance="instance-1")
    ok = await send(parts, txn_request(3, {TP0: 1}, member=member, generation=1,
                                       instance="instance-1"))
    assert ok == {TP0: 0}
    cases = [
        (dict(member=member, generation=0, instance="instance-1"), ErrorCode.ILLEGAL_GENERATION),
        (dict(member="stranger", generation=1), ErrorCode.UNKNOWN_MEMBER_ID),
        (dict(member="stranger", generation=1, instance="instance-1"),
         ErrorCode.FENCED_INSTANCE_ID),
        (dict(member=member, generation=1, instance="instance-2"), ErrorCode.UNKNOWN_MEMBER_ID),
        (dict(member="", generation=1), ErrorCode.UNKNOWN_MEMBER_ID),
    ]
    for version in (3, 4):
        for fields, expected in cases:
            errors = await send(parts, txn_request(version, {TP0: 2, TP1: 2}, **fields))
            assert errors == {TP0: expected, TP1: expected}, (version, fields)
    # A v3 producer outside the group (-1, "", no instance) is not checked, as before v3.
    assert await send(parts, txn_request(3, {TP1: 3})) == {TP1: 0}
    for version in (0, 1, 2):
        assert await send(parts, txn_request(version, {TP1: 4})) == {TP1: 0}, version
    # Nothing refused reached the pending offsets.
    pending = parts.coordinator.offsets.pending_transactional_offsets[PID].items(GROUP)
    assert {tp: p.offset_and_metadata.offset for tp, p in pending} == {TP0: 1, TP1: 4}


async def test_empty_group_id_is_invalid(parts: Components) -> None:
    assert await send(parts, txn_request(3, {TP0: 1}, group="")) == {
        TP0: ErrorCode.INVALID_GROUP_ID}


class FakeTransactions:
    """The transaction coordinator's KIP-890 check, answering what the test says."""

    def __init__(self, error: int) -> None:
        self.error = error
        self.asked: list[tuple[str, int, int, tuple[str, int]]] = []

    def verify_partition(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         tp: tuple[str, int]) -> int:
        self.asked.append((transactional_id, producer_id, producer_epoch, tp))
        return self.error


@pytest.mark.parametrize(("refusal", "version", "answered"), [
    # the offsets partition is not in the transaction
    (ErrorCode.INVALID_TXN_STATE, 3, ErrorCode.INVALID_TXN_STATE),
    (ErrorCode.PRODUCER_FENCED, 3, ErrorCode.INVALID_PRODUCER_EPOCH),
    # TRANSACTION_ABORTABLE reaches v4 clients only (Kafka's genericError)
    (ErrorCode.TRANSACTION_ABORTABLE, 3, ErrorCode.INVALID_TXN_STATE),
    (ErrorCode.TRANSACTION_ABORTABLE, 4, ErrorCode.TRANSACTION_ABORTABLE),
    # NETWORK_EXCEPTION: retry at the same coordinator; clients before v2 are told otherwise
    (ErrorCode.NETWORK_EXCEPTION, 3, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
    (ErrorCode.NETWORK_EXCEPTION, 1, ErrorCode.COORDINATOR_NOT_AVAILABLE),
])
async def test_offsets_partition_must_be_in_the_transaction(
        parts: Components, refusal: int, version: int, answered: int) -> None:
    fake = FakeTransactions(refusal)
    errors = await send(parts, txn_request(version, {TP0: 1, ("no-such-topic", 0): 1}), fake)
    assert errors == {TP0: answered, ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    offsets_tp = (OFFSETS_TOPIC, parts.coordinator.partition_for(GROUP))
    assert fake.asked == [("tx", PID, EPOCH, offsets_tp)]
    assert offsets_batches(parts) == [], "a refused commit reached the log"


async def test_verification_passes_then_is_skipped_while_the_transaction_is_open(
        parts: Components) -> None:
    fake = FakeTransactions(0)
    assert await send(parts, txn_request(3, {TP0: 1}), fake) == {TP0: 0}
    assert len(fake.asked) == 1
    fake.error = ErrorCode.INVALID_TXN_STATE  # open in the log already: Kafka asks no more
    assert await send(parts, txn_request(3, {TP1: 2}), fake) == {TP1: 0}
    assert len(fake.asked) == 1
    await end_txn(parts, commit=True)
    assert await send(parts, txn_request(3, {TP2: 3}), fake) == {
        TP2: ErrorCode.INVALID_TXN_STATE}


async def test_a_fenced_epoch_is_refused_by_the_log(parts: Components) -> None:
    await txn_commit(parts, {TP0: om(1)}, epoch=5)
    await end_txn(parts, commit=True, epoch=5)
    assert await txn_commit(parts, {TP0: om(2)}, epoch=4) == {
        TP0: ErrorCode.INVALID_PRODUCER_EPOCH}
    assert parts.coordinator.groups.get_classic(GROUP) is not None
    assert GROUP not in parts.coordinator.offsets.open_transactions_by_group
    assert PID not in parts.coordinator.offsets.pending_transactional_offsets
    assert fetch(parts, [TP0], True) == {TP0: om(1)}
