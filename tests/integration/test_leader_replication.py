"""A single broker with the leader's side of replication built in: acks=all is answered as
before (the ISR is the broker alone, the high watermark its log end), and a Fetch sent as a
replica, over the wire in both of Kafka's forms (ReplicaId up to v14, ReplicaState from v15),
is refused as Kafka refuses an unknown replica, without moving the high watermark."""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Producer
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from broker.testing import EmbeddedBroker
from protocol.errors import ErrorCode
from tests.support.clients import confluent_consume, create_topic, unique_topic
from tests.support.requests import list_offsets
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
