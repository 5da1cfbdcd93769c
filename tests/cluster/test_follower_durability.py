"""With flush.messages=1 a follower's fetch offset is fsynced before the leader sees it: the
leader acknowledges acks=all produce requests on it, so an offset it took from a follower's
page cache could be lost, acknowledged, by a power cut of both. Two brokers of an embedded
cluster, every partition led by broker 1 and followed by broker 2; the follower's fsyncs are
slowed at the disk seam so that "written, not yet fsynced" lasts long enough to be seen; every
fetch offset the follower's fetcher puts in a request is recorded with the follower's recovery
point at that moment."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from broker.interbroker.replica_fetcher import FetchState, ReplicaFetcher
from broker.log import disk
from broker.testing import EmbeddedCluster

LEADER, FOLLOWER = 1, 2
SLOW_FSYNC_S = 0.02


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """(node, fetch offset, recovery point) of each partition of each replica fetch built."""
    seen: list[tuple[int, int, int]] = []
    lock = threading.Lock()
    build_request = ReplicaFetcher._fetch_builder

    def spy(self: ReplicaFetcher, asked: dict[Any, tuple[FetchState, int]]
            ) -> Callable[[int], Any]:
        followed = self.manager.replica_manager.follower_partitions
        with lock:
            for tp, (_state, offset) in asked.items():
                partition = followed.get(tp)
                if partition is not None and tp[0].startswith("durable-"):
                    seen.append((self.manager.node_id, offset, partition.log.recovery_point))
        return build_request(self, asked)

    monkeypatch.setattr(ReplicaFetcher, "_fetch_builder", spy)
    return seen


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddedCluster]:
    follower_dir = str(tmp_path / f"broker-{FOLLOWER}")
    real_fsync = disk.fsync

    def slow_follower_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.startswith(follower_dir) and "/durable-" in path:
            time.sleep(SLOW_FSYNC_S)
        real_fsync(fd)

    monkeypatch.setattr(disk, "fsync", slow_follower_fsync)
    with EmbeddedCluster(2, tmp_path, log_flush_interval_messages=1,
                         replica_fetch_wait_max_ms=100) as c:
        yield c


def test_every_fetch_offset_of_a_follower_is_fsynced(
        cluster: EmbeddedCluster, reported: list[tuple[int, int, int]]) -> None:
    topic = f"durable-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 2, -1, replica_assignment=[[LEADER, FOLLOWER]] * 2,
                                  config={"min.insync.replicas": "2"})],
                        operation_timeout=10)[topic].result(30)
    for p in range(2):
        cluster.wait_for_leader(topic, p, LEADER)
        cluster.wait_for_isr(topic, p, 2)
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                         "linger.ms": 0, "enable.idempotence": True})
    errors: list[Any] = []
    for i in range(60):
        producer.produce(topic, f"v{i}".encode(), partition=i % 2,
                         on_delivery=lambda err, _msg: errors.append(err))
        if i % 10 == 9:
            producer.flush(30)  # several rounds: appends, then fetches reporting them
    assert producer.flush(30) == 0
    assert errors == [None] * 60
    grown = [(offset, rp) for node, offset, rp in reported if node == FOLLOWER and offset > 0]
    assert grown, "the follower reported no appended offset"
    ahead = [(offset, rp) for offset, rp in grown if offset > rp]
    assert ahead == [], "fetch offsets reported before they were fsynced"
