"""The transaction APIs through their handlers, parsed as a client's bytes: Kafka's error codes
per version (KafkaApis answers PRODUCER_FENCED as INVALID_PRODUCER_EPOCH to clients that predate
it: InitProducerId before v4, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn before v2)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DescribeTransactionsRequest, ListTransactionsRequest
from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    WriteTxnMarkersRequest,
)

from broker.apis import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    describe_transactions,
    end_txn,
    find_coordinator,
    init_producer_id,
    list_transactions,
    write_txn_markers,
)
from broker.txn import TOPIC as TXN_TOPIC
from protocol import registry
from protocol.errors import ErrorCode
from tests.support.components import Components, build, parse, settle, wire_roundtrip

E = ErrorCode
TID = "handler-txn"
DATA = "payments"
OVERRIDES = {"offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "3"}
# The versions served (what the registry must advertise).
SERVED = {
    InitProducerIdRequest: (0, 5), AddPartitionsToTxnRequest: (0, 5),
    AddOffsetsToTxnRequest: (0, 4), EndTxnRequest: (0, 4), WriteTxnMarkersRequest: (0, 1),
    DescribeTransactionsRequest: (0, 0), ListTransactionsRequest: (0, 1),
}


def test_the_registry_serves_these_versions() -> None:
    for req, versions in SERVED.items():
        spec = registry.APIS[req.API_KEY]
        assert (spec.min_version, spec.max_version) == versions, req.__name__


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic(DATA, 2, {})
    yield c
    await c.close()


async def call(c: Components, handle: Callable[..., Any], request: Any) -> Any:
    """The response as the client decodes it, whether answered now or once writes commit."""
    req = parse(request)
    out = handle(c.context, req)
    if inspect.isawaitable(out):
        task = asyncio.ensure_future(out)
        await settle()
        assert task.done(), f"{req.spec.name} still waiting"
        out = task.result()
    return wire_roundtrip(req, out)


async def init(c: Components, version: int = 4, tid: str = TID, timeout_ms: int = 60_000,
               pid: int = -1, epoch: int = -1) -> Any:
    args: dict[str, Any] = {"transactional_id": tid, "transaction_timeout_ms": timeout_ms}
    if version >= 3:
        args.update(producer_id=pid, producer_epoch=epoch)
    return await call(c, init_producer_id.handle, InitProducerIdRequest(**args, version=version))


def add_request(version: int, pid: int, epoch: int, tps: list[tuple[str, int]],
                tid: str = TID, verify_only: bool = False) -> AddPartitionsToTxnRequest:
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    topics = [AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=ps)
              for t, ps in by_topic.items()]
    if version < 4:
        return AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch, v3_and_below_topics=topics, version=version)
    txn = AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, verify_only=verify_only,
        topics=topics)
    return AddPartitionsToTxnRequest(transactions=[txn], version=version)


def partition_errors(topic_results: list) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.partition_error_code
            for t in topic_results for p in t.results_by_partition}


async def ongoing(c: Components) -> tuple[int, int]:
    """A producer with (DATA, 0) in its transaction."""
    r = await init(c)
    resp = await call(c, add_partitions_to_txn.handle,
                      add_request(3, r.producer_id, r.producer_epoch, [(DATA, 0)]))
    assert partition_errors(resp.results_by_topic_v3_and_below) == {(DATA, 0): E.NONE}
    return r.producer_id, r.producer_epoch


# -- FindCoordinator ----------------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
async def test_find_coordinator_answers_this_node_for_a_transactional_id(
        parts: Components, version: int) -> None:
    if version < 4:
        req = FindCoordinatorRequest(key=TID, key_type=1, version=version)
    else:
        req = FindCoordinatorRequest(key_type=1, coordinator_keys=[TID, "other"], version=version)
    resp = await call(parts, find_coordinator.handle, req)
    node = parts.context.node
    if version < 4:
        assert (resp.error_code, resp.node_id, resp.host, resp.port) == (
            E.NONE, node.node_id, node.host, node.port)
    else:
        assert [(c.key, c.error_code, c.node_id) for c in resp.coordinators] == [
            (TID, E.NONE, node.node_id), ("other", E.NONE, node.node_id)]
    assert TXN_TOPIC in parts.topics.metadata.topics  # created on first need


@pytest.mark.parametrize("version", [3, 4])
async def test_find_coordinator_refuses_an_unknown_key_type(parts: Components,
                                                            version: int) -> None:
    if version < 4:
        req = FindCoordinatorRequest(key="k", key_type=7, version=version)
        resp = await call(parts, find_coordinator.handle, req)
        assert (resp.error_code, resp.node_id, resp.host, resp.port) == (
            E.INVALID_REQUEST, -1, "", -1)
    else:
        req = FindCoordinatorRequest(key_type=7, coordinator_keys=["k"], version=version)
        resp = await call(parts, find_coordinator.handle, req)
        assert [(c.error_code, c.node_id) for c in resp.coordinators] == [(E.INVALID_REQUEST, -1)]


# -- InitProducerId -----------------------------------------------------------------------------

@pytest.mark.parametrize("version", range(6))
async def test_init_producer_id_for_a_transactional_id(parts: Components, version: int) -> None:
    first = await init(parts, version)
    assert (first.error_code, first.producer_epoch) == (E.NONE, 0)
    again = await init(parts, version)
    assert (again.error_code, again.producer_id, again.producer_epoch) == (
        E.NONE, first.producer_id, 1)
    bad = await init(parts, version, timeout_ms=900_001)
    assert (bad.error_code, bad.producer_id, bad.producer_epoch) == (
        E.INVALID_TRANSACTION_TIMEOUT, -1, -1)


@pytest.mark.parametrize("version", [3, 4, 5])
async def test_init_producer_id_fenced_by_version(parts: Components, version: int) -> None:
    first = await init(parts, version)
    await init(parts, version)  # epoch 1: epoch 0 is fenced now
    await init(parts, version)  # epoch 2, the last epoch forgotten
    stale = await init(parts, version, pid=first.producer_id, epoch=0)
    expected = E.INVALID_PRODUCER_EPOCH if version < 4 else E.PRODUCER_FENCED
    assert (stale.error_code, stale.producer_id, stale.producer_epoch) == (expected, -1, -1)
    half = await init(parts, version, pid=first.producer_id, epoch=-1)
    assert half.error_code == E.INVALID_REQUEST


async def test_init_producer_id_without_a_transactional_id_is_idempotent(
        parts: Components) -> None:
    resp = await call(parts, init_producer_id.handle, InitProducerIdRequest(
        transactional_id=None, transaction_timeout_ms=0, version=4))
    assert (resp.error_code, resp.producer_epoch) == (E.NONE, 0)
    assert parts.transactions.transactions == {}


async def test_init_producer_id_while_a_transaction_is_open(parts: Components) -> None:
    await ongoing(parts)
    resp = await init(parts)
    assert resp.error_code == E.CONCURRENT_TRANSACTIONS
    await settle()
    resp = await init(parts)
    assert (resp.error_code, resp.producer_epoch) == (E.NONE, 2)


# -- AddPartitionsToTxn -------------------------------------------------------------------------

@pytest.mark.parametrize("version", range(6))
async def test_add_partitions_to_txn(parts: Components, version: int) -> None:
    r = await init(parts)
    req = add_request(version, r.producer_id, r.producer_epoch, [(DATA, 0), (DATA, 1)])
    resp = await call(parts, add_partitions_to_txn.handle, req)
    if version < 4:
        errors = partition_errors(resp.results_by_topic_v3_and_below)
    else:
        assert resp.error_code == E.NONE
        [txn] = resp.results_by_transaction
        assert txn.transactional_id == TID
        errors = partition_errors(txn.topic_results)
    assert errors == {(DATA, 0): E.NONE, (DATA, 1): E.NONE}
    assert parts.transactions.transactions[TID].topic_partitions == {(DATA, 0), (DATA, 1)}


@pytest.mark.parametrize("version", range(6))
async def test_add_partitions_fenced_by_version(parts: Components, version: int) -> None:
    r = await init(parts)
    await init(parts)
    req = add_request(version, r.producer_id, r.producer_epoch, [(DATA, 0)])
    resp = await call(parts, add_partitions_to_txn.handle, req)
    results = (resp.results_by_topic_v3_and_below if version < 4
               else resp.results_by_transaction[0].topic_results)
    expected = E.INVALID_PRODUCER_EPOCH if version < 2 else E.PRODUCER_FENCED
    assert partition_errors(results) == {(DATA, 0): expected}


async def test_add_partitions_with_an_unknown_or_internal_partition(parts: Components) -> None:
    r = await init(parts)
    req = add_request(3, r.producer_id, r.producer_epoch,
                      [(DATA, 0), (DATA, 9), ("__consumer_offsets", 0)])
    resp = await call(parts, add_partitions_to_txn.handle, req)
    assert partition_errors(resp.results_by_topic_v3_and_below) == {
        (DATA, 0): E.OPERATION_NOT_ATTEMPTED, (DATA, 9): E.UNKNOWN_TOPIC_OR_PARTITION,
        ("__consumer_offsets", 0): E.TOPIC_AUTHORIZATION_FAILED}
    assert parts.transactions.transactions[TID].topic_partitions == set()


@pytest.mark.parametrize("version", [4, 5])
async def test_add_partitions_verify_only(parts: Components, version: int) -> None:
    pid, epoch = await ongoing(parts)
    req = add_request(version, pid, epoch, [(DATA, 0), (DATA, 1)], verify_only=True)
    resp = await call(parts, add_partitions_to_txn.handle, req)
    assert partition_errors(resp.results_by_transaction[0].topic_results) == {
        (DATA, 0): E.NONE, (DATA, 1): E.TRANSACTION_ABORTABLE}
    assert parts.transactions.transactions[TID].topic_partitions == {(DATA, 0)}  # not added


# -- AddOffsetsToTxn and EndTxn ----------------------------------------------------------------

@pytest.mark.parametrize("version", range(5))
async def test_add_offsets_to_txn(parts: Components, version: int) -> None:
    r = await init(parts)
    resp = await call(parts, add_offsets_to_txn.handle, AddOffsetsToTxnRequest(
        transactional_id=TID, producer_id=r.producer_id, producer_epoch=r.producer_epoch,
        group_id="g", version=version))
    assert resp.error_code == E.NONE
    offsets_tp = ("__consumer_offsets", parts.offsets_store.partition_for("g"))
    assert parts.transactions.transactions[TID].topic_partitions == {offsets_tp}
    fenced = await call(parts, add_offsets_to_txn.handle, AddOffsetsToTxnRequest(
        transactional_id=TID, producer_id=r.producer_id, producer_epoch=r.producer_epoch + 1,
        group_id="g", version=version))
    assert fenced.error_code == (E.INVALID_PRODUCER_EPOCH if version < 2 else E.PRODUCER_FENCED)


@pytest.mark.parametrize("version", range(5))
async def test_end_txn(parts: Components, version: int) -> None:
    pid, epoch = await ongoing(parts)

    def end(committed: bool, e: int = epoch, tid: str = TID) -> EndTxnRequest:
        return EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=e,
                             committed=committed, version=version)

    fenced = await call(parts, end_txn.handle, end(True, epoch + 1))
    assert fenced.error_code == (E.INVALID_PRODUCER_EPOCH if version < 2 else E.PRODUCER_FENCED)
    assert (await call(parts, end_txn.handle, end(True))).error_code == E.NONE
    await settle()
    assert parts.transactions.transactions[TID].state.kafka_name == "CompleteCommit"
    assert (await call(parts, end_txn.handle, end(True))).error_code == E.NONE  # a retry
    assert (await call(parts, end_txn.handle, end(False))).error_code == E.INVALID_TXN_STATE
    assert (await call(parts, end_txn.handle, end(True, tid="nope"))).error_code == \
        E.INVALID_PRODUCER_ID_MAPPING


# -- WriteTxnMarkers ----------------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 1])
async def test_write_txn_markers(parts: Components, version: int) -> None:
    completed: list[tuple[int, list[int], bool]] = []
    parts.coordinator.handle_txn_completion = (  # type: ignore[attr-defined]
        lambda p, ps, c: completed.append((p, list(ps), c)))
    marker = WriteTxnMarkersRequest.WritableTxnMarker(
        producer_id=77, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
        topics=[WriteTxnMarkersRequest.WritableTxnMarker.WritableTxnMarkerTopic(
            name=DATA, partition_indexes=[0, 5]),
            WriteTxnMarkersRequest.WritableTxnMarker.WritableTxnMarkerTopic(
            name="__consumer_offsets", partition_indexes=[1])])
    resp = await call(parts, write_txn_markers.handle,
                      WriteTxnMarkersRequest(markers=[marker], version=version))
    [m] = resp.markers
    assert m.producer_id == 77
    assert {(t.name, p.partition_index): p.error_code for t in m.topics for p in t.partitions} == {
        (DATA, 0): E.NONE, (DATA, 5): E.UNKNOWN_TOPIC_OR_PARTITION,
        ("__consumer_offsets", 1): E.NONE}
    assert completed == [(77, [1], False)]


# -- DescribeTransactions and ListTransactions ------------------------------------------------

async def test_describe_transactions(parts: Components) -> None:
    pid, epoch = await ongoing(parts)
    resp = await call(parts, describe_transactions.handle, DescribeTransactionsRequest(
        transactional_ids=[TID, "missing", ""], version=0))
    found, missing, empty = resp.transaction_states
    md = parts.transactions.transactions[TID]
    assert (found.error_code, found.transactional_id, found.transaction_state,
            found.transaction_timeout_ms, found.transaction_start_time_ms, found.producer_id,
            found.producer_epoch) == (E.NONE, TID, "Ongoing", 60_000, md.txn_start_timestamp,
                                      pid, epoch)
    assert [(t.topic, list(t.partitions)) for t in found.topics] == [(DATA, [0])]
    assert (missing.error_code, missing.transactional_id) == (
        E.TRANSACTIONAL_ID_NOT_FOUND, "missing")
    assert empty.error_code == E.INVALID_REQUEST


@pytest.mark.parametrize("version", [0, 1])
async def test_list_transactions(parts: Components, version: int) -> None:
    pid, _ = await ongoing(parts)
    other = await init(parts, tid="idle")
    args: dict[str, Any] = {"state_filters": [], "producer_id_filters": []}
    resp = await call(parts, list_transactions.handle,
                      ListTransactionsRequest(**args, version=version))
    assert resp.error_code == E.NONE
    assert sorted((s.transactional_id, s.producer_id, s.transaction_state)
                  for s in resp.transaction_states) == sorted(
        [(TID, pid, "Ongoing"), ("idle", other.producer_id, "Empty")])
    args = {"state_filters": ["Ongoing", "Nonsense"], "producer_id_filters": [pid]}
    resp = await call(parts, list_transactions.handle,
                      ListTransactionsRequest(**args, version=version))
    assert [s.transactional_id for s in resp.transaction_states] == [TID]
    assert list(resp.unknown_state_filters) == ["Nonsense"]
    if version >= 1:
        await parts.advance(5000)
        resp = await call(parts, list_transactions.handle, ListTransactionsRequest(
            state_filters=["Ongoing"], producer_id_filters=[], duration_filter=5000,
            version=version))
        assert resp.transaction_states == []  # running 5000 ms is not longer than 5000 ms
        resp = await call(parts, list_transactions.handle, ListTransactionsRequest(
            state_filters=["Ongoing"], producer_id_filters=[], duration_filter=4999,
            version=version))
        assert [s.transactional_id for s in resp.transaction_states] == [TID]
