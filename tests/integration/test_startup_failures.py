"""A start that fails for a reason the operator can fix says so in one line and exits with 2.

Each case starts the real entry point (`python -m broker`, PYTHONPATH inherited) against a real
obstacle: a listening socket on the Kafka or the metrics port, a file where the log dir should
be, a read-only log dir, a log dir held by a running broker. Listeners are bound before the
logs are loaded, so a start that fails on a port leaves the clean-shutdown marker in place and
the next start does not recover.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.log.manager import CLEAN_SHUTDOWN_FILE
from broker.testing import EmbeddedBroker
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, unique_topic

START_TIMEOUT_S = 120  # a shared two-core machine: imports alone can take seconds


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port some other process holds: bound and listening on 127.0.0.1."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def run_broker(overrides: dict[str, str], prefix: list[str] | None = None,
               ) -> subprocess.CompletedProcess[str]:
    args = [*(prefix or []), sys.executable, "-m", "broker"]
    for key, value in overrides.items():
        args += ["--override", f"{key}={value}"]
    return subprocess.run(args, capture_output=True, text=True, timeout=START_TIMEOUT_S,
                          env={**os.environ})


def assert_one_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit code 2 and exactly one line on stderr, naming every needle; no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1, result.stderr
    [line] = lines
    assert line.startswith("mini-broker: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    assert "Traceback" not in result.stdout + result.stderr
    return line


def overrides_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"log.dirs": str(tmp_path / "logs"), "listeners": "PLAINTEXT://127.0.0.1:0",
            "metrics.listener": "", **extra}


def test_listener_port_in_use(tmp_path: Path, held_port: int) -> None:
    result = run_broker(overrides_for(
        tmp_path, listeners=f"PLAINTEXT://127.0.0.1:{held_port}"))
    assert_one_line(result, f"PLAINTEXT://127.0.0.1:{held_port}", "(listeners)", "in use",
                    "another port in listeners")
    assert not (tmp_path / "logs").exists(), "the log dir was touched before the bind"


def test_metrics_port_in_use(tmp_path: Path, held_port: int) -> None:
    result = run_broker(overrides_for(
        tmp_path, **{"metrics.listener": f"http://127.0.0.1:{held_port}/metrics"}))
    assert_one_line(result, f"http://127.0.0.1:{held_port}/metrics", "(metrics.listener)",
                    "in use", "another port in metrics.listener")


def test_log_dir_not_a_directory(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "logs"
    not_a_dir.write_text("a file, not a directory\n")
    result = run_broker(overrides_for(tmp_path))
    assert_one_line(result, str(not_a_dir), "(log.dirs)", "not a directory")
    assert not_a_dir.read_text() == "a file, not a directory\n"


def test_log_dir_read_only(tmp_path: Path) -> None:
    """Root writes anywhere while it holds CAP_DAC_OVERRIDE: as root, the broker runs with
    every capability dropped (setpriv), as an unprivileged user would."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: a read-only dir is writable")
        prefix = [setpriv, "--inh-caps=-all", "--bounding-set=-all", "--"]
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    log_dir.chmod(0o555)
    try:
        result = run_broker(overrides_for(tmp_path), prefix)
    finally:
        log_dir.chmod(0o755)
    assert_one_line(result, str(log_dir), "(log.dirs)", "read-only")
    assert list(log_dir.iterdir()) == []


def test_log_dir_locked_by_another_broker(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path) as running:
        result = run_broker(overrides_for(tmp_path))
        assert_one_line(result, str(tmp_path / "logs"), "(log.dirs)",
                        "locked by another process")
        assert running.running
    assert (tmp_path / "logs" / CLEAN_SHUTDOWN_FILE).exists()


def test_a_start_failed_on_its_port_does_not_cost_the_next_start_a_recovery(
        tmp_path: Path, held_port: int) -> None:
    """A clean stop leaves the marker; a start that fails on its port must not consume it,
    so the start after that loads the logs as shut down cleanly, recovering nothing."""
    broker = BrokerProcess(tmp_path / "broker", {"metrics.listener": ""}).start(START_TIMEOUT_S)
    lines = broker.new_log_lines()
    ready = [e["event"] for e in lines if str(e.get("event", "")).startswith("listening on ")]
    assert ready == [f"listening on PLAINTEXT://127.0.0.1:{broker.port}, metrics off, "
                     f"data {broker.data_dir / 'logs'}"]
    events = [e.get("event") for e in lines]
    assert events.index(ready[0]) == events.index("broker started") - 1, "ready line first"
    create_topic(broker.bootstrap, unique_topic("marker"))  # a log for the next start to load
    assert broker.stop() == 0
    log_dir = broker.data_dir / "logs"
    assert (log_dir / CLEAN_SHUTDOWN_FILE).exists()

    failed = run_broker({"log.dirs": str(log_dir), "metrics.listener": "",
                         "listeners": f"PLAINTEXT://127.0.0.1:{held_port}"})
    assert_one_line(failed, "(listeners)", "in use")
    assert (log_dir / CLEAN_SHUTDOWN_FILE).exists(), "the failed start consumed the marker"

    broker.start(START_TIMEOUT_S)
    try:
        lines = broker.new_log_lines()
        [loaded] = [e for e in lines if e.get("event") == "loaded logs"]
        assert loaded["clean_shutdown"] is True and loaded["logs"] > 0
        assert not [e for e in lines if "recover" in str(e.get("event", ""))], lines
    finally:
        assert broker.stop() == 0
