"""The coordinators' internal topics in cluster mode, real brokers on a real etcd: created
through the controller with Kafka's replication keys. With the defaults
(``offsets.topic.replication.factor`` 3, ``transaction.state.log.replication.factor`` 3,
``transaction.state.log.min.isr`` 2) a lone broker answers FindCoordinator
COORDINATOR_NOT_AVAILABLE and creates nothing, as Kafka until enough brokers are alive; once
three are, a broker that is not the controller has the topics created (proposed to the
controller), each partition on three replicas, the transaction log with min.insync.replicas 2.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from broker.cluster.etcd_process import EtcdProcess
from tests.cluster.test_cluster_brokers import eventually, metadata, partitions_of
from tests.cluster.test_cluster_coordinators import GROUP_TYPE, TXN_TYPE, find
from tests.support.broker import BrokerProcess

COORDINATOR_NOT_AVAILABLE = 15
PARTITIONS = 3


def overrides(etcd: EtcdProcess, prefix: str, node_id: int) -> dict[str, str]:
    """Kafka's replication defaults for the internal topics (nothing set)."""
    return {"node.id": str(node_id), "minibroker.etcd.endpoints": etcd.endpoint,
            "minibroker.etcd.prefix": prefix, "broker.session.timeout.ms": "4000",
            "broker.heartbeat.interval.ms": "500", "controlled.shutdown.retry.backoff.ms": "500",
            "offsets.topic.num.partitions": str(PARTITIONS),
            "transaction.state.log.num.partitions": str(PARTITIONS)}


@pytest.fixture
def brokers() -> Iterator[list[BrokerProcess]]:
    """The brokers the test starts, stopped after it."""
    started: list[BrokerProcess] = []
    yield started
    for b in started:
        if b.proc is not None and b.proc.poll() is None:
            b.stop()


def topic_names(broker: BrokerProcess) -> set[str]:
    return {t.name for t in metadata(broker).topics}


def test_internal_topics_wait_for_their_replication_factor_then_go_through_the_controller(
        brokers: list[BrokerProcess], tmp_path: Path, etcd_server: EtcdProcess) -> None:
    prefix = f"/test-{uuid.uuid4().hex[:12]}"
    first = BrokerProcess(tmp_path / "b1", overrides(etcd_server, prefix, 1)).start()
    brokers.append(first)
    # One broker alive, three replicas wanted: not available, and nothing created, for as
    # long as it is asked.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        for key_type in (GROUP_TYPE, TXN_TYPE):
            [answer] = find(first, key_type, ["k"]).values()
            assert answer.error_code == COORDINATOR_NOT_AVAILABLE, answer
        time.sleep(0.3)
    assert not {"__consumer_offsets", "__transaction_state"} & topic_names(first)
    logged = [e for e in first.new_log_lines()
              if e.get("event") == "internal topic not created: too few live brokers"]
    # Logged once per topic for one live broker, not once per request.
    assert sorted(e["topic"] for e in logged) == ["__consumer_offsets", "__transaction_state"]
    assert {(e["live_brokers"], e["replication_factor"]) for e in logged} == {(1, 3)}

    for node_id in (2, 3):
        brokers.append(BrokerProcess(tmp_path / f"b{node_id}",
                                     overrides(etcd_server, prefix, node_id)).start())
    eventually(lambda: len(metadata(first).brokers) == 3, 30)
    controller_id = metadata(first).controller_id
    asked = next(b for b in brokers if int(b.overrides["node.id"]) != controller_id)
    asked.new_log_lines()

    def found(key_type: int) -> Any:
        [answer] = find(asked, key_type, ["k"]).values()
        return answer if answer.error_code == 0 else None

    for key_type in (GROUP_TYPE, TXN_TYPE):
        answer = eventually(functools.partial(found, key_type), 30)
        assert answer.node_id in (1, 2, 3)
    proposed = {e.get("topic") for e in asked.new_log_lines()
                if e.get("event") == "topic proposed to the controller"}
    if controller_id == metadata(first).controller_id:  # the controller did not move meanwhile
        assert proposed == {"__consumer_offsets", "__transaction_state"}
    for name in ("__consumer_offsets", "__transaction_state"):
        parts = partitions_of(metadata(first), name)
        assert sorted(parts) == list(range(PARTITIONS))
        assert all(sorted(p.replica_nodes) == [1, 2, 3] for p in parts.values()), parts

    admin = AdminClient({"bootstrap.servers": asked.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "__transaction_state")
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["min.insync.replicas"].value == "2"
    assert configs["cleanup.policy"].value == "compact"
