"""Admin answers at Kafka's edges, through confluent-kafka's AdminClient: topics created with
manual replica assignments, and authorized operations when no authorizer is configured."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient, NewTopic
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse

from broker.testing import EmbeddedBroker
from tests.support.clients import create_topic
from tests.support.wire import Wire

TOPIC_OPS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
             AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
             AclOperation.ALTER_CONFIGS}
CLUSTER_OPS = {AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
               AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
               AclOperation.DESCRIBE}
GROUP_OPS = {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker of its own in this process: nothing here needs a process boundary."""
    with EmbeddedBroker(tmp_path) as embedded:
        yield embedded


def admin(broker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap_servers})


def commit_for_group(broker, group: str, topic: str) -> None:
    """A group that exists only through its committed offsets (assign and commit)."""
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        c.close()


def create(broker, topic: NewTopic) -> None:
    client = admin(broker)  # held until the future resolves, or it resolves as destroyed
    client.create_topics([topic], operation_timeout=10)[topic.topic].result(timeout=10)


def test_manual_replica_assignment_on_this_broker_creates_the_topic(broker):
    create(broker, NewTopic("manual", 3, replica_assignment=[[1], [1], [1]]))
    md = admin(broker).list_topics("manual", timeout=10).topics["manual"]
    assert md.error is None
    assert sorted(md.partitions) == [0, 1, 2]
    assert all(p.replicas == [1] and p.leader == 1 for p in md.partitions.values())


@pytest.mark.parametrize("assignment, words", [
    ([[2]], "broker 2, but no such broker is registered"),
    ([[1, 1]], "the broker 1 more than once"),
    ([[1], [2]], "broker 2, but no such broker is registered"),
])
def test_manual_assignment_kafka_refuses_is_refused_the_same_way(broker, assignment, words):
    with pytest.raises(KafkaException) as info:
        create(broker, NewTopic("refused", len(assignment), replica_assignment=assignment))
    err = info.value.args[0]
    assert err.name() == "INVALID_REPLICA_ASSIGNMENT", err
    assert words in err.str()
    assert "refused" not in admin(broker).list_topics(timeout=10).topics


def test_manual_assignment_with_a_partition_count_is_an_invalid_request(broker):
    """librdkafka sends -1 counts with an assignment; Kafka refuses anything else."""
    wire = Wire(broker.port)
    topic = CreateTopicsRequest.CreatableTopic
    req = CreateTopicsRequest[7](timeout_ms=5000, validate_only=False, topics=[topic(
        name="counted", num_partitions=1, replication_factor=-1, configs=[],
        assignments=[topic.CreatableReplicaAssignment(partition_index=0, broker_ids=[1])])])
    [result] = wire.request(req, CreateTopicsResponse).topics
    assert result.error_code == 42  # INVALID_REQUEST
    assert "numPartitions was not set to -1" in result.error_message


def test_authorized_operations_without_an_authorizer_are_every_supported_one(broker):
    create_topic(broker.bootstrap_servers, "ops")
    client = admin(broker)
    cluster = client.describe_cluster(include_authorized_operations=True).result(timeout=10)
    assert set(cluster.authorized_operations) == CLUSTER_OPS
    [topic] = client.describe_topics(TopicCollection(["ops"]),
                                     include_authorized_operations=True).values()
    assert set(topic.result(timeout=10).authorized_operations) == TOPIC_OPS
    commit_for_group(broker, "ops-group", "ops")
    [group] = client.describe_consumer_groups(["ops-group"],
                                              include_authorized_operations=True).values()
    assert set(group.result(timeout=10).authorized_operations) == GROUP_OPS


def test_authorized_operations_are_absent_unless_asked(broker):
    create_topic(broker.bootstrap_servers, "quiet")
    client = admin(broker)
    cluster = client.describe_cluster().result(timeout=10)
    assert not cluster.authorized_operations
    [topic] = client.describe_topics(TopicCollection(["quiet"])).values()
    assert not topic.result(timeout=10).authorized_operations


def test_an_excessively_large_creation_is_a_policy_violation(broker):
    """Kafka's controller refuses one request creating more than 10,000 records."""
    client = admin(broker)
    futures = client.create_topics([NewTopic("huge", 10_000), NewTopic("small", 1)])
    for name, fut in futures.items():
        with pytest.raises(KafkaException) as info:
            fut.result(timeout=10)
        assert info.value.args[0].name() == "POLICY_VIOLATION", name
    assert not {"huge", "small"} & set(client.list_topics(timeout=10).topics)
