"""Leader epochs on a real broker: librdkafka fetches with the epoch Metadata gave it and
follows a new epoch (fenced, then validated with OffsetForLeaderEpoch); raw requests get
Kafka's FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH answers; restarts, clean or not, keep
the epochs the log was written in.

The broker runs on the test's own loop (async mode), so the partition's epoch is moved on
that loop as the cluster will move it; the blocking clients run in threads.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)

from broker.replica.partition import Partition
from broker.testing import EmbeddedBroker
from protocol.errors import ErrorCode as E
from tests.support.clients import (
    confluent_consumer,
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
)
from tests.support.wire import Wire

TIMEOUT_S = 60.0


def partition_of(b: EmbeddedBroker, topic: str) -> Partition:
    assert b.broker is not None and b.broker.replica_manager is not None
    return b.broker.replica_manager.partitions[(topic, 0)]


def api_errors(b: EmbeddedBroker, api: str) -> dict[int, int]:
    """Error codes the broker answered for ``api`` so far (its request metrics)."""
    assert b.broker is not None and b.broker.metrics is not None
    out: dict[int, int] = {}
    for stats in b.broker.metrics.stats.values():
        if stats.api == api:
            for code, n in stats.errors.items():
                out[code] = out.get(code, 0) + n
    return out


def api_requests(b: EmbeddedBroker, api: str) -> int:
    assert b.broker is not None and b.broker.metrics is not None
    return sum(s.requests for s in b.broker.metrics.stats.values() if s.api == api)


class Reader(threading.Thread):
    """One librdkafka consumer reading ``count`` records from offset 0 with assign()."""

    def __init__(self, bootstrap: str, topic: str, count: int) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.count = bootstrap, topic, count
        self.values: list[bytes] = []
        self.errors: list[Any] = []
        self.stop_at = threading.Event()

    def run(self) -> None:
        from confluent_kafka import TopicPartition

        consumer = confluent_consumer(self.bootstrap, self.errors,
                                      {"topic.metadata.refresh.interval.ms": 1000})
        try:
            consumer.assign([TopicPartition(self.topic, 0, 0)])
            while len(self.values) < self.count and not self.stop_at.is_set():
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    self.errors.append(msg.error())
                    continue
                self.values.append(msg.value())
        finally:
            consumer.close()


async def wait_for(condition: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TIMEOUT_S
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_librdkafka_reads_on_through_a_new_leader_epoch(tmp_path: Path) -> None:
    async with EmbeddedBroker(tmp_path, **{"metrics.listener": "http://127.0.0.1:0/metrics"}) as b:
        topic = unique_topic("epochs")
        bootstrap = b.bootstrap_servers
        await asyncio.to_thread(create_topic, bootstrap, topic)
        first = numbered(5, "before")
        assert await asyncio.to_thread(confluent_produce, bootstrap, topic, first) == list(
            range(5))
        reader = Reader(bootstrap, topic, 10)
        reader.start()
        try:
            await wait_for(lambda: len(reader.values) >= 5, "the first five records")
            fetches_before = api_requests(b, "Fetch")
            assert E.FENCED_LEADER_EPOCH not in api_errors(b, "Fetch")
            assert b.broker is not None and b.broker.replica_manager is not None
            # What the cluster does at an election; the consumer's parked fetch is fenced.
            assert b.broker.replica_manager.make_leader((topic, 0), 1)
            second = numbered(5, "after")
            assert await asyncio.to_thread(confluent_produce, bootstrap, topic, second) == list(
                range(5, 10))
            await wait_for(lambda: len(reader.values) >= 10 or not reader.is_alive(),
                           "the records written in the new epoch")
        finally:
            reader.stop_at.set()
            await asyncio.to_thread(reader.join, TIMEOUT_S)
        assert reader.values == [r.value for r in first + second]
        assert not [e for e in reader.errors if e.fatal()], reader.errors
        # The consumer fetched with epoch 0, was fenced once the partition moved to epoch 1,
        # refreshed its metadata and validated its position (OffsetForLeaderEpoch) before
        # reading on: epochs were checked, not ignored.
        assert api_requests(b, "Fetch") > fetches_before
        assert api_errors(b, "Fetch").get(E.FENCED_LEADER_EPOCH, 0) >= 1
        assert api_requests(b, "OffsetForLeaderEpoch") >= 1
        assert E.UNKNOWN_LEADER_EPOCH not in api_errors(b, "OffsetForLeaderEpoch")


def epoch_request(topic: str, leader_epoch: int, current: int) -> Any:
    part = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current, leader_epoch=leader_epoch)
    return OffsetForLeaderEpochRequest[4](replica_id=-1, topics=[
        OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=[part])])


def end_offset(port: int, topic: str, leader_epoch: int, current: int = -1
               ) -> tuple[int, int, int]:
    wire = Wire(port)
    try:
        resp = wire.request(epoch_request(topic, leader_epoch, current),
                            OffsetForLeaderEpochResponse)
    finally:
        wire.close()
    [p] = resp.topics[0].partitions
    return p.error_code, p.leader_epoch, p.end_offset


def fetch_error(port: int, topic: str, current: int) -> tuple[int, int]:
    """(error, high watermark) of a Fetch v12 of partition 0 carrying ``current``."""
    request = FetchRequest[12](
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=[],
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[
            FetchRequest.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=current, fetch_offset=0,
                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)])])
    wire = Wire(port)
    try:
        resp = wire.request(request, FetchResponse)
    finally:
        wire.close()
    [p] = resp.responses[0].partitions
    return p.error_code, p.high_watermark


async def test_raw_requests_and_restarts_keep_the_epochs(tmp_path: Path) -> None:
    async with EmbeddedBroker(tmp_path) as b:
        topic = unique_topic("raw")
        await asyncio.to_thread(create_topic, b.bootstrap_servers, topic)
        await asyncio.to_thread(confluent_produce, b.bootstrap_servers, topic, numbered(3))
        partition_of(b, topic).make_leader(2)
        await asyncio.to_thread(confluent_produce, b.bootstrap_servers, topic, numbered(4))

        async def ask(leader_epoch: int, current: int = -1) -> tuple[int, int, int]:
            return await asyncio.to_thread(end_offset, b.port, topic, leader_epoch, current)

        assert await ask(0) == (E.NONE, 0, 3)
        assert await ask(1, current=2) == (E.NONE, 0, 3)
        assert await ask(2, current=2) == (E.NONE, 2, 7)
        assert await ask(3) == (E.NONE, -1, -1)
        assert await ask(0, current=1) == (E.FENCED_LEADER_EPOCH, -1, -1)
        assert await ask(0, current=3) == (E.UNKNOWN_LEADER_EPOCH, -1, -1)
        assert await asyncio.to_thread(fetch_error, b.port, topic, 1) == (
            E.FENCED_LEADER_EPOCH, -1)
        assert await asyncio.to_thread(fetch_error, b.port, topic, 3) == (
            E.UNKNOWN_LEADER_EPOCH, -1)
        assert await asyncio.to_thread(fetch_error, b.port, topic, 2) == (E.NONE, 7)

        checkpoint = tmp_path / "logs" / f"{topic}-0" / "leader-epoch-checkpoint"
        await b.restart_async(clean=True)
        assert checkpoint.read_text() == "0\n2\n0 0\n2 3\n"
        assert partition_of(b, topic).leader_epoch == 2
        assert await ask(0, current=2) == (E.NONE, 0, 3)

        await asyncio.to_thread(confluent_produce, b.bootstrap_servers, topic, numbered(2))
        await b.kill_async()  # a crash: whatever was not flushed is recovered
        await b.start_async()
        assert b.recovered
        assert partition_of(b, topic).leader_epoch == 2
        assert await ask(0, current=2) == (E.NONE, 0, 3)
        assert await ask(2, current=2) == (E.NONE, 2, 9)
