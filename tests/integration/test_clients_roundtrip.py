"""Real clients round-trip awkward records through one broker, with every compression codec.

Each client produces and consumes its own topic; a second group of tests produces with one
client and consumes with another. Every byte of key, value and headers is compared, timestamps
are the explicit CreateTime values the producer set, offsets are consecutive from 0, and the
segment files show the batches stored with the codec the producer used (never recompressed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    CODEC_ID,
    CODECS,
    CONSUMERS,
    LOG_APPEND_TIME,
    PRODUCER_LIMITS,
    PRODUCERS,
    assert_roundtrip,
    assert_stored_as_sent,
    confluent_produce,
    create_topic,
    disk_batches,
    sample_records,
    unique_topic,
    watermarks,
)

CLIENTS = ["confluent", "aiokafka", "kafka-python"]


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    """One broker for the module: starting one per case would dominate the run time."""
    b = BrokerProcess(tmp_path_factory.mktemp("roundtrip"), {"num.partitions": "1"}).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.stop()


def _roundtrip(broker: BrokerProcess, producer: str, consumer: str, codec: str) -> None:
    topic = unique_topic(f"rt-{producer}-{consumer}-{codec}")
    create_topic(broker.bootstrap, topic)
    sent = sample_records(40, seed=len(topic), **PRODUCER_LIMITS[producer])

    offsets = PRODUCERS[producer](broker.bootstrap, topic, sent, compression=codec)
    assert offsets == list(range(len(sent)))

    got = CONSUMERS[consumer](broker.bootstrap, topic, len(sent))
    assert_roundtrip(got, sent)
    assert watermarks(broker.bootstrap, topic) == (0, len(sent))

    batches = disk_batches(broker.data_dir / "logs", topic)
    assert batches, "nothing on disk"
    assert {b.magic for b in batches} == {2}
    assert_stored_as_sent(batches, codec)
    assert batches[0].base_offset == 0
    for prev, nxt in zip(batches, batches[1:], strict=False):
        assert nxt.base_offset == prev.last_offset + 1
    assert batches[-1].last_offset == len(sent) - 1
    assert sum(b.record_count for b in batches) == len(sent)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("client", CLIENTS)
def test_same_client_roundtrip(shared_broker: BrokerProcess, client: str, codec: str) -> None:
    _roundtrip(shared_broker, client, client, codec)


@pytest.mark.parametrize(
    ("producer", "consumer", "codec"),
    [
        ("confluent", "kafka-python", "zstd"),
        ("kafka-python", "aiokafka", "lz4"),
        ("aiokafka", "confluent", "snappy"),
        ("confluent", "aiokafka", "gzip"),
    ],
)
def test_cross_client_roundtrip(
    shared_broker: BrokerProcess, producer: str, consumer: str, codec: str
) -> None:
    _roundtrip(shared_broker, producer, consumer, codec)


@pytest.mark.parametrize("consumer", CLIENTS)
def test_log_append_time_topic(shared_broker: BrokerProcess, consumer: str) -> None:
    """A topic with message.timestamp.type=LogAppendTime: the broker's clock replaces the
    producer's timestamps, and every client reads them back as LogAppendTime."""
    topic = unique_topic(f"lat-{consumer}")
    create_topic(shared_broker.bootstrap, topic, config={"message.timestamp.type":
                                                          "LogAppendTime"})
    sent = sample_records(12, seed=3)
    before = int(time.time() * 1000)
    assert confluent_produce(shared_broker.bootstrap, topic, sent[:6], compression="zstd") == [
        0, 1, 2, 3, 4, 5]
    assert confluent_produce(shared_broker.bootstrap, topic, sent[6:]) == list(range(6, 12))
    after = int(time.time() * 1000)

    got = CONSUMERS[consumer](shared_broker.bootstrap, topic, len(sent))
    assert [g.offset for g in got] == list(range(len(sent)))
    for g, r in zip(got, sent, strict=True):
        assert (g.rec.key, g.rec.value, g.rec.headers) == (r.key, r.value, r.headers)
        assert g.timestamp_type == LOG_APPEND_TIME
        assert before - 5 <= g.rec.timestamp <= after + 5, (g.rec.timestamp, before, after)
    batches = disk_batches(shared_broker.data_dir / "logs", topic)
    assert all(b.attributes & 0x8 for b in batches), "timestamp-type bit must be set"
    # librdkafka may split a send into batches and leaves a batch uncompressed when zstd would
    # not shrink it; the codec of each is what it was sent with (checked in the round trips).
    assert {b.codec for b in batches} <= {CODEC_ID["zstd"], 0}


def test_broker_still_healthy(shared_broker: BrokerProcess) -> None:
    """After every case above: still running, and no request was refused or errored."""
    assert shared_broker.proc is not None and shared_broker.proc.poll() is None
    bad = [
        line for line in shared_broker.new_log_lines()
        if line.get("level") in ("error", "critical") or line.get("event") == "closing connection"
    ]
    assert not bad, bad[:5]
