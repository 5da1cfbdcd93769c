"""Per-API authorization through the handlers, with Kafka's StandardAuthorizer turned on.

Each request is parsed from a client's bytes and carries a principal on its connection's
session, as SASL or a client certificate would set it. For each API: a principal without the
ACL Kafka requires gets Kafka's error and changes nothing (no record appended, no topic made or
removed, no group joined, no offset committed); with the ACL it works; a super user needs none.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    DescribeLogDirsRequest,
    DescribeProducersRequest,
    DescribeTopicPartitionsRequest,
    DescribeTransactionsRequest,
    IncrementalAlterConfigsRequest,
    ListGroupsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
    WriteTxnMarkersRequest,
)
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.apis import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    alter_configs,
    create_partitions,
    create_topics,
    delete_groups,
    delete_records,
    delete_topics,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_log_dirs,
    describe_producers,
    describe_topic_partitions,
    describe_transactions,
    end_txn,
    fetch,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    list_transactions,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    sync_group,
    txn_offset_commit,
    write_txn_markers,
)
from broker.apis.authorize import INT32_MIN
from broker.group.offset_cache import OffsetAndMetadata
from broker.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from broker.security.principal import KafkaPrincipal
from protocol.errors import ErrorCode
from tests.support.clients import BASE_TS
from tests.support.components import Components, build, parse, settle, wire_roundtrip
from tests.support.requests import (
    LATEST,
    fetch_request,
    fetched_values,
    list_offsets_request,
    produce_request,
    record_batch,
)

E = ErrorCode
Op = AclOperation
Rt = ResourceType
TOPIC, SECRET, GROUP, TID = "events", "secret", "readers", "txn-1"
ALICE = KafkaPrincipal("User", "alice")
ADMIN = KafkaPrincipal("User", "admin")
OVERRIDES = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:admin",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
}
TOPIC_OPS = {int(o) for o in (Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DELETE, Op.ALTER,
                              Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS)}


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic(TOPIC, 2, {})
    c.topics.create_topic(SECRET, 1, {})
    yield c
    await c.close()


def acl(rtype: ResourceType, name: str, op: AclOperation, *, principal: str = "User:alice",
        deny: bool = False, pattern: PatternType = PatternType.LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op,
                      AclPermissionType.DENY if deny else AclPermissionType.ALLOW)


def grant(c: Components, *bindings: AclBinding) -> None:
    assert c.context.authorizer.create_acls(list(bindings)) == [None] * len(bindings)


async def call(c: Components, handle: Callable[..., Any], request: Any,
               principal: KafkaPrincipal = ALICE, listener: str | None = None) -> Any:
    """The decoded response to ``request`` sent by ``principal``."""
    req = parse(request)
    req.connection.session.principal = principal
    if listener is not None:
        req.connection.session.listener = listener
    out = handle(c.context, req)
    if inspect.isawaitable(out):
        task = asyncio.ensure_future(out)
        await settle()
        assert task.done(), f"{req.spec.name} still waiting"
        out = task.result()
    assert out is not None
    return wire_roundtrip(req, out)


def leo(c: Components, topic: str, partition: int = 0) -> int:
    return c.replica_manager.partitions[(topic, partition)].log_end_offset


def produce_errors(resp: Any) -> dict[tuple[str, int], int]:
    return {(t.name, p.index): p.error_code for t in resp.responses
            for p in t.partition_responses}


def produce_two(topics: list[str], records: bytes, tid: str | None = None) -> Any:
    part = produce_request(TOPIC, records).topic_data[0].partition_data[0].__class__
    tdata = produce_request(TOPIC, records).topic_data[0].__class__
    req = produce_request(TOPIC, records)
    req.topic_data = [tdata(name=t, partition_data=[part(index=0, records=records)])
                      for t in topics]
    req.transactional_id = tid
    return req


def txn_batch(pid: int, epoch: int) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, True, pid, epoch, 0, 16 << 20)
    builder.append(0, BASE_TS, None, b"t", [])
    return bytes(builder.build())


# -- Produce and Fetch ---------------------------------------------------------------------------

async def test_produce_needs_write_on_the_topic(parts: Components) -> None:
    batch = record_batch([b"a", b"b"])
    resp = await call(parts, produce.handle, produce_request(TOPIC, batch))
    assert produce_errors(resp) == {(TOPIC, 0): E.TOPIC_AUTHORIZATION_FAILED}
    assert leo(parts, TOPIC) == 0
    # READ does not let anyone write; WRITE on a prefix does, for that topic only.
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.READ), acl(Rt.TOPIC, "ev", Op.WRITE,
                                                    pattern=PatternType.PREFIXED))
    resp = await call(parts, produce.handle, produce_two([TOPIC, SECRET], batch))
    assert produce_errors(resp) == {(TOPIC, 0): E.NONE, (SECRET, 0): E.TOPIC_AUTHORIZATION_FAILED}
    assert (leo(parts, TOPIC), leo(parts, SECRET)) == (2, 0)
    # A denied topic that does not exist answers the refusal, not its absence.
    resp = await call(parts, produce.handle, produce_request("nowhere", batch))
    assert produce_errors(resp) == {("nowhere", 0): E.TOPIC_AUTHORIZATION_FAILED}
    # acks=0: no answer, and nothing appended.
    assert produce.handle(parts.context, _as(parse(produce_request(SECRET, batch, acks=0)),
                                             ALICE)) is None
    assert leo(parts, SECRET) == 0


def _as(req: Any, principal: KafkaPrincipal) -> Any:
    req.connection.session.principal = principal
    return req


async def test_produce_by_a_super_user_needs_no_acl(parts: Components) -> None:
    resp = await call(parts, produce.handle, produce_request(SECRET, record_batch([b"x"])),
                      principal=ADMIN)
    assert produce_errors(resp) == {(SECRET, 0): E.NONE}
    assert leo(parts, SECRET) == 1


async def test_transactional_produce_needs_write_on_the_transactional_id(
        parts: Components) -> None:
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.WRITE))
    req = produce_two([TOPIC], txn_batch(7, 0), tid=TID)
    resp = await call(parts, produce.handle, req)
    assert produce_errors(resp) == {(TOPIC, 0): E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    assert leo(parts, TOPIC) == 0
    # With WRITE on the id the check passes on to the transaction (not begun: refused there).
    grant(parts, acl(Rt.TRANSACTIONAL_ID, TID, Op.WRITE))
    resp = await call(parts, produce.handle, produce_two([TOPIC], txn_batch(7, 0), tid=TID))
    assert produce_errors(resp)[(TOPIC, 0)] not in (
        E.NONE, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, E.TOPIC_AUTHORIZATION_FAILED)


async def test_fetch_needs_read_on_the_topic(parts: Components) -> None:
    parts.replica_manager.append_records([((TOPIC, 0), record_batch([b"a"])),
                                          ((SECRET, 0), record_batch([b"s"]))], 9)
    resp = await call(parts, fetch.handle, fetch_request([(TOPIC, 0, 0), (SECRET, 0, 0)],
                                                         max_wait_ms=0))
    assert {(t.topic, p.error_code) for t in resp.responses for p in t.partitions} == {
        (TOPIC, E.TOPIC_AUTHORIZATION_FAILED), (SECRET, E.TOPIC_AUTHORIZATION_FAILED)}
    assert all(not p.records for t in resp.responses for p in t.partitions)
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.READ))
    resp = await call(parts, fetch.handle, fetch_request([(TOPIC, 0, 0), (SECRET, 0, 0)],
                                                         max_wait_ms=0))
    got = {t.topic: p for t in resp.responses for p in t.partitions}
    assert got[TOPIC].error_code == E.NONE and fetched_values(got[TOPIC].records) == [(0, b"a")]
    assert (got[SECRET].error_code, got[SECRET].high_watermark) == (
        E.TOPIC_AUTHORIZATION_FAILED, -1)
    assert not got[SECRET].records


async def test_list_offsets_and_offset_for_leader_epoch_need_describe(parts: Components) -> None:
    resp = await call(parts, list_offsets.handle, list_offsets_request(TOPIC, LATEST))
    [p] = resp.topics[0].partitions
    assert (p.error_code, p.offset) == (E.TOPIC_AUTHORIZATION_FAILED, -1)
    req = OffsetForLeaderEpochRequest[4](replica_id=-1, topics=[
        OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=TOPIC, partitions=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                partition=0, current_leader_epoch=0, leader_epoch=0)])])
    resp = await call(parts, offset_for_leader_epoch.handle, req)
    assert resp.topics[0].partitions[0].error_code == E.TOPIC_AUTHORIZATION_FAILED
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.READ))  # READ implies DESCRIBE
    resp = await call(parts, list_offsets.handle, list_offsets_request(TOPIC, LATEST))
    assert resp.topics[0].partitions[0].error_code == E.NONE
    resp = await call(parts, offset_for_leader_epoch.handle, req)
    assert resp.topics[0].partitions[0].error_code == E.NONE


# -- Metadata and friends -----------------------------------------------------------------------

def metadata_request(names: list[str] | None, *, create: bool = False, version: int = 10,
                     ops: bool = False) -> Any:
    topics = None if names is None else [
        MetadataRequest.MetadataRequestTopic(topic_id=None, name=n) for n in names]
    args: dict[str, Any] = {"topics": topics, "allow_auto_topic_creation": create,
                            "include_topic_authorized_operations": ops}
    if version <= 10:
        args["include_cluster_authorized_operations"] = ops
    return MetadataRequest[version](**args)


async def test_metadata_lists_only_describable_topics(parts: Components) -> None:
    resp = await call(parts, metadata.handle, metadata_request(None))
    assert resp.topics == []
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.WRITE))
    resp = await call(parts, metadata.handle, metadata_request(None))
    assert [t.name for t in resp.topics] == [TOPIC]
    resp = await call(parts, metadata.handle, metadata_request(None), principal=ADMIN)
    assert {TOPIC, SECRET} <= {t.name for t in resp.topics}
    # Named: the secret topic and a missing one look alike, without a topic id.
    resp = await call(parts, metadata.handle, metadata_request([SECRET, "missing", TOPIC]))
    by_name = {t.name: t for t in resp.topics}
    assert by_name[TOPIC].error_code == E.NONE and len(by_name[TOPIC].partitions) == 2
    for name in (SECRET, "missing"):
        t = by_name[name]
        assert (t.error_code, t.partitions, t.is_internal, t.topic_id) == (
            E.TOPIC_AUTHORIZATION_FAILED, [], False, None)  # None: the zero uuid


async def test_metadata_auto_creates_only_with_create(parts: Components) -> None:
    grant(parts, acl(Rt.TOPIC, "auto-", Op.DESCRIBE, pattern=PatternType.PREFIXED))
    resp = await call(parts, metadata.handle, metadata_request(["auto-1"], create=True))
    assert [(t.name, t.error_code) for t in resp.topics] == [
        ("auto-1", E.TOPIC_AUTHORIZATION_FAILED)]
    assert "auto-1" not in parts.metadata.topics
    grant(parts, acl(Rt.TOPIC, "auto-1", Op.CREATE))
    resp = await call(parts, metadata.handle, metadata_request(["auto-1"], create=True))
    assert [(t.name, t.error_code) for t in resp.topics] == [("auto-1", E.NONE)]
    assert "auto-1" in parts.metadata.topics
    grant(parts, acl(Rt.CLUSTER, "kafka-cluster", Op.CREATE))
    resp = await call(parts, metadata.handle, metadata_request(["auto-2"], create=True))
    assert [(t.name, t.error_code) for t in resp.topics] == [("auto-2", E.NONE)]


async def test_metadata_authorized_operations_are_the_principals(parts: Components) -> None:
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.READ))
    resp = await call(parts, metadata.handle, metadata_request([TOPIC, SECRET], ops=True))
    by_name = {t.name: t for t in resp.topics}
    assert set(by_name[TOPIC].authorized_operations) == {int(Op.READ), int(Op.DESCRIBE)}
    assert by_name[SECRET].authorized_operations is None  # INT32_MIN: not computed
    assert resp.authorized_operations == set()  # no DESCRIBE on the cluster: 0
    resp = await call(parts, metadata.handle, metadata_request([SECRET], ops=True),
                      principal=ADMIN)
    assert set(resp.topics[0].authorized_operations) == TOPIC_OPS
    assert int(Op.DESCRIBE) in resp.authorized_operations


async def test_metadata_describe_cluster_and_coordinator_advertise_the_listener(
        parts: Components) -> None:
    node = parts.context.node
    node.endpoints.update({"PLAINTEXT": (node.host, node.port), "SASL_SSL": ("sec.example", 9094)})
    resp = await call(parts, metadata.handle, metadata_request(None), listener="SASL_SSL")
    assert [(b.host, b.port) for b in resp.brokers] == [("sec.example", 9094)]
    resp = await call(parts, describe_cluster.handle, DescribeClusterRequest[1](
        include_cluster_authorized_operations=True, endpoint_type=1), listener="SASL_SSL")
    assert [(b.host, b.port) for b in resp.brokers] == [("sec.example", 9094)]
    assert resp.authorized_operations == set()
    grant(parts, acl(Rt.GROUP, GROUP, Op.DESCRIBE))
    resp = await call(parts, find_coordinator.handle, FindCoordinatorRequest[3](
        key=GROUP, key_type=0), listener="SASL_SSL")
    assert (resp.error_code, resp.host, resp.port) == (E.NONE, "sec.example", 9094)
    resp = await call(parts, describe_cluster.handle, DescribeClusterRequest[1](
        include_cluster_authorized_operations=True, endpoint_type=1), principal=ADMIN)
    assert (resp.brokers[0].host, resp.brokers[0].port) == (node.host, node.port)
    assert int(Op.DESCRIBE) in resp.authorized_operations


async def test_describe_topic_partitions_pages_only_describable_topics(
        parts: Components) -> None:
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.WRITE))
    req = DescribeTopicPartitionsRequest[0](topics=[
        DescribeTopicPartitionsRequest.TopicRequest(name=n) for n in (SECRET, TOPIC)],
        response_partition_limit=100, cursor=None)
    resp = await call(parts, describe_topic_partitions.handle, req)
    by_name = {t.name: t for t in resp.topics}
    assert by_name[TOPIC].error_code == E.NONE and len(by_name[TOPIC].partitions) == 2
    assert by_name[TOPIC].topic_authorized_operations == (1 << Op.WRITE) | (1 << Op.DESCRIBE)
    assert (by_name[SECRET].error_code, by_name[SECRET].partitions,
            by_name[SECRET].topic_authorized_operations) == (
        E.TOPIC_AUTHORIZATION_FAILED, [], INT32_MIN)
    resp = await call(parts, describe_topic_partitions.handle, DescribeTopicPartitionsRequest[0](
        topics=[], response_partition_limit=100, cursor=None))
    assert [t.name for t in resp.topics] == [TOPIC]


# -- Topic administration ---------------------------------------------------------------------

def create_request(*names: str) -> Any:
    topic = CreateTopicsRequest.CreatableTopic
    return CreateTopicsRequest[7](timeout_ms=5000, validate_only=False, topics=[
        topic(name=n, num_partitions=1, replication_factor=1, assignments=[], configs=[])
        for n in names])


async def test_create_topics_needs_create(parts: Components) -> None:
    resp = await call(parts, create_topics.handle, create_request("new-1"))
    [t] = resp.topics
    assert (t.name, t.error_code, t.error_message) == (
        "new-1", E.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
    assert "new-1" not in parts.metadata.topics
    # CREATE on the topic creates it; without DESCRIBE_CONFIGS the configs stay hidden.
    grant(parts, acl(Rt.TOPIC, "new-1", Op.CREATE))
    resp = await call(parts, create_topics.handle, create_request("new-1", "new-2"))
    by_name = {t.name: t for t in resp.topics}
    t = by_name["new-1"]
    assert (t.error_code, t.topic_config_error_code, t.configs, t.num_partitions) == (
        E.NONE, E.TOPIC_AUTHORIZATION_FAILED, [], -1)
    assert by_name["new-2"].error_code == E.TOPIC_AUTHORIZATION_FAILED
    assert "new-1" in parts.metadata.topics and "new-2" not in parts.metadata.topics
    # CREATE on the cluster allows any name; DESCRIBE_CONFIGS shows the configs.
    grant(parts, acl(Rt.CLUSTER, "kafka-cluster", Op.CREATE),
          acl(Rt.TOPIC, "*", Op.DESCRIBE_CONFIGS))
    resp = await call(parts, create_topics.handle, create_request("new-2"))
    [t] = resp.topics
    assert (t.error_code, t.topic_config_error_code, t.num_partitions) == (E.NONE, E.NONE, 1)
    assert t.configs


async def test_delete_topics_needs_delete_and_hides_names(parts: Components) -> None:
    secret_id = parts.metadata.topics[SECRET].topic_id
    req = DeleteTopicsRequest[6](timeout_ms=5000, topics=[
        DeleteTopicsRequest.DeleteTopicState(name=SECRET, topic_id=None),
        DeleteTopicsRequest.DeleteTopicState(name=None, topic_id=secret_id),
        DeleteTopicsRequest.DeleteTopicState(name="ghost", topic_id=None)])
    resp = await call(parts, delete_topics.handle, req)
    assert [(r.name, r.error_code) for r in resp.responses] == [
        (SECRET, E.TOPIC_AUTHORIZATION_FAILED), (None, E.TOPIC_AUTHORIZATION_FAILED),
        ("ghost", E.TOPIC_AUTHORIZATION_FAILED)]
    assert SECRET in parts.metadata.topics
    # DESCRIBE reveals the name by id, and that a named topic does not exist.
    grant(parts, acl(Rt.TOPIC, "*", Op.DESCRIBE))
    resp = await call(parts, delete_topics.handle, req)
    assert [(r.name, r.error_code) for r in resp.responses] == [
        (SECRET, E.TOPIC_AUTHORIZATION_FAILED), (SECRET, E.TOPIC_AUTHORIZATION_FAILED),
        ("ghost", E.UNKNOWN_TOPIC_OR_PARTITION)]
    grant(parts, acl(Rt.TOPIC, SECRET, Op.DELETE))
    resp = await call(parts, delete_topics.handle, DeleteTopicsRequest[6](
        timeout_ms=5000, topics=[DeleteTopicsRequest.DeleteTopicState(name=None,
                                                                       topic_id=secret_id)]))
    assert [(r.name, r.error_code) for r in resp.responses] == [(SECRET, E.NONE)]
    assert SECRET not in parts.metadata.topics


async def test_create_partitions_needs_alter(parts: Components) -> None:
    req = CreatePartitionsRequest[3](timeout_ms=5000, validate_only=False, topics=[
        CreatePartitionsRequest.CreatePartitionsTopic(name=TOPIC, count=4, assignments=None)])
    resp = await call(parts, create_partitions.handle, req)
    assert [(r.name, r.error_code) for r in resp.results] == [
        (TOPIC, E.TOPIC_AUTHORIZATION_FAILED)]
    assert parts.metadata.topics[TOPIC].partitions == 2
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.ALTER))
    resp = await call(parts, create_partitions.handle, req)
    assert [(r.name, r.error_code) for r in resp.results] == [(TOPIC, E.NONE)]
    assert parts.metadata.topics[TOPIC].partitions == 4


async def test_delete_records_needs_delete(parts: Components) -> None:
    parts.replica_manager.append_records([((TOPIC, 0), record_batch([b"a", b"b"]))], 9)
    req = DeleteRecordsRequest[2](timeout_ms=5000, topics=[
        DeleteRecordsRequest.DeleteRecordsTopic(name=TOPIC, partitions=[
            DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(
                partition_index=0, offset=1)])])
    resp = await call(parts, delete_records.handle, req)
    [p] = resp.topics[0].partitions
    assert (p.error_code, p.low_watermark) == (E.TOPIC_AUTHORIZATION_FAILED, -1)
    assert parts.replica_manager.partitions[(TOPIC, 0)].log_start_offset == 0
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.DELETE))
    resp = await call(parts, delete_records.handle, req)
    assert resp.topics[0].partitions[0].error_code == E.NONE
    assert parts.replica_manager.partitions[(TOPIC, 0)].log_start_offset == 1


# -- Configs and log dirs ----------------------------------------------------------------------

async def test_configs_need_describe_configs_and_alter_configs(parts: Components) -> None:
    res = DescribeConfigsRequest.DescribeConfigsResource
    req = DescribeConfigsRequest[4](resources=[
        res(resource_type=4, resource_name="1", configuration_keys=None),
        res(resource_type=2, resource_name=TOPIC, configuration_keys=["retention.ms"])],
        include_synonyms=False, include_documentation=False)
    resp = await call(parts, describe_configs.handle, req)
    assert sorted((r.resource_type, r.error_code, r.error_message) for r in resp.results) == [
        (2, E.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed."),
        (4, E.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")]
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.ALTER_CONFIGS))  # implies DESCRIBE_CONFIGS
    resp = await call(parts, describe_configs.handle, req)
    by_type = {r.resource_type: r for r in resp.results}
    assert by_type[2].error_code == E.NONE and [c.name for c in by_type[2].configs] == [
        "retention.ms"]
    assert by_type[4].error_code == E.CLUSTER_AUTHORIZATION_FAILED

    alter = AlterConfigsRequest.AlterConfigsResource
    req = AlterConfigsRequest[2](resources=[
        alter(resource_type=2, resource_name=SECRET, configs=[
            alter.AlterableConfig(name="retention.ms", value="1000")]),
        alter(resource_type=4, resource_name="", configs=[
            alter.AlterableConfig(name="log.retention.ms", value="1000")])],
        validate_only=False)
    resp = await call(parts, alter_configs.handle, req)
    assert [(r.resource_name, r.error_code) for r in resp.responses] == [
        (SECRET, E.TOPIC_AUTHORIZATION_FAILED), ("", E.CLUSTER_AUTHORIZATION_FAILED)]
    assert parts.topics.topic_overrides(SECRET) == {}
    assert parts.topics.dynamic.overrides("") == {}

    inc = IncrementalAlterConfigsRequest.AlterConfigsResource
    req = IncrementalAlterConfigsRequest[1](resources=[inc(
        resource_type=2, resource_name=TOPIC, configs=[inc.AlterableConfig(
            name="retention.ms", config_operation=0, value="5000")])], validate_only=False)
    resp = await call(parts, incremental_alter_configs.handle, req)
    assert [r.error_code for r in resp.responses] == [E.NONE]
    assert parts.topics.topic_overrides(TOPIC) == {"retention.ms": "5000"}
    req = IncrementalAlterConfigsRequest[1](resources=[inc(
        resource_type=2, resource_name=SECRET, configs=[inc.AlterableConfig(
            name="retention.ms", config_operation=0, value="5000")])], validate_only=False)
    resp = await call(parts, incremental_alter_configs.handle, req)
    assert [r.error_code for r in resp.responses] == [E.TOPIC_AUTHORIZATION_FAILED]
    assert parts.topics.topic_overrides(SECRET) == {}


async def test_describe_log_dirs_needs_describe_on_the_cluster(parts: Components) -> None:
    req = DescribeLogDirsRequest[4](topics=None)
    resp = await call(parts, describe_log_dirs.handle, req)
    assert (resp.error_code, resp.results) == (E.CLUSTER_AUTHORIZATION_FAILED, [])
    grant(parts, acl(Rt.CLUSTER, "kafka-cluster", Op.DESCRIBE))
    resp = await call(parts, describe_log_dirs.handle, req)
    assert resp.error_code == E.NONE and len(resp.results) == 1


# -- Groups ------------------------------------------------------------------------------------

def join_request() -> Any:
    return JoinGroupRequest[9](
        group_id=GROUP, session_timeout_ms=6000, rebalance_timeout_ms=300_000, member_id="",
        group_instance_id=None, protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"s")],
        reason=None)


async def test_group_membership_needs_read_on_the_group(parts: Components) -> None:
    resp = await call(parts, join_group.handle, join_request())
    assert (resp.error_code, resp.generation_id, resp.member_id, resp.protocol_name) == (
        E.GROUP_AUTHORIZATION_FAILED, -1, "", None)
    assert GROUP not in parts.coordinator.groups
    resp = await call(parts, heartbeat.handle, HeartbeatRequest[4](
        group_id=GROUP, generation_id=1, member_id="m", group_instance_id=None))
    assert resp.error_code == E.GROUP_AUTHORIZATION_FAILED
    resp = await call(parts, sync_group.handle, SyncGroupRequest[5](
        group_id=GROUP, generation_id=1, member_id="m", group_instance_id=None,
        protocol_type="consumer", protocol_name="range", assignments=[]))
    assert (resp.error_code, resp.assignment) == (E.GROUP_AUTHORIZATION_FAILED, b"")
    resp = await call(parts, leave_group.handle, LeaveGroupRequest[4](group_id=GROUP, members=[
        LeaveGroupRequest.MemberIdentity(member_id="m", group_instance_id=None)]))
    assert (resp.error_code, resp.members) == (E.GROUP_AUTHORIZATION_FAILED, [])
    # DESCRIBE is not READ; READ lets the member join (the first join asks for a member id).
    grant(parts, acl(Rt.GROUP, GROUP, Op.DESCRIBE))
    resp = await call(parts, join_group.handle, join_request())
    assert resp.error_code == E.GROUP_AUTHORIZATION_FAILED
    grant(parts, acl(Rt.GROUP, GROUP, Op.READ))
    resp = await call(parts, join_group.handle, join_request())
    assert resp.error_code == E.MEMBER_ID_REQUIRED


async def test_find_coordinator_needs_describe_on_the_key(parts: Components) -> None:
    resp = await call(parts, find_coordinator.handle, FindCoordinatorRequest[4](
        key_type=0, coordinator_keys=[GROUP, "other"]))
    assert [(c.key, c.error_code, c.node_id) for c in resp.coordinators] == [
        (GROUP, E.GROUP_AUTHORIZATION_FAILED, -1), ("other", E.GROUP_AUTHORIZATION_FAILED, -1)]
    resp = await call(parts, find_coordinator.handle, FindCoordinatorRequest[2](
        key=TID, key_type=1))
    assert (resp.error_code, resp.node_id, resp.error_message) == (
        E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, "Transactional Id authorization failed.")
    grant(parts, acl(Rt.GROUP, GROUP, Op.READ), acl(Rt.TRANSACTIONAL_ID, TID, Op.WRITE))
    resp = await call(parts, find_coordinator.handle, FindCoordinatorRequest[4](
        key_type=0, coordinator_keys=[GROUP, "other"]))
    assert [(c.key, c.error_code) for c in resp.coordinators] == [
        (GROUP, E.NONE), ("other", E.GROUP_AUTHORIZATION_FAILED)]
    resp = await call(parts, find_coordinator.handle, FindCoordinatorRequest[2](
        key=TID, key_type=1))
    assert resp.error_code == E.NONE


def commit_request(group: str, topics: list[str]) -> Any:
    topic = OffsetCommitRequest.OffsetCommitRequestTopic
    return OffsetCommitRequest[8](
        group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=[topic(name=t, partitions=[topic.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=5, committed_leader_epoch=-1,
            committed_metadata="")]) for t in topics])


def commit_errors(resp: Any) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


async def test_offset_commit_needs_read_on_the_group_then_the_topic(parts: Components) -> None:
    resp = await call(parts, offset_commit.handle, commit_request(GROUP, [TOPIC]))
    assert commit_errors(resp) == {(TOPIC, 0): E.GROUP_AUTHORIZATION_FAILED}
    assert GROUP not in parts.coordinator.groups
    grant(parts, acl(Rt.GROUP, GROUP, Op.READ), acl(Rt.TOPIC, TOPIC, Op.READ))
    resp = await call(parts, offset_commit.handle, commit_request(GROUP, [TOPIC, SECRET]))
    assert commit_errors(resp) == {(TOPIC, 0): E.NONE, (SECRET, 0): E.TOPIC_AUTHORIZATION_FAILED}
    found = parts.coordinator.fetch_offsets(GROUP, [(TOPIC, 0), (SECRET, 0)])
    assert found[(SECRET, 0)] is None and found[(TOPIC, 0)].offset == 5


async def test_offset_fetch_needs_describe_on_the_group_and_filters_topics(
        parts: Components) -> None:
    parts.coordinator.groups.clear()
    admin_commit = await call(parts, offset_commit.handle, commit_request(GROUP, [TOPIC, SECRET]),
                              principal=ADMIN)
    assert set(commit_errors(admin_commit).values()) == {E.NONE}
    group = OffsetFetchRequest.OffsetFetchRequestGroup
    named = OffsetFetchRequest[8](groups=[group(group_id=GROUP, topics=[
        group.OffsetFetchRequestTopics(name=t, partition_indexes=[0]) for t in (TOPIC, SECRET)])],
        require_stable=False)
    resp = await call(parts, offset_fetch.handle, named)
    assert [(g.group_id, g.error_code, g.topics) for g in resp.groups] == [
        (GROUP, E.GROUP_AUTHORIZATION_FAILED, [])]
    old = OffsetFetchRequest[5](group_id=GROUP, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0])])
    resp = await call(parts, offset_fetch.handle, old)
    assert (resp.error_code, resp.topics) == (E.GROUP_AUTHORIZATION_FAILED, [])
    v1 = OffsetFetchRequest[1](group_id=GROUP, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0])])
    resp = await call(parts, offset_fetch.handle, v1)
    assert [(p.partition_index, p.error_code) for t in resp.topics for p in t.partitions] == [
        (0, E.GROUP_AUTHORIZATION_FAILED)]

    grant(parts, acl(Rt.GROUP, GROUP, Op.DESCRIBE), acl(Rt.TOPIC, TOPIC, Op.DESCRIBE))
    resp = await call(parts, offset_fetch.handle, named)
    [g] = resp.groups
    assert g.error_code == E.NONE
    assert {(t.name, p.committed_offset, p.error_code) for t in g.topics for p in t.partitions} == {
        (TOPIC, 5, E.NONE), (SECRET, -1, E.TOPIC_AUTHORIZATION_FAILED)}
    every = OffsetFetchRequest[8](groups=[group(group_id=GROUP, topics=None)],
                                  require_stable=False)
    resp = await call(parts, offset_fetch.handle, every)
    assert [(t.name, p.committed_offset) for t in resp.groups[0].topics
            for p in t.partitions] == [(TOPIC, 5)]


async def test_describe_list_and_delete_groups(parts: Components) -> None:
    for gid in (GROUP, "hidden"):
        await call(parts, offset_commit.handle, commit_request(gid, [TOPIC]), principal=ADMIN)
    resp = await call(parts, list_groups.handle, ListGroupsRequest[4](states_filter=[]))
    assert resp.groups == []
    resp = await call(parts, describe_groups.handle, DescribeGroupsRequest[5](
        groups=[GROUP], include_authorized_operations=True))
    [g] = resp.groups
    assert (g.error_code, g.group_state, g.authorized_operations) == (
        E.GROUP_AUTHORIZATION_FAILED, "", None)
    grant(parts, acl(Rt.GROUP, GROUP, Op.DESCRIBE))
    resp = await call(parts, list_groups.handle, ListGroupsRequest[4](states_filter=[]))
    assert [g.group_id for g in resp.groups] == [GROUP]
    resp = await call(parts, describe_groups.handle, DescribeGroupsRequest[5](
        groups=[GROUP, "hidden"], include_authorized_operations=True))
    by_id = {g.group_id: g for g in resp.groups}
    assert by_id[GROUP].error_code == E.NONE
    assert set(by_id[GROUP].authorized_operations) == {int(Op.DESCRIBE)}
    assert by_id["hidden"].error_code == E.GROUP_AUTHORIZATION_FAILED
    resp = await call(parts, list_groups.handle, ListGroupsRequest[4](states_filter=[]),
                      principal=ADMIN)
    assert {g.group_id for g in resp.groups} >= {GROUP, "hidden"}

    resp = await call(parts, delete_groups.handle, DeleteGroupsRequest[2](
        groups_names=[GROUP, "hidden"]))
    assert {(r.group_id, r.error_code) for r in resp.results} == {
        (GROUP, E.GROUP_AUTHORIZATION_FAILED), ("hidden", E.GROUP_AUTHORIZATION_FAILED)}
    assert {GROUP, "hidden"} <= set(parts.coordinator.groups)
    grant(parts, acl(Rt.GROUP, GROUP, Op.DELETE))
    resp = await call(parts, delete_groups.handle, DeleteGroupsRequest[2](
        groups_names=[GROUP, "hidden"]))
    assert {(r.group_id, r.error_code) for r in resp.results} == {
        (GROUP, E.NONE), ("hidden", E.GROUP_AUTHORIZATION_FAILED)}
    assert GROUP not in parts.coordinator.groups and "hidden" in parts.coordinator.groups


async def test_offset_delete_needs_delete_on_the_group_and_read_on_the_topic(
        parts: Components) -> None:
    await call(parts, offset_commit.handle, commit_request(GROUP, [TOPIC, SECRET]),
               principal=ADMIN)
    topic = OffsetDeleteRequest.OffsetDeleteRequestTopic
    req = OffsetDeleteRequest[0](group_id=GROUP, topics=[
        topic(name=t, partitions=[topic.OffsetDeleteRequestPartition(partition_index=0)])
        for t in (TOPIC, SECRET)])
    resp = await call(parts, offset_delete.handle, req)
    assert (resp.error_code, resp.topics) == (E.GROUP_AUTHORIZATION_FAILED, [])
    grant(parts, acl(Rt.GROUP, GROUP, Op.DELETE), acl(Rt.TOPIC, TOPIC, Op.READ))
    resp = await call(parts, offset_delete.handle, req)
    assert resp.error_code == E.NONE
    assert commit_errors(resp) == {(TOPIC, 0): E.NONE, (SECRET, 0): E.TOPIC_AUTHORIZATION_FAILED}
    found = parts.coordinator.fetch_offsets(GROUP, [(TOPIC, 0), (SECRET, 0)])
    assert found[(TOPIC, 0)] is None and isinstance(found[(SECRET, 0)], OffsetAndMetadata)


# -- Transactions ------------------------------------------------------------------------------

def init_request(tid: str | None) -> Any:
    return InitProducerIdRequest[4](transactional_id=tid, transaction_timeout_ms=60_000,
                                    producer_id=-1, producer_epoch=-1)


async def test_init_producer_id(parts: Components) -> None:
    resp = await call(parts, init_producer_id.handle, init_request(TID))
    assert (resp.error_code, resp.producer_id, resp.producer_epoch) == (
        E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
    assert parts.transactions.transactions == {}
    resp = await call(parts, init_producer_id.handle, init_request(None))
    assert (resp.error_code, resp.producer_id) == (E.CLUSTER_AUTHORIZATION_FAILED, -1)
    # Idempotence: WRITE on some topic (here any topic with a prefix) is enough, as Kafka 3+.
    grant(parts, acl(Rt.TOPIC, "ev", Op.WRITE, pattern=PatternType.PREFIXED))
    resp = await call(parts, init_producer_id.handle, init_request(None))
    assert resp.error_code == E.NONE and resp.producer_id >= 0
    resp = await call(parts, init_producer_id.handle, init_request(None),
                      principal=KafkaPrincipal("User", "bob"))
    assert resp.error_code == E.CLUSTER_AUTHORIZATION_FAILED
    grant(parts, acl(Rt.CLUSTER, "kafka-cluster", Op.IDEMPOTENT_WRITE, principal="User:bob"))
    resp = await call(parts, init_producer_id.handle, init_request(None),
                      principal=KafkaPrincipal("User", "bob"))
    assert resp.error_code == E.NONE
    grant(parts, acl(Rt.TRANSACTIONAL_ID, TID, Op.WRITE))
    resp = await call(parts, init_producer_id.handle, init_request(TID))
    assert (resp.error_code, resp.producer_epoch) == (E.NONE, 0)


def add_request(version: int, pid: int, epoch: int, tps: list[tuple[str, int]]) -> Any:
    topics = [AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=[p])
              for t, p in tps]
    if version < 4:
        return AddPartitionsToTxnRequest[version](
            v3_and_below_transactional_id=TID, v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch, v3_and_below_topics=topics)
    return AddPartitionsToTxnRequest[version](transactions=[
        AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction(
            transactional_id=TID, producer_id=pid, producer_epoch=epoch, verify_only=False,
            topics=topics)])


def add_errors(resp: Any) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.partition_error_code
            for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition}


async def test_transaction_apis(parts: Components) -> None:
    grant(parts, acl(Rt.TRANSACTIONAL_ID, TID, Op.WRITE, principal="User:admin"))
    r = await call(parts, init_producer_id.handle, init_request(TID), principal=ADMIN)
    pid, epoch = r.producer_id, r.producer_epoch
    # AddPartitionsToTxn: the id first, then each topic.
    resp = await call(parts, add_partitions_to_txn.handle,
                      add_request(3, pid, epoch, [(TOPIC, 0)]))
    assert add_errors(resp) == {(TOPIC, 0): E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    grant(parts, acl(Rt.TRANSACTIONAL_ID, TID, Op.WRITE), acl(Rt.TOPIC, TOPIC, Op.WRITE))
    resp = await call(parts, add_partitions_to_txn.handle,
                      add_request(3, pid, epoch, [(TOPIC, 0), (SECRET, 0)]))
    assert add_errors(resp) == {(TOPIC, 0): E.OPERATION_NOT_ATTEMPTED,
                                (SECRET, 0): E.TOPIC_AUTHORIZATION_FAILED}
    assert parts.transactions.describe(TID).partitions == []
    # v4+ comes from brokers: CLUSTER_ACTION.
    resp = await call(parts, add_partitions_to_txn.handle,
                      add_request(4, pid, epoch, [(TOPIC, 0)]))
    assert (resp.error_code, resp.results_by_transaction) == (
        E.CLUSTER_AUTHORIZATION_FAILED, [])
    resp = await call(parts, add_partitions_to_txn.handle,
                      add_request(3, pid, epoch, [(TOPIC, 0)]))
    assert add_errors(resp) == {(TOPIC, 0): E.NONE}
    await settle()

    # AddOffsetsToTxn: the id, then READ on the group.
    offsets_req = AddOffsetsToTxnRequest[3](transactional_id=TID, producer_id=pid,
                                            producer_epoch=epoch, group_id=GROUP)
    resp = await call(parts, add_offsets_to_txn.handle, offsets_req,
                      principal=KafkaPrincipal("User", "bob"))
    assert resp.error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    resp = await call(parts, add_offsets_to_txn.handle, offsets_req)
    assert resp.error_code == E.GROUP_AUTHORIZATION_FAILED
    # TxnOffsetCommit: the id, then the group, then each topic.
    topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    commit = TxnOffsetCommitRequest[3](
        transactional_id=TID, group_id=GROUP, producer_id=pid, producer_epoch=epoch,
        generation_id=-1, member_id="", group_instance_id=None,
        topics=[topic(name=t, partitions=[topic.TxnOffsetCommitRequestPartition(
            partition_index=0, committed_offset=3, committed_leader_epoch=-1,
            committed_metadata="")]) for t in (TOPIC, SECRET)])
    resp = await call(parts, txn_offset_commit.handle, commit,
                      principal=KafkaPrincipal("User", "bob"))
    assert set(commit_errors(resp).values()) == {E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    resp = await call(parts, txn_offset_commit.handle, commit)
    assert set(commit_errors(resp).values()) == {E.GROUP_AUTHORIZATION_FAILED}
    grant(parts, acl(Rt.GROUP, GROUP, Op.READ), acl(Rt.TOPIC, TOPIC, Op.READ))
    resp = await call(parts, add_offsets_to_txn.handle, offsets_req)
    assert resp.error_code == E.NONE
    await settle()
    resp = await call(parts, txn_offset_commit.handle, commit)
    assert commit_errors(resp) == {(TOPIC, 0): E.NONE, (SECRET, 0): E.TOPIC_AUTHORIZATION_FAILED}

    # EndTxn: WRITE on the id.
    end = EndTxnRequest[3](transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                           committed=True)
    resp = await call(parts, end_txn.handle, end, principal=KafkaPrincipal("User", "bob"))
    assert resp.error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert parts.transactions.describe(TID).state == "Ongoing"
    resp = await call(parts, end_txn.handle, end)
    assert resp.error_code == E.NONE


async def test_write_txn_markers_needs_alter_or_cluster_action(parts: Components) -> None:
    marker = WriteTxnMarkersRequest.WritableTxnMarker
    req = WriteTxnMarkersRequest[1](markers=[marker(
        producer_id=5, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
        topics=[marker.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=[0])])])
    resp = await call(parts, write_txn_markers.handle, req)
    [m] = resp.markers
    assert [(t.name, p.partition_index, p.error_code) for t in m.topics
            for p in t.partitions] == [(TOPIC, 0, E.CLUSTER_AUTHORIZATION_FAILED)]
    assert leo(parts, TOPIC) == 0
    grant(parts, acl(Rt.CLUSTER, "kafka-cluster", Op.CLUSTER_ACTION))
    resp = await call(parts, write_txn_markers.handle, req)
    assert resp.markers[0].topics[0].partitions[0].error_code == E.NONE
    assert leo(parts, TOPIC) == 1


async def test_describe_and_list_transactions_and_producers(parts: Components) -> None:
    grant(parts, acl(Rt.TRANSACTIONAL_ID, TID, Op.WRITE, principal="User:admin"))
    await call(parts, init_producer_id.handle, init_request(TID), principal=ADMIN)
    resp = await call(parts, list_transactions.handle, ListTransactionsRequest[1](
        state_filters=[], producer_id_filters=[], duration_filter=-1))
    assert resp.transaction_states == []
    resp = await call(parts, describe_transactions.handle, DescribeTransactionsRequest[0](
        transactional_ids=[TID]))
    assert resp.transaction_states[0].error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    grant(parts, acl(Rt.TRANSACTIONAL_ID, TID, Op.DESCRIBE))
    resp = await call(parts, list_transactions.handle, ListTransactionsRequest[1](
        state_filters=[], producer_id_filters=[], duration_filter=-1))
    assert [t.transactional_id for t in resp.transaction_states] == [TID]
    resp = await call(parts, describe_transactions.handle, DescribeTransactionsRequest[0](
        transactional_ids=[TID]))
    assert resp.transaction_states[0].error_code == E.NONE

    req = DescribeProducersRequest[0](topics=[DescribeProducersRequest.TopicRequest(
        name=TOPIC, partition_indexes=[0, 1])])
    resp = await call(parts, describe_producers.handle, req)
    assert [(p.partition_index, p.error_code) for p in resp.topics[0].partitions] == [
        (0, E.TOPIC_AUTHORIZATION_FAILED), (1, E.TOPIC_AUTHORIZATION_FAILED)]
    grant(parts, acl(Rt.TOPIC, TOPIC, Op.READ))
    resp = await call(parts, describe_producers.handle, req)
    assert [p.error_code for p in resp.topics[0].partitions] == [E.NONE, E.NONE]


# -- Deny and removal ---------------------------------------------------------------------------

async def test_a_deny_acl_wins_and_removing_an_acl_takes_effect_at_once(
        parts: Components) -> None:
    grant(parts, acl(Rt.TOPIC, "*", Op.WRITE), acl(Rt.TOPIC, SECRET, Op.WRITE, deny=True))
    resp = await call(parts, produce.handle, produce_two([TOPIC, SECRET], record_batch([b"v"])))
    assert produce_errors(resp) == {(TOPIC, 0): E.NONE, (SECRET, 0): E.TOPIC_AUTHORIZATION_FAILED}
    parts.context.authorizer.delete_acls([AclBindingFilter(
        Rt.TOPIC, "*", PatternType.LITERAL, None, None, Op.ANY, AclPermissionType.ANY)])
    resp = await call(parts, produce.handle, produce_request(TOPIC, record_batch([b"w"])))
    assert produce_errors(resp) == {(TOPIC, 0): E.TOPIC_AUTHORIZATION_FAILED}
    assert leo(parts, TOPIC) == 1
    assert parts.context.authorizer.denials[("WRITE", "TOPIC")] >= 2
