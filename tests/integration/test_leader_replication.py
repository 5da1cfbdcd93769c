"""A single broker with the leader's side of replication built in: acks=all is answered as
before (the ISR is the broker alone, the high watermark its log end), and a Fetch sent as a
replica, over the wire in both of Kafka's forms (ReplicaId up to v14, ReplicaState from v15),
is refused as Kafka refuses an unknown replica, without moving the high watermark."""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path

from confluent_kafka import Producer
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceResponse
from prometheus_client.parser import text_string_to_metric_families

from broker.testing import EmbeddedBroker
from protocol.errors import ErrorCode
from tests.support.clients import confluent_consume, create_topic, unique_topic
from tests.support.requests import list_offsets, produce_request, record_batch
from tests.support.wire import Wire

LATEST = -1


def _replica_fetch(version: int, topic: str, *, replica_id: int, epoch: int) -> FetchRequest:
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=epoch, fetch_offset=0, last_fetched_epoch=-1,
        log_start_offset=0, partition_max_bytes=1 << 20)
    common = dict(max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                  session_id=0, session_epoch=-1,
                  topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
                  forgotten_topics_data=[], rack_id="")
    if version >= 15:
        state = FetchRequest.ReplicaState(replica_id=replica_id, replica_epoch=5)
        return FetchRequest[version](replica_state=state, **common)
    return FetchRequest[version](replica_id=replica_id, **common)


def test_acks_all_and_replica_fetches_on_a_single_broker(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path) as broker:
        bootstrap = broker.bootstrap_servers
        topic = unique_topic("acks-all")
        create_topic(bootstrap, topic, 1)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                             "enable.idempotence": True})
        reports: list = []
        for i in range(20):
            producer.produce(topic, f"v{i}".encode(),
                             on_delivery=lambda e, m: reports.append((e, m.offset())))
        assert producer.flush(30) == 0
        assert [e for e, _ in reports if e is not None] == []
        assert sorted(o for _, o in reports) == list(range(20))
        wire = Wire(broker.port)
        error, offset, _ts = list_offsets(wire, topic, LATEST)
        assert (error, offset) == (0, 20), "the high watermark is not the log end"
        got = confluent_consume(bootstrap, topic, 20)
        assert [(g.offset, g.rec.value) for g in got] == [(i, f"v{i}".encode()) for i in range(20)]
        for version, epoch, expected in ((12, -1, ErrorCode.NOT_LEADER_OR_FOLLOWER),
                                         (12, 0, ErrorCode.UNKNOWN_LEADER_EPOCH),
                                         (15, -1, ErrorCode.NOT_LEADER_OR_FOLLOWER)):
            request = _replica_fetch(version, topic, replica_id=1, epoch=epoch)
            if version >= 13:
                request.topics[0].topic_id = _topic_id(broker, topic)
            resp = wire.request(request, FetchResponse)
            part = resp.responses[0].partitions[0]
            assert part.error_code == expected, (version, epoch, part.error_code)
            assert not part.records, "a refused replica fetch read records"
        assert list_offsets(wire, topic, LATEST)[1] == 20


def _topic_id(broker: EmbeddedBroker, topic: str) -> uuid.UUID:
    """The topic id a v13+ Fetch names the topic by (from Metadata v12)."""
    from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

    wire = Wire(broker.port)
    resp = wire.request(MetadataRequest[12](
        topics=[MetadataRequest[12].MetadataRequestTopic(topic_id=None, name=topic)],
        allow_auto_topic_creation=False, include_topic_authorized_operations=False),
        MetadataResponse)
    topic_id: uuid.UUID = resp.topics[0].topic_id
    return topic_id


def _consumer_fetch(version: int, topic: str, offset: int, last_fetched_epoch: int, *,
                    session_id: int = 0, session_epoch: int = -1,
                    topic_id: uuid.UUID | None = None) -> FetchRequest:
    """A consumer's Fetch (replica id -1) carrying the epoch of the last batch it has."""
    partition = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=-1, fetch_offset=offset,
        last_fetched_epoch=last_fetched_epoch, log_start_offset=-1, partition_max_bytes=1 << 20)
    fetch_topic = (FetchRequest.FetchTopic(topic_id=topic_id, partitions=[partition])
                   if version >= 13 else FetchRequest.FetchTopic(topic=topic,
                                                                 partitions=[partition]))
    common = dict(max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
                  session_id=session_id, session_epoch=session_epoch, topics=[fetch_topic],
                  forgotten_topics_data=[], rack_id="")
    if version >= 15:
        state = FetchRequest.ReplicaState(replica_id=-1, replica_epoch=-1)
        return FetchRequest[version](replica_state=state, **common)
    return FetchRequest[version](replica_id=-1, **common)


def test_a_fetch_past_its_last_fetched_epoch_gets_the_diverging_epoch(tmp_path: Path) -> None:
    """Kafka checks LastFetchedEpoch for every fetcher: this single broker's epoch 0 ends at
    its log end (5), so a fetcher at 8 that last fetched epoch 0 diverged; epoch 4 is unknown."""
    with EmbeddedBroker(tmp_path) as broker:
        topic = unique_topic("diverging")
        create_topic(broker.bootstrap_servers, topic, 1)
        wire = Wire(broker.port)
        answer = wire.request(produce_request(topic, record_batch([b"a", b"b", b"c", b"d", b"e"])),
                              ProduceResponse)
        assert answer.responses[0].partition_responses[0].error_code == 0
        topic_id = _topic_id(broker, topic)
        for version in (12, 13, 16):
            diverged = _only_partition(wire.request(
                _consumer_fetch(version, topic, 8, 0, topic_id=topic_id), FetchResponse))
            assert diverged.error_code == 0, version
            assert _diverging(diverged) == (0, 5), version
            assert not diverged.records, "records sent to a diverged fetcher"
            reading = _only_partition(wire.request(
                _consumer_fetch(version, topic, 2, 0, topic_id=topic_id), FetchResponse))
            assert reading.error_code == 0 and reading.records, version
            assert _diverging(reading) is None, "diverged where it did not"
            unknown = _only_partition(wire.request(
                _consumer_fetch(version, topic, 5, 4, topic_id=topic_id), FetchResponse))
            assert unknown.error_code == ErrorCode.OFFSET_OUT_OF_RANGE, version
        opened = wire.request(_consumer_fetch(12, topic, 5, 0, session_epoch=0), FetchResponse)
        assert opened.session_id != 0 and _diverging(_only_partition(opened)) is None
        incremental = wire.request(_consumer_fetch(12, topic, 9, 0, session_id=opened.session_id,
                                                   session_epoch=1), FetchResponse)
        part = _only_partition(incremental)
        assert _diverging(part) == (0, 5), (
            "an incremental fetch left out the diverged partition")


def _only_partition(resp: FetchResponse) -> FetchResponse.FetchableTopicResponse.PartitionData:
    assert resp.error_code == 0, resp
    [topic] = resp.responses
    [part] = topic.partitions
    return part


def _diverging(part: FetchResponse.FetchableTopicResponse.PartitionData) -> tuple[int, int] | None:
    """The partition's DivergingEpoch (a tagged field: None when not sent)."""
    found = part.diverging_epoch
    return None if found is None else (found.epoch, found.end_offset)


def test_replication_metrics_of_a_single_broker(tmp_path: Path) -> None:
    """/metrics of a running broker: every partition led here, in sync, at min ISR 1."""
    with EmbeddedBroker(tmp_path, metrics_listener="http://127.0.0.1:0/metrics") as broker:
        topic = unique_topic("metered")
        create_topic(broker.bootstrap_servers, topic, 3)
        assert broker.metrics_url is not None
        with urllib.request.urlopen(broker.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        samples = {s.name: s.value for f in text_string_to_metric_families(text)
                   for s in f.samples if not s.labels}
        assert samples["minibroker_leader_partitions"] == 3
        assert samples["minibroker_under_replicated_partitions"] == 0
        assert samples["minibroker_under_min_isr_partitions"] == 0
        assert samples["minibroker_at_min_isr_partitions"] == 3
        assert samples["minibroker_isr_shrinks_total"] == 0
        assert samples["minibroker_isr_expands_total"] == 0
