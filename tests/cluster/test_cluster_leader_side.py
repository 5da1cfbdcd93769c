"""The leader's side of replication over the wire, on two real broker processes in cluster
mode on a real etcd: the replication keys of server.properties (default.replication.factor 2,
min.insync.replicas 2, replica.lag.time.max.ms) take effect, CreateTopics beyond the live
brokers is refused in Kafka's words, a partition whose follower is gone (SIGKILL) leaves the
ISR and refuses acks=all, the leader's /metrics show it, and a test playing that follower
over the wire (Fetch v12 with its replica id) gets DivergingEpoch when it claims an epoch
that ends earlier on the leader."""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceResponse
from prometheus_client.parser import text_string_to_metric_families

from broker.cluster.etcd_process import EtcdProcess
from protocol.errors import ErrorCode
from tests.cluster.test_cluster_brokers import cluster_overrides, eventually, metadata
from tests.support.broker import BrokerProcess
from tests.support.requests import produce_request, record_batch
from tests.support.wire import Wire

LAG_MS = 2000
TOPIC = "led-by-1"
REPLICATION = {"default.replication.factor": "2", "min.insync.replicas": "2",
               "replica.lag.time.max.ms": str(LAG_MS)}


@pytest.fixture
def two(tmp_path: Path, etcd_server: EtcdProcess) -> Iterator[list[BrokerProcess]]:
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    brokers: list[BrokerProcess] = []
    try:
        for node_id in (1, 2):
            overrides = {**cluster_overrides(etcd_server, prefix, node_id), **REPLICATION}
            brokers.append(BrokerProcess(tmp_path / f"b{node_id}", overrides).start())
        yield brokers
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()


def _create(wire: Wire, name: str, replication_factor: int,
            assignment: list[int] | None = None) -> Any:
    topic = CreateTopicsRequest.CreatableTopic
    assignments = [] if assignment is None else [
        topic.CreatableReplicaAssignment(partition_index=0, broker_ids=assignment)]
    request = CreateTopicsRequest[7](timeout_ms=15000, validate_only=False, topics=[topic(
        name=name, num_partitions=-1 if assignment else 1,
        replication_factor=replication_factor, assignments=assignments, configs=[])])
    [result] = wire.request(request, CreateTopicsResponse).topics
    return result


def _partition(broker: BrokerProcess, name: str) -> Any:
    """Partition 0 of ``name`` in the broker's Metadata, None while it has none."""
    for t in metadata(broker).topics:
        if t.name == name and t.partitions:
            return t.partitions[0]
    return None


def _scrape(broker: BrokerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _replica_fetch(offset: int, last_fetched_epoch: int, leader_epoch: int) -> FetchRequest:
    """Fetch v12 as replica 2 (ReplicaId), naming the topic."""
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=leader_epoch, fetch_offset=offset,
        last_fetched_epoch=last_fetched_epoch, log_start_offset=0,
        partition_max_bytes=1 << 20)
    return FetchRequest[12](replica_id=2, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                            isolation_level=0, session_id=0, session_epoch=-1,
                            topics=[FetchRequest.FetchTopic(topic=TOPIC,
                                                            partitions=[partition])],
                            forgotten_topics_data=[], rack_id="")


def test_leader_side_with_its_follower_gone(two: list[BrokerProcess]) -> None:
    b1, b2 = two
    wire = Wire(b1.port)
    by_default = _create(wire, "defaulted", -1)
    assert by_default.error_code == 0, by_default
    assert eventually(lambda: _partition(b1, "defaulted"), 30)
    assert len(_partition(b1, "defaulted").replica_nodes) == 2, "default.replication.factor"
    too_many = _create(wire, "three", 3)
    assert (too_many.error_code, too_many.error_message) == (
        ErrorCode.INVALID_REPLICATION_FACTOR,
        "Replication factor: 3 larger than available brokers: 2.")
    assert _create(wire, TOPIC, -1, assignment=[1, 2]).error_code == 0
    eventually(lambda: (p := _partition(b1, TOPIC)) is not None and p.leader_id == 1, 30)
    b2.kill()
    eventually(lambda: list(_partition(b1, TOPIC).isr_nodes) == [1], 30)  # 2 left the ISR
    led = Wire(b1.port)
    error, _ = _produce(led, [b"refused"], acks=-1)
    assert error == ErrorCode.NOT_ENOUGH_REPLICAS, "acks=all taken under min.insync.replicas"
    assert _produce(led, [b"a", b"b", b"c", b"d", b"e"], acks=1) == (0, 0)
    epoch = _partition(b1, TOPIC).leader_epoch

    def under_min_isr() -> bool:
        samples = _scrape(b1)
        return (samples[("minibroker_under_min_isr_partitions", ())] >= 1
                and samples[("minibroker_follower_lag_records", (
                    ("partition", "0"), ("replica", "2"), ("topic", TOPIC)))] == 5)

    eventually(under_min_isr, 10)
    diverged = _only(led.request(_replica_fetch(8, epoch, epoch), FetchResponse))
    assert diverged.error_code == 0 and not diverged.records
    assert diverged.diverging_epoch is not None
    assert (diverged.diverging_epoch.epoch, diverged.diverging_epoch.end_offset) == (epoch, 5)
    unknown = _only(led.request(_replica_fetch(5, epoch + 1, epoch), FetchResponse))
    assert unknown.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    reading = _only(led.request(_replica_fetch(0, -1, epoch), FetchResponse))
    assert reading.error_code == 0 and reading.records and reading.diverging_epoch is None
    assert reading.high_watermark == 0, "the high watermark moved under min.insync.replicas"


def _produce(wire: Wire, values: list[bytes], acks: int) -> tuple[int, int]:
    resp = wire.request(produce_request(TOPIC, record_batch(values), acks=acks),
                        ProduceResponse)
    [topic] = resp.responses
    [part] = topic.partition_responses
    return part.error_code, part.base_offset


def _only(resp: Any) -> Any:
    assert resp.error_code == 0, resp
    [topic] = resp.responses
    [part] = topic.partitions
    return part
