"""DeleteRecords, DescribeLogDirs and DescribeTopicPartitions against a real broker, through
confluent-kafka's and kafka-python's admin clients (raw wire where no client asks the way
this test needs): the low watermark consumers see, Kafka's errors, the new start after a
restart and the retention pass that deletes the segments below it, log dir sizes as data
arrives, and describeTopics' pages."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient
from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.structs import TopicPartition as KpTopicPartition

from protocol.errors import ErrorCode
from tests.support.clients import (
    confluent_consume,
    confluent_produce,
    create_topic,
    numbered,
    segment_files,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.wire import Wire

E = ErrorCode


def confluent_delete(bootstrap: str, offsets: dict[tuple[str, int], int]
                     ) -> dict[tuple[str, int], int | str]:
    """{(topic, partition): low watermark, or the error's name} from AdminClient.delete_records."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    futures = admin.delete_records(
        [TopicPartition(t, p, o) for (t, p), o in offsets.items()], request_timeout=15)
    out: dict[tuple[str, int], int | str] = {}
    for tp, fut in futures.items():
        try:
            out[(tp.topic, tp.partition)] = fut.result(20).low_watermark
        except KafkaException as exc:
            out[(tp.topic, tp.partition)] = exc.args[0].name()
    return out


def kafka_python_admin(bootstrap: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)


def test_delete_records_moves_what_consumers_see(broker) -> None:
    topic = unique_topic("trim")
    create_topic(broker.bootstrap, topic, partitions=2)
    confluent_produce(broker.bootstrap, topic, numbered(10))
    confluent_produce(broker.bootstrap, topic, numbered(3), partition=1)

    assert confluent_delete(broker.bootstrap, {(topic, 0): 4}) == {(topic, 0): 4}
    assert watermarks(broker.bootstrap, topic) == (4, 10)
    got = confluent_consume(broker.bootstrap, topic, 6, start=OFFSET_BEGINNING)
    assert [g.offset for g in got] == list(range(4, 10))

    # -1 is the high watermark; out of range and unknown partitions are Kafka's errors.
    assert confluent_delete(broker.bootstrap, {(topic, 1): OFFSET_END}) == {(topic, 1): 3}
    assert watermarks(broker.bootstrap, topic, 1) == (3, 3)
    assert confluent_delete(broker.bootstrap, {(topic, 0): 11}) == {
        (topic, 0): "OFFSET_OUT_OF_RANGE"}
    assert watermarks(broker.bootstrap, topic) == (4, 10)

    admin = kafka_python_admin(broker.bootstrap)
    try:
        result = admin.delete_records({KpTopicPartition(topic, 0): 7})
        assert result[KpTopicPartition(topic, 0)]["low_watermark"] == 7
    finally:
        admin.close()
    assert watermarks(broker.bootstrap, topic) == (7, 10)


def test_a_compacted_topic_refuses_deletion(broker) -> None:
    compacted, both = unique_topic("compact"), unique_topic("both")
    create_topic(broker.bootstrap, compacted, config={"cleanup.policy": "compact"})
    create_topic(broker.bootstrap, both, config={"cleanup.policy": "compact,delete"})
    for topic in (compacted, both):
        confluent_produce(broker.bootstrap, topic, numbered(5))
    assert confluent_delete(broker.bootstrap, {(compacted, 0): 2, (both, 0): 2}) == {
        (compacted, 0): "POLICY_VIOLATION", (both, 0): 2}
    assert watermarks(broker.bootstrap, compacted) == (0, 5)


def test_internal_topics_and_versions_on_the_wire(broker) -> None:
    topic = unique_topic("wire")
    create_topic(broker.bootstrap, topic)
    confluent_produce(broker.bootstrap, topic, numbered(6))
    wire = Wire(broker.port)
    # A group's FindCoordinator creates __consumer_offsets, if no test made a group before.
    found = wire.request(FindCoordinatorRequest[3](key="wire-group", key_type=0),
                         FindCoordinatorResponse)
    assert found.error_code == 0
    part_cls = DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition
    for version, offset in ((0, 1), (1, 2), (2, 3)):
        resp = wire.request(DeleteRecordsRequest[version](
            topics=[DeleteRecordsRequest.DeleteRecordsTopic(
                        name=topic, partitions=[part_cls(partition_index=0, offset=offset)]),
                    DeleteRecordsRequest.DeleteRecordsTopic(
                        name="__consumer_offsets",
                        partitions=[part_cls(partition_index=0, offset=0)])],
            timeout_ms=5000), DeleteRecordsResponse)
        got = {(t.name, p.partition_index): (p.error_code, p.low_watermark)
               for t in resp.topics for p in t.partitions}
        assert got == {(topic, 0): (0, offset),
                       ("__consumer_offsets", 0): (E.INVALID_TOPIC_EXCEPTION, -1)}


def test_new_start_survives_a_restart_and_retention_deletes_below_it(broker_factory) -> None:
    broker = broker_factory({"log.retention.check.interval.ms": "300"})
    topic = unique_topic("segments")
    # Small segments: one produced batch of ~100 bytes each, a segment every few batches.
    create_topic(broker.bootstrap, topic, config={"segment.bytes": "300"})
    confluent_produce(broker.bootstrap, topic, numbered(30), one_batch_each=True)
    log_dir = Path(broker.overrides["log.dirs"])
    bases = [int(f.stem) for f in segment_files(log_dir, topic)]
    assert len(bases) > 4, bases
    cut = bases[3] + 1  # inside the fourth segment
    assert confluent_delete(broker.bootstrap, {(topic, 0): cut}) == {(topic, 0): cut}
    # The next retention pass deletes the segments wholly below the new start, not its own.
    wait_until(lambda: [int(f.stem) for f in segment_files(log_dir, topic)] == bases[3:], 10,
               "segments below the new log start deleted")
    broker.restart()
    assert watermarks(broker.bootstrap, topic) == (cut, 30)
    got = confluent_consume(broker.bootstrap, topic, 30 - cut, start=OFFSET_BEGINNING)
    assert [g.offset for g in got] == list(range(cut, 30))


def test_describe_log_dirs_sizes_grow_with_data(broker_factory, tmp_path: Path) -> None:
    dirs = [tmp_path / "d1", tmp_path / "d2"]
    broker = broker_factory({"log.dirs": ",".join(str(d) for d in dirs)})
    topic = unique_topic("sized")
    create_topic(broker.bootstrap, topic, partitions=2)

    def sizes() -> dict[str, dict[int, int]]:
        admin = kafka_python_admin(broker.bootstrap)
        try:
            [answer] = admin.describe_log_dirs()
        finally:
            admin.close()
        out: dict[str, dict[int, int]] = {}
        for d in answer["log_dirs"]:
            assert d["error_code"] == 0 and d["total_bytes"] >= d["usable_bytes"] > 0, d
            out[d["log_dir"]] = {p["partition_index"]: p["partition_size"]
                                 for t in d["topics"] if t["name"] == topic
                                 for p in t["partitions"]}
        return out

    before = sizes()
    assert sorted(before) == sorted(str(d.absolute()) for d in dirs)
    assert sorted(i for held in before.values() for i in held) == [0, 1]
    assert all(size == 0 for held in before.values() for size in held.values())
    confluent_produce(broker.bootstrap, topic, numbered(200), partition=1)
    after = sizes()
    grown = {i: size for held in after.values() for i, size in held.items()}
    assert grown[0] == 0 and grown[1] > 200 * 10, grown


@pytest.mark.parametrize("limit", [1, 2, 3, 2000])
def test_describe_topic_partitions_pages_with_a_cursor(broker, limit: int) -> None:
    first, second = unique_topic("pages-a"), unique_topic("pages-b")
    create_topic(broker.bootstrap, first, partitions=5)
    create_topic(broker.bootstrap, second, partitions=2)
    admin = kafka_python_admin(broker.bootstrap)
    seen: list[tuple[str, int]] = []
    pages = 0
    cursor = None
    try:
        while True:
            page = admin.describe_topic_partitions([second, first], limit, cursor)
            pages += 1
            answered = sum(len(t["partitions"]) for t in page["topics"])
            assert 1 <= answered <= limit
            for t in page["topics"]:
                assert t["error_code"] == 0 and t["topic_id"] is not None
                seen += [(t["name"], p["partition_index"]) for p in t["partitions"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert pages < 20, "the cursor never ends"
    finally:
        admin.close()
    assert seen == sorted([(first, i) for i in range(5)] + [(second, i) for i in range(2)])
    assert pages == -(-7 // min(limit, 2000))


def test_describe_topics_through_confluent(broker) -> None:
    from confluent_kafka import TopicCollection

    topic = unique_topic("described")
    create_topic(broker.bootstrap, topic, partitions=3)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4"})
    futures = admin.describe_topics(TopicCollection([topic, "nowhere-topic"]),
                                    request_timeout=15)
    desc = futures[topic].result(20)
    assert [p.id for p in desc.partitions] == [0, 1, 2]
    assert all(p.leader.id == 1 and [r.id for r in p.isr] == [1] for p in desc.partitions)
    with pytest.raises(KafkaException) as missing:
        futures["nowhere-topic"].result(20)
    assert missing.value.args[0].name() == "UNKNOWN_TOPIC_OR_PART"
