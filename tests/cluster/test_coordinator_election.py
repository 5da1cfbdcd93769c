"""The group coordinator follows the leadership of `__consumer_offsets`' partitions as the
store tells it (Kafka's onElection / onResignation through onLeadershipChange): a broker's real
replica manager and coordinators behind ``ClusterReplicas`` and the server's
``CoordinatorLeadership``, the partition states written by the controller and by hand, on a
real etcd and the in-process store."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cluster.broker_node import ClusterReplicas
from broker.cluster.partition_watcher import LocalReplicaTransitions
from broker.cluster.topic_state import PartitionState, state_key
from broker.group.coordinator import GroupCoordinator
from broker.group.offset_cache import OffsetAndMetadata
from broker.group.offsets_store import TOPIC
from broker.replica.delayed_result import Completion
from broker.wiring import CoordinatorLeadership
from protocol.errors import ErrorCode
from tests.cluster.conftest import Backend
from tests.cluster.test_topics import cluster, controller_of, stop_all
from tests.support.components import build, settle

pytestmark = pytest.mark.timeout(90)

OM = OffsetAndMetadata(42, 3, "checkpoint", 1_700_000_000_000)


def owned(groups: GroupCoordinator) -> set[int]:
    assert groups.ownership is not None
    return groups.ownership.owned


async def test_the_group_coordinator_follows_its_partitions_leadership(
        backend: Backend, tmp_path: Path) -> None:
    nodes = await cluster(backend, 2)
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "3"})
    groups = c.coordinator
    groups.follow_partition_leadership()
    c.transactions.follow_partition_leadership()
    node = nodes[0]
    c.replica_manager.broker_id = node.node_id  # as ClusterNode.join sets it
    replicas = ClusterReplicas(node.store, c.replica_manager, c.log_manager,
                               c.topics.log_config,
                               leadership=[CoordinatorLeadership(groups, c.transactions,
                                                                 node.cache)])
    replicas.start()
    node.watcher.listeners.append(LocalReplicaTransitions(node.node_id, replicas))
    try:
        c.topics.create_topic("orders", 1, {})
        me, other = nodes[0].node_id, nodes[1].node_id
        assert (await controller_of(nodes).create_topic(
            TOPIC, assignment={0: [me], 1: [other], 2: [me]},
            configs={"cleanup.policy": "compact"})).ok
        assert await backend.eventually(lambda: owned(groups) == {0, 2}, within_s=5)
        by_partition: dict[int, str] = {}
        for i in range(100):
            by_partition.setdefault(groups.partition_for(f"g{i}"), f"g{i}")
        mine, theirs = by_partition[0], by_partition[1]

        async def commit(group: str) -> ErrorCode:
            done = groups.commit_offsets(group, "", None, -1, {("orders", 0): OM})
            for _ in range(50):
                await settle()
                if done.done():
                    break
            assert isinstance(done, Completion) and done.done()
            return done.result()[("orders", 0)]

        assert await commit(mine) == ErrorCode.NONE
        assert await commit(theirs) == ErrorCode.NOT_COORDINATOR

        # Partition 0 goes offline (its leader -1, as the controller writes for a lost
        # broker): unloaded here.
        await backend.store.put(state_key(TOPIC, 0), PartitionState(-1, 1, [me], 1).encode())
        assert await backend.eventually(lambda: owned(groups) == {2}, within_s=5)
        assert mine not in groups.groups
        assert await commit(mine) == ErrorCode.NOT_COORDINATOR

        # Led again in a newer epoch: loaded back from the partition's log.
        await backend.store.put(state_key(TOPIC, 0), PartitionState(me, 2, [me], 1).encode())
        assert await backend.eventually(lambda: owned(groups) == {0, 2}, within_s=5)
        assert groups.fetch_offsets(mine, [("orders", 0)]) == {("orders", 0): OM}
    finally:
        await replicas.stop()
        await c.close()
        await stop_all(nodes)
