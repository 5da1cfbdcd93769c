"""segmentio's kafka-go as Debian 12 packages it (golang-github-segmentio-kafka-go-dev, 0.2.1),
driven by tests/conformance/go/kafkago/main.go, one broker per test.

This kafka-go writes fixed request versions. Its records travel only in Produce v2 (message
format v1) and Fetch v2, and it creates topics with CreateTopics v0: Kafka 4 serves none of
these (KIP-896), and closes the connection of a client that sends them; the tests check that
the broker refuses them the same way and stores nothing. What it does speak that Kafka 4 still
serves works: Metadata v1, ListOffsets v1, DeleteTopics v1, and a consumer group (FindCoordinator
v0, JoinGroup v1, SyncGroup v0, Heartbeat v0, OffsetCommit v2, OffsetFetch v1) whose commits a
new member resumes from. (Its Reader.Close never sends LeaveGroup: it dials the coordinator with
the context it has just cancelled, so a closed member stays until its session times out.)

`bash tests/conformance/go/install.sh` (run by `make test`) installs and builds; without it
these tests skip with its reason.
"""

from __future__ import annotations

import pytest

from tests.conformance.go import programs
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    confluent_consumer,
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
    wait_until,
    watermarks,
)

KAFKA_GO_CODECS = ["none", "gzip", "snappy", "lz4"]  # this kafka-go has no zstd
PARTITIONS, PER_PARTITION, COMMIT_AT = 3, 10, 4
SESSION_TIMEOUT = 6  # the members' session timeout in kafkago/main.go, seconds
# The request versions this kafka-go's consumer group sends, all served by Kafka 4.
GROUP_APIS = ("FindCoordinator", "JoinGroup", "SyncGroup", "Heartbeat", "OffsetCommit",
              "OffsetFetch", "LeaveGroup", "Metadata", "ListOffsets")


@pytest.fixture(scope="module")
def kafka_go() -> programs.Program:
    return programs.require("kafkago")


def _topics(bootstrap: str) -> set[str]:
    errors: list = []
    consumer = confluent_consumer(bootstrap, errors)
    try:
        return set(consumer.list_topics(timeout=10).topics)
    finally:
        consumer.close()


def test_metadata_offsets_and_topic_admin(kafka_go, broker: BrokerProcess) -> None:
    """ReadPartitions (Metadata v1) lists the partitions and their leader, ReadOffsets
    (ListOffsets v1) the first and next offsets, DeleteTopics v1 deletes; CreateTopics v0 is
    refused by closing the connection, as Kafka 4 does, and creates nothing."""
    topic, doomed = unique_topic("kgo-meta"), unique_topic("kgo-doomed")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    create_topic(broker.bootstrap, doomed)
    confluent_produce(broker.bootstrap, topic, numbered(7))
    result = kafka_go.run(broker.bootstrap, "metadata", topic, doomed)
    assert result["partitionsError"] is None
    assert result["partitions"] == list(range(PARTITIONS))
    assert set(result["leaders"].values()) == {broker.bootstrap}
    assert (result["offsets"], result["offsetsError"]) == ([0, 7], None)
    assert result["deleteError"] is None
    assert result["createError"] is not None
    topics = _topics(broker.bootstrap)
    assert topic in topics and doomed not in topics
    assert result["createdTopic"] not in topics
    assert programs.refusals(broker) == ["unsupported version 0 of CreateTopics"]


@pytest.mark.parametrize("codec", KAFKA_GO_CODECS)
def test_produce_v2_refused(kafka_go, broker: BrokerProcess, codec: str) -> None:
    """WriteCompressedMessages sends Produce v2 (message format v1): the broker closes the
    connection, as Kafka 4 does, and stores nothing."""
    topic = unique_topic(f"kgo-{codec}")
    create_topic(broker.bootstrap, topic)
    result = kafka_go.run(broker.bootstrap, "produce", codec, topic)
    assert result["produceError"] is not None and result["written"] == 0, result
    assert programs.refusals(broker) == ["unsupported version 2 of Produce"]
    assert watermarks(broker.bootstrap, topic) == (0, 0)


def test_fetch_v2_refused(kafka_go, broker: BrokerProcess) -> None:
    """ReadOffsets (ListOffsets v1) sees the records librdkafka produced; reading them sends
    Fetch v2, which the broker refuses by closing the connection, as Kafka 4 does."""
    topic = unique_topic("kgo-fetch")
    create_topic(broker.bootstrap, topic)
    confluent_produce(broker.bootstrap, topic, numbered(5))
    result = kafka_go.run(broker.bootstrap, "fetch", topic, 5)
    assert (result["offsets"], result["offsetsError"], result["seekError"]) == ([0, 5], None,
                                                                                None)
    assert result["records"] == [] and result["readError"] is not None, result
    assert programs.refusals(broker) == ["unsupported version 2 of Fetch"]


def test_group_commit_and_resume(kafka_go, group_broker: BrokerProcess) -> None:
    """A Reader with a GroupID joins, is assigned every partition with no committed offset
    (kafka-go's FirstOffset), commits offset 4 on each (OffsetCommit v2) and closes; a new
    member of the group (let in once the first, which never sent LeaveGroup, misses the
    rebalance) starts each partition at 4 (OffsetFetch v1). librdkafka reads the same committed
    offsets; the group is Empty once the second member's session times out. The members' own
    fetches (Fetch v2) are refused: that is all the broker refuses."""
    bootstrap = group_broker.bootstrap
    topic, group = unique_topic("kgo-group"), unique_topic("kgo-group-g")
    create_topic(bootstrap, topic, PARTITIONS)
    for p in range(PARTITIONS):
        confluent_produce(bootstrap, topic, numbered(PER_PARTITION, f"p{p}"), partition=p)
    result = kafka_go.run(bootstrap, "group", topic, group, PARTITIONS, COMMIT_AT)
    assert result["firstJoinError"] is None and result["secondJoinError"] is None, result
    assert result["firstAssignment"] == {str(p): -2 for p in range(PARTITIONS)}
    assert result["commitError"] is None
    assert result["firstCloseError"] is None and result["secondCloseError"] is None
    assert result["secondAssignment"] == {str(p): COMMIT_AT for p in range(PARTITIONS)}

    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    errors: list = []
    consumer = confluent_consumer(bootstrap, errors, {"group.id": group})
    try:
        committed = consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
    finally:
        consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == {
        p: COMMIT_AT for p in range(PARTITIONS)}
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def state() -> str:
        return admin.describe_consumer_groups([group])[group].result(timeout=10).state.name

    wait_until(lambda: state() == "EMPTY", SESSION_TIMEOUT + 10, "the member's session to expire")

    refused = programs.refusals(group_broker)
    assert set(refused) == {"unsupported version 2 of Fetch"}, refused
    assert not any(api in r for r in refused for api in GROUP_APIS)
