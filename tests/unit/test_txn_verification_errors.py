"""What a client is told when the KIP-890 check is asked of a transaction coordinator on
another broker, by Kafka's chain: AddPartitionsToTxnManager turns the coordinator's answer (or
its absence) into an error, then the produce path (ReplicaManager's retriable set as
NOT_ENOUGH_REPLICAS) or the group coordinator (TxnOffsetCommit: NETWORK_EXCEPTION retried at
the same coordinator; NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE unchanged) hands it on.

The verifier is the real RemoteTransactionVerifier over a real metadata cache and inter-broker
client (whose peers resolve to nothing: no socket is opened); the coordinator's answers are
AddPartitionsToTxn responses decoded from the wire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.producer import AddPartitionsToTxnResponse, TxnOffsetCommitRequest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.apis import txn_offset_commit
from broker.cluster.liveness import BrokerLivenessView
from broker.cluster.memory import InMemoryStore
from broker.cluster.metadata_cache import ClusterMetadataCache
from broker.cluster.partition_watcher import PartitionUpdate
from broker.cluster.registration import BrokerInfo, RegisteredBroker
from broker.cluster.topic_state import NO_LEADER, PartitionState
from broker.group.offsets_store import TOPIC as OFFSETS_TOPIC
from broker.interbroker import txn
from broker.interbroker.client import InterBrokerClient, InterBrokerSettings
from broker.replica.delayed_result import Completion, completed
from protocol.errors import ErrorCode
from tests.support.components import Components, build, parse, settle, wire_roundtrip

E = ErrorCode
TXN_ID, PID, EPOCH = "tx", 4000, 0
GROUP, TOPIC = "verified-group", "orders"
TXN_STATE = "__transaction_state"
SELF, COORDINATOR = 1, 2
TopicPartition = tuple[str, int]
Outcome = Callable[[list[TopicPartition]], dict[TopicPartition, ErrorCode]]


# -- the verifier: what it hands on --------------------------------------------------------------

def coordinator_answer(error: ErrorCode) -> Outcome:
    """The coordinator answered ``error`` for each partition (AddPartitionsToTxn v4)."""
    def read(tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        result = AddPartitionsToTxnResponse.AddPartitionsToTxnResult
        topic = result.AddPartitionsToTxnTopicResult
        by_topic: dict[str, list[int]] = {}
        for name, index in tps:
            by_topic.setdefault(name, []).append(index)
        response = AddPartitionsToTxnResponse[4](throttle_time_ms=0, error_code=0,
                                                 results_by_transaction=[result(
            transactional_id=TXN_ID, topic_results=[topic(name=n, results_by_partition=[
                topic.AddPartitionsToTxnPartitionResult(partition_index=i,
                                                        partition_error_code=error)
                for i in ps]) for n, ps in by_topic.items()])])
        return txn._verified(_from_wire(response), TXN_ID, tps)
    return read


def request_refused(error: ErrorCode) -> Outcome:
    """The coordinator refused the whole request with ``error``."""
    def read(tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        response = AddPartitionsToTxnResponse[4](throttle_time_ms=0, error_code=error,
                                                 results_by_transaction=[])
        return txn._verified(_from_wire(response), TXN_ID, tps)
    return read


def _from_wire(response: Any) -> Any:
    return type(response).decode(response.encode(version=4), version=4)


def test_a_request_level_cluster_authorization_failure_is_invalid_txn_state() -> None:
    """Kafka's manager: the client must not see CLUSTER_AUTHORIZATION_FAILED (this broker may
    not ask); the verification did not complete."""
    tps = [(TOPIC, 0), (TOPIC, 1)]
    assert request_refused(E.CLUSTER_AUTHORIZATION_FAILED)(tps) == dict.fromkeys(
        tps, E.INVALID_TXN_STATE)
    assert request_refused(E.UNKNOWN_SERVER_ERROR)(tps) == dict.fromkeys(
        tps, E.UNKNOWN_SERVER_ERROR)


@pytest.mark.parametrize("error", [E.NONE, E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE,
                                   E.COORDINATOR_LOAD_IN_PROGRESS, E.CONCURRENT_TRANSACTIONS,
                                   E.TRANSACTION_ABORTABLE, E.PRODUCER_FENCED])
def test_each_partition_answer_is_handed_on_as_the_coordinator_gave_it(error: E) -> None:
    """Per-partition answers pass the manager unchanged (the callers convert fencing and
    TRANSACTION_ABORTABLE by request version)."""
    assert coordinator_answer(error)([(TOPIC, 0)]) == {(TOPIC, 0): error}


@pytest.fixture
async def verifier() -> AsyncIterator[txn.RemoteTransactionVerifier]:
    """This broker (1) and the id's coordinator (2, the leader of its __transaction_state
    partition), whose address resolves to nothing."""
    cache = ClusterMetadataCache(BrokerLivenessView(InMemoryStore()))
    cache.partition_changed(PartitionUpdate(TXN_STATE, "txn-state-id", 0, [COORDINATOR],
                                            PartitionState(COORDINATOR, 0, [COORDINATOR], 1), 2))
    client = InterBrokerClient(InterBrokerSettings("PLAINTEXT", "PLAINTEXT",
                                                   request_timeout_ms=200), lambda _node: None)
    out = txn.RemoteTransactionVerifier(SELF, cache, client, lambda _tid: 0,
                                        lambda _tid: False)
    yield out
    await out.close()
    await client.close()


def _live(verifier: txn.RemoteTransactionVerifier, node: int) -> None:
    """``node`` registered, as the liveness watch would have listed it."""
    verifier.cache.liveness.live[node] = RegisteredBroker(
        BrokerInfo(node, {"PLAINTEXT": ("127.0.0.1", 1)}), 10)


def _lead(verifier: txn.RemoteTransactionVerifier, leader: int) -> None:
    verifier.cache.partition_changed(PartitionUpdate(
        TXN_STATE, "txn-state-id", 0, [COORDINATOR], PartitionState(leader, 1, [COORDINATOR], 1),
        3))


async def _asked(verifier: txn.RemoteTransactionVerifier
                 ) -> dict[TopicPartition, ErrorCode]:
    pending = verifier(TXN_ID, PID, EPOCH, [(TOPIC, 0)])
    assert pending is not None, "the coordinator is another broker's"
    return await pending


async def test_a_coordinator_that_is_not_live_is_not_available(
        verifier: txn.RemoteTransactionVerifier) -> None:
    """Kafka's getTransactionCoordinator finds no alive node: COORDINATOR_NOT_AVAILABLE at
    once, nothing sent (not a connection attempt answered NETWORK_EXCEPTION)."""
    assert await _asked(verifier) == {(TOPIC, 0): E.COORDINATOR_NOT_AVAILABLE}
    _lead(verifier, NO_LEADER)
    assert await _asked(verifier) == {(TOPIC, 0): E.COORDINATOR_NOT_AVAILABLE}
    assert verifier.remote_requests == 0


async def test_a_live_coordinator_that_does_not_answer_is_a_network_exception(
        verifier: txn.RemoteTransactionVerifier) -> None:
    _live(verifier, COORDINATOR)
    assert await _asked(verifier) == {(TOPIC, 0): E.NETWORK_EXCEPTION}
    assert verifier.remote_requests == 1


# -- what the client is told ----------------------------------------------------------------------

@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "3"})
    c.topics.create_topic(TOPIC, 1, {})
    yield c
    await c.close()


def unanswered(tps: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
    return dict.fromkeys(tps, E.NETWORK_EXCEPTION)  # what the verifier hands on (above)


def _remote(c: Components, outcome: Outcome) -> list[list[TopicPartition]]:
    """The replica manager's remote check answers ``outcome``; what it was asked."""
    asked: list[list[TopicPartition]] = []

    def verify(tid: str, pid: int, epoch: int, tps: list[TopicPartition]
               ) -> Completion[dict[TopicPartition, ErrorCode]]:
        asked.append(tps)
        return completed(outcome(tps))

    c.replica_manager.verify_transaction_remote = verify
    return asked


async def txn_offset_commit_error(c: Components, version: int) -> int:
    topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    fields: dict[str, Any] = dict(partition_index=0, committed_offset=5, committed_metadata="")
    if version >= 2:
        fields["committed_leader_epoch"] = -1
    body: dict[str, Any] = dict(transactional_id=TXN_ID, group_id=GROUP, producer_id=PID,
                                producer_epoch=EPOCH, topics=[topic(
                                    name=TOPIC, partitions=[
                                        topic.TxnOffsetCommitRequestPartition(**fields)])])
    if version >= 3:
        body.update(generation_id=-1, member_id="", group_instance_id=None)
    req = parse(TxnOffsetCommitRequest[version](**body))
    out = txn_offset_commit.handle(c.context, req)
    if isinstance(out, Completion):
        if not out.done():
            await settle()
        out = out.result()
    [[error]] = [[p.error_code for p in t.partitions] for t in wire_roundtrip(req, out).topics]
    return int(error)


async def produce_error(c: Components, version: int) -> ErrorCode:
    builder = DefaultRecordBatchBuilder(2, 0, True, PID, EPOCH, 0, 16 << 20)
    builder.append(0, 1_700_000_000_000, None, b"v", [])
    answer = c.replica_manager.append_records([((TOPIC, 0), bytes(builder.build()))], version,
                                              1, 30_000, transactional_id=TXN_ID)
    if not answer.done():
        await settle()
    return answer.result()[(TOPIC, 0)].error


NER = E.NOT_ENOUGH_REPLICAS
# (the verifier's outcome, TxnOffsetCommit v1, v3, v4, Produce v9, v11), as Kafka answers.
CASES = [
    ("not in the transaction", coordinator_answer(E.TRANSACTION_ABORTABLE),
     E.INVALID_TXN_STATE, E.INVALID_TXN_STATE, E.TRANSACTION_ABORTABLE,
     E.INVALID_TXN_STATE, E.TRANSACTION_ABORTABLE),
    ("fenced", coordinator_answer(E.PRODUCER_FENCED),
     E.INVALID_PRODUCER_EPOCH, E.INVALID_PRODUCER_EPOCH, E.INVALID_PRODUCER_EPOCH,
     E.INVALID_PRODUCER_EPOCH, E.INVALID_PRODUCER_EPOCH),
    ("not the coordinator", coordinator_answer(E.NOT_COORDINATOR),
     E.NOT_COORDINATOR, E.NOT_COORDINATOR, E.NOT_COORDINATOR, NER, NER),
    ("coordinator not available", coordinator_answer(E.COORDINATOR_NOT_AVAILABLE),
     E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_NOT_AVAILABLE,
     NER, NER),
    ("coordinator loading", coordinator_answer(E.COORDINATOR_LOAD_IN_PROGRESS),
     E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS,
     E.COORDINATOR_LOAD_IN_PROGRESS, NER, NER),
    ("ending a transaction", coordinator_answer(E.CONCURRENT_TRANSACTIONS),
     E.CONCURRENT_TRANSACTIONS, E.CONCURRENT_TRANSACTIONS, E.CONCURRENT_TRANSACTIONS,
     NER, NER),
    ("no answer (timeout, lost connection)", unanswered,
     E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS,
     E.COORDINATOR_LOAD_IN_PROGRESS, NER, NER),
    ("this broker may not ask", request_refused(E.CLUSTER_AUTHORIZATION_FAILED),
     E.INVALID_TXN_STATE, E.INVALID_TXN_STATE, E.INVALID_TXN_STATE,
     E.INVALID_TXN_STATE, E.INVALID_TXN_STATE),
]


@pytest.mark.parametrize(("outcome", "v1", "v3", "v4", "produce_v9", "produce_v11"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
async def test_the_client_is_told_what_kafka_tells_it(
        parts: Components, outcome: Outcome, v1: E, v3: E, v4: E, produce_v9: E,
        produce_v11: E) -> None:
    """TxnOffsetCommit asks about the group's offsets partition; NOT_COORDINATOR and
    COORDINATOR_NOT_AVAILABLE of the transaction coordinator reach its producer unchanged, as
    in Kafka (whose group coordinator converts only NETWORK_EXCEPTION and the append errors);
    a produce gets the retriable NOT_ENOUGH_REPLICAS for all of them."""
    asked = _remote(parts, outcome)
    offsets_tp = (OFFSETS_TOPIC, parts.coordinator.partition_for(GROUP))
    got = [await txn_offset_commit_error(parts, v) for v in (1, 3, 4)]
    assert got == [v1, v3, v4]
    assert asked == [[offsets_tp]] * 3
    assert [await produce_error(parts, v) for v in (9, 11)] == [produce_v9, produce_v11]
    assert parts.replica_manager.partitions[(TOPIC, 0)].log_end_offset == 0, "nothing appended"
