"""Leader epochs through the broker's owners and handlers: appends stamped with the partition's
epoch, the epoch cache kept through DeleteRecords, retention, restarts and crashes, and the
answers of OffsetForLeaderEpoch, Fetch, ListOffsets, Metadata and DescribeTopicPartitions."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from broker.apis import (
    describe_topic_partitions,
    fetch,
    list_offsets,
    metadata,
    offset_for_leader_epoch,
)
from broker.log import Log, LogConfig
from broker.log.leader_epoch_cache import LEADER_EPOCH_CHECKPOINT_FILE
from broker.replica.delayed_result import Completion
from broker.replica.partition import Partition
from broker.startup_error import StartupError
from protocol.errors import ErrorCode as E
from protocol.record_batch import iter_batches
from protocol.templates import PackedMetadataResponse
from tests.support.clients import BASE_TS
from tests.support.components import Components, build, parse, wire_roundtrip
from tests.support.requests import EARLIEST, LATEST, MAX_TIMESTAMP

TOPIC = "epochs"
OFFSETS = "__consumer_offsets"


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    c.topics.create_topic(TOPIC, 1, {})
    yield c
    await c.close()


def answer(c: Components, handle: Any, request: Any) -> Any:
    """The decoded answer of a handler that answers at once."""
    req = parse(request)
    out = handle(c.context, req)
    if isinstance(out, Completion):
        assert out.done()
        out = out.result()
    return wire_roundtrip(req, out)


def batch(n: int, ts: int = BASE_TS) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i in range(n):
        assert builder.append(ts + i, None, b"v%d" % i, []) is not None
    builder.close()
    return bytes(builder.buffer())


def partition(c: Components, index: int = 0, topic: str = TOPIC) -> Partition:
    return c.replica_manager.partitions[(topic, index)]


def produce(c: Components, n: int, ts: int = BASE_TS, index: int = 0) -> int:
    info, _moved = partition(c, index).append(batch(n, ts), c.wall_ms())
    return info.first_offset


def stamped_epochs(log: Log) -> list[tuple[int, int]]:
    """(base offset, partition leader epoch) of every batch of the log, as stored."""
    out = []
    for seg in log.segments:
        for _pos, header in iter_batches(seg.log_path.read_bytes()):
            out.append((header.base_offset, header.partition_leader_epoch))
    return out


def epochs_of(c: Components) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in partition(c).log.leader_epoch_cache.entries()]


async def two_epochs(c: Components) -> None:
    """Epoch 0 writes offsets 0-1 (timestamps BASE_TS..), epoch 3 offsets 2-4 (BASE_TS+100..)."""
    assert produce(c, 2) == 0
    assert partition(c).make_leader(3)
    assert produce(c, 3, BASE_TS + 100) == 2


# -- appends -------------------------------------------------------------------------------------

async def test_appends_are_stamped_with_the_partitions_epoch(parts: Components) -> None:
    p = partition(parts)
    assert p.leader_epoch == 0
    assert epochs_of(parts) == [(0, 0)], "a new partition leads in epoch 0 from offset 0"
    await two_epochs(parts)
    assert stamped_epochs(p.log) == [(0, 0), (2, 3)]
    assert epochs_of(parts) == [(0, 0), (3, 2)]
    # Stamping does not touch what the CRC covers: every stored batch is still valid.
    for seg in p.log.segments:
        assert all(h.is_valid() for _pos, h in iter_batches(seg.log_path.read_bytes()))
    # The end-transaction markers a coordinator writes carry it too.
    info, _ = p.append_end_txn_marker(7, 0, 0, True, parts.wall_ms())
    assert stamped_epochs(p.log)[-1] == (info.first_offset, 3)


async def test_make_leader_refuses_an_older_epoch(parts: Components) -> None:
    p = partition(parts)
    assert p.make_leader(2) and not p.make_leader(2)
    with pytest.raises(ValueError):
        p.make_leader(1)
    assert p.leader_epoch == 2


# -- OffsetForLeaderEpoch -------------------------------------------------------------------------

def epoch_request(leader_epoch: int, current: int = -1, *, index: int = 0, version: int = 4,
                  replica_id: int = -1) -> Any:
    part = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=index, current_leader_epoch=current, leader_epoch=leader_epoch)
    return OffsetForLeaderEpochRequest[version](replica_id=replica_id, topics=[
        OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=TOPIC, partitions=[part])])


def end_offset(c: Components, leader_epoch: int, current: int = -1, **kw: Any
               ) -> tuple[int, int, int]:
    resp = answer(c, offset_for_leader_epoch.handle, epoch_request(leader_epoch, current, **kw))
    [p] = resp.topics[0].partitions
    return p.error_code, p.leader_epoch, p.end_offset


async def test_offset_for_leader_epoch_answers_from_the_cache(parts: Components) -> None:
    assert end_offset(parts, 0) == (E.NONE, 0, 0), "epoch 0 is the latest: the log end"
    await two_epochs(parts)
    assert end_offset(parts, 0) == (E.NONE, 0, 2), "epoch 0 ended where epoch 3 began"
    assert end_offset(parts, 1) == (E.NONE, 0, 2), "an epoch never seen: the one below"
    assert end_offset(parts, 3) == (E.NONE, 3, 5)
    assert end_offset(parts, 4) == (E.NONE, -1, -1), "beyond the latest"
    assert end_offset(parts, -1) == (E.NONE, -1, -1)
    # The request's current leader epoch is checked first.
    assert end_offset(parts, 0, current=3) == (E.NONE, 0, 2)
    assert end_offset(parts, 0, current=2) == (E.FENCED_LEADER_EPOCH, -1, -1)
    assert end_offset(parts, 0, current=4) == (E.UNKNOWN_LEADER_EPOCH, -1, -1)
    # A follower (v3+ replica id) gets the answer a consumer gets, as Kafka gives it.
    assert end_offset(parts, 0, version=3, replica_id=1) == (E.NONE, 0, 2)
    assert end_offset(parts, 0, current=2, version=2) == (E.FENCED_LEADER_EPOCH, -1, -1)
    assert end_offset(parts, 0, index=9)[0] == E.UNKNOWN_TOPIC_OR_PARTITION


# -- Fetch ---------------------------------------------------------------------------------------

def fetch_request(current: int | None, *, offset: int = 0, session_epoch: int = -1,
                  session_id: int = 0, version: int = 12) -> Any:
    parts = [] if current is None else [FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=current, fetch_offset=offset, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=1 << 20)]
    return FetchRequest[version](
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        session_id=session_id, session_epoch=session_epoch,
        topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=parts)] if parts else [],
        forgotten_topics_data=[], rack_id="")


def fetched(resp: Any) -> tuple[int, int, int]:
    """(error, high watermark, records read) of the only partition of a Fetch answer."""
    [t] = resp.responses
    [p] = t.partitions
    records = MemoryRecords(bytes(p.records or b""))
    count = 0
    while records.has_next():
        b = records.next_batch()
        count += len(list(b)) if b is not None else 0
    return p.error_code, p.high_watermark, count


async def test_fetch_checks_the_current_leader_epoch(parts: Components) -> None:
    await two_epochs(parts)
    assert fetched(answer(parts, fetch.handle, fetch_request(3))) == (E.NONE, 5, 5)
    assert fetched(answer(parts, fetch.handle, fetch_request(-1))) == (E.NONE, 5, 5)
    assert fetched(answer(parts, fetch.handle, fetch_request(2))) == (
        E.FENCED_LEADER_EPOCH, -1, 0)
    assert fetched(answer(parts, fetch.handle, fetch_request(4))) == (
        E.UNKNOWN_LEADER_EPOCH, -1, 0)
    # Before v9 the field does not exist on the wire: nothing to check.
    assert fetched(answer(parts, fetch.handle, fetch_request(2, version=8)))[0] == E.NONE


async def test_an_incremental_fetch_checks_the_epoch_its_session_kept(parts: Components
                                                                      ) -> None:
    await two_epochs(parts)
    first = answer(parts, fetch.handle, fetch_request(3, offset=5, session_epoch=0))
    assert first.session_id and fetched(first)[0] == E.NONE
    partition(parts).make_leader(4)  # the consumer's epoch 3 is now stale
    again = answer(parts, fetch.handle, fetch_request(None, session_id=first.session_id,
                                                      session_epoch=1))
    assert fetched(again)[0] == E.FENCED_LEADER_EPOCH
    # Naming the partition again with the new epoch replaces the kept one.
    fresh = answer(parts, fetch.handle, fetch_request(4, offset=5, session_id=first.session_id,
                                                      session_epoch=2))
    assert fetched(fresh) == (E.NONE, 5, 0)


async def test_a_parked_fetch_is_fenced_when_the_epoch_moves(parts: Components) -> None:
    """Kafka's DelayedFetch: a new leader epoch completes a waiting fetch, and the answer
    fences the client that waited on the old one."""
    await two_epochs(parts)
    request = fetch_request(3, offset=5)
    request.max_wait_ms, request.min_bytes = 30_000, 1
    req = parse(request)
    out = fetch.handle(parts.context, req)
    assert isinstance(out, Completion) and not out.done(), "at the log end: it waits"
    assert not parts.replica_manager.make_leader((TOPIC, 0), 3), "the same epoch: no change"
    assert not out.done()
    assert parts.replica_manager.make_leader((TOPIC, 0), 4)
    assert out.done(), "answered at once, not at max_wait_ms"
    assert fetched(wire_roundtrip(req, out.result())) == (E.FENCED_LEADER_EPOCH, -1, 0)


async def test_a_fenced_fetch_from_v16_names_the_current_leader(parts: Components) -> None:
    """Kafka's handleFetchRequest from v16: FENCED_LEADER_EPOCH carries CurrentLeader (this
    broker and its epoch) and the answer its endpoint; before v16 neither is filled."""
    await two_epochs(parts)
    topic_id = parts.topics.metadata.topics[TOPIC].topic_id

    def fenced(version: int) -> Any:
        return FetchRequest[version](
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
            session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(
                topic_id=topic_id, partitions=[FetchRequest.FetchTopic.FetchPartition(
                    partition=0, current_leader_epoch=2, fetch_offset=0,
                    last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])],
            forgotten_topics_data=[], rack_id="")

    node = parts.context.node
    got = answer(parts, fetch.handle, fenced(16))
    [p] = got.responses[0].partitions
    assert p.error_code == E.FENCED_LEADER_EPOCH
    assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (node.node_id, 3)
    assert [(n.node_id, n.port) for n in got.node_endpoints] == [(node.node_id, node.port)]
    older = answer(parts, fetch.handle, fenced(15))
    [p] = older.responses[0].partitions
    assert p.error_code == E.FENCED_LEADER_EPOCH
    assert p.current_leader is None or p.current_leader.leader_id == -1
    ok = answer(parts, fetch.handle, fetch_request(3, version=12))
    assert fetched(ok) == (E.NONE, 5, 5)


# -- ListOffsets ----------------------------------------------------------------------------------

def list_request(timestamp: int, current: int = -1, version: int = 8) -> Any:
    topic = ListOffsetsRequest.ListOffsetsTopic
    return ListOffsetsRequest[version](replica_id=-1, isolation_level=0, topics=[topic(
        name=TOPIC, partitions=[topic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=current, timestamp=timestamp)])])


def listed(c: Components, timestamp: int, current: int = -1, version: int = 8
           ) -> tuple[int, int, int]:
    resp = answer(c, list_offsets.handle, list_request(timestamp, current, version))
    [p] = resp.topics[0].partitions
    return p.error_code, p.offset, p.leader_epoch


async def test_list_offsets_checks_and_reports_leader_epochs(parts: Components) -> None:
    await two_epochs(parts)
    assert listed(parts, LATEST) == (E.NONE, 5, 3), "latest: the partition's epoch"
    assert listed(parts, EARLIEST) == (E.NONE, 0, 0), "earliest: the first cached epoch"
    assert listed(parts, BASE_TS + 1) == (E.NONE, 1, 0), "a lookup: the batch's epoch"
    assert listed(parts, BASE_TS + 50) == (E.NONE, 2, 3)
    assert listed(parts, MAX_TIMESTAMP) == (E.NONE, 4, 3)
    assert listed(parts, BASE_TS + 1000) == (E.NONE, -1, -1)
    assert listed(parts, LATEST, current=3) == (E.NONE, 5, 3)
    assert listed(parts, LATEST, current=2) == (E.FENCED_LEADER_EPOCH, -1, -1)
    assert listed(parts, EARLIEST, current=9) == (E.UNKNOWN_LEADER_EPOCH, -1, -1)
    assert listed(parts, LATEST, current=2, version=4)[0] == E.FENCED_LEADER_EPOCH


async def test_list_offsets_while_the_high_watermark_lags_the_epoch_start(parts: Components
                                                                          ) -> None:
    """A leader just elected whose high watermark is still below where its epoch began
    answers OFFSET_NOT_AVAILABLE (LEADER_NOT_AVAILABLE before v5), as Kafka does."""
    await two_epochs(parts)
    p = partition(parts)
    p.high_watermark = 2  # what a new leader holds until its followers catch up
    p.make_leader(4)
    assert p.leader_epoch_start_offset == 5
    assert listed(parts, LATEST) == (E.OFFSET_NOT_AVAILABLE, -1, -1)
    assert listed(parts, LATEST, version=4) == (E.LEADER_NOT_AVAILABLE, -1, -1)
    assert listed(parts, BASE_TS + 50) == (E.OFFSET_NOT_AVAILABLE, -1, -1)
    assert listed(parts, BASE_TS) == (E.NONE, 0, 0), "readable below the watermark"
    assert listed(parts, EARLIEST) == (E.NONE, 0, 0)


# -- Metadata and DescribeTopicPartitions ---------------------------------------------------------

def metadata_epochs(c: Components, names: list[str] | None, version: int = 12
                    ) -> dict[tuple[str, int], int]:
    topics = None if names is None else [
        MetadataRequest.MetadataRequestTopic(topic_id=None, name=n) for n in names]
    req = parse(MetadataRequest[version](topics=topics, allow_auto_topic_creation=False,
                                         include_topic_authorized_operations=False))
    resp = PackedMetadataResponse.decode(metadata.handle(c.context, req).encode(version),
                                         version)
    return {(t.name, p.partition_index): p.leader_epoch for t in resp.topics
            for p in t.partitions}


def described_epochs(c: Components, name: str) -> list[int]:
    from kafka.protocol.admin import DescribeTopicPartitionsRequest

    req = DescribeTopicPartitionsRequest[0](
        topics=[DescribeTopicPartitionsRequest.TopicRequest(name=name)],
        response_partition_limit=100, cursor=None)
    resp = answer(c, describe_topic_partitions.handle, req)
    return [p.leader_epoch for p in resp.topics[0].partitions]


async def test_metadata_and_describe_report_each_partitions_epoch(parts: Components) -> None:
    parts.topics.create_topic("wide", 3, {})
    assert metadata_epochs(parts, ["wide"]) == {("wide", 0): 0, ("wide", 1): 0, ("wide", 2): 0}
    assert metadata_epochs(parts, None)[(TOPIC, 0)] == 0
    partition(parts, 1, "wide").make_leader(2)
    assert metadata_epochs(parts, ["wide"]) == {("wide", 0): 0, ("wide", 1): 2, ("wide", 2): 0}
    every = metadata_epochs(parts, None)
    assert every[("wide", 1)] == 2 and every[(TOPIC, 0)] == 0
    assert described_epochs(parts, "wide") == [0, 2, 0]
    for i in (0, 2):
        partition(parts, i, "wide").make_leader(2)
    assert metadata_epochs(parts, ["wide"]) == {("wide", 0): 2, ("wide", 1): 2, ("wide", 2): 2}
    assert metadata_epochs(parts, ["wide"], version=7)[("wide", 2)] == 2


# -- the log start moving ------------------------------------------------------------------------

async def test_delete_records_truncates_the_cache_from_the_start(parts: Components) -> None:
    await two_epochs(parts)
    p = partition(parts)
    p.delete_records(1)
    assert epochs_of(parts) == [(0, 1), (3, 2)]
    assert listed(parts, EARLIEST) == (E.NONE, 1, 0)
    p.delete_records(4)
    assert epochs_of(parts) == [(3, 4)]
    assert end_offset(parts, 0) == (E.NONE, 0, 4), "below the earliest: where data starts"


def test_retention_truncates_the_cache_from_the_start(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=200, retention_bytes=0, file_delete_delay_ms=0)
    log = Log(tmp_path / "t-0", cfg, "t", 0)
    for epoch in (0, 0, 1, 1, 2):
        log.append(bytearray(batch(1)), BASE_TS, leader_epoch=epoch)
    assert [tuple(e) for e in log.leader_epoch_cache.entries()] == [(0, 0), (1, 2), (2, 4)]
    assert log.num_segments > 1
    assert log.delete_old_segments(BASE_TS) > 0
    assert log.log_start_offset == 5, "retention.bytes=0 leaves an empty log at its end"
    assert [tuple(e) for e in log.leader_epoch_cache.entries()] == [(2, 5)]
    assert log.end_offset_for_epoch(1) == (1, 5), "below the earliest: where data starts"
    log.close()
    # As Kafka's loader, a restart cuts the entries at or past the log end: an epoch without
    # data is the new leader's to assign again.
    again = Log(tmp_path / "t-0", cfg, "t", 0)
    assert again.leader_epoch_cache.entries() == []
    again.close()


# -- restarts and crashes ------------------------------------------------------------------------

async def test_a_restart_keeps_the_checkpoint_and_the_epoch(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    c.topics.create_topic(TOPIC, 1, {})
    await two_epochs(c)
    await c.close()
    path = tmp_path / "logs" / f"{TOPIC}-0" / LEADER_EPOCH_CHECKPOINT_FILE
    assert path.read_text() == "0\n2\n0 0\n3 2\n"
    again = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    try:
        assert partition(again).leader_epoch == 3, "a lone broker leads in its latest epoch"
        assert epochs_of(again) == [(0, 0), (3, 2)]
        assert end_offset(again, 0) == (E.NONE, 0, 2)
        assert produce(again, 1) == 5
        assert stamped_epochs(partition(again).log)[-1] == (5, 3)
    finally:
        await again.close()


def crashed_log(tmp_path: Path) -> tuple[Path, int]:
    """A log whose epochs 0 and 1 were flushed, then epoch 2 appended and never flushed, and
    no close (a crash): its dir and the recovery point."""
    d = tmp_path / "t-0"
    log = Log(d, LogConfig(), "t", 0)
    log.append(bytearray(batch(2)), BASE_TS, leader_epoch=0)
    log.append(bytearray(batch(2)), BASE_TS, leader_epoch=1)
    log.flush()
    recovery_point = log.recovery_point
    log.append(bytearray(batch(2)), BASE_TS, leader_epoch=2)
    log._close_files()  # the process dies: nothing more is written
    return d, recovery_point


def test_recovery_rebuilds_the_epochs_past_the_recovery_point(tmp_path: Path) -> None:
    d, recovery_point = crashed_log(tmp_path)
    assert (d / LEADER_EPOCH_CHECKPOINT_FILE).read_text() == "0\n2\n0 0\n1 2\n"
    log = Log.load(d, LogConfig(), "t", 0, clean_shutdown=False, recovery_point=recovery_point)
    assert [tuple(e) for e in log.leader_epoch_cache.entries()] == [(0, 0), (1, 2), (2, 4)]
    assert log.end_offset_for_epoch(1) == (1, 4)
    log.close()


def test_recovery_drops_epochs_whose_data_was_lost(tmp_path: Path) -> None:
    d, recovery_point = crashed_log(tmp_path)
    log = Log.load(d, LogConfig(), "t", 0, clean_shutdown=False, recovery_point=recovery_point)
    log.flush()  # the checkpoint now holds epoch 2 from offset 4
    log._close_files()
    segment = sorted(d.glob("*.log"))[-1]
    data = segment.read_bytes()
    positions = [pos for pos, _h in iter_batches(data)]
    segment.write_bytes(data[:positions[-1] + 10])  # the epoch-2 batch is torn
    log = Log.load(d, LogConfig(), "t", 0, clean_shutdown=False, recovery_point=recovery_point)
    assert log.log_end_offset == 4
    assert [tuple(e) for e in log.leader_epoch_cache.entries()] == [(0, 0), (1, 2)]
    log.close()


def test_a_missing_checkpoint_is_rebuilt_from_the_batches(tmp_path: Path) -> None:
    d, recovery_point = crashed_log(tmp_path)
    shutil.copytree(d, tmp_path / "copy")
    (d / LEADER_EPOCH_CHECKPOINT_FILE).unlink()
    log = Log.load(d, LogConfig(), "t", 0, clean_shutdown=False, recovery_point=recovery_point)
    assert [tuple(e) for e in log.leader_epoch_cache.entries()] == [(0, 0), (1, 2), (2, 4)]
    log.close()
    # A torn checkpoint (no entry line yet) reads as empty, as Kafka reads it: rebuilt too.
    copy = tmp_path / "copy"
    (copy / LEADER_EPOCH_CHECKPOINT_FILE).write_text("0\n")
    log = Log.load(copy, LogConfig(), "t", 0, clean_shutdown=True)
    assert [tuple(e) for e in log.leader_epoch_cache.entries()] == [(0, 0), (1, 2), (2, 4)]
    log.close()


def test_a_malformed_checkpoint_fails_the_load_naming_it(tmp_path: Path) -> None:
    d, _ = crashed_log(tmp_path)
    (d / LEADER_EPOCH_CHECKPOINT_FILE).write_text("0\n3\n0 0\n1 2\n")  # says 3, holds 2
    with pytest.raises(StartupError, match=LEADER_EPOCH_CHECKPOINT_FILE):
        Log.load(d, LogConfig(), "t", 0, clean_shutdown=True)
