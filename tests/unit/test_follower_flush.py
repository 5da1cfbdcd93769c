"""A follower reports to its leader only offsets as durable as its flush policy asks: the
leader counts a follower's fetch offset as held (high watermark, acks=all), so with
flush.messages=1 the offset a fetch sends is fsynced first, as Kafka's follower flushes in
its append before the next fetch. By default (flush.messages unset) nothing waits or fsyncs.

The fetches go to a leader that cannot be reached: what is checked is the fetch offset the
fetcher puts in its request, and the follower's recovery point at that moment. The follower's
fsyncs are held at the disk seam to make "not durable yet" last as long as the test wants."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.interbroker.client import InterBrokerClient, InterBrokerSettings
from broker.interbroker.replica_fetcher import (
    FetcherSettings,
    FetchState,
    ReplicaFetcher,
    ReplicaFetcherManager,
)
from broker.log import disk
from broker.replica.partition import Partition
from tests.support.components import Components, build
from tests.support.log_batches import T0
from tests.unit.test_follower_partition import MAX_BYTES, TOPIC, TP, leader_log

LEADER = 1
WAIT_S = 10.0


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1"})
    yield c
    await c.close()


class FollowerDisk:
    """fsyncs of the followed partition's files, counted, and held while ``held`` is clear
    (or failed with EIO once ``fail`` is set), on whatever thread makes them."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.released = threading.Event()
        self.released.set()
        self.fail = False
        self.synced = 0

    def fsync(self, fd: int) -> None:
        if f"{TOPIC}-0" in os.readlink(f"/proc/self/fd/{fd}"):
            self.released.wait(WAIT_S)
            if self.fail:
                raise OSError(errno.EIO, "injected fsync failure")
            self.synced += 1
        self.real(fd)


@pytest.fixture
def follower_disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[FollowerDisk]:
    gate = FollowerDisk(disk.fsync)
    monkeypatch.setattr(disk, "fsync", gate.fsync)
    yield gate
    gate.released.set()  # nothing left waiting on the gate after the test


class Reported:
    """The fetch offsets a fetcher put in its requests, each with the follower's recovery
    point and log end at that moment."""

    def __init__(self, fetcher: ReplicaFetcher, partition: Partition) -> None:
        self.offsets: list[tuple[int, int, int]] = []
        build_request = fetcher._fetch_builder

        def spy(asked: dict[Any, tuple[FetchState, int]]) -> Callable[[int], Any]:
            log = partition.log
            self.offsets.append((asked[TP][1], log.recovery_point, log.log_end_offset))
            return build_request(asked)

        fetcher._fetch_builder = spy  # type: ignore[method-assign]


def follower(parts: Components, configs: dict[str, str]) -> tuple[ReplicaFetcher, FetchState,
                                                                   Partition]:
    """``TOPIC``-0 followed from ``LEADER``, and a fetcher for it whose leader never answers
    (no address: each fetch fails and backs off, after its request was built)."""
    parts.topics.create_topic(TOPIC, 1, configs)
    rm = parts.replica_manager
    rm.broker_id = 0
    rm.make_follower(TP, LEADER, 3, [0, LEADER], [0, LEADER], 0, partition=rm.partitions[TP])
    client = InterBrokerClient(InterBrokerSettings("PLAINTEXT", "PLAINTEXT",
                                                   request_timeout_ms=50), lambda _node: None)
    manager = ReplicaFetcherManager(rm, client, FetcherSettings(), 0, lambda: 1)
    fetcher = ReplicaFetcher(manager, LEADER, 0, client)
    state = FetchState(TP, None, 3, truncating=False)
    fetcher.partitions[TP] = state
    return fetcher, state, rm.follower_partitions[TP]


def append_from_leader(parts: Components, partition: Partition, records: bytes) -> None:
    """What the fetcher does with an answer's records (ReplicaFetcher._append)."""
    info = partition.append_as_follower(records, T0)
    assert info is not None
    parts.replica_manager.follower_appended(partition, info)


async def test_flush_messages_1_reports_only_fsynced_offsets(
        parts: Components, tmp_path: Path, follower_disk: FollowerDisk) -> None:
    fetcher, state, p = follower(parts, {"flush.messages": "1"})
    assert p.log.writes_on_writer  # the dir's writer writes and fsyncs it
    reported = Reported(fetcher, p)
    follower_disk.released.clear()
    leader = leader_log(tmp_path, 5)
    append_from_leader(parts, p, bytes(leader.read(0, MAX_BYTES, None, True)))
    assert p.log_end_offset == 10
    fetch = asyncio.create_task(fetcher._fetch([state]))
    await asyncio.sleep(0.2)  # the writer has had time to write; its fsync is held
    assert p.log.recovery_point < 10
    assert reported.offsets == [], "reported an offset that is not fsynced"
    assert not fetch.done()
    follower_disk.released.set()
    await asyncio.wait_for(fetch, WAIT_S)
    assert reported.offsets == [(10, 10, 10)]
    assert follower_disk.synced > 0
    for offset, recovery_point, _end in reported.offsets:
        assert offset <= recovery_point


async def test_default_flush_policy_reports_the_log_end_at_once_without_fsync(
        parts: Components, tmp_path: Path, follower_disk: FollowerDisk) -> None:
    fetcher, state, p = follower(parts, {})
    assert not p.log.writes_on_writer
    reported = Reported(fetcher, p)
    leader = leader_log(tmp_path, 5)
    append_from_leader(parts, p, bytes(leader.read(0, MAX_BYTES, None, True)))
    await asyncio.wait_for(fetcher._fetch([state]), WAIT_S)
    assert reported.offsets == [(10, 0, 10)]  # the OS decides when it reaches the disk
    assert follower_disk.synced == 0


async def test_flush_messages_n_waits_only_for_the_flush_it_owes(
        parts: Components, tmp_path: Path, follower_disk: FollowerDisk) -> None:
    """flush.messages=3: after 2 unflushed messages the log end goes at once (Kafka's append
    flushes only at 3); at 4 it goes once the flush made it durable."""
    fetcher, state, p = follower(parts, {"flush.messages": "3"})
    reported = Reported(fetcher, p)
    leader = leader_log(tmp_path, 2)  # two batches of two records
    append_from_leader(parts, p, bytes(leader.read(0, MAX_BYTES, 2, False)))
    assert p.log_end_offset == 2
    await asyncio.wait_for(fetcher._fetch([state]), WAIT_S)
    follower_disk.released.clear()
    append_from_leader(parts, p, bytes(leader.read(2, MAX_BYTES, 4, False)))
    assert p.log_end_offset == 4
    fetch = asyncio.create_task(fetcher._fetch([state]))
    await asyncio.sleep(0.2)
    assert len(reported.offsets) == 1, "reported an offset the flush policy owes a flush"
    follower_disk.released.set()
    await asyncio.wait_for(fetch, WAIT_S)
    assert reported.offsets == [(2, 0, 2), (4, 4, 4)]


async def test_a_failed_fsync_reports_nothing_and_waits_for_newer_state(
        parts: Components, tmp_path: Path, follower_disk: FollowerDisk) -> None:
    fetcher, state, p = follower(parts, {"flush.messages": "1"})
    reported = Reported(fetcher, p)
    follower_disk.released.clear()
    leader = leader_log(tmp_path, 5)
    append_from_leader(parts, p, bytes(leader.read(0, MAX_BYTES, None, True)))
    fetch = asyncio.create_task(fetcher._fetch([state]))
    await asyncio.sleep(0.1)
    follower_disk.fail = True
    follower_disk.released.set()
    await asyncio.wait_for(fetch, WAIT_S)  # the failed dir wakes the wait
    assert p.offline
    assert reported.offsets == []
    assert state.waiting_for_state


async def test_an_unflushed_tail_the_writer_never_had_is_flushed_before_it_is_reported(
        parts: Components, tmp_path: Path, follower_disk: FollowerDisk) -> None:
    """Records appended before flush.messages=1 applied (or recovered unflushed at a start)
    were never handed to the dir's writer: the fetcher asks a flush for them rather than
    wait for a writer that has nothing to write."""
    fetcher, state, p = follower(parts, {})
    reported = Reported(fetcher, p)
    leader = leader_log(tmp_path, 5)
    append_from_leader(parts, p, bytes(leader.read(0, MAX_BYTES, None, True)))
    assert p.log.recovery_point == 0
    p.log.update_config(replace(p.log.config, flush_interval_messages=1))
    assert p.log.writes_on_writer and not p.log.writer_covers_end
    await asyncio.wait_for(fetcher._fetch([state]), WAIT_S)
    assert reported.offsets == [(10, 10, 10)]
    assert follower_disk.synced > 0
