"""Start time of an EmbeddedCluster: etcd and N in-process brokers, empty to ready.

    python -m bench.cluster_start --json [--nodes 3] [--starts 5]

Each start is a fresh cluster (new etcd on tmpfs, new data dirs, new ports), timed from the
call to ``start()`` until every broker is registered in etcd and a controller is elected
(``EmbeddedCluster.start_seconds``); the etcd part is timed alone too. The first import of
broker.testing.cluster (kafka-python's codecs, grpc, the broker) is timed once, apart. One line
per start (start, seconds, etcd_seconds, close_seconds), then a summary: median and worst of
the starts, the goal (3 nodes under 2 s) and whether the worst met it, and the load average.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from typing import Any

GOAL_S = 2.0


def one_start(nodes: int) -> dict[str, Any]:
    from broker.cluster.etcd_process import EtcdProcess
    from broker.testing.cluster import EmbeddedCluster

    started = time.perf_counter()
    etcd = EtcdProcess().start()
    etcd_seconds = time.perf_counter() - started
    etcd.close()
    cluster = EmbeddedCluster(nodes)
    cluster.start()
    assert len(cluster.registered()) == nodes and cluster.controller() is not None
    closing = time.perf_counter()
    cluster.close()
    return {"seconds": round(cluster.start_seconds, 3), "etcd_seconds": round(etcd_seconds, 3),
            "close_seconds": round(time.perf_counter() - closing, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster_start")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ns = ap.parse_args()
    logging.disable(logging.WARNING)  # the brokers' warnings (resignations on close)
    began = time.perf_counter()
    import broker.testing.cluster  # noqa: F401  (the first import, timed apart)

    imported = time.perf_counter() - began
    rows = []
    for i in range(ns.starts):
        row = {"start": i + 1, "nodes": ns.nodes, **one_start(ns.nodes)}
        rows.append(row)
        print(json.dumps(row) if ns.json else row, flush=True)
    times = [r["seconds"] for r in rows]
    summary = {"nodes": ns.nodes, "starts": ns.starts,
               "median_s": round(statistics.median(times), 3), "worst_s": max(times),
               "etcd_median_s": round(statistics.median(r["etcd_seconds"] for r in rows), 3),
               "first_import_s": round(imported, 3), "goal_s": GOAL_S,
               "goal_met": max(times) < GOAL_S, "loadavg": os.getloadavg()[0]}
    print(json.dumps(summary) if ns.json else summary, flush=True)


if __name__ == "__main__":
    main()
