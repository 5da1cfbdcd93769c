"""kcat (Debian's package, librdkafka inside) as its users type it: `-L`, `-P`, `-C`, and two
`-G` balanced consumers sharing a topic's partitions, each record consumed by exactly one;
headers (`-H` on produce, `%h` and `-J` on consume), timestamps (`%T`, `-Q`, `-o s@`/`e@`) and
the idempotent producer (`-X enable.idempotence=true`).

Every kcat run is bounded by a timeout; the long-running `-G` processes are stopped with
SIGTERM (kcat then closes its consumer: commits and leaves the group) and killed if they linger.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from broker.testing import EmbeddedBroker
from tests.conformance.conftest import GROUP_OVERRIDES
from tests.support.clients import (
    CREATE_TIME,
    Rec,
    assert_idempotent_batches,
    confluent_consume,
    confluent_produce,
    create_topic,
    disk_batches,
    unique_topic,
    wait_until,
    watermarks,
)

KCAT = shutil.which("kcat") or shutil.which("kafkacat")

pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat not on PATH (make test installs it)")


@pytest.fixture
def broker(mini_broker_factory: Callable[..., Any]) -> Iterator[EmbeddedBroker]:
    """An embedded broker for each test: kcat is the real client process, the broker need not
    be one (no test here stops the broker or reads its log)."""
    with mini_broker_factory() as b:
        yield b


@pytest.fixture
def group_broker(mini_broker_factory: Callable[..., Any]) -> Iterator[EmbeddedBroker]:
    """The conformance suite's group-tuned broker (tests/conformance/conftest.py), embedded."""
    with mini_broker_factory(**GROUP_OVERRIDES) as b:
        yield b


def kcat(*args: str, stdin: str | None = None, timeout: float = 30) -> str:
    proc = subprocess.run([KCAT or "kcat", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"kcat {args} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


class Balanced:
    """A `kcat -G` process; its stdout lines are collected by a reader thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, stderr_path: Path,
                 session_ms: int = 6000) -> None:
        self.lines: list[str] = []
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [KCAT or "kcat", "-b", bootstrap, "-G", group, topic, "-u", "-q",
             "-f", "%p|%o|%k|%s\n",
             "-X", "auto.offset.reset=earliest", "-X", "broker.address.family=v4",
             "-X", f"session.timeout.ms={session_ms}", "-X", "heartbeat.interval.ms=250",
             "-X", "auto.commit.interval.ms=200", "-X", "fetch.wait.max.ms=100"],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.reader.join(5)
        self._stderr.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: the member dies without leaving the group or committing."""
        self.proc.kill()
        self.proc.wait(5)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def test_kcat_metadata_produce_consume(broker: EmbeddedBroker) -> None:
    topic = unique_topic("kcat-pc")
    create_topic(broker.bootstrap_servers, topic, 2)
    meta = json.loads(kcat("-L", "-J", "-b", broker.bootstrap_servers, "-t", topic))
    assert [b["name"] for b in meta["brokers"]] == [broker.bootstrap_servers]
    (t,) = meta["topics"]
    assert t["topic"] == topic and len(t["partitions"]) == 2 and "error" not in t, t

    lines = [f"line {i} ünïcødé" for i in range(50)]
    kcat("-P", "-b", broker.bootstrap_servers, "-t", topic, "-p", "1", "-K", ":",
         stdin="".join(f"k{i}:{line}\n" for i, line in enumerate(lines)))
    assert watermarks(broker.bootstrap_servers, topic, 1) == (0, 50)
    out = kcat("-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "1", "-o", "beginning",
               "-e", "-q", "-f", "%o %k %s\n")
    assert out.splitlines() == [f"{i} k{i} {line}" for i, line in enumerate(lines)]
    tail = kcat("-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "1", "-o", "-5", "-e",
                "-q")
    assert tail.splitlines() == lines[-5:]
    assert kcat("-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-e", "-q") == ""


def _admin(bootstrap: str, errors: list) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "error_cb": errors.append,
                        "broker.address.family": "v4"})


def _stable_shares(admin: AdminClient, group: str, members: int) -> list[set[int]] | None:
    """Each member's partitions, once the group is Stable with `members` members."""
    d = admin.describe_consumer_groups([group], request_timeout=10)[group].result(15)
    if d.state != ConsumerGroupState.STABLE or len(d.members) != members:
        return None
    return [{tp.partition for tp in m.assignment.topic_partitions} for m in d.members]


def _committed(admin: AdminClient, group: str) -> dict[int, int]:
    req = [ConsumerGroupTopicPartitions(group)]
    listed = admin.list_consumer_group_offsets(req, request_timeout=10)[group].result(15)
    return {tp.partition: tp.offset for tp in listed.topic_partitions}


def _produce_lines(bootstrap: str, topic: str, values: list[str]) -> None:
    kcat("-P", "-b", bootstrap, "-t", topic, "-K", ":",
         stdin="".join(f"key-{v}:{v}\n" for v in values))


def test_kcat_balanced_consumers(group_broker: EmbeddedBroker, tmp_path: Path) -> None:
    b = group_broker
    topic, group = unique_topic("kcat-g"), unique_topic("kcat-grp")
    partitions, count = 4, 400
    create_topic(b.bootstrap_servers, topic, partitions)
    errors: list = []
    admin = _admin(b.bootstrap_servers, errors)

    def stable_with_two():
        return _stable_shares(admin, group, 2)

    consumers = [Balanced(b.bootstrap_servers, group, topic, tmp_path / f"kcat-{i}.err")
                 for i in range(2)]
    try:
        shares = wait_until(stable_with_two, 30, "two kcat -G members in a stable group")
        assert sorted(len(s) for s in shares) == [2, 2] and set().union(*shares) == set(
            range(partitions)), shares

        values = [f"v{i}" for i in range(count)]
        kcat("-P", "-b", b.bootstrap_servers, "-t", topic, "-K", ":",
             stdin="".join(f"key{i}:{v}\n" for i, v in enumerate(values)))
        assert sum(watermarks(b.bootstrap_servers, topic, p)[1] for p in range(partitions)) == count

        wait_until(lambda: sum(len(c.lines) for c in consumers) >= count, 30,
                   f"{count} records through the two kcat -G consumers")
        time.sleep(0.5)  # anything arriving now would be a duplicate
    finally:
        codes = [c.stop() for c in consumers]
    got = [c.lines for c in consumers]
    assert all(got), f"both consumers must get records: {[len(g) for g in got]}"
    seen = Counter(line.split("|", 3)[3] for g in got for line in g)
    assert sorted(seen) == sorted(values), "every record consumed"
    assert max(seen.values()) == 1, [v for v, n in seen.items() if n > 1][:10]
    # Each consumer read only its own two partitions, each in offset order from 0.
    parts = [{int(line.split("|")[0]) for line in g} for g in got]
    assert sorted(parts, key=min) == sorted(shares, key=min), (parts, shares)
    for g in got:
        by_part: dict[int, list[int]] = {}
        for line in g:
            p, o = line.split("|")[:2]
            by_part.setdefault(int(p), []).append(int(o))
        for p, offs in by_part.items():
            assert offs == list(range(len(offs))), f"partition {p}: {offs[:10]}..."
    assert codes == [0, 0], f"kcat exit codes {codes}: {[c.stderr() for c in consumers]}"

    # kcat closed its consumers on SIGTERM: the final positions are committed.
    committed = _committed(admin, group)
    assert committed == {p: watermarks(b.bootstrap_servers, topic, p)[1] for p in range(partitions)}
    assert not errors, errors


def test_kcat_member_dies(group_broker: EmbeddedBroker, tmp_path: Path) -> None:
    """A `kcat -G` member is SIGKILLed (no LeaveGroup): its session expires in the heartbeat
    purgatory, the group rebalances, and the survivor takes its partitions over from the
    offsets it had committed."""
    b = group_broker
    topic, group = unique_topic("kcat-die"), unique_topic("kcat-die-grp")
    partitions = 4
    create_topic(b.bootstrap_servers, topic, partitions)
    errors: list = []
    admin = _admin(b.bootstrap_servers, errors)
    session_s = 3
    consumers = [Balanced(b.bootstrap_servers, group, topic, tmp_path / f"kcat-{i}.err",
                          session_ms=session_s * 1000) for i in range(2)]
    survivor, victim = consumers
    try:
        wait_until(lambda: _stable_shares(admin, group, 2), 30, "a stable group of two")
        first = [f"one-{i}" for i in range(200)]
        _produce_lines(b.bootstrap_servers, topic, first)
        ends = {p: watermarks(b.bootstrap_servers, topic, p)[1] for p in range(partitions)}
        wait_until(lambda: sum(len(c.lines) for c in consumers) >= len(first), 30,
                   "the first records consumed")
        # auto.commit.interval.ms=200: wait until everything read is committed, then kill.
        wait_until(lambda: _committed(admin, group) == ends, 10, "commits of the first records")
        victim_parts = {int(line.split("|")[0]) for line in victim.lines}
        assert victim_parts and len(victim_parts) < partitions, victim_parts
        victim.kill()
        killed_at = time.monotonic()

        second = [f"two-{i}" for i in range(200)]
        _produce_lines(b.bootstrap_servers, topic, second)
        shares = wait_until(lambda: _stable_shares(admin, group, 1), 30,
                            "the group of one after the session timeout")
        expelled_after = time.monotonic() - killed_at
        assert shares == [set(range(partitions))], shares
        assert expelled_after >= session_s - 0.5, f"expelled after {expelled_after:.1f}s"
        wait_until(lambda: sum(len(c.lines) for c in consumers) >= len(first) + len(second), 30,
                   "the second records consumed by the survivor")
        time.sleep(0.5)  # anything arriving now would be a duplicate
    finally:
        codes = [c.stop() for c in consumers]
    assert codes[0] == 0, survivor.stderr()
    values = [line.split("|", 3)[3] for c in consumers for line in c.lines]
    seen = Counter(values)
    assert sorted(seen) == sorted(first + second), "every record consumed"
    assert max(seen.values()) == 1, [v for v, n in seen.items() if n > 1][:10]
    # The survivor read the victim's partitions from exactly where the victim's commits were.
    taken_over = [line for line in survivor.lines
                  if int(line.split("|")[0]) in victim_parts and line.split("|")[3][:4] == "two-"]
    for p in victim_parts:
        offs = [int(line.split("|")[1]) for line in taken_over if int(line.split("|")[0]) == p]
        assert offs == list(range(ends[p], ends[p] + len(offs))) and offs, (p, ends[p], offs)
    assert not errors, errors


def test_kcat_headers(broker: EmbeddedBroker) -> None:
    """`-H name=value` (repeated, a name twice, an empty value, non-ASCII) is sent on every
    record; kcat's `%h` and `-J` and confluent-kafka read every header back in order."""
    topic = unique_topic("kcat-h")
    create_topic(broker.bootstrap_servers, topic)
    headers = (("trace", b"abc-123"), ("dup", b"first"), ("dup", b"second"), ("empty", b""),
               ("ключ", "значение".encode()))
    flags = [arg for k, v in headers for arg in ("-H", f"{k}={v.decode()}")]
    kcat("-P", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-K", ":", *flags,
         stdin="".join(f"k{i}:v{i}\n" for i in range(5)))

    csv = ",".join(f"{k}={v.decode()}" for k, v in headers)
    out = kcat("-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-o", "beginning",
               "-e", "-q", "-f", "%o|%k|%s|%h\n")
    assert out.splitlines() == [f"{i}|k{i}|v{i}|{csv}" for i in range(5)]

    envelope = [json.loads(line) for line in kcat(
        "-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
        "-J").splitlines()]
    assert [e["offset"] for e in envelope] == list(range(5))
    for e in envelope:
        # kcat prints -J headers as a flat [name, value, name, value, ...] list
        assert e["headers"] == [x for k, v in headers for x in (k, v.decode())], e

    got = confluent_consume(broker.bootstrap_servers, topic, 5)
    assert [g.rec for g in got] == [
        Rec(f"k{i}".encode(), f"v{i}".encode(), headers, g.rec.timestamp)
        for i, g in enumerate(got)]


def test_kcat_timestamps(broker: EmbeddedBroker) -> None:
    """Explicit CreateTimes set by another producer come back exactly through `%T`; kcat -P
    stamps each record with its CreateTime (now), which `%T` and `-J` print; `-Q` finds the
    first offset at a timestamp (ListOffsets by time) and `-o s@`/`e@` start and stop consuming
    at timestamps."""
    topic = unique_topic("kcat-ts")
    create_topic(broker.bootstrap_servers, topic)
    base = int(time.time() * 1000) - 10 * 86_400_000
    explicit = [Rec(f"k{i}".encode(), f"old-{i}".encode(), (), base + 1000 * i)
                for i in range(5)]
    assert confluent_produce(broker.bootstrap_servers, topic, explicit) == list(range(5))
    out = kcat("-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-o", "beginning",
               "-e", "-q", "-f", "%o|%T|%s\n")
    assert out.splitlines() == [f"{i}|{r.timestamp}|{r.value.decode()}"
                                for i, r in enumerate(explicit)]

    before = int(time.time() * 1000)
    kcat("-P", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0",
         stdin="now-0\nnow-1\nnow-2\n")
    after = int(time.time() * 1000)
    stamped = kcat("-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-o", "5", "-e",
                   "-q", "-f", "%T|%s\n").splitlines()
    assert [line.split("|")[1] for line in stamped] == ["now-0", "now-1", "now-2"]
    assert all(before <= int(line.split("|")[0]) <= after for line in stamped), (
        before, stamped, after)
    envelope = [json.loads(line) for line in kcat(
        "-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q",
        "-J").splitlines()]
    assert [(e["tstype"], e["ts"]) for e in envelope] == [
        ("create", r.timestamp) for r in explicit] + [
        ("create", int(line.split("|")[0])) for line in stamped]
    assert {g.timestamp_type for g in confluent_consume(broker.bootstrap_servers, topic, 8)} == {
        CREATE_TIME}

    # -Q: the first offset whose timestamp is at or after the one asked for; -1 past the last.
    def query(ts: int) -> int:
        found = kcat("-Q", "-b", broker.bootstrap_servers, "-t", f"{topic}:0:{ts}")
        return int(found.split("offset")[1].split()[0])

    assert [query(ts) for ts in (base - 1, base, base + 1500, base + 4001, before)] == [
        0, 0, 2, 5, 5]
    assert query(after + 60_000) == -1

    # -o s@ / e@: consume from the first record at or after a time, stop before another.
    def window(start: int, stop: int) -> list[str]:
        return kcat("-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-o",
                    f"s@{start}", "-o", f"e@{stop}", "-e", "-q", "-f", "%o|%s\n").splitlines()

    assert window(base + 1000, base + 3000) == ["1|old-1", "2|old-2"]
    assert window(base + 3500, after + 1) == [
        "4|old-4", "5|now-0", "6|now-1", "7|now-2"]


def test_kcat_idempotent_producer(broker: EmbeddedBroker) -> None:
    """`-X enable.idempotence=true`: every record stored once, all batches with one producer id
    and epoch and sequence numbers running from 0 without gap, in step with the offsets."""
    topic = unique_topic("kcat-idem")
    create_topic(broker.bootstrap_servers, topic)
    n = 2000
    kcat("-P", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-K", ":",
         "-X", "enable.idempotence=true", "-X", "acks=all", "-X", "linger.ms=5",
         "-X", "batch.num.messages=100", "-X", "broker.address.family=v4",
         stdin="".join(f"k{i}:idem-{i}\n" for i in range(n)), timeout=60)
    assert watermarks(broker.bootstrap_servers, topic) == (0, n)
    assert_idempotent_batches(broker.data_dir / "logs", topic, 0, n)
    assert len(disk_batches(broker.data_dir / "logs", topic)) >= n // 100
    out = kcat("-C", "-b", broker.bootstrap_servers, "-t", topic, "-p", "0", "-o", "beginning",
               "-e", "-q", "-f", "%o|%k|%s\n", timeout=60)
    assert out.splitlines() == [f"{i}|k{i}|idem-{i}" for i in range(n)]
