"""Template-encoded responses are byte for byte what kafka-python encodes, at every version."""

from __future__ import annotations

import random

import pytest

from protocol.registry import APIS, PRODUCE_KEY
from protocol.templates import SinglePartitionProduceResponse

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
