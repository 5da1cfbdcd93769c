"""bench.pipeline's saturation mode and plot, its storage ceiling, and bench.gc, end to end on
tiny loads: each prints well-formed JSON lines with the fields docs/benchmarks.md quotes, so
none of them rots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _rows(args: list[str], timeout: float) -> list[dict]:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_pipeline_saturation_rows_and_plot(tmp_path):
    png = tmp_path / "img" / "pipeline.png"
    rows = _rows(["-m", "bench.pipeline", "--json", "--saturation", "0.9", "--saturation-runs", "1",
                  "--records", "60",
                  "--record-size", "4096", "--repeat", "2", "--plot", str(png)], 180)
    assert rows[0]["phase"] == "serial_saturated" and rows[0]["errors"] == 0
    offered = [r for r in rows if r.get("phase") == "offered"]
    assert sorted(r["mode"] for r in offered) == ["pipelined", "pipelined", "serial", "serial"]
    assert all(r["target_rate"] == rows[-1]["offered_records_per_s"] > 0 for r in offered)
    summary = rows[-1]
    assert summary["scenario"] == "saturation"
    for mode in ("serial", "pipelined"):
        for p in ("p50", "p95", "p99", "p999"):
            assert summary[f"median_{p}_ms_{mode}"] > 0
            assert summary[f"pooled_{p}_ms_{mode}"] > 0
    assert summary["median_paired_p99_ms_pipelined_over_serial"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Each run's CPU: the producer's, the broker's (/proc counts in 10 ms ticks, so a tiny run
    # may show none, or a whole tick more than it used: no upper bound on box_busy here), and
    # how busy both kept the cores.
    for r in offered:
        assert r["client_cpu_s"] > 0 and r["broker_cpu_s"] >= 0
        assert r["box_busy"] > 0
        # Where the produce requests waited, from the broker's /metrics: flush per message, so
        # at least one fsync, each covering at least one request.
        assert r["produce_requests"] >= 1 and r["fsyncs"] >= 1
        assert r["remote_ms_mean"] > 0 and r["fsync_ms_mean"] > 0
        assert r["requests_per_fsync"] >= 1


def test_pipeline_storage_ceiling():
    rows = _rows(["-m", "bench.pipeline", "--json", "--scenario", "storage", "--records", "64",
                  "--record-size", "65536", "--batch-size", "262144", "--repeat", "2"], 120)
    runs = [r for r in rows if r["scenario"] == "storage"]
    assert sorted(r["mode"] for r in runs) == ["overlapped", "overlapped", "serial", "serial"]
    for r in runs:
        assert r["chunks"] == 16 and r["mb_per_s"] > 0
        # Serial fsyncs every chunk; overlapped fsyncs at most that often (a group commit).
        assert 1 <= r["fsyncs"] <= 16
        assert r["fsyncs"] == 16 or r["mode"] == "overlapped"
    summary = rows[-1]
    assert summary["scenario"] == "storage_ceiling"
    assert summary["ceiling_ratio_overlapped_over_serial"] == round(
        summary["median_mb_per_s_overlapped"] / summary["median_mb_per_s_serial"], 3)


def test_gc_policies_ab(tmp_path):
    rows = _rows(["-m", "bench.gc", "--json", "--workload", "requests", "--repeat", "2",
                  "--seconds", "1", "--policies", "default,tuned"], 180)
    runs = [r for r in rows if "summary" not in r]
    assert [(r["policy"], r["rep"]) for r in runs] == [
        ("default", 0), ("tuned", 0), ("tuned", 1), ("default", 1)]  # who goes first rotates
    for r in runs:
        assert "error" not in r, r
        assert len(r["gc_collections"]) == 3 and r["gc_total_pause_ms"] >= 0
    [tuned] = [r for r in rows if r.get("summary") == "requests" and r["policy"] == "tuned"]
    assert tuned["broker_cpu_us_per_req_ratio_to_default"] > 0
