"""Fetch (key 1): read up to the high watermark; park a DelayedFetch when below min_bytes.

KIP-74: the first batch of the first partition with data is returned whole even when larger
than the limits, so a consumer can always make progress; after it, partition_max_bytes and the
response max_bytes bound what is read. Requests are served without a fetch session (session id
0), which every client accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import FetchResponse

from broker.delayed_fetch import DelayedFetch
from broker.log.log import OffsetOutOfRangeError
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.network.request_channel import Request
    from broker.replica_manager import ReplicaManager
    from broker.server import Broker

TopicResponse = FetchResponse.FetchableTopicResponse
PartitionData = TopicResponse.PartitionData


@dataclass(slots=True)
class PartitionFetch:
    topic: str | None
    topic_id: Any
    index: int
    fetch_offset: int
    max_bytes: int
    error: ErrorCode = ErrorCode.NONE


def handle(broker: Broker, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    version = request.version
    wanted = _resolve(broker, req, version)
    rm = broker.rm

    def respond() -> FetchResponse:
        return _response(_read(rm, wanted, req.max_bytes), version)

    results = _read(rm, wanted, req.max_bytes)
    total = sum(len(r.records) for r in results)
    has_error = any(r.error != ErrorCode.NONE for r in results)
    if req.max_wait_ms <= 0 or total >= req.min_bytes or has_error or not wanted:
        return _response(results, version)
    watched = [
        ((w.topic, w.index), w.fetch_offset, rm.partitions[(w.topic, w.index)].hw_bytes)
        for w in wanted
    ]
    op = DelayedFetch(req.max_wait_ms, rm, watched, total, req.min_bytes, respond)
    rm.fetch_purgatory.try_complete_else_watch(op, [w[0] for w in watched])
    return op.future


def _resolve(broker: Broker, req: Any, version: int) -> list[PartitionFetch]:
    out = []
    for topic in req.topics:
        if version >= 13:
            info = broker.metadata.by_id.get(topic.topic_id)
            name = info.name if info else None
            missing = ErrorCode.UNKNOWN_TOPIC_ID
        else:
            name, missing = topic.topic, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        for p in topic.partitions:
            pf = PartitionFetch(name, getattr(topic, "topic_id", None), p.partition,
                                p.fetch_offset, p.partition_max_bytes)
            if name is None or (name, p.partition) not in broker.rm.partitions:
                pf.error = missing
            elif p.current_leader_epoch > 0:
                pf.error = ErrorCode.UNKNOWN_LEADER_EPOCH
            out.append(pf)
    return out


@dataclass(slots=True)
class Result:
    want: PartitionFetch
    error: ErrorCode
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1


def _read(rm: ReplicaManager, wanted: list[PartitionFetch], max_bytes: int) -> list[Result]:
    remaining = max_bytes
    min_one = True
    results: list[Result] = []
    for w in wanted:
        if w.error != ErrorCode.NONE:
            results.append(Result(w, w.error))
            continue
        p = rm.partitions.get((w.topic, w.index))  # type: ignore[arg-type]
        if p is None:  # deleted while parked
            results.append(Result(w, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            continue
        hw = p.high_watermark
        try:
            data = p.log.read(w.fetch_offset, min(w.max_bytes, max(remaining, 0)), hw, min_one)
        except OffsetOutOfRangeError:
            results.append(Result(w, ErrorCode.OFFSET_OUT_OF_RANGE, b"", hw, p.log_start_offset))
            continue
        if data:
            min_one = False
            remaining -= len(data)
        results.append(Result(w, ErrorCode.NONE, data, hw, p.log_start_offset))
    return results


def _response(results: list[Result], version: int) -> FetchResponse:
    topics: dict[Any, list[PartitionData]] = {}
    for r in results:
        key = r.want.topic_id if version >= 13 else r.want.topic
        topics.setdefault(key, []).append(
            PartitionData(
                partition_index=r.want.index, error_code=r.error,
                high_watermark=r.high_watermark, last_stable_offset=r.high_watermark,
                log_start_offset=r.log_start_offset, aborted_transactions=None,
                preferred_read_replica=-1, records=r.records,
            )
        )
    if version >= 13:
        responses = [TopicResponse(topic_id=k, partitions=v) for k, v in topics.items()]
    else:
        responses = [TopicResponse(topic=k, partitions=v) for k, v in topics.items()]
    return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=responses)
