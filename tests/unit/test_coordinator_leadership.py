"""The coordinators' load and unload transitions (cluster mode's onElection / onResignation),
on the broker's real parts: a partition not led answers NOT_COORDINATOR, one being loaded
COORDINATOR_LOAD_IN_PROGRESS; loading reads the partition's groups and offsets (or
transactions) back from its log; unloading answers parked JoinGroups NOT_COORDINATOR and
drops only that partition's state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kafka.protocol.admin import ListGroupsRequest

from broker.apis import list_groups
from broker.group.classic_group import GroupState
from broker.group.offset_cache import OffsetAndMetadata
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode
from tests.support.components import Components, build, parse, settle

PARTITIONS = 3
OVERRIDES = {"offsets.topic.num.partitions": str(PARTITIONS),
             "transaction.state.log.num.partitions": str(PARTITIONS)}
OM = OffsetAndMetadata(42, 3, "checkpoint", 1_700_000_000_000)


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic("orders", 1, {})
    # The topics exist (in cluster mode the controller makes them); then only led partitions
    # are coordinated.
    c.offsets_store.ensure_topic()
    c.transactions.ensure_topic()
    c.coordinator.follow_partition_leadership()
    c.transactions.follow_partition_leadership()
    yield c
    await c.close()


def two_groups(c: Components) -> tuple[str, str]:
    """Two group ids of different partitions."""
    by_partition: dict[int, str] = {}
    for i in range(100):
        by_partition.setdefault(c.coordinator.partition_for(f"g{i}"), f"g{i}")
    return by_partition[0], by_partition[1]


async def commit(c: Components, group: str) -> ErrorCode:
    done = c.coordinator.commit_offsets(group, "", None, -1, {("orders", 0): OM})
    await settle()
    assert isinstance(done, Completion) and done.done()
    return done.result()[("orders", 0)]


async def test_groups_follow_their_partitions_leadership(parts: Components) -> None:
    c, groups = parts, parts.coordinator
    g, other = two_groups(c)
    p, q = groups.partition_for(g), groups.partition_for(other)
    assert await commit(c, g) == ErrorCode.NOT_COORDINATOR  # not led: nothing loaded
    assert groups.heartbeat(g, "m", None, 1) == ErrorCode.NOT_COORDINATOR

    groups.begin_loading(p)
    assert await commit(c, g) == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert groups.coordinator_error(g) == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert groups.leave_group(g, [("m", None)]) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                                   [ErrorCode.COORDINATOR_LOAD_IN_PROGRESS])
    listed = list_groups.handle(c.context, parse(ListGroupsRequest[4](states_filter=[])))
    assert listed.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    groups.load_partition(p)
    groups.load_partition(q)
    listed = list_groups.handle(c.context, parse(ListGroupsRequest[4](states_filter=[])))
    assert listed.error_code == ErrorCode.NONE
    assert await commit(c, g) == ErrorCode.NONE
    assert await commit(c, other) == ErrorCode.NONE
    assert groups.fetch_offsets(g, [("orders", 0)]) == {("orders", 0): OM}

    # A member parked in its first rebalance (the initial delay) is answered NOT_COORDINATOR
    # when the partition goes; the group and its offsets leave this broker; the other stays.
    first = groups.join_group(g, "", None, True, "client", "/127.0.0.1", 60_000, 10_000,
                              "consumer", [("range", b"")])
    member = first.result().member_id
    parked = groups.join_group(g, member, None, True, "client", "/127.0.0.1", 60_000, 10_000,
                               "consumer", [("range", b"")])
    assert isinstance(parked, Completion) and not parked.done()
    group = groups.groups.classic(g)
    groups.unload_partition(p)
    assert parked.done() and parked.result().error == ErrorCode.NOT_COORDINATOR
    assert group.state == GroupState.DEAD and g not in groups.groups
    assert await commit(c, g) == ErrorCode.NOT_COORDINATOR
    assert groups.coordinator_error(other) is None
    assert groups.fetch_offsets(other, [("orders", 0)]) == {("orders", 0): OM}
    await c.advance(120_000)  # the dropped session and join deadlines do nothing
    assert g not in groups.groups

    # Led again: the offsets come back from the log.
    groups.begin_loading(p)
    groups.load_partition(p)
    assert groups.coordinator_error(g) is None
    assert groups.fetch_offsets(g, [("orders", 0)]) == {("orders", 0): OM}


async def test_transactions_follow_their_partitions_leadership(parts: Components) -> None:
    txns = parts.transactions
    tid = "producer-1"
    p = txns.partition_for(tid)
    refused = txns.init_producer_id(tid, 60_000)
    assert refused.result().error == ErrorCode.NOT_COORDINATOR

    assert txns.list_transactions().error == ErrorCode.NONE  # nothing led: nothing listed
    txns.begin_loading(p)
    loading = txns.init_producer_id(tid, 60_000)
    assert loading.result().error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert txns.describe(tid).error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    # Kafka's listTransactionStates: nothing listed while a partition led here loads.
    listing = txns.list_transactions()
    assert (listing.error, listing.transactions) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, [])
    txns.load_partition(p)
    init = txns.init_producer_id(tid, 60_000)
    await settle()
    result = init.result()
    assert result.error == ErrorCode.NONE
    added = txns.add_partitions(tid, result.producer_id, result.producer_epoch, [("orders", 0)])
    await settle()
    assert added.result() == ErrorCode.NONE
    listing = txns.list_transactions()
    assert listing.error == ErrorCode.NONE
    assert [t.transactional_id for t in listing.transactions] == [tid]

    txns.unload_partition(p)
    assert tid not in txns.transactions
    gone = txns.add_partitions(tid, result.producer_id, result.producer_epoch, [("orders", 0)])
    assert gone.result() == ErrorCode.NOT_COORDINATOR
    assert txns.describe(tid).error == ErrorCode.NOT_COORDINATOR

    txns.load_partition(p)  # led again: the ongoing transaction read back from the log
    md = txns.transactions[tid]
    assert (md.producer_id, md.producer_epoch) == (result.producer_id, result.producer_epoch)
    assert md.state.kafka_name == "Ongoing" and md.topic_partitions == {("orders", 0)}
