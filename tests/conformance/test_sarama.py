"""IBM/Shopify sarama as Debian 12 packages it (golang-github-shopify-sarama-dev, 1.22), driven by
tests/conformance/go/sarama/main.go, one broker per test: a producer per codec with keys, values
and headers (null, empty, binary) and CreateTime timestamps read back byte for byte, by sarama
and by librdkafka; the idempotent producer; a consumer group that commits and is resumed by a
new member; two members sharing partitions, then one taking over when the other leaves.

sarama is configured for Kafka 2.1 (`Config.Version = V2_1_0_0`), which makes it send the
newest versions it knows: Produce v3, Fetch v4, Metadata v5, ListOffsets v1, CreateTopics v2,
JoinGroup v1, SyncGroup/Heartbeat/LeaveGroup v0, OffsetFetch v1 and, with
`Consumer.Offsets.Retention` set, OffsetCommit v2. Where this sarama cannot work with a Kafka 4
broker, the tests check that the broker refuses it as Kafka does: zstd needs Produce v7, and
sarama's default OffsetCommit v1 is no longer served.

`bash tests/conformance/go/install.sh` (run by `make test`) installs and builds; without it
these tests skip with its reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.go import programs
from tests.conformance.support import (
    assert_exactly_once,
    assert_idempotent_delivery,
    committed_offsets,
)
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    CODEC_ID,
    Rec,
    assert_roundtrip,
    confluent_consume,
    confluent_consumer,
    confluent_produce,
    create_topic,
    disk_batches,
    sample_records,
    unique_topic,
    watermarks,
)

SARAMA_CODECS = ["none", "gzip", "snappy", "lz4"]  # and zstd, refused: see below
RECORDS = 40
IDEMPOTENT_PARTITIONS, IDEMPOTENT_PER_PARTITION = 6, 100
RESUME_PARTITIONS, RESUME_PER_PARTITION, RESUME_FIRST_PART = 3, 40, 15
SHARE_PARTITIONS, SHARE_PER_PARTITION = 4, 50
UNSUPPORTED_COMPRESSION = "does not support the compression type"  # sarama's text for error 76


@pytest.fixture(scope="module")
def sarama() -> programs.Program:
    return programs.require("sarama")


def _sent(records: list[Rec]) -> list[list]:
    """The records as the program prints what it consumed: offset, timestamp, key, value,
    headers."""
    return [[i, r.timestamp, programs.token(r.key), programs.token(r.value),
             [[programs.token(k.encode()), programs.token(v)] for k, v in r.headers]]
            for i, r in enumerate(records)]


def _roundtrip(sarama: programs.Program, broker: BrokerProcess, tmp_path: Path, codec: str,
               records: list[Rec]) -> tuple[str, dict]:
    topic = unique_topic(f"sarama-{codec}")
    path = tmp_path / f"{codec}.txt"
    programs.write_records(path, records)
    return topic, sarama.run(broker.bootstrap, "roundtrip", codec, topic, path)


@pytest.mark.parametrize("codec", SARAMA_CODECS)
def test_roundtrip_every_codec(sarama, broker: BrokerProcess, tmp_path: Path,
                               codec: str) -> None:
    """Keys, values and headers (null, empty, binary, duplicate, non-ASCII, key and value both
    null) and CreateTime timestamps come back byte for byte, to sarama and to librdkafka; the
    broker stores the batches with sarama's codec."""
    records = sample_records(RECORDS, seed=SARAMA_CODECS.index(codec), both_null=True)
    topic, result = _roundtrip(sarama, broker, tmp_path, codec, records)
    assert "produceErrors" not in result, result["produceErrors"][:3]
    assert result["acked"] == [[0, i, r.timestamp] for i, r in enumerate(records)]
    assert result["consumeErrors"] == []
    got = result["records"]
    assert len(got) == len(records)
    for i, (row, want) in enumerate(zip(got, _sent(records), strict=True)):
        assert row == want, f"record {i}: sarama read {row!r:.300} for {want!r:.300}"
    assert_roundtrip(confluent_consume(broker.bootstrap, topic, len(records)), records)
    batches = disk_batches(broker.data_dir / "logs", topic)
    assert sum(b.record_count for b in batches) == len(records)
    # sarama compresses every batch, even a lone record.
    assert {b.codec for b in batches} == {CODEC_ID[codec]}, [(b.codec, b.record_count)
                                                            for b in batches]
    assert any(b.record_count > 1 for b in batches)


def test_zstd_produce_refused_below_produce_v7(sarama, broker: BrokerProcess,
                                               tmp_path: Path) -> None:
    """This sarama compresses with zstd but sends it in Produce v3; Kafka (2.1 and later)
    refuses zstd below Produce v7 with UNSUPPORTED_COMPRESSION_TYPE, and so does the broker:
    every record fails, nothing is stored."""
    records = sample_records(10, seed=9)
    topic, result = _roundtrip(sarama, broker, tmp_path, "zstd", records)
    errors = result.get("produceErrors")
    assert errors and len(errors) == len(records), result
    assert all(UNSUPPORTED_COMPRESSION in e for e in errors), errors[:3]
    assert watermarks(broker.bootstrap, topic) == (0, 0)
    assert disk_batches(broker.data_dir / "logs", topic) == []


def test_consumes_zstd_batches(sarama, broker: BrokerProcess) -> None:
    """zstd batches produced by librdkafka on a topic that keeps the producer's codec come to
    sarama's Fetch v4 as they are stored, and it decompresses them byte for byte."""
    records = sample_records(RECORDS, seed=7, both_null=True)
    topic = unique_topic("sarama-zstd-in")
    create_topic(broker.bootstrap, topic)
    confluent_produce(broker.bootstrap, topic, records, compression="zstd")
    batches = disk_batches(broker.data_dir / "logs", topic)
    assert any(b.codec == CODEC_ID["zstd"] and b.record_count > 1 for b in batches)
    result = sarama.run(broker.bootstrap, "consume", topic, len(records))
    assert result["consumeErrors"] == []
    assert result["records"] == _sent(records)


def test_zstd_topic_refuses_fetch_below_v10(sarama, broker: BrokerProcess) -> None:
    records = sample_records(10, seed=8)
    topic = unique_topic("sarama-zstd-topic")
    create_topic(broker.bootstrap, topic, config={"compression.type": "zstd"})
    confluent_produce(broker.bootstrap, topic, records)
    result = sarama.run(broker.bootstrap, "consume", topic, len(records))
    assert result["records"] == []
    assert any(UNSUPPORTED_COMPRESSION in e for e in result["consumeErrors"]), result


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_batch_max_timestamp_from_records(sarama, broker: BrokerProcess, tmp_path: Path,
                                          codec: str) -> None:
    records = sample_records(RECORDS, seed=3)
    topic, result = _roundtrip(sarama, broker, tmp_path, codec, records)
    assert "produceErrors" not in result
    batches = disk_batches(broker.data_dir / "logs", topic)
    assert [b.max_timestamp for b in batches] == [
        max(r.timestamp for r in records[b.base_offset:b.last_offset + 1]) for b in batches]
    from confluent_kafka import TopicPartition

    errors: list = []
    consumer = confluent_consumer(broker.bootstrap, errors)
    try:
        found = consumer.offsets_for_times(
            [TopicPartition(topic, 0, records[5].timestamp)], timeout=10)
    finally:
        consumer.close()
    assert found[0].offset == 5, found


def test_idempotent_producer(sarama, broker: BrokerProcess) -> None:
    """Producer.Idempotent, acks=all, one request in flight, requests of at most 20 records
    interleaving six partitions: every record acknowledged once at a dense offset in send
    order, and stored once (one producer id, gap-free sequence numbers)."""
    topic = unique_topic("sarama-idem")
    n = IDEMPOTENT_PER_PARTITION
    result = sarama.run(broker.bootstrap, "idempotent", topic, IDEMPOTENT_PARTITIONS, n)
    assert "produceErrors" not in result, result["produceErrors"][:3]
    assert_idempotent_delivery(broker, topic, IDEMPOTENT_PARTITIONS, n, result["acked"],
                               result["consumed"])


def _as_rows(rows: list) -> list[tuple[str, int, int, bytes]]:
    return [(m, p, o, v.encode()) for m, p, o, v in rows]


def test_group_commit_and_resume(sarama, group_broker: BrokerProcess) -> None:
    """A ConsumerGroup member processes and marks the first 15 records of each of 3 partitions,
    its offsets are committed (OffsetCommit v2) and it leaves; a new member of the group starts
    exactly at the committed offsets and processes the rest: each record processed once."""
    topic, group = unique_topic("sarama-resume"), unique_topic("sarama-resume-g")
    p_count, per, part = RESUME_PARTITIONS, RESUME_PER_PARTITION, RESUME_FIRST_PART
    result = sarama.run(group_broker.bootstrap, "resume", topic, group, p_count, per, part)
    assert result["errors"] == []
    expected = {(p, o): f"{p}:{o}".encode() for p in range(p_count) for o in range(per)}
    first, second = _as_rows(result["first"]), _as_rows(result["second"])
    assert {(p, o) for _m, p, o, _v in first} == {k for k in expected if k[1] < part}
    assert_exactly_once(first + second, expected)
    at = {str(p): part for p in range(p_count)}
    assert result["committedAfterFirst"] == at
    assert result["groupStateAfterFirst"] == "Empty"
    assert result["secondInitialOffsets"] == at
    done = {str(p): per for p in range(p_count)}
    assert result["highWatermarks"] == done
    assert result["committedAfterSecond"] == done
    assert result["groupStateAfterSecond"] == "Empty"
    assert committed_offsets(group_broker.bootstrap, group, topic, p_count) == done


def test_default_offset_commit_v1_refused(sarama, group_broker: BrokerProcess) -> None:
    """Without Consumer.Offsets.Retention, this sarama commits through OffsetCommit v1, which
    Kafka 4 no longer serves: the broker closes the connection (as Kafka does for a version it
    does not serve), nothing is committed, and the next member starts from the beginning."""
    topic, group = unique_topic("sarama-v1"), unique_topic("sarama-v1-g")
    result = sarama.run(group_broker.bootstrap, "resume", topic, group, 1, 10, 4, 0)
    assert result["committedAfterFirst"] == {"0": -1}
    assert result["secondInitialOffsets"] == {"0": -2}  # sarama.OffsetOldest
    assert "unsupported version 1 of OffsetCommit" in programs.refusals(group_broker)
    assert committed_offsets(group_broker.bootstrap, group, topic, 1) == {"0": -1001}


def test_group_of_two_shares_then_takes_over(sarama, group_broker: BrokerProcess) -> None:
    """Two members share 4 partitions 2+2 (range), each record of the first half processed by
    the member holding its partition; member-1 leaves with its offsets committed, member-0 takes
    every partition over in the next generation and processes the second half from exactly
    there: each record processed once, the group Empty after both close."""
    topic, group = unique_topic("sarama-share"), unique_topic("sarama-share-g")
    p_count, per = SHARE_PARTITIONS, SHARE_PER_PARTITION
    result = sarama.run(group_broker.bootstrap, "share", topic, group, p_count, per)
    assert result["errors"] == []
    stable = result["stable"]
    owner = {p: m for m in ("member-0", "member-1") for p in stable[m]}
    assert sorted(owner) == list(range(p_count))
    assert len(stable["member-0"]) == len(stable["member-1"]) == p_count // 2, stable
    assert result["groupStateLive"] == "Stable"

    expected = {(p, o): f"{p}:{o}".encode() for p in range(p_count) for o in range(2 * per)}
    rows = _as_rows(result["rows"])
    assert_exactly_once(rows, expected)
    for m, p, o, _v in rows:
        want = owner[p] if o < per else "member-0"
        assert m == want, f"({p}, {o}) processed by {m}, its partition was {want}'s"
    left = {str(p): per for p in stable["member-1"]}
    assert {p: o for p, o in result["committedAfterLeave"].items() if p in left} == left
    takeover = result["takeover"]
    assert takeover["partitions"] == list(range(p_count))
    assert takeover["generation"] > stable["generation"]
    done = {str(p): 2 * per for p in range(p_count)}
    assert result["highWatermarks"] == done
    assert result["committedAfterClose"] == done
    assert result["groupStateAfterClose"] == "Empty"
    assert committed_offsets(group_broker.bootstrap, group, topic, p_count) == done
    assert [r for r in programs.refusals(group_broker) if "unsupported" in r] == []

