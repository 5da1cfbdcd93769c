"""The broker's GC policies side by side (minibroker.gc.policy), A/B alternating in one run.

    python -m bench.gc --json [--policies default,freeze,tuned,tuned:10000]
                       [--workload requests idle produce]
                       [--repeat 3] [--seconds 10] [--gen0 50000]

Each repetition runs every policy once per workload, rotating which goes first, each on a
fresh broker process (`python -m broker`, as bench.peers starts it, plus the policy's keys):

  requests  bench.peers' closed loop: 16 producers, acks=1, 1 KiB, one record in flight each;
            broker CPU us per request, requests/s, p99.
  idle      bench.peers' idle expiry: --idle-connections raw connections each parking a
            FetchRequest (max_wait_ms --idle-wait-ms); broker CPU, RSS, how late the last
            answer came after its timeout.
  produce   bench.pipeline's produce scenario, pipelined, 64 KiB records, fsync per message;
            broker CPU per record, p99.

Each row carries the collector's record from the broker's shutdown log line ("gc pauses":
collections and pause time per generation). Then one summary row per workload and policy:
medians over the repetitions, and the median of the per-repetition ratios to the first policy
(CPU time, not wall time, is the steadier figure on a shared machine; the spread is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import peers
from bench.pipeline import _gc_record, run_produce
from tests.support.broker import BrokerProcess

# The figures each workload is judged by (lower is better for all but requests_s).
FIGURES: dict[str, tuple[str, ...]] = {
    "requests": ("broker_cpu_us_per_req", "requests_s", "p50_ms", "p99_ms"),
    "idle": ("broker_cpu_s", "cpu_pct", "rss_mb", "late_ms_max", "late_ms_p50"),
    "produce": ("broker_cpu_us_per_record", "mb_per_s", "p50_ms", "p99_ms", "p999_ms"),
}


def _keys(policy: str, gen0: int) -> dict[str, str]:
    """`tuned:20000` is the tuned policy with that gen0 threshold (default: --gen0)."""
    name, _, threshold = policy.partition(":")
    return {"minibroker.gc.policy": name, "minibroker.gc.gen0.threshold": threshold or str(gen0)}


def _peers_run(workload: str, policy: str, gen0: int, sc: peers.Scale) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-gc-") as tmp:
        broker = BrokerProcess(Path(tmp), _keys(policy, gen0)).start()
        assert broker.proc is not None
        try:
            b = peers.Running("mini-broker", broker.bootstrap, broker.proc.pid,
                              broker.metrics_port)
            cpu0 = peers.proc_cpu_s(b.pid)
            row = peers.RUNNERS[workload](b, sc)
            row.setdefault("broker_cpu_s", round(peers.proc_cpu_s(b.pid) - cpu0, 2))
        finally:
            broker.stop(30)
        row.update(_gc_record(broker))
    return row


def _produce_run(policy: str, gen0: int, records: int) -> dict[str, Any]:
    row = run_produce("pipelined", records, 65536, 0, _keys(policy, gen0))
    if row.get("broker_cpu_s") is not None:
        row["broker_cpu_us_per_record"] = round(row["broker_cpu_s"] / records * 1e6, 1)
    return row


def summarize(rows: list[dict[str, Any]], policies: list[str]) -> list[dict[str, Any]]:
    """Per workload and policy: medians, spreads, and paired ratios to the first policy."""
    out = []
    base = policies[0]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        by = {p: {r["rep"]: r for r in rows if r["workload"] == workload and r["policy"] == p
                  and "error" not in r} for p in policies}
        for p in policies:
            mine = list(by[p].values())
            if not mine:
                continue
            s: dict[str, Any] = {"summary": workload, "policy": p, "runs": len(mine)}
            for f in (*FIGURES[workload], "gc_total_pause_ms"):
                vals = [r[f] for r in mine if r.get(f) is not None]
                if not vals:
                    continue
                s[f"{f}_median"] = round(statistics.median(vals), 3)
                s[f"{f}_range"] = [min(vals), max(vals)]
                pairs = [by[p][k][f] / by[base][k][f] for k in by[p]
                         if k in by[base] and by[base][k].get(f) and by[p][k].get(f) is not None]
                if p != base and pairs:
                    s[f"{f}_ratio_to_{base}"] = round(statistics.median(pairs), 3)
            s["gc_collections_median"] = [statistics.median(r["gc_collections"][g] for r in mine
                                                            if "gc_collections" in r) or 0
                                          for g in range(3)] if any(
                "gc_collections" in r for r in mine) else None
            out.append(s)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--policies", default="default,freeze,tuned",
                    help="comma-separated; tuned:N sets gen0's threshold to N for that entry")
    ap.add_argument("--workload", nargs="+", choices=list(FIGURES), default=["requests", "idle"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--gen0", type=int, default=50_000,
                    help="minibroker.gc.gen0.threshold for the tuned policy")
    ap.add_argument("--seconds", type=float, default=10.0, help="requests: seconds per run")
    ap.add_argument("--idle-connections", type=int, default=5000)
    ap.add_argument("--idle-wait-ms", type=int, default=5000)
    ap.add_argument("--records", type=int, default=1000, help="produce: 64 KiB records per run")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    sc = peers.Scale(requests_seconds=args.seconds, idle_connections=args.idle_connections,
                     idle_wait_ms=args.idle_wait_ms, idle_window_s=min(3.0, args.idle_wait_ms
                                                                        / 2000))
    peers._raise_nofile(args.idle_connections + 1024)
    rows: list[dict[str, Any]] = []
    for workload in args.workload:
        for rep in range(args.repeat):
            k = rep % len(policies)
            for policy in policies[k:] + policies[:k]:  # rotate who goes first
                row: dict[str, Any] = {"workload": workload, "policy": policy, "rep": rep,
                                       "loadavg_1m": round(os.getloadavg()[0], 2)}
                t0 = time.perf_counter()
                try:
                    if workload == "produce":
                        row.update(_produce_run(policy, args.gen0, args.records))
                    else:
                        row.update(_peers_run(workload, policy, args.gen0, sc))
                except Exception as exc:  # noqa: BLE001 - one failed run is a row
                    row["error"] = f"{type(exc).__name__}: {exc}"
                row["wall_s"] = round(time.perf_counter() - t0, 2)
                rows.append(row)
                print(json.dumps(row) if args.json else row, flush=True)
    for s in summarize(rows, policies):
        print(json.dumps(s) if args.json else s, flush=True)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
