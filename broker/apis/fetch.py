"""Fetch (key 1): read up to the high watermark; park a DelayedFetch when below min_bytes.

KIP-74: the first batch of the first partition with data is returned whole even when larger
than the limits, so a consumer always makes progress; after it, partition_max_bytes and the
response max_bytes bound what is read. KIP-227 fetch sessions: an incremental request names
only changed partitions and its response carries only partitions with news.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import FetchResponse

from broker.delayed_fetch import DelayedFetch
from broker.fetch_session import FINAL_EPOCH, INITIAL_EPOCH, CachedPartition, FetchSession
from broker.log.log import OffsetOutOfRangeError
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.network.request import Request
    from broker.replica_manager import ReplicaManager
    from broker.server import Broker

TopicResponse = FetchResponse.FetchableTopicResponse
PartitionData = TopicResponse.PartitionData


@dataclass(slots=True)
class Result:
    want: CachedPartition
    error: ErrorCode
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1


def handle(broker: Broker, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    version = request.version
    session, wanted, error = _session_context(broker, req, version)
    if error != ErrorCode.NONE:
        return FetchResponse(throttle_time_ms=0, error_code=error, session_id=0, responses=[])
    rm = broker.rm
    incremental = session is not None and req.session_epoch > INITIAL_EPOCH
    session_id = session.session_id if session is not None else 0

    def respond() -> FetchResponse:
        results = _read(broker, wanted, req.max_bytes, version)
        return _response(results, version, session_id, incremental)

    results = _read(broker, wanted, req.max_bytes, version)
    total = sum(len(r.records) for r in results)
    has_error = any(r.error != ErrorCode.NONE for r in results)
    if req.max_wait_ms <= 0 or total >= req.min_bytes or has_error or not wanted:
        return _response(results, version, session_id, incremental)
    watched = [
        ((w.topic, w.index), w.fetch_offset, rm.partitions[(w.topic, w.index)].hw_bytes)
        for w in wanted
    ]
    op = DelayedFetch(req.max_wait_ms, rm, watched, total, req.min_bytes, respond)
    rm.fetch_purgatory.try_complete_else_watch(op, [w[0] for w in watched])
    return op.future


def _session_context(
    broker: Broker, req: Any, version: int
) -> tuple[FetchSession | None, list[CachedPartition], ErrorCode]:
    """Which partitions to read, and the session they belong to (None: sessionless)."""
    requested = _requested(broker, req, version)
    cache = broker.fetch_sessions
    if version < 7 or req.session_epoch in (FINAL_EPOCH, INITIAL_EPOCH):
        if version >= 7 and req.session_id:
            cache.remove(req.session_id)
        if version < 7 or req.session_epoch == FINAL_EPOCH:
            return None, list(requested.values()), ErrorCode.NONE
        session = cache.create(requested)
        return session, list(requested.values()), ErrorCode.NONE
    session = cache.get(req.session_id)
    if session is None:
        return None, [], ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    if session.epoch != req.session_epoch:
        return None, [], ErrorCode.INVALID_FETCH_SESSION_EPOCH
    session.epoch += 1
    for key, cached in requested.items():
        old = session.partitions.get(key)
        if old is None:
            session.partitions[key] = cached
        else:
            old.fetch_offset, old.max_bytes = cached.fetch_offset, cached.max_bytes
    for forgotten in req.forgotten_topics_data:
        topic = forgotten.topic_id if version >= 13 else forgotten.topic
        for index in forgotten.partitions:
            session.partitions.pop((topic, index), None)
    return session, list(session.partitions.values()), ErrorCode.NONE


def _requested(broker: Broker, req: Any, version: int) -> dict[Any, CachedPartition]:
    out: dict[Any, CachedPartition] = {}
    for topic in req.topics:
        if version >= 13:
            info = broker.metadata.by_id.get(topic.topic_id)
            name, key = (info.name if info else None), topic.topic_id
        else:
            name = key = topic.topic
        for p in topic.partitions:
            out[(key, p.partition)] = CachedPartition(
                name, getattr(topic, "topic_id", None), p.partition, p.fetch_offset,
                p.partition_max_bytes,
            )
    return out


def _read(broker: Broker, wanted: list[CachedPartition], max_bytes: int, version: int
          ) -> list[Result]:
    rm: ReplicaManager = broker.rm
    remaining = max_bytes
    min_one = True
    results: list[Result] = []
    for w in wanted:
        p = rm.partitions.get((w.topic, w.index))  # type: ignore[arg-type]
        if p is None:
            missing = ErrorCode.UNKNOWN_TOPIC_ID if version >= 13 else (
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            results.append(Result(w, missing))
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


def _response(results: list[Result], version: int, session_id: int, incremental: bool
              ) -> FetchResponse:
    topics: dict[Any, list[PartitionData]] = {}
    for r in results:
        w = r.want
        changed = (r.records or r.error != ErrorCode.NONE or r.high_watermark != w.high_watermark
                   or r.log_start_offset != w.log_start_offset)
        w.high_watermark, w.log_start_offset = r.high_watermark, r.log_start_offset
        if incremental and not changed:
            continue
        key = w.topic_id if version >= 13 else w.topic
        topics.setdefault(key, []).append(
            PartitionData(
                partition_index=w.index, error_code=r.error,
                high_watermark=r.high_watermark, last_stable_offset=r.high_watermark,
                log_start_offset=r.log_start_offset, aborted_transactions=None,
                preferred_read_replica=-1, records=r.records,
            )
        )
    if version >= 13:
        responses = [TopicResponse(topic_id=k, partitions=v) for k, v in topics.items()]
    else:
        responses = [TopicResponse(topic=k, partitions=v) for k, v in topics.items()]
    return FetchResponse(throttle_time_ms=0, error_code=0, session_id=session_id,
                         responses=responses)
