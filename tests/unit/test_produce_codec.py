"""The hand-written Produce decoder against kafka-python's, on random requests of every served
version, valid, truncated, with flipped bytes and with tagged fields: the same message (or both
refuse), and records that are views into the frame, not copies."""

from __future__ import annotations

import random
from typing import Any

import pytest
from kafka.protocol.producer import ProduceRequest

from protocol.produce_codec import MAX_VERSION, MIN_VERSION, ProduceRequestCodec, decode_produce
from protocol.registry import APIS, PRODUCE_KEY
from protocol.validate import schema_violation

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)
Topic = ProduceRequest.TopicProduceData
Partition = Topic.PartitionProduceData


def _random_request(rnd: random.Random) -> ProduceRequest:
    def name() -> str:
        return "".join(rnd.choice("abcé-_.0") for _ in range(rnd.randrange(0, 12)))

    def records() -> bytes | None:
        return None if rnd.random() < 0.1 else rnd.randbytes(rnd.choice((0, 1, 61, 200, 1100)))

    topics = [Topic(name=name(), partition_data=[
        Partition(index=rnd.randrange(-1, 2**31), records=records())
        for _ in range(rnd.randrange(0, 4))]) for _ in range(rnd.randrange(0, 4))]
    return ProduceRequest(transactional_id=None if rnd.random() < 0.5 else name(),
                          acks=rnd.choice((-1, 0, 1, 7)), timeout_ms=rnd.randrange(-5, 2**31),
                          topic_data=topics)


def _tree(message: Any) -> Any:
    """Every field as plain values (records as bytes), and the bookkeeping kafka-python sets."""
    if message is None or isinstance(message, (int, str)):
        return message
    if isinstance(message, (bytes, memoryview)):
        return bytes(message)
    if isinstance(message, list):
        return [_tree(m) for m in message]
    fields = {k: _tree(getattr(message, k)) for k in
              ("transactional_id", "acks", "timeout_ms", "topic_data", "name", "partition_data",
               "index", "records") if hasattr(message, k)}
    return (type(message).__name__, message._version, message.tags, message.unknown_tags,
            fields)


def _outcome(decode: Any, body: bytes | bytearray, version: int) -> Any:
    try:
        message = decode(memoryview(body), version)
    except Exception:
        return "refused"
    return _tree(message), schema_violation(message, version)


def _theirs(data: memoryview, version: int) -> Any:
    return ProduceRequest.decode(data, version=version)


def _same(body: bytes | bytearray, version: int) -> None:
    assert _outcome(decode_produce, body, version) == _outcome(_theirs, body, version)


@pytest.mark.parametrize("version", VERSIONS)
def test_random_requests_decode_as_kafka_python_decodes_them(version: int) -> None:
    rnd = random.Random(version)
    for _ in range(200):
        sent = _random_request(rnd)
        body = bytes(sent.encode(version=version))
        mine = decode_produce(memoryview(body), version)
        assert _tree(mine) == _tree(ProduceRequest.decode(body, version=version))
        assert type(mine) is ProduceRequest
        assert mine.expect_response() == (sent.acks != 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_truncated_and_garbled_requests_fail_or_decode_alike(version: int) -> None:
    rnd = random.Random(1000 + version)
    for _ in range(150):
        body = bytes(_random_request(rnd).encode(version=version))
        for cut in {0, 1, len(body) // 2, max(0, len(body) - 1), rnd.randrange(len(body) + 1)}:
            _same(body[:cut], version)
        garbled = bytearray(body)
        for _ in range(rnd.randrange(1, 4)):
            if garbled:
                garbled[rnd.randrange(len(garbled))] = rnd.choice((0x00, 0x80, 0xFF, 0x7F, 0x01))
        _same(garbled, version)


@pytest.mark.parametrize("version", range(9, MAX_VERSION + 1))
def test_tagged_fields_are_kept_as_kafka_python_keeps_them(version: int) -> None:
    body = bytearray(ProduceRequest(transactional_id=None, acks=1, timeout_ms=5, topic_data=[
        Topic(name="t", partition_data=[Partition(index=0, records=b"xyz")])]).encode(
            version=version))
    assert body[-1] == 0
    tagged = body[:-1] + bytes([1, 9, 2, 0xAA, 0xBB])  # one unknown tag on the request
    _same(tagged, version)
    assert decode_produce(memoryview(tagged), version).unknown_tags


def test_records_are_a_writable_view_into_the_frame() -> None:
    frame = bytearray(ProduceRequest(transactional_id=None, acks=1, timeout_ms=5, topic_data=[
        Topic(name="t", partition_data=[Partition(index=0, records=b"abcdef")])]).encode(
            version=11))
    records = decode_produce(memoryview(frame), 11).topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and not records.readonly
    records[0:1] = b"Z"
    assert b"Zbcdef" in frame, "written in place: the records are the frame's bytes"


def test_the_registry_decodes_produce_by_hand_and_still_builds_with_kafka_python() -> None:
    spec = APIS[PRODUCE_KEY]
    assert spec.request is ProduceRequestCodec and spec.name == "Produce"
    assert (spec.min_version, spec.max_version) == (MIN_VERSION, MAX_VERSION)
    assert spec.flexible(9) and not spec.flexible(8)
    built = spec.request(transactional_id="x", acks=-1, timeout_ms=1, topic_data=[])
    body = bytes(built.encode(version=7))
    assert _tree(spec.request.decode(body, version=7)) == _tree(
        ProduceRequest.decode(body, version=7))
    assert ProduceRequest[7] is not ProduceRequestCodec[7]
