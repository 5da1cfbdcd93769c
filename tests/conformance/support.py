"""Helpers shared by the conformance tests (the generic client helpers are in tests/support)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    Rec,
    assert_idempotent_batches,
    confluent_consumer,
    disk_batches,
    watermarks,
)


class Ledger:
    """Thread-safe record of who consumed what: (member, partition, offset, value)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[tuple[str, int, int, bytes]] = []

    def add(self, member: str, partition: int, offset: int, value: bytes) -> None:
        with self._lock:
            self.rows.append((member, partition, offset, value))

    def snapshot(self) -> list[tuple[str, int, int, bytes]]:
        with self._lock:
            return list(self.rows)

    def positions(self) -> set[tuple[int, int]]:
        return {(p, o) for _m, p, o, _v in self.snapshot()}

    def wait_for(self, expected: Iterable[tuple[int, int]], timeout: float, what: str) -> None:
        want = set(expected)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if want <= self.positions():
                return
            time.sleep(0.05)
        missing = sorted(want - self.positions())
        raise AssertionError(f"{what}: {len(missing)} records never consumed, e.g. {missing[:10]}")


def assert_exactly_once(rows: list[tuple[str, int, int, bytes]],
                        expected: dict[tuple[int, int], bytes]) -> None:
    """Each expected (partition, offset) consumed once, with the value produced there."""
    seen = Counter((p, o) for _m, p, o, _v in rows)
    dups = sorted(k for k, n in seen.items() if n > 1)
    assert not dups, f"{len(dups)} records consumed more than once, e.g. " + ", ".join(
        f"{k} by {[m for m, p, o, _v in rows if (p, o) == k]}" for k in dups[:5])
    missing = sorted(set(expected) - set(seen))
    assert not missing, f"{len(missing)} records never consumed, e.g. {missing[:10]}"
    extra = sorted(set(seen) - set(expected))
    assert not extra, f"records consumed that were never produced: {extra[:10]}"
    for _m, p, o, v in rows:
        assert v == expected[(p, o)], f"({p}, {o}): value {v!r} != {expected[(p, o)]!r}"


def module_broker(data_dir: Path, overrides: dict[str, str]) -> Iterator[BrokerProcess]:
    """A broker for one module's tests (a fixture yields from it), killed after them unless it
    stopped by itself."""
    b = BrokerProcess(data_dir, overrides).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.kill()


@dataclass
class ScenarioRun:
    """What one run of a client program reported (its JSON summary) for the plan it was given;
    each test reads its own scenario's part."""

    broker: BrokerProcess
    summary: dict
    plan: dict
    sent: dict[str, list[Rec]]
    stderr: str

    def __getitem__(self, name: str) -> dict:
        result = self.summary["results"][name]
        assert "error" not in result, f"{name}: {result['error']}\n{self.stderr[-4000:]}"
        return result


def committed_offsets(bootstrap: str, group: str, topic: str,
                      partitions: int) -> dict[str, int]:
    """The group's committed offsets as the venv's confluent-kafka reads them (OffsetFetch, no
    join), so a client's own report of its commits is checked against the broker's."""
    from confluent_kafka import TopicPartition

    errors: list = []
    consumer = confluent_consumer(bootstrap, errors, {"group.id": group})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                 timeout=10)
    finally:
        consumer.close()
    assert not errors, errors
    return {str(tp.partition): tp.offset for tp in got}


def assert_idempotent_delivery(broker: BrokerProcess, topic: str, partitions: int,
                               per_partition: int, acked: list, consumed: list) -> None:
    """The idempotent producer's records (values "partition:offset"), given as [partition,
    offset, value] rows: each acknowledged once at a dense offset, read back once, and stored
    once: offsets 0.. on each partition, one producer id with gap-free sequence numbers, over
    several batches (the producer had requests in flight together)."""
    expected = {(p, o): f"{p}:{o}" for p in range(partitions) for o in range(per_partition)}
    assert len(acked) == len(expected)
    assert {(p, o): v for p, o, v in acked} == expected
    counted = Counter((p, o, v) for p, o, v in consumed)
    assert [k for k, c in counted.items() if c > 1] == [], "records consumed twice"
    assert {(p, o): v for p, o, v in counted} == expected
    log_dir = broker.data_dir / "logs"
    for p in range(partitions):
        assert watermarks(broker.bootstrap, topic, p) == (0, per_partition)
        assert_idempotent_batches(log_dir, topic, p, per_partition)
        assert len(disk_batches(log_dir, topic, p)) >= 3, "the producer pipelined no batches"


def assert_idempotent_scenario(run: ScenarioRun, partitions: int, per_partition: int) -> None:
    """A program's "idempotent" scenario, which reports [partition, offset, value] per record
    acknowledged (a row of another length, with the error, for one that failed): no error,
    every record acknowledged, and delivered and stored as assert_idempotent_delivery checks."""
    result, topic = run["idempotent"], run.plan["idempotent"]["topic"]
    assert result["errors"] == []
    acked = result["acked"]
    assert [a for a in acked if len(a) != 3] == [], "records not acknowledged"
    assert_idempotent_delivery(run.broker, topic, partitions, per_partition, acked,
                               result["consumed"])
