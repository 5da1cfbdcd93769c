"""Fetch (key 1): the ReplicaManager reads (or parks the fetch until min_bytes are readable).

This module owns the request's view: KIP-227 fetch sessions: an incremental request names
only changed partitions and its response carries only partitions with news. A read_committed
fetch (isolation_level 1) reads up to the last stable offset and gets the aborted
transactions of what it read (null for read_uncommitted, as Kafka answers). With ACLs on,
each partition's topic needs READ, checked on every fetch of a session as Kafka does: a denied
partition answers TOPIC_AUTHORIZATION_FAILED and is never read nor waited on. A client older
than Fetch v10 cannot read zstd, so a partition of a topic whose compression.type is zstd
answers it UNSUPPORTED_COMPRESSION_TYPE, as Kafka does. A partition whose current leader
epoch (v9+, kept by the session for the partitions an incremental fetch leaves out; -1 is not
checked) is older than the partition's answers FENCED_LEADER_EPOCH, newer
UNKNOWN_LEADER_EPOCH, checked by the ReplicaManager on every read, a parked fetch's too, as
Kafka's Partition.fetchRecords and DelayedFetch check it. In cluster mode a partition of the
cluster this broker does not lead answers NOT_LEADER_OR_FOLLOWER; topic ids are the cluster's.
From v16 a partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH names its current
leader (CurrentLeader) and the answer lists the leaders' endpoints (NodeEndpoints), as Kafka's
handleFetchRequest does from that version.
A fetch from a replica (ReplicaId, or v15+ ReplicaState, >= 0) needs CLUSTER_ACTION on the
cluster instead of READ on its topics and is served by the ReplicaManager as a follower's
(docs/replication.md).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from kafka.protocol.consumer import FetchResponse

from broker.apis.authorize import cluster_allowed, filter_allowed
from broker.apis.current_leader import (
    FETCH_CURRENT_LEADER_VERSION,
    FETCH_LEADER_ERRORS,
    current_leaders,
)
from broker.cluster.broker_node import topic_id_text
from broker.replica.fetch_session import FINAL_EPOCH, INITIAL_EPOCH, CachedPartition, FetchSession
from broker.replica.replica_manager import FetchResult, PartitionFetch
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode
from protocol.templates import FetchPartition, PackedFetchResponse

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 1  # Fetch
VERSIONS = range(4, 17)

LeaderIdAndEpoch = FetchResponse.FetchableTopicResponse.PartitionData.LeaderIdAndEpoch
EpochEndOffset = FetchResponse.FetchableTopicResponse.PartitionData.EpochEndOffset

ZSTD_FETCH_VERSION = 10  # the first Fetch version whose clients can read zstd


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    version = request.version
    session, wanted, error = _session_context(ctx, req, version)
    if error != ErrorCode.NONE:
        # The top-level error alone: no session, no topics (the client starts a new session).
        return PackedFetchResponse(error, 0, [], by_id=version >= 13)
    incremental = session is not None and req.session_epoch > INITIAL_EPOCH
    session_id = session.session_id if session is not None else 0
    refused: dict[int, ErrorCode] = {}
    replica_id, replica_epoch = _replica(req, version)
    if replica_id >= 0 and ctx.authorizer.enabled:  # Kafka: a follower needs CLUSTER_ACTION
        if not cluster_allowed(ctx, request, AclOperation.CLUSTER_ACTION):
            refused = {i: ErrorCode.TOPIC_AUTHORIZATION_FAILED for i in range(len(wanted))}
    elif ctx.authorizer.enabled:
        readable = filter_allowed(ctx, request, AclOperation.READ, ResourceType.TOPIC,
                                  (w.topic for w in wanted))
        refused = {i: ErrorCode.TOPIC_AUTHORIZATION_FAILED for i, w in enumerate(wanted)
                   if w.topic is not None and w.topic not in readable}
    if version < ZSTD_FETCH_VERSION:
        refused.update(_zstd_refused(ctx, wanted, refused))
    if ctx.cluster is not None:
        refused.update(_not_led(ctx, wanted, refused))
    skip = refused
    fetches = [PartitionFetch((w.topic, w.index) if w.topic is not None else None,
                              w.fetch_offset, w.max_bytes, w.current_leader_epoch,
                              w.fetcher_log_start_offset, w.last_fetched_epoch)
               for i, w in enumerate(wanted) if i not in skip]
    # Sized to what the connection may still hold: a client that does not read its responses
    # gets empty ones (as a quota-throttled fetch does) instead of the broker's memory.
    allowance = request.connection.response_allowance
    results = ctx.replica_manager.fetch_messages(fetches, req.max_bytes, req.min_bytes,
                                                 req.max_wait_ms, limit=allowance,
                                                 isolation_level=req.isolation_level,
                                                 replica_id=replica_id,
                                                 replica_epoch=replica_epoch)
    # What the answer needs waits with a parked fetch in one partial: no closure (a function
    # and a cell per name), no empty dict of refusals, nothing of the decoded request.
    if version >= FETCH_CURRENT_LEADER_VERSION:
        return results.then(partial(_respond_naming_leaders, ctx, request, wanted,
                                    refused or None, session_id, incremental))
    return results.then(partial(_respond, wanted, refused or None, version, session_id,
                                incremental))


def _respond_naming_leaders(ctx: ApiContext, request: Request, wanted: list[CachedPartition],
                            refused: dict[int, ErrorCode] | None, session_id: int,
                            incremental: bool, results: list[FetchResult]
                            ) -> PackedFetchResponse:
    """v16+: the answer, each partition refused for leadership naming its current leader."""
    response = _respond(wanted, refused, request.version, session_id, incremental, results)
    if not any(p[1] in FETCH_LEADER_ERRORS for _, partitions in response.topics
               for p in partitions):
        return response
    names = {(w.topic_id, w.index): w.topic for w in wanted}
    refused_tps = [(names.get((key, p[0])), p[0]) for key, partitions in response.topics
                   for p in partitions if p[1] in FETCH_LEADER_ERRORS]
    found = current_leaders(ctx, request, [(name, index) for name, index in refused_tps
                                           if name is not None])
    message = response.message  # from now on what is sent
    for topic in message.responses:
        for p in topic.partitions:
            name = names.get((topic.topic_id, p.partition_index))
            leader = found.leaders.get((name, p.partition_index)) if name else None
            if p.error_code in FETCH_LEADER_ERRORS:
                p.current_leader = LeaderIdAndEpoch(
                    leader_id=leader[0] if leader else -1,
                    leader_epoch=leader[1] if leader else -1)
    message.node_endpoints = [
        FetchResponse.NodeEndpoint(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack)
        for e in found.endpoints]
    return response


def _respond(wanted: list[CachedPartition], refused: dict[int, ErrorCode] | None, version: int,
             session_id: int, incremental: bool, results: list[FetchResult]
             ) -> PackedFetchResponse:
    if refused:
        results = _with_refused(results, refused)
    return _response(wanted, results, version, session_id, incremental)


def _session_context(
    ctx: ApiContext, req: Any, version: int
) -> tuple[FetchSession | None, list[CachedPartition], ErrorCode]:
    """Which partitions to read, and the session they belong to (None: sessionless)."""
    requested = _requested(ctx, req, version)
    cache = ctx.fetch_sessions
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
            old.current_leader_epoch = cached.current_leader_epoch
            old.fetcher_log_start_offset = cached.fetcher_log_start_offset
            old.last_fetched_epoch = cached.last_fetched_epoch
    for forgotten in req.forgotten_topics_data:
        topic = forgotten.topic_id if version >= 13 else forgotten.topic
        for index in forgotten.partitions:
            session.partitions.pop((topic, index), None)
    return session, list(session.partitions.values()), ErrorCode.NONE


def _requested(ctx: ApiContext, req: Any, version: int) -> dict[Any, CachedPartition]:
    out: dict[Any, CachedPartition] = {}
    for topic in req.topics:
        if version >= 13:
            key = topic.topic_id
            if ctx.cluster is not None:
                name = ctx.cluster.cache.topic_name_of(topic_id_text(key)) if key else None
            else:
                info = ctx.topics.metadata.by_id.get(key)
                name = info.name if info else None
        else:
            name = key = topic.topic
        for p in topic.partitions:
            out[(key, p.partition)] = CachedPartition(
                name, getattr(topic, "topic_id", None), p.partition, p.fetch_offset,
                p.partition_max_bytes, current_leader_epoch=p.current_leader_epoch,
                fetcher_log_start_offset=getattr(p, "log_start_offset", -1),
                last_fetched_epoch=p.last_fetched_epoch if version >= 12 else -1,
            )
    return out


def _replica(req: Any, version: int) -> tuple[int, int]:
    """(replica id, broker epoch) of the fetcher: ReplicaId up to v14, ReplicaState from
    v15 (KIP-903); -1 for a consumer."""
    if version >= 15:
        state = getattr(req, "replica_state", None)
        if state is None:
            return -1, -1
        return state.replica_id, state.replica_epoch
    return getattr(req, "replica_id", -1), -1


def _zstd_refused(ctx: ApiContext, wanted: list[CachedPartition], refused: dict[int, ErrorCode]
                  ) -> dict[int, ErrorCode]:
    """The partitions of zstd topics among those not refused already."""
    out: dict[int, ErrorCode] = {}
    partitions = ctx.replica_manager.partitions
    for i, w in enumerate(wanted):
        partition = partitions.get((w.topic, w.index)) if i not in refused else None
        if partition is not None and partition.log.config.compression_type == "zstd":
            out[i] = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    return out


def _not_led(ctx: ApiContext, wanted: list[CachedPartition], refused: dict[int, ErrorCode]
             ) -> dict[int, ErrorCode]:
    """Cluster mode: the partitions of the cluster this broker does not lead."""
    cluster = ctx.cluster
    assert cluster is not None
    asked = [(w.topic, w.index) for i, w in enumerate(wanted)
             if i not in refused and w.topic is not None]
    not_led = cluster.not_led(asked, ctx.replica_manager.partitions)
    if not not_led:
        return {}
    return {i: ErrorCode.NOT_LEADER_OR_FOLLOWER for i, w in enumerate(wanted)
            if i not in refused and (w.topic, w.index) in not_led}


def _with_refused(results: list[FetchResult], refused: dict[int, ErrorCode]
                  ) -> list[FetchResult]:
    """The read partitions' results with each refused partition's error put back in its
    place (ascending) among them."""
    merged = list(results)
    for i in sorted(refused):
        merged.insert(i, FetchResult(refused[i]))
    return merged


def _response(wanted: list[CachedPartition], results: list[FetchResult], version: int,
              session_id: int, incremental: bool) -> PackedFetchResponse:
    topics: dict[Any, list[FetchPartition]] = {}
    diverging: dict[tuple[Any, int], tuple[int, int]] = {}
    by_id = version >= 13
    for w, r in zip(wanted, results, strict=True):
        error = r.error
        if error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and by_id:
            error = ErrorCode.UNKNOWN_TOPIC_ID
        elif error == ErrorCode.KAFKA_STORAGE_ERROR and version <= 5:
            error = ErrorCode.NOT_LEADER_OR_FOLLOWER  # what clients of those versions know
        hw, log_start = r.high_watermark, r.log_start_offset
        changed = (r.records or error != ErrorCode.NONE or hw != w.high_watermark
                   or log_start != w.log_start_offset or r.diverging_epoch is not None)
        w.high_watermark, w.log_start_offset = hw, log_start
        if incremental and not changed:
            continue
        key = w.topic_id if by_id else w.topic
        aborted = None if r.aborted is None else [
            (a.producer_id, a.first_offset) for a in r.aborted]
        partition = (w.index, error, hw, r.last_stable_offset, log_start, aborted, r.records)
        if r.diverging_epoch is not None:
            diverging[(key, w.index)] = r.diverging_epoch
        same_topic = topics.get(key)
        if same_topic is None:
            topics[key] = [partition]
        else:
            same_topic.append(partition)
    response = PackedFetchResponse(0, session_id, list(topics.items()), by_id=by_id)
    if diverging:
        _set_diverging(response, diverging)
    return response


def _set_diverging(response: PackedFetchResponse,
                   diverging: dict[tuple[Any, int], tuple[int, int]]) -> None:
    """Each diverged partition's DivergingEpoch (v12+, a tagged field the packed layout has
    not): the answer becomes kafka-python's message, which writes it."""
    for topic in response.message.responses:
        key = topic.topic_id if response.by_id else topic.topic
        for p in topic.partitions:
            found = diverging.get((key, p.partition_index))
            if found is not None:
                p.diverging_epoch = EpochEndOffset(epoch=found[0], end_offset=found[1])
