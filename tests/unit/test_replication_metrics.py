"""The leader's replication metrics with Kafka's meanings, read from the exposition the
metrics endpoint serves: leader count, under-replicated, under- and at-min-ISR partitions,
ISR shrinks and expands once committed, and each follower's lag. The followers are played by
replica fetches through the replica manager; the cluster by a writer that commits what the
leader proposes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics.collector import BrokerMetrics
from broker.replica.delayed_result import Completion
from broker.replica.replica_manager import PartitionFetch, ReplicaManager
from broker.replica.replica_state import LeaderAndIsrState
from protocol.errors import ErrorCode
from tests.support.components import Components, build
from tests.support.requests import record_batch

TOPIC = "metered"
TP = (TOPIC, 0)
LAG_MS = 10_000


class CommittingIsrWriter:
    """Commits every proposal at once, as the cluster's store would."""

    def __init__(self) -> None:
        self.committed: list[tuple[int, ...]] = []

    def alter_isr(self, tp: tuple[str, int], proposed: LeaderAndIsrState
                  ) -> Completion[LeaderAndIsrState]:
        done: Completion[LeaderAndIsrState] = Completion()
        self.committed.append(proposed.isr)
        done.set_result(LeaderAndIsrState(proposed.leader_epoch, proposed.isr,
                                          proposed.partition_epoch + 1))
        return done


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"}, offsets_topic=False)
    yield c
    await c.close()


def scrape(c: Components) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, by name and labels."""
    m = BrokerMetrics(node_id=0)
    m.replica_manager, m.log_manager = c.replica_manager, c.log_manager
    text, _ = m.exposition()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(f"minibroker_{name}", tuple(sorted(labels.items())))]


def fetch_as(rm: ReplicaManager, replica: int, offset: int) -> None:
    answer = rm.fetch_messages([PartitionFetch(TP, offset, 1 << 20, -1, 0)], 1 << 20, 0, 0,
                               replica_id=replica)
    assert answer.result()[0].error == ErrorCode.NONE


async def test_a_single_broker_leads_everything_at_min_isr(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 3, {})
    samples = scrape(parts)
    assert value(samples, "leader_partitions") == 3
    assert value(samples, "under_replicated_partitions") == 0
    assert value(samples, "under_min_isr_partitions") == 0
    assert value(samples, "at_min_isr_partitions") == 3, "ISR 1 = min.insync.replicas 1"
    assert value(samples, "isr_shrinks_total") == value(samples, "isr_expands_total") == 0
    assert not any(name == "minibroker_follower_lag_records" for name, _ in samples)


async def test_isr_changes_and_follower_lag(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    writer = CommittingIsrWriter()
    rm.broker_id, rm.isr_writer, rm.replica_lag_time_max_ms = 0, writer, LAG_MS
    rm.partitions[TP].min_insync_replicas = 2
    rm.make_leader(TP, 1, replicas=[0, 1, 2], isr=[0, 1, 2], partition_epoch=0)
    rm.append_records([(TP, record_batch([b"a", b"b", b"c", b"d"]))], 9, 1, 0)
    fetch_as(rm, 1, 4)
    fetch_as(rm, 2, 1)
    samples = scrape(parts)
    assert value(samples, "follower_lag_records", topic=TOPIC, partition="0", replica="1") == 0
    assert value(samples, "follower_lag_records", topic=TOPIC, partition="0", replica="2") == 3
    assert value(samples, "under_replicated_partitions") == 0
    await parts.advance(LAG_MS + LAG_MS // 2)
    fetch_as(rm, 1, 4)  # replica 1 stays caught up; replica 2 does not
    await parts.advance(LAG_MS // 2)
    assert writer.committed == [(0, 1)], "replica 2 was not dropped"
    samples = scrape(parts)
    assert value(samples, "isr_shrinks_total") == 1
    assert value(samples, "under_replicated_partitions") == 1
    assert value(samples, "at_min_isr_partitions") == 1, "ISR 2 of min.insync.replicas 2"
    assert value(samples, "under_min_isr_partitions") == 0
    lag = value(samples, "follower_lag_seconds", topic=TOPIC, partition="0", replica="2")
    assert lag >= LAG_MS / 1000, "replica 2's lag time"
    assert value(samples, "follower_lag_seconds", topic=TOPIC, partition="0", replica="1") == 0
    fetch_as(rm, 2, 4)
    samples = scrape(parts)
    assert writer.committed == [(0, 1), (0, 1, 2)]
    assert value(samples, "isr_expands_total") == 1
    assert value(samples, "under_replicated_partitions") == 0
    assert value(samples, "follower_lag_records", topic=TOPIC, partition="0", replica="2") == 0


async def test_under_min_isr(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    rm = parts.replica_manager
    rm.broker_id = 0
    rm.partitions[TP].min_insync_replicas = 2
    rm.make_leader(TP, 1, replicas=[0, 1], isr=[0], partition_epoch=0)
    samples = scrape(parts)
    assert value(samples, "under_min_isr_partitions") == 1
    assert value(samples, "under_replicated_partitions") == 1
    assert value(samples, "at_min_isr_partitions") == 0
    assert value(samples, "follower_lag_records", topic=TOPIC, partition="0", replica="1") == 0
