"""Raw requests and record batches for tests that speak the wire protocol through `Wire`.

Builders return kafka-python request objects (send them with `Wire.send` or `Wire.request`);
the `*_response` helpers decode a frame as `Wire.read_frame` returns it (correlation id first).
"""

from __future__ import annotations

import struct

from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from tests.support.clients import BASE_TS
from tests.support.wire import CLIENT_ID, Wire

# ListOffsets' special timestamps.
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


def correlation_id_of(frame: bytes) -> int:
    return struct.unpack_from(">i", frame)[0]


def record_batch(values: list[bytes], keys: list[bytes] | None = None) -> bytes:
    """One uncompressed RecordBatch v2, CreateTime timestamps from BASE_TS up by one."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=16 << 20)
    for i, value in enumerate(values):
        key = keys[i] if keys else None
        assert builder.append(BASE_TS + i, key, value, []) is not None
    builder.close()
    return bytes(builder.buffer())


def produce_request(topic: str, records: bytes, *, acks: int = 1, partition: int = 0,
                    timeout_ms: int = 15000, version: int = 9):
    return ProduceRequest[version](
        transactional_id=None, acks=acks, timeout_ms=timeout_ms,
        topic_data=[ProduceRequest.TopicProduceData(
            name=topic,
            partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(
                index=partition, records=records)],
        )],
    )


def produce_response(frame: bytes, version: int = 9):
    """(error code, base offset) of the single partition of a produce response."""
    resp = ProduceResponse.decode(frame, version=version, header=True)
    [topic] = resp.responses
    [part] = topic.partition_responses
    return part.error_code, part.base_offset


def fetch_request(partitions: list[tuple[str, int, int]], *, max_wait_ms: int,
                  min_bytes: int = 1, max_bytes: int = 50 << 20,
                  partition_max_bytes: int = 10 << 20, session_id: int = 0,
                  session_epoch: int = -1,
                  forgotten: list[tuple[str, list[int]]] | None = None):
    """FetchRequest v12 (topic names, flexible); session_epoch -1 means sessionless."""
    by_topic: dict[str, list] = {}
    for topic, index, offset in partitions:
        by_topic.setdefault(topic, []).append(FetchRequest.FetchTopic.FetchPartition(
            partition=index, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=partition_max_bytes,
        ))
    return FetchRequest[12](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
        isolation_level=0, session_id=session_id, session_epoch=session_epoch,
        topics=[FetchRequest.FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        forgotten_topics_data=[
            FetchRequest.ForgottenTopic(topic=t, partitions=ps) for t, ps in (forgotten or [])
        ],
        rack_id="",
    )


def fetch_response(frame: bytes):
    return FetchResponse.decode(frame, version=12, header=True)


def fetched_values(records: bytes | None) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record in a fetched partition's record set; control batches
    (transaction markers) are skipped, as consumers skip them."""
    out: list[tuple[int, bytes | None]] = []
    mr = MemoryRecords(bytes(records or b""))
    while mr.has_next():
        batch = mr.next_batch()
        if batch is None:
            break
        if not batch.is_control_batch:
            out.extend((r.offset, r.value) for r in batch)
    return out


def list_offsets_request(topic: str, timestamp: int, *, partition: int = 0, version: int = 8):
    topic_cls = ListOffsetsRequest.ListOffsetsTopic
    return ListOffsetsRequest[version](replica_id=-1, isolation_level=0, topics=[topic_cls(
        name=topic, partitions=[topic_cls.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=-1, timestamp=timestamp)])])


def list_offsets(wire: Wire, topic: str, timestamp: int) -> tuple[int, int, int]:
    """(error code, offset, timestamp) ListOffsets v8 answers for partition 0 of `topic`."""
    resp = wire.request(list_offsets_request(topic, timestamp), ListOffsetsResponse)
    part = resp.topics[0].partitions[0]
    return part.error_code, part.offset, part.timestamp


def list_offsets_latest(wire: Wire, topic: str, correlation_id: int) -> int:
    """The high watermark of partition 0 (ListOffsets v7, LATEST), which must not be an error."""
    wire.send(list_offsets_request(topic, LATEST, version=7), correlation_id)
    resp = ListOffsetsResponse.decode(wire.read_frame(), version=7, header=True)
    assert resp.header.correlation_id == correlation_id
    [part] = resp.topics[0].partitions
    assert part.error_code == 0, part
    return part.offset


def api_versions_request():
    return ApiVersionsRequest[3](client_software_name=CLIENT_ID, client_software_version="1")
