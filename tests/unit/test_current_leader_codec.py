"""The CurrentLeader and NodeEndpoints tagged fields (KIP-951) through the codecs the broker
answers with: Produce v10+ (partition tag 0, top-level tag 0) and Fetch (partition tag 1 from
v12, top-level tag 0 from v16). The expected bytes are written out from Kafka's
ProduceResponse.json / FetchResponse.json, not taken from the codec under test."""

from __future__ import annotations

import struct
import uuid

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceResponse

from protocol.templates import PackedFetchResponse

ProducePartition = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
FetchPartitionData = FetchResponse.FetchableTopicResponse.PartitionData


def _leader_tag(tag: int, leader: int, epoch: int) -> bytes:
    """One tagged LeaderIdAndEpoch: tag, size 9 (two int32 and the struct's empty tags)."""
    return bytes([tag, 9]) + struct.pack(">ii", leader, epoch) + b"\x00"


def _endpoints_tag(node_id: int, host: str, port: int) -> bytes:
    """Tag 0: a compact array of one NodeEndpoint with a null rack."""
    body = (b"\x02" + struct.pack(">i", node_id) + bytes([len(host) + 1]) + host.encode()
            + struct.pack(">i", port) + b"\x00" + b"\x00")
    return bytes([0, len(body)]) + body


def _produce(current_leader: bool) -> ProduceResponse:
    partition = ProducePartition(index=3, error_code=6, base_offset=-1, log_append_time_ms=-1,
                                 log_start_offset=-1, record_errors=[], error_message=None)
    response = ProduceResponse(
        responses=[ProduceResponse.TopicProduceResponse(name="t",
                                                        partition_responses=[partition])],
        throttle_time_ms=0)
    if current_leader:
        partition.current_leader = ProducePartition.LeaderIdAndEpoch(leader_id=2,
                                                                     leader_epoch=5)
        response.node_endpoints = [ProduceResponse.NodeEndpoint(node_id=2, host="h",
                                                                port=9092, rack=None)]
    return response


@pytest.mark.parametrize("version", [10, 11])
def test_produce_current_leader_and_node_endpoints(version: int) -> None:
    plain = bytes(_produce(False).encode(version=version))
    tagged = bytes(_produce(True).encode(version=version))
    # The tail is the partition's tags, the topic's, the throttle time and the response's
    # tags: the partition's none (b"\x00") become one, tag 0; the response's likewise.
    partition_end = len(plain) - 7
    expected = (plain[:partition_end] + b"\x01" + _leader_tag(0, 2, 5)
                + plain[partition_end + 1:-1] + b"\x01" + _endpoints_tag(2, "h", 9092))
    assert tagged == expected
    back = ProduceResponse.decode(tagged, version=version)
    [p] = back.responses[0].partition_responses
    assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (2, 5)
    [node] = back.node_endpoints
    assert (node.node_id, node.host, node.port, node.rack) == (2, "h", 9092, None)


def test_produce_before_v10_has_no_tagged_leader() -> None:
    assert _produce(True).encode(version=9) == _produce(False).encode(version=9)


def _fetch(version: int, current_leader: bool) -> FetchResponse:
    packed = PackedFetchResponse(0, 0, [(uuid.UUID(int=7), [(0, 6, -1, -1, -1, None, None)])],
                                 by_id=version >= 13)
    if version < 13:
        packed = PackedFetchResponse(0, 0, [("t", [(0, 6, -1, -1, -1, None, None)])],
                                     by_id=False)
    message = packed.message
    if current_leader:
        [p] = message.responses[0].partitions
        p.current_leader = FetchPartitionData.LeaderIdAndEpoch(leader_id=2, leader_epoch=5)
        message.node_endpoints = [FetchResponse.NodeEndpoint(node_id=2, host="h", port=9092,
                                                             rack=None)]
    return message


@pytest.mark.parametrize("version", [12, 15, 16])
def test_fetch_current_leader_and_node_endpoints(version: int) -> None:
    plain = bytes(_fetch(version, False).encode(version=version))
    tagged = bytes(_fetch(version, True).encode(version=version))
    # The partition's tags are followed by the topic's and the response's (each b"\x00").
    head = plain[:-3]
    expected = head + b"\x01" + _leader_tag(1, 2, 5) + b"\x00"
    if version >= 16:
        expected += b"\x01" + _endpoints_tag(2, "h", 9092)
    else:
        expected += b"\x00"
    assert tagged == expected
    back = FetchResponse.decode(tagged, version=version)
    [p] = back.responses[0].partitions
    assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (2, 5)
    if version >= 16:
        assert [(n.node_id, n.host, n.port) for n in back.node_endpoints] == [(2, "h", 9092)]


def test_a_materialized_packed_fetch_sends_the_tagged_fields() -> None:
    packed = PackedFetchResponse(0, 0, [(uuid.UUID(int=7), [(0, 6, -1, -1, -1, None, None)])],
                                 by_id=True)
    [p] = packed.message.responses[0].partitions
    p.current_leader = FetchPartitionData.LeaderIdAndEpoch(leader_id=4, leader_epoch=1)
    back = PackedFetchResponse.decode(packed.encode(16), version=16)
    assert back.responses[0].partitions[0].current_leader.leader_id == 4
