"""DescribeLogDirs through its handler on two real log dirs: every dir by absolute path, the
partitions each holds with their sizes as data arrives, the asked partitions only, an offline
dir answered KAFKA_STORAGE_ERROR, and the volume's bytes from v4 on."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DescribeLogDirsRequest

from broker.apis import describe_log_dirs
from protocol import registry
from protocol.errors import ErrorCode
from tests.support.components import Components, build, parse, settle, wire_roundtrip
from tests.support.requests import record_batch

E = ErrorCode
TOPIC = "sized"


def test_the_registry_serves_these_versions() -> None:
    spec = registry.APIS[DescribeLogDirsRequest.API_KEY]
    assert (spec.min_version, spec.max_version) == (1, 4)


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    dirs = f"{tmp_path / 'a'},{tmp_path / 'b'}"
    c = build(tmp_path / "a", {"log.dirs": dirs, "offsets.topic.num.partitions": "1"})
    c.topics.create_topic(TOPIC, 3, {})
    yield c
    await c.close()


def describe(c: Components, topics: dict[str, list[int]] | None = None, version: int = 4) -> Any:
    asked = None if topics is None else [
        DescribeLogDirsRequest.DescribableLogDirTopic(topic=t, partitions=ps)
        for t, ps in topics.items()]
    parsed = parse(DescribeLogDirsRequest[version](topics=asked))
    return wire_roundtrip(parsed, describe_log_dirs.handle(c.context, parsed))


def sizes(resp: Any) -> dict[str, dict[tuple[str, int], int]]:
    """{log dir: {(topic, partition): size}} of a response."""
    return {r.log_dir: {(t.name, p.partition_index): p.partition_size
                        for t in r.topics for p in t.partitions} for r in resp.results}


def produce(c: Components, partition: int, n: int) -> None:
    batch = record_batch([b"x" * 100] * n)
    out = c.replica_manager.append_records([((TOPIC, partition), batch)], 9)
    assert out.done() and out.result()[(TOPIC, partition)].error == E.NONE


async def test_every_dir_and_its_partitions_with_sizes_that_grow(parts: Components,
                                                                 tmp_path: Path) -> None:
    resp = describe(parts)
    a, b = str((tmp_path / "a").absolute()), str((tmp_path / "b").absolute())
    assert resp.error_code == 0
    assert [(r.log_dir, r.error_code) for r in resp.results] == [(a, 0), (b, 0)]
    before = sizes(resp)
    held = {tp for d in before.values() for tp in d}
    # Each partition in exactly one dir, the topic's and __consumer_offsets'.
    assert held == {(TOPIC, 0), (TOPIC, 1), (TOPIC, 2), ("__consumer_offsets", 0)}
    assert sum(len(d) for d in before.values()) == 4
    assert all(size == 0 for d in before.values() for size in d.values())
    for r in resp.results:
        for t in r.topics:
            assert all(p.offset_lag == 0 and not p.is_future_key for p in t.partitions)
    produce(parts, 1, 10)
    after = sizes(describe(parts))
    dir_of_1 = next(d for d, held in after.items() if (TOPIC, 1) in held)
    log = parts.replica_manager.partitions[(TOPIC, 1)].log
    assert after[dir_of_1][(TOPIC, 1)] == log.size_in_bytes > 1000
    assert all(size == 0 for d in after.values() for tp, size in d.items() if tp != (TOPIC, 1))


async def test_only_the_asked_partitions(parts: Components) -> None:
    got = sizes(describe(parts, {TOPIC: [0, 2, 7], "nowhere": [0]}))
    assert {tp for d in got.values() for tp in d} == {(TOPIC, 0), (TOPIC, 2)}
    resp = describe(parts, {})
    assert len(resp.results) == 2
    assert all(r.error_code == 0 and r.topics == [] for r in resp.results)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
async def test_volume_bytes_from_v4(parts: Components, tmp_path: Path, version: int) -> None:
    resp = describe(parts, version=version)
    usage = shutil.disk_usage(tmp_path)
    for r in resp.results:
        if version >= 4:
            assert r.total_bytes == usage.total
            assert 0 < r.usable_bytes <= r.total_bytes
        else:  # not on the wire: the client reads Kafka's default
            assert (r.total_bytes, r.usable_bytes) == (-1, -1)


async def test_an_offline_dir_answers_storage_error_and_the_other_goes_on(
        parts: Components, tmp_path: Path) -> None:
    bad = tmp_path / "b"
    parts.log_manager.failure_channel.maybe_add_offline_log_dir(str(bad), "test",
                                                                OSError(5, "EIO"))
    await settle()
    resp = describe(parts)
    by_dir = {r.log_dir: r for r in resp.results}
    offline = by_dir[str(bad.absolute())]
    assert (offline.error_code, offline.topics) == (E.KAFKA_STORAGE_ERROR, [])
    assert (offline.total_bytes, offline.usable_bytes) == (-1, -1)
    online = by_dir[str((tmp_path / "a").absolute())]
    assert online.error_code == 0 and online.topics
