"""broker.testing's pieces without a broker: error answers in each API's layout, the names
faults accept, the manual clock's due-now callbacks, keyword arguments as property keys."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DeleteTopicsRequest
from kafka.protocol.consumer import FetchRequest, OffsetFetchRequest
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from broker.metadata.file_store import MetadataStore
from broker.network.request import Request
from broker.testing import ManualClock, error_response
from broker.testing.embedded import _with_port, property_name
from broker.testing.faults import Faults, _merged, api_spec, error_code
from protocol.framing import RequestHeaderView
from protocol.templates import PackedFetchResponse, SinglePartitionProduceResponse

P = ProduceRequest
TopicData = P.TopicProduceData
PartitionData = TopicData.PartitionProduceData


def produce_request(version: int) -> ProduceRequest:
    return P(version=version, acks=1, timeout_ms=1000, topic_data=[
        TopicData(name="t", partition_data=[PartitionData(index=0, records=b""),
                                            PartitionData(index=1, records=b"")]),
        TopicData(name="u", partition_data=[PartitionData(index=0, records=b"")])])


def roundtrip(response, version):
    return type(response).decode(response.encode(version=version), version=version)


@pytest.mark.parametrize("version", range(3, 12))
def test_produce_error_names_every_partition_of_the_request(version):
    response = roundtrip(error_response(api_spec("Produce"), version, produce_request(version),
                                        6), version)
    got = {(t.name, p.index): p.error_code
           for t in response.responses for p in t.partition_responses}
    assert got == {("t", 0): 6, ("t", 1): 6, ("u", 0): 6}


def test_a_topic_fault_answers_only_its_entries():
    request = produce_request(9)
    response = error_response(api_spec("Produce"), 9, request, 6,
                              keep=lambda t, p: t == "t" and p == 1, top_level=False)
    assert [(t.name, [p.index for p in t.partition_responses]) for t in response.responses] \
        == [("t", [1])]


@pytest.mark.parametrize("version", [3, 9, 11])
def test_a_topic_fault_merged_into_a_packed_produce_answer_is_sent(version):
    """The served partition's answer is packed from a template; the faulted entries merged
    into it must reach the wire."""
    failed = error_response(api_spec("Produce"), version, produce_request(version), 6,
                            keep=lambda t, p: t == "u", top_level=False)
    served = SinglePartitionProduceResponse("t", 0, 0, 42, -1, 0)
    response = _merged(served, failed)
    got = roundtrip(response, version)
    assert {(t.name, p.index): (p.error_code, p.base_offset)
            for t in got.responses for p in t.partition_responses} \
        == {("t", 0): (0, 42), ("u", 0): (6, 0)}


@pytest.mark.parametrize("version", [4, 11, 12])
def test_fetch_error_is_top_level_and_per_partition(version):
    F = FetchRequest
    request = F(version=version, max_wait_ms=1, min_bytes=1, topics=[
        F.FetchTopic(topic="t", partitions=[F.FetchTopic.FetchPartition(partition=2)])])
    response = roundtrip(error_response(api_spec("Fetch"), version, request, 6), version)
    [topic] = response.responses
    assert topic.topic == "t"
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [(2, 6)]
    if version >= 7:
        assert response.error_code == 6


class _Broker:
    """What the fault filter is handed: the dispatch of a broker holding the topics' metadata."""

    def __init__(self, tmp_path: Path) -> None:
        self.metadata = MetadataStore(tmp_path)
        self.metadata.load()
        self.served: list[tuple[str, int]] = []

    def handle(self, request: Request) -> PackedFetchResponse:
        """Every partition asked for, served without error (high watermark 10)."""
        by_id = request.version >= 13
        topics = []
        for t in request.body.topics:
            name = self.metadata.by_id[t.topic_id].name if by_id else t.topic
            self.served += [(name, p.partition) for p in t.partitions]
            topics.append((t.topic_id if by_id else t.topic,
                           [(p.partition, 0, 10, 10, 0, None, b"") for p in t.partitions]))
        return PackedFetchResponse(0, 0, topics, by_id=by_id)


def fetch_request(version: int, topics: dict[str, tuple[uuid.UUID, list[int]]]) -> Request:
    """A Fetch naming each topic by name (v12 and before) or by id (v13 and later)."""
    F = FetchRequest
    entries = [F.FetchTopic(**({"topic_id": tid} if version >= 13 else {"topic": name}),
                            partitions=[F.FetchTopic.FetchPartition(partition=p, fetch_offset=0,
                                                                    partition_max_bytes=1024)
                                        for p in partitions])
               for name, (tid, partitions) in topics.items()]
    body = F(version=version, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, topics=entries)
    wire = body.encode(version=version)
    return Request(connection=None, header=RequestHeaderView(1, version, 7, "c"),  # type: ignore[arg-type]
                   spec=api_spec("Fetch"), body=F.decode(wire, version=version),
                   expects_response=True, size=len(wire), received=0.0)


@pytest.mark.parametrize("version", [12, 13, 16])
@pytest.mark.parametrize("partition", [None, 1])
def test_a_topic_fault_matches_a_fetch_by_name_or_by_topic_id(tmp_path, version, partition):
    """From v13 a Fetch names topics by id only: the fault names the topic as the broker's
    metadata does, answers only its entries (under the topic's id), and the rest is served."""
    broker = _Broker(tmp_path)
    t, u = broker.metadata.add("t", 2, {}), broker.metadata.add("u", 1, {})
    faults = Faults()
    faults.inject_errors("Fetch", "NOT_LEADER_OR_FOLLOWER", count=1, topic="t",
                         partition=partition)
    request = fetch_request(version, {"t": (t.topic_id, [0, 1]), "u": (u.topic_id, [0])})
    answer = faults(request, broker.handle)
    assert faults.counts == {("error", "Fetch"): 1}
    faulted = {("t", 0), ("t", 1)} if partition is None else {("t", 1)}
    assert set(broker.served) == {("t", 0), ("t", 1), ("u", 0)} - faulted
    got = roundtrip(answer, version)
    assert got.error_code == 0
    names = {t.topic_id: "t", u.topic_id: "u"}
    keys = [names[r.topic_id] if version >= 13 else r.topic for r in got.responses]
    assert sorted(keys) == ["t", "u"], "one entry per topic, served and faulted merged"
    errors = {(key, p.partition_index): p.error_code
              for key, r in zip(keys, got.responses, strict=True) for p in r.partitions}
    assert errors == {tp: 6 if tp in faulted else 0 for tp in [("t", 0), ("t", 1), ("u", 0)]}


@pytest.mark.parametrize("version", [12, 13])
def test_a_topic_fault_passes_a_fetch_of_other_topics(tmp_path, version):
    broker = _Broker(tmp_path)
    u = broker.metadata.add("u", 1, {})
    broker.metadata.add("t", 1, {})
    faults = Faults()
    faults.inject_errors("Fetch", 6, count=1, topic="t")
    answer: Any = faults(fetch_request(version, {"u": (u.topic_id, [0])}), broker.handle)
    assert faults.counts == {} and len(faults.armed) == 1
    assert broker.served == [("u", 0)] and isinstance(answer, PackedFetchResponse)


def test_layouts_of_other_apis():
    metadata = error_response(api_spec("Metadata"), 12, MetadataRequest(
        version=12, topics=[MetadataRequest.MetadataRequestTopic(name="t")]), 5)
    assert [(t.name, t.error_code) for t in metadata.topics] == [("t", 5)]
    batched = error_response(api_spec("find_coordinator"), 4, FindCoordinatorRequest(
        version=4, key_type=0, coordinator_keys=["g1", "g2"]), 15)
    assert [(c.key, c.error_code) for c in batched.coordinators] == [("g1", 15), ("g2", 15)]
    single = error_response(api_spec("FindCoordinator"), 2, FindCoordinatorRequest(
        version=2, key="g", key_type=0), 15)
    assert single.error_code == 15
    OF = OffsetFetchRequest
    offsets = error_response(api_spec("OffsetFetch"), 8, OF(version=8, groups=[
        OF.OffsetFetchRequestGroup(group_id="g", topics=[
            OF.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name="t",
                                                               partition_indexes=[0, 1])])]),
        16)
    [group] = offsets.groups
    assert (group.group_id, group.error_code) == ("g", 16)
    assert [p.partition_index for p in group.topics[0].partitions] == [0, 1]
    deleted = error_response(api_spec(20), 5, DeleteTopicsRequest(
        version=5, topic_names=["a", "b"], timeout_ms=1), 41)
    assert [(r.name, r.error_code) for r in deleted.responses] == [("a", 41), ("b", 41)]


def test_names_and_codes():
    assert api_spec("produce").key == 0
    assert api_spec("LIST_OFFSETS").key == 2
    assert api_spec(3).name == "Metadata"
    assert error_code("NOT_LEADER_OR_FOLLOWER") == 6
    assert error_code("not_coordinator") == 16
    assert error_code("UNSUPPORTED_VERSION") == 35  # named by kafka-python's table only
    assert error_code(7) == 7
    with pytest.raises(ValueError):
        api_spec("NoSuchApi")
    with pytest.raises(ValueError):
        error_code("NO_SUCH_ERROR")


def test_faults_count_down_and_clear():
    faults = Faults()
    fault = faults.inject_errors("Produce", 6, count=2)
    faults.delay("Fetch", 10, count=None)
    assert fault.remaining == 2 and len(faults.armed) == 2
    with pytest.raises(ValueError):
        faults.inject_errors("Produce", 6, partition=0)  # a partition needs its topic
    faults.clear()
    assert faults.armed == []


def test_property_names():
    assert property_name("num_partitions") == "num.partitions"
    assert property_name("log.retention.ms") == "log.retention.ms"
    assert _with_port("PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", 9) \
        == "PLAINTEXT://127.0.0.1:9,SSL://127.0.0.1:0"


async def test_manual_clock_runs_due_callbacks_without_an_advance():
    clock = ManualClock(wall_start_ms=1_000, run_due_soon=True)  # the embedded broker's
    ran: list[str] = []
    clock.call_at(0, ran.append, "due")
    clock.call_at(50, ran.append, "later")
    await asyncio.sleep(0)
    assert ran == ["due"]
    clock.advance(49)
    assert ran == ["due"]
    clock.advance(1)
    assert ran == ["due", "later"]
    assert clock.wall_ms() == 1_050
