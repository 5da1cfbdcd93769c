"""bench.partitions end to end on a tiny size: one mini-broker row with every field
docs/benchmarks.md quotes, so the benchmark does not rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("create_s", "rss_mb", "open_fds", "metadata_ms", "metadata_p99_ms", "ping_idle_ms",
          "ping_ms", "ping_p99_ms", "stop_s", "start_s", "kill_restart_s")


def test_bench_partitions_rows() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.partitions", "--json", "--partitions", "6",
         "--per-topic", "4", "--broker", "mini-broker", "--ping-seconds", "0.5",
         "--metadata-requests", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    [row] = rows
    assert (row["bench"], row["broker"], row["partitions"], row["topics"]) == (
        "partitions", "mini-broker", 6, 2)
    assert "error" not in row
    for field in FIELDS:
        assert row[field] > 0, field
    # Every created partition is in the full answer, before and after a SIGKILL restart
    # (plus the broker's own __consumer_offsets, when it exists).
    assert row["metadata_partitions"] >= 6 and row["restart_partitions"] == row[
        "metadata_partitions"]
    assert row["pings"] >= 1 and row["metadata_answers_meanwhile"] >= 1
