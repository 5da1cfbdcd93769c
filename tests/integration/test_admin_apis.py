"""ListOffsets, OffsetForLeaderEpoch, DescribeConfigs, DescribeCluster, CreatePartitions and
DeleteTopics through confluent-kafka's AdminClient and on the wire, against a real broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions
from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

from broker.testing import EmbeddedBroker
from tests.support.clients import Rec, confluent_produce, create_topic
from tests.support.requests import EARLIEST, LATEST, MAX_TIMESTAMP, list_offsets
from tests.support.wire import Wire


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker of its own in this process: nothing here needs a process boundary."""
    with EmbeddedBroker(tmp_path) as embedded:
        yield embedded


def test_list_offsets_by_time_and_max_timestamp(broker):
    create_topic(broker.bootstrap_servers, "times")
    stamps = [1_000, 5_000, 3_000, 9_000, 7_000]  # out of order: max is not the last
    sent = [Rec(b"k", f"v{i}".encode(), (), ts) for i, ts in enumerate(stamps)]
    confluent_produce(broker.bootstrap_servers, "times", sent, one_batch_each=True)
    wire = Wire(broker.port)
    assert list_offsets(wire, "times", EARLIEST) == (0, 0, -1)
    assert list_offsets(wire, "times", LATEST) == (0, 5, -1)
    assert list_offsets(wire, "times", MAX_TIMESTAMP) == (0, 3, 9_000)
    assert list_offsets(wire, "times", 4_000) == (0, 1, 5_000)  # first record at or after
    assert list_offsets(wire, "times", 9_001) == (0, -1, -1)
    assert list_offsets(wire, "no-such-topic", LATEST)[0] == 3


def test_offset_for_leader_epoch(broker):
    create_topic(broker.bootstrap_servers, "epochs")
    confluent_produce(broker.bootstrap_servers, "epochs", [Rec(b"k", b"v", (), 1)] * 4)
    topic_cls = OffsetForLeaderEpochRequest.OffsetForLeaderTopic
    req = OffsetForLeaderEpochRequest[4](replica_id=-1, topics=[topic_cls(
        topic="epochs", partitions=[topic_cls.OffsetForLeaderPartition(
            partition=0, current_leader_epoch=0, leader_epoch=0)])])
    p = Wire(broker.port).request(req, OffsetForLeaderEpochResponse).topics[0].partitions[0]
    assert (p.error_code, p.leader_epoch, p.end_offset) == (0, 0, 4)


def test_admin_configs_cluster_partitions_and_delete(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    create_topic(broker.bootstrap_servers, "cfg", partitions=2, config={"retention.ms": "12345"})
    res = ConfigResource(ConfigResource.Type.TOPIC, "cfg")
    configs = admin.describe_configs([res])[res].result(15)
    assert configs["retention.ms"].value == "12345" and not configs["retention.ms"].is_default
    assert configs["segment.bytes"].value == "1073741824" and configs["segment.bytes"].is_default
    broker_res = ConfigResource(ConfigResource.Type.BROKER, "1")
    broker_cfg = admin.describe_configs([broker_res])[broker_res].result(15)
    assert broker_cfg["num.partitions"].value == "1"

    cluster = admin.describe_cluster().result(15)
    assert [n.id for n in cluster.nodes] == [1] and cluster.controller.id == 1
    assert cluster.cluster_id

    admin.create_partitions([NewPartitions("cfg", 5)])["cfg"].result(15)
    meta = admin.list_topics("cfg", timeout=10)
    assert sorted(meta.topics["cfg"].partitions) == [0, 1, 2, 3, 4]
    shrink = admin.create_partitions([NewPartitions("cfg", 3)])["cfg"]
    try:
        shrink.result(15)
        raise AssertionError("shrinking partitions must fail")
    except Exception as exc:  # KafkaException(INVALID_PARTITIONS)
        assert "INVALID_PARTITIONS" in str(exc) or "partitions" in str(exc).lower()

    confluent_produce(broker.bootstrap_servers, "cfg", [Rec(b"k", b"v", (), 1)], partition=4)
    admin.delete_topics(["cfg"])["cfg"].result(15)
    assert "cfg" not in admin.list_topics(timeout=10).topics
    assert not (broker.data_dir / "logs" / "cfg-4").exists()
    # A consumer asking for it now gets an error, not stale data.
    low_high = None
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "x",
                         "allow.auto.create.topics": False})
    try:
        low_high = consumer.get_watermark_offsets(TopicPartition("cfg", 4), timeout=3)
    except Exception:
        low_high = None
    finally:
        consumer.close()
    assert low_high is None
