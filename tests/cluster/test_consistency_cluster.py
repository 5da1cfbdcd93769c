"""The consistency checker against an EmbeddedCluster of three brokers: a topic with three
replicas and min.insync.replicas 2, idempotent producers with acks=all, and faults aimed at
the partitions' leaders. Kafka's promise holds there: every acknowledged record is read, once
and in order, whatever leader crashed, stalled, was cut off or was moved meanwhile.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from bench.consistency.__main__ import CLUSTER_DEFAULTS
from bench.consistency.faults import ClusterTarget
from bench.consistency.workload import Result, Workload, run_check
from broker.testing import EmbeddedCluster


def run_on_cluster(make: Callable[..., EmbeddedCluster], faults: list[str],
                   fault_s: float = 1.0) -> tuple[Result, dict[tuple[str, str], int]]:
    """The workload on a fresh cluster of three, one fault of each kind in turn, each held
    ``fault_s``; the result and the cluster's count of the faults that fired."""
    topic = f"consistency-{uuid.uuid4().hex[:8]}"
    # Producing lasts until the faults are healed (a heal waits for every broker to be
    # registered and every ISR to be whole again): a few hundred records at this rate; the
    # budget only bounds a cluster that never heals.
    workload = Workload(topic=topic, partitions=3, replication_factor=3, min_insync_replicas=2,
                        duration_s=3, records=4000, rate=40, faults=faults,
                        fault_interval_s=1, fault_duration_s=fault_s, fault_count=len(faults),
                        drain_timeout_s=20)
    with make(nodes=3, **CLUSTER_DEFAULTS) as cluster:
        result = run_check(ClusterTarget(cluster, topic, 3), workload)
        assert all(sorted(cluster.replicas(topic, p)) == [1, 2, 3] for p in range(3))
        return result, cluster.fault_counts


def assert_nothing_lost(result: Result) -> None:
    """Every fault began and was healed; every acknowledged record was read, and nothing
    else went wrong; the producers were producing when the first fault began."""
    assert [f.kind for f in result.faults] == list(result.workload.faults), result.faults
    assert all(f.error is None and f.end_s is not None for f in result.faults), result.faults
    h = result.history
    assert h.drained
    assert result.analysis.ok, result.analysis.to_dict()
    acked = {s.value for s in h.sends if h.acknowledged(s)}
    read = {r.value for p in h.polls() for r in p.records}
    assert len(acked) > 200 and acked <= read
    assert result.analysis.read == result.analysis.acknowledged == len(acked)
    assert min(s.sent_s for s in h.sends) < result.faults[0].start_s


@pytest.mark.timeout(120)
def test_leader_crash_and_move_lose_nothing(
        mini_broker_cluster_factory: Callable[..., EmbeddedCluster]) -> None:
    result, counts = run_on_cluster(mini_broker_cluster_factory, ["kill", "move-leader"])
    assert_nothing_lost(result)
    kill, move = result.faults
    assert f"leader of {result.topic}-" in kill.detail, kill.detail  # the crash hit a leader
    assert f"to {move.node}" in move.detail, move.detail
    assert counts[("kill", "broker")] == 1 and counts[("move_leader", "controller")] == 1


@pytest.mark.timeout(120)
def test_isolated_and_paused_leaders_lose_nothing(
        mini_broker_cluster_factory: Callable[..., EmbeddedCluster]) -> None:
    """Each fault outlasts the leader's lease (broker.session.timeout.ms, 6 s here), so the
    controller elects another leader while the old one still takes the clients' requests
    (isolated: the zombie) or is about to resume (paused). With acks=all and two replicas in
    sync required, neither may acknowledge what the new leader does not have."""
    session_s = int(CLUSTER_DEFAULTS["broker.session.timeout.ms"]) / 1000
    result, counts = run_on_cluster(mini_broker_cluster_factory, ["isolate", "pause"],
                                    fault_s=session_s + 1)
    assert_nothing_lost(result)
    assert all(f"leader of {result.topic}-" in f.detail for f in result.faults), result.faults
    assert counts[("cut", "etcd")] >= 1 and counts[("pause", "broker")] == 1
