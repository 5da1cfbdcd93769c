"""The consistency checker against an EmbeddedCluster of three brokers: a topic with three
replicas and min.insync.replicas 2, idempotent producers with acks=all, and faults aimed at
the partitions' leaders. Kafka's promise holds there: every acknowledged record is read, once
and in order, whatever leader crashed or was moved meanwhile.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from bench.consistency.__main__ import CLUSTER_DEFAULTS
from bench.consistency.faults import ClusterTarget
from bench.consistency.workload import Workload, run_check
from broker.testing import EmbeddedCluster


@pytest.mark.timeout(120)
def test_leader_crash_and_move_lose_nothing(
        mini_broker_cluster_factory: Callable[..., EmbeddedCluster]) -> None:
    topic = f"consistency-{uuid.uuid4().hex[:8]}"
    # Producing lasts until both faults are healed (the kill's heal waits for the crashed
    # broker's lease to expire and for every ISR to be whole again): a few hundred records at
    # this rate; the budget only bounds a cluster that never heals.
    workload = Workload(topic=topic, partitions=3, replication_factor=3, min_insync_replicas=2,
                        duration_s=3, records=4000, rate=40, faults=["kill", "move-leader"],
                        fault_interval_s=1, fault_duration_s=0.5, fault_count=2,
                        drain_timeout_s=20)
    with mini_broker_cluster_factory(nodes=3, **CLUSTER_DEFAULTS) as cluster:
        result = run_check(ClusterTarget(cluster, topic, 3), workload)
        counts = cluster.fault_counts
        assert all(sorted(cluster.replicas(topic, p)) == [1, 2, 3] for p in range(3))
    assert len(result.faults) == 2, result.faults
    kill, move = result.faults
    assert (kill.kind, move.kind) == ("kill", "move-leader")
    assert all(f.error is None and f.end_s is not None for f in result.faults), result.faults
    assert f"leader of {topic}-" in kill.detail, kill.detail  # the crash hit a leader
    assert f"to {move.node}" in move.detail, move.detail
    assert counts[("kill", "broker")] == 1 and counts[("move_leader", "controller")] == 1
    h = result.history
    assert h.drained
    assert result.analysis.ok, result.analysis.to_dict()
    acked = {s.value for s in h.sends if h.acknowledged(s)}
    read = {r.value for p in h.polls() for r in p.records}
    assert len(acked) > 200 and acked <= read
    assert result.analysis.read == result.analysis.acknowledged == len(acked)
    assert min(s.sent_s for s in h.sends) < kill.start_s  # producing when the leader crashed
