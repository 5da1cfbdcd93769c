"""protocol.validate.schema_violation: every served request that keeps to its schema passes,
and every null Kafka's readers refuse ("non-nullable field ... was serialized as null") is
named, whether it came from kafka-python's encoder or from hand-written bytes."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.admin import DeleteTopicsRequest
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer import FetchRequest, JoinGroupRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from protocol.validate import plan, schema_violation
from tests.property.messages import SERVED, Builder, null_paths, problems

SERVED_IDS = [f"{spec.name}-v{v}" for spec, v in SERVED]


def _roundtrip(message: ApiMessage, cls: type[ApiMessage], version: int) -> ApiMessage:
    # The base encoder: MetadataRequest's own rewrites a null topic list for v0.
    return cls.decode(ApiMessage.encode(message, version=version), version=version)


@pytest.mark.parametrize(("spec", "version"), SERVED, ids=SERVED_IDS)
def test_valid_requests_pass(spec, version) -> None:
    for null_rate in (0.0, 1.0):  # nullable fields filled, then all null
        sent = Builder(null_rate=null_rate).message(spec.request, version)
        got = _roundtrip(sent, spec.request, version)
        assert problems(got, version) == []
        assert schema_violation(got, version) is None


@pytest.mark.parametrize(("spec", "version"), SERVED, ids=SERVED_IDS)
def test_every_forbidden_null_is_named(spec, version) -> None:
    missed = []
    for path, where in null_paths(spec.request, version):
        value = None if where == "field" else [None]
        sent = Builder(overrides={path: value}).message(spec.request, version)
        got = _roundtrip(sent, spec.request, version)
        dotted = ".".join(path).replace(".[]", "[]")
        expected = (f"non-nullable field {dotted} is null" if where == "field"
                    else f"non-nullable element of {dotted} is null")
        if schema_violation(got, version) != expected:
            missed.append((dotted, where, schema_violation(got, version)))
    assert missed == []


# -- hand-written bytes: what a mutating client sends, independent of any encoder ------------


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def s16(text: str) -> bytes:
    return i16(len(text)) + text.encode()


def test_produce_topic_name_null() -> None:
    # v3: transactional_id null, acks -1, timeout 5000, one topic named null, no partitions.
    body = i16(-1) + i16(-1) + i32(5000) + i32(1) + i16(-1) + i32(0)
    req = ProduceRequest.decode(body, version=3)
    assert req.topic_data[0].name is None  # what kafka-python hands on
    assert schema_violation(req, 3) == "non-nullable field topic_data[].name is null"


def test_produce_topic_name_null_compact() -> None:
    # v9 (flexible): compact lengths are length + 1, so 0 is null.
    body = b"\x00" + i16(1) + i32(5000) + b"\x02" + b"\x00" + b"\x01" + b"\x00" + b"\x00"
    req = ProduceRequest.decode(body, version=9)
    assert schema_violation(req, 9) == "non-nullable field topic_data[].name is null"


def test_any_negative_string_length_is_null() -> None:
    # Kafka's readers treat every negative length as null, not only -1.
    body = i16(-1) + i16(1) + i32(5000) + i32(1) + i16(-7) + i32(0)
    req = ProduceRequest.decode(body, version=3)
    assert schema_violation(req, 3) == "non-nullable field topic_data[].name is null"


def test_produce_nulls_where_allowed_pass() -> None:
    # transactional_id and records are nullable in every version.
    body = (i16(-1) + i16(1) + i32(5000) + i32(1) + s16("t") + i32(1) + i32(0) + i32(-1))
    req = ProduceRequest.decode(body, version=3)
    assert req.topic_data[0].partition_data[0].records is None
    assert schema_violation(req, 3) is None


def test_fetch_topics_null() -> None:
    body = i32(-1) + i32(500) + i32(1) + i32(1 << 20) + b"\x00" + i32(-1)
    req = FetchRequest.decode(body, version=4)
    assert req.topics is None
    assert schema_violation(req, 4) == "non-nullable field topics is null"


def test_metadata_topics_null_only_from_v1() -> None:
    # v0 has no "all topics" null; v1 made the array nullable.
    body = i32(-1)
    assert schema_violation(MetadataRequest.decode(body, version=0), 0) == (
        "non-nullable field topics is null")
    assert schema_violation(MetadataRequest.decode(body, version=1), 1) is None


def test_delete_topics_null_name_element() -> None:
    body = i32(2) + s16("t") + i16(-1) + i32(30000)
    req = DeleteTopicsRequest.decode(body, version=1)
    assert req.topic_names == ["t", None]
    assert schema_violation(req, 1) == "non-nullable element of topic_names is null"


def test_join_group_protocol_metadata_null() -> None:
    body = (s16("g") + i32(10000) + s16("") + s16("consumer") + i32(1) + s16("range")
            + i32(-1))
    req = JoinGroupRequest.decode(body, version=0)
    assert schema_violation(req, 0) == "non-nullable field protocols[].metadata is null"


def test_first_violation_in_schema_order() -> None:
    body = i16(-1) + i16(1) + i32(5000) + i32(2) + s16("t") + i32(-1) + i16(-1) + i32(0)
    req = ProduceRequest.decode(body, version=3)
    assert schema_violation(req, 3) == "non-nullable field topic_data[].partition_data is null"


def test_plan_reads_only_what_can_break() -> None:
    source = plan(ProduceRequest, 9).__doc__ or ""
    for name in ("topic_data", "name", "partition_data"):
        assert f".{name}" in source
    for name in ("transactional_id", "acks", "timeout_ms", "records", "index"):
        assert f".{name}" not in source
    # v12 made topics and their names nullable: nothing left to check, no compiled walk.
    assert plan(MetadataRequest, 12).__doc__ is None
