"""`make cluster`'s launcher (tools/cluster_run.py) as a subprocess, on free ports: etcd and
three brokers start, a topic spread over the three serves every partition, and SIGINT stops
every process it started, cleanly; a broker that cannot start makes it exit with that broker's
code and leaves nothing behind.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cluster.test_cluster_brokers import eventually
from tests.support.clients import Rec, assert_roundtrip, confluent_consume, confluent_produce

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 6
PER_PARTITION = 10


def free_base_port(count: int = 3, attempts: int = 50) -> int:
    """The first of `count` consecutive loopback ports nobody listens on right now."""
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(20000, 40000)
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {count} consecutive free ports in {attempts} attempts")


class Launcher:
    """`python -m tools.cluster_run` with its output collected by a reader thread."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.base = free_base_port()
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.cluster_run", "--base-port", str(self.base),
             "--etcd-port", "0", "--metrics-base-port", "0", "--data-dir", str(data_dir),
             "--log-format", "json", "--start-timeout", "150", *extra],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any("cluster ready" in line for line in self.lines):
            assert self.proc.poll() is None, f"launcher exited:\n{self.output[-6000:]}"
            assert time.monotonic() < deadline, f"not ready in {timeout} s:\n{self.output[-6000:]}"
            time.sleep(0.1)

    def children(self) -> list[int]:
        """PIDs whose parent is the launcher (etcd and the brokers)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.proc.pid:
                found.append(int(entry))
        return found

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # its children get SIGTERM from the kernel (PDEATHSIG)
            self.proc.wait(30)


def processes_mentioning(text: str) -> list[int]:
    """Live PIDs whose command line mentions `text` (a data dir only this test uses)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if entry.isdigit() and text.encode() in cmdline and not gone(int(entry)):
            found.append(int(entry))
    return found


def gone(pid: int) -> bool:
    """No such process (or only a zombie nobody has reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_cluster_run_serves_a_spread_topic_and_stops_everything_on_sigint(
        tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "cluster")
    try:
        launcher.wait_ready(160)
        bootstrap = ",".join(f"127.0.0.1:{launcher.base + i}" for i in range(3))
        assert f"bootstrap.servers={bootstrap}" in launcher.output
        pids = launcher.children()
        assert len(pids) == 4, launcher.output[-3000:]  # etcd and three brokers

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("runit", PARTITIONS, 1)],
                            operation_timeout=30)["runit"].result(timeout=60)

        def leaders() -> dict[int, int] | None:
            topic = admin.list_topics("runit", timeout=10).topics["runit"]
            got = {p: m.leader for p, m in topic.partitions.items()}
            return got if len(got) == PARTITIONS and -1 not in got.values() else None

        assert sorted(set(eventually(leaders, 30).values())) == [1, 2, 3]
        for p in range(PARTITIONS):
            sent = [Rec(f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), (), 1_700_000_000_000 + i)
                    for i in range(PER_PARTITION)]
            assert confluent_produce(bootstrap, "runit", sent, partition=p) == list(
                range(PER_PARTITION))
            assert_roundtrip(confluent_consume(bootstrap, "runit", PER_PARTITION, partition=p),
                             sent)

        launcher.proc.send_signal(signal.SIGINT)
        assert launcher.proc.wait(90) == 0, launcher.output[-6000:]
        deadline = time.monotonic() + 10
        while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in pids if not gone(pid)] == []
        assert processes_mentioning(str(tmp_path)) == []
        launcher._reader.join(10)
        for node in (1, 2, 3):
            assert any(line.startswith(f"broker-{node} ") and "broker stopped cleanly" in line
                       for line in launcher.lines), launcher.output[-6000:]
        # The data stays where it was put, for the next run.
        assert (tmp_path / "cluster" / "etcd" / "etcd.etcd").is_dir()
        assert any((tmp_path / "cluster" / "broker-1").iterdir())
    finally:
        launcher.close()


def test_cluster_run_exits_with_the_code_of_a_broker_that_cannot_start(
        tmp_path: Path) -> None:
    launcher = Launcher(tmp_path / "cluster", "--override", "no.such.key=1")
    try:
        code = launcher.proc.wait(120)
        launcher._reader.join(10)
        assert code == 2, launcher.output[-6000:]  # the broker's ConfigError exit code
        assert "exited with code 2 while starting" in launcher.output
        assert "no.such.key" in launcher.output
        assert processes_mentioning(str(tmp_path)) == []
    finally:
        launcher.close()


@pytest.fixture(autouse=True)
def _needs_etcd() -> None:
    """The launcher finds etcd as the tests do; without one these tests cannot run."""
    from broker.cluster.etcd_process import EtcdNotFound, find_etcd

    try:
        find_etcd()
    except EtcdNotFound as e:
        pytest.fail(f"the cluster tests need a real etcd: {e}")
