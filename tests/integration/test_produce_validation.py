"""Topic compression and per-record produce errors against a real broker, as Kafka answers them.

Topics are created through confluent-kafka's AdminClient with Kafka's topic keys. A topic
whose compression.type names a codec stores every batch with it (read back from the segment
file), whatever the producer sent, and every record comes back byte for byte. Records Kafka's
LogValidator refuses (no key on a compacted topic, a timestamp beyond
message.timestamp.after.max.ms) fail the whole produce with INVALID_RECORD / INVALID_TIMESTAMP,
the refused records listed in record_errors, and nothing is stored.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zstandard
from confluent_kafka.admin import AdminClient, ConfigResource
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    CODEC_ID,
    ClientError,
    DiskBatch,
    Rec,
    assert_roundtrip,
    confluent_consume,
    confluent_produce,
    create_topic,
    disk_batches,
    numbered,
    sample_records,
    unique_topic,
    watermarks,
)
from tests.support.wire import Wire

INVALID_TIMESTAMP = 32
INVALID_RECORD = 87
HOUR_MS = 3_600_000
RECORDS_OFFSET = 61  # the records section of a v2 batch starts after the 61-byte header


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("validation")).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.stop()


def stored(broker: BrokerProcess, topic: str) -> list[DiskBatch]:
    return disk_batches(broker.data_dir / "logs", topic)


def topic_config(broker: BrokerProcess, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4"})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    return {k: v.value for k, v in admin.describe_configs([res])[res].result(15).items()}


def raw_produce(broker: BrokerProcess, topic: str, records: list[tuple[bytes | None, int]]):
    """One uncompressed batch of (key, timestamp) records in a ProduceRequest v9; the
    partition's response, which carries record_errors and error_message."""
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i, (key, ts) in enumerate(records):
        builder.append(i, ts, key, b"value-%d" % i, [])
    request = ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=5000,
        topic_data=[ProduceRequest.TopicProduceData(
            name=topic,
            partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(
                index=0, records=bytes(builder.build()))],
        )],
    )
    wire = Wire(broker.port)
    try:
        response = wire.request(request, ProduceResponse)
    finally:
        wire.close()
    [topic_response] = response.responses
    [partition] = topic_response.partition_responses
    return partition


# -- compression.type --------------------------------------------------------------------------


@pytest.mark.parametrize("producer_codec", ["lz4", "none"])
def test_gzip_topic_stores_gzip_whatever_the_producer_sent(
    broker: BrokerProcess, producer_codec: str
) -> None:
    topic = unique_topic(f"gzip-from-{producer_codec}")
    create_topic(broker.bootstrap, topic, config={"compression.type": "gzip"})
    assert topic_config(broker, topic)["compression.type"] == "gzip"
    sent = sample_records(40, seed=7)

    assert confluent_produce(broker.bootstrap, topic, sent, compression=producer_codec) == list(
        range(len(sent)))

    batches = stored(broker, topic)
    assert batches and {b.codec for b in batches} == {CODEC_ID["gzip"]}
    assert sum(b.record_count for b in batches) == len(sent)
    assert_roundtrip(confluent_consume(broker.bootstrap, topic, len(sent)), sent)
    assert watermarks(broker.bootstrap, topic) == (0, len(sent))


def test_zstd_topic_recompresses_at_its_level(broker: BrokerProcess) -> None:
    topic = unique_topic("zstd-19")
    create_topic(broker.bootstrap, topic,
                 config={"compression.type": "zstd", "compression.zstd.level": "19"})
    sent = sample_records(30, seed=11)

    confluent_produce(broker.bootstrap, topic, sent, compression="lz4")

    batches = stored(broker, topic)
    assert batches and {b.codec for b in batches} == {CODEC_ID["zstd"]}
    for b in batches:  # the payload is exactly zstd at level 19 of the records section
        data = b.segment.read_bytes()[b.position : b.position + 12 + b.length]
        payload = data[RECORDS_OFFSET:]
        records = zstandard.ZstdDecompressor().decompressobj().decompress(payload)
        assert payload == zstandard.ZstdCompressor(level=19).compress(records)
        assert payload != zstandard.ZstdCompressor(level=3).compress(records)
    assert_roundtrip(confluent_consume(broker.bootstrap, topic, len(sent)), sent)


def test_producer_topic_keeps_the_producer_codec(broker: BrokerProcess) -> None:
    topic = unique_topic("producer-codec")
    create_topic(broker.bootstrap, topic, config={"compression.type": "producer"})
    sent = sample_records(20, seed=5)
    confluent_produce(broker.bootstrap, topic, sent, compression="snappy")
    assert CODEC_ID["snappy"] in {b.codec for b in stored(broker, topic)}
    assert_roundtrip(confluent_consume(broker.bootstrap, topic, len(sent)), sent)


def test_bad_compression_configs_are_refused(broker: BrokerProcess) -> None:
    for config in ({"compression.type": "brotli"}, {"compression.gzip.level": "10"},
                   {"compression.zstd.level": "23"}, {"message.timestamp.after.max.ms": "-1"}):
        with pytest.raises(Exception, match="INVALID_CONFIG"):
            create_topic(broker.bootstrap, unique_topic("bad"), config=config)


# -- per-record errors -----------------------------------------------------------------------


def test_keyless_record_on_compacted_topic_is_invalid_record(broker: BrokerProcess) -> None:
    topic = unique_topic("compacted")
    create_topic(broker.bootstrap, topic, config={"cleanup.policy": "compact"})
    now = int(time.time() * 1000)

    part = raw_produce(broker, topic, [(b"k0", now), (None, now), (b"k2", now), (None, now)])

    assert part.error_code == INVALID_RECORD
    assert [e.batch_index for e in part.record_errors] == [1, 3]
    assert all("without a key" in e.batch_index_error_message for e in part.record_errors)
    assert part.error_message and "2 record errors" in part.error_message
    assert watermarks(broker.bootstrap, topic) == (0, 0) and stored(broker, topic) == []
    # with keys, the same topic takes them; a librdkafka producer sees the refusal too
    assert raw_produce(broker, topic, [(b"k0", now), (b"k1", now)]).error_code == 0
    with pytest.raises(ClientError, match="INVALID_RECORD"):
        confluent_produce(broker.bootstrap, topic, [Rec(None, b"v")], timeout=10)
    assert watermarks(broker.bootstrap, topic) == (0, 2)


def test_timestamp_beyond_after_max_is_invalid_timestamp(broker: BrokerProcess) -> None:
    topic = unique_topic("future")
    create_topic(broker.bootstrap, topic,
                 config={"message.timestamp.after.max.ms": str(HOUR_MS)})
    now = int(time.time() * 1000)

    part = raw_produce(broker, topic, [(b"k0", now), (b"k1", now + 2 * HOUR_MS), (b"k2", now)])

    assert part.error_code == INVALID_TIMESTAMP
    assert [e.batch_index for e in part.record_errors] == [1]
    assert "out of range" in part.record_errors[0].batch_index_error_message
    assert part.error_message
    assert watermarks(broker.bootstrap, topic) == (0, 0) and stored(broker, topic) == []
    # librdkafka reports the partition's error only for a lone refused record (with several,
    # each listed record fails with INVALID_RECORD, whatever the partition's error).
    with pytest.raises(ClientError, match="INVALID_TIMESTAMP"):
        confluent_produce(broker.bootstrap, topic, numbered(1, ts=now + 2 * HOUR_MS), timeout=10)
    sent = numbered(3, ts=now)
    assert confluent_produce(broker.bootstrap, topic, sent, compression="gzip") == [0, 1, 2]
    assert_roundtrip(confluent_consume(broker.bootstrap, topic, 3), sent)


def test_broker_still_healthy(broker: BrokerProcess) -> None:
    assert broker.proc is not None and broker.proc.poll() is None
    bad = [line for line in broker.new_log_lines() if line.get("level") in ("error", "critical")]
    assert not bad, bad[:5]
