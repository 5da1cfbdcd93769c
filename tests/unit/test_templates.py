"""Template-encoded responses are byte for byte what kafka-python encodes, at every version."""

from __future__ import annotations

import random
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse

from broker.apis.fetch import handle as handle_fetch
from broker.replica.fetch_session import FetchSessionCache
from protocol.errors import ErrorCode
from protocol.registry import APIS, FETCH_KEY, PRODUCE_KEY
from protocol.templates import FetchPartition, PackedFetchResponse, SinglePartitionProduceResponse

PRODUCE = APIS[PRODUCE_KEY]


@pytest.mark.parametrize("version", range(PRODUCE.min_version, PRODUCE.max_version + 1))
def test_single_partition_produce_response_matches_kafka_python(version: int) -> None:
    rnd = random.Random(version)
    names = ["t", "", "é" * 70, "x" * 300, "requests"]
    for _ in range(300):
        answer = SinglePartitionProduceResponse(
            rnd.choice(names), rnd.randrange(-1, 2**31), rnd.choice((0, 6, 87, -1)),
            rnd.choice((-1, 0, rnd.randrange(2**63))), rnd.choice((-1, rnd.randrange(2**41))),
            rnd.choice((-1, 0, rnd.randrange(2**40))))
        expected = bytes(answer.to_message().encode(version=version))
        assert answer.encode(version) == expected
        assert answer.encode(version) == expected, "the cached name gives the same bytes"


def test_it_reads_as_a_produce_response() -> None:
    answer = SinglePartitionProduceResponse("t", 3, 0, 41, -1, 0)
    [t] = answer.responses
    [p] = t.partition_responses
    assert (t.name, p.index, p.error_code, p.base_offset, p.record_errors, p.error_message) == (
        "t", 3, 0, 41, [], None)


# -- Fetch -------------------------------------------------------------------------------------

FETCH = APIS[FETCH_KEY]
FETCH_VERSIONS = range(FETCH.min_version, FETCH.max_version + 1)


def _fetch_partition(rnd: random.Random, records: bool) -> FetchPartition:
    aborted = rnd.choice((None, None, [], [(rnd.randrange(2**40), rnd.randrange(2**40))
                                           for _ in range(rnd.randrange(1, 4))]))
    data: bytes | memoryview | None = b""
    if records:
        blob = rnd.randbytes(rnd.choice((1, 61, 200, 70_000)))
        data = rnd.choice((blob, memoryview(blob)[:len(blob) // 2 + 1]))
    elif rnd.random() < 0.1:
        data = None
    offsets = (rnd.choice((-1, rnd.randrange(2**50))), rnd.choice((-1, rnd.randrange(2**50))),
               rnd.choice((-1, 0, rnd.randrange(2**50))))
    return (rnd.randrange(2**31), rnd.choice((0, 1, 3, 100)), *offsets, aborted, data)


def _fetch_answer(rnd: random.Random, version: int, records: bool) -> PackedFetchResponse:
    by_id = version >= 13
    names = ["t", "", "é" * 70, "x" * 300, "idle"]
    shape = rnd.choice(((1, 1), (1, 3), (3, 2), (0, 0), (2, 1)))
    topics = []
    for _ in range(shape[0]):
        key = uuid.UUID(int=rnd.randrange(2**128)) if by_id else rnd.choice(names)
        topics.append((key, [_fetch_partition(rnd, records and rnd.random() < 0.7)
                             for _ in range(shape[1])]))
    return PackedFetchResponse(rnd.choice((0, 0, 70, 71)), rnd.choice((0, rnd.randrange(2**31))),
                               topics, by_id=by_id)


def _joined(encoded: bytes | list[Any]) -> bytes:
    return b"".join(encoded) if type(encoded) is list else encoded


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("records", [False, True], ids=["empty", "records"])
def test_packed_fetch_response_matches_kafka_python(version: int, records: bool) -> None:
    rnd = random.Random(version * 2 + records)
    for _ in range(200):
        answer = _fetch_answer(rnd, version, records)
        expected = bytes(answer.to_message().encode(version=version))
        encoded = answer.encode(version)
        assert _joined(encoded) == expected
        assert _joined(answer.encode(version)) == expected, "the cached names give the same bytes"
        blobs = [p[6] for _, ps in answer.topics for p in ps if p[6]]
        if not blobs:
            assert type(encoded) is bytes, "an answer without records is one bytes object"
        else:
            assert type(encoded) is list
            assert [part for part in encoded if any(part is b for b in blobs)] == blobs, (
                "each partition's records are handed on as they are, not copied")


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_the_idle_answer_matches_kafka_python(version: int) -> None:
    """The long poll's expiry: one partition, no records, no aborted transactions."""
    key = uuid.UUID(int=7) if version >= 13 else "idle"
    answer = PackedFetchResponse(0, 5, [(key, [(0, 0, 0, 0, 0, None, b"")])],
                                 by_id=version >= 13)
    assert answer.encode(version) == bytes(answer.to_message().encode(version=version))


def test_it_reads_as_a_fetch_response_and_edits_stick() -> None:
    answer = PackedFetchResponse(0, 9, [("t", [(2, 0, 41, 41, 0, None, b"")])], by_id=False)
    [t] = answer.responses
    [p] = t.partitions
    assert (t.topic, p.partition_index, p.high_watermark, p.preferred_read_replica) == (
        "t", 2, 41, -1)
    p.error_code = 6  # code that edits the answer's entries (fault injection) edits what is sent
    assert FetchResponse.decode(answer.encode(12), version=12).responses[0].partitions[0] \
        .error_code == 6


SESSION_ERRORS = [ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH]


def _kafka_python_session_error(error: int, version: int) -> bytes:
    """The session-error answer as kafka-python's generic encoder writes it."""
    return bytes(FetchResponse(throttle_time_ms=0, error_code=error, session_id=0,
                               responses=[]).encode(version=version))


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@pytest.mark.parametrize("error", SESSION_ERRORS, ids=lambda e: e.name)
def test_the_session_error_answer_matches_kafka_python(version: int, error: ErrorCode) -> None:
    """A top-level error, no session and no topics."""
    answer = PackedFetchResponse(error, 0, [], by_id=version >= 13)
    assert answer.encode(version) == _kafka_python_session_error(error, version)


@pytest.mark.parametrize("version", range(7, FETCH.max_version + 1))  # sessions start at v7
def test_the_fetch_handler_packs_its_session_errors(version: int) -> None:
    ctx = SimpleNamespace(fetch_sessions=FetchSessionCache(),
                          topics=SimpleNamespace(metadata=SimpleNamespace(by_id={})))
    session = ctx.fetch_sessions.create({})
    assert session is not None

    def fetch(session_id: int, epoch: int) -> Any:
        body = FetchRequest(version=version, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                            session_id=session_id, session_epoch=epoch, topics=[],
                            forgotten_topics_data=[])
        return handle_fetch(ctx, SimpleNamespace(body=body, version=version))  # type: ignore[arg-type]

    unknown = fetch(session.session_id + 1, 1)
    stale = fetch(session.session_id, session.epoch + 1)
    for answer, error in zip((unknown, stale), SESSION_ERRORS, strict=True):
        assert type(answer) is PackedFetchResponse, "packed from the template"
        assert answer.encode(version) == _kafka_python_session_error(error, version)
