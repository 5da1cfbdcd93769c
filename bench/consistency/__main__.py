"""Does a broker keep what it acknowledged? A bounded workload under faults, then Jepsen's
anomalies for Kafka.

    python -m bench.consistency --json [--faults kill,pause] [--fault-interval 5]
        [--duration 20] [--records 20000] [--txn] [--bootstrap HOST:PORT | --cluster N]
        [--png PATH]

Without --bootstrap a broker is started for the run (`python -m broker` on an ephemeral
127.0.0.1 port with a temporary data dir; --broker embedded runs it in this process) and
takes the faults; --cluster N starts an EmbeddedCluster instead (etcd and N brokers in this
process; the topic has 3 replicas and min.insync.replicas 2 unless told otherwise), whose
faults aim at the topic's leaders; with --bootstrap the run has no faults. One JSON line per
fault, then one summary line (counts of every anomaly, the first cases of each, throughput,
client errors, the PNG timeline's path). The exit status is 1 when any anomaly fails the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.consistency.faults import (
    BootstrapTarget,
    ClusterTarget,
    EmbeddedTarget,
    FaultTarget,
    ProcessTarget,
)
from bench.consistency.workload import Result, Workload, run_check

# Small internal topics: the broker starts in a second; nothing checked depends on them.
BROKER_DEFAULTS = {"offsets.topic.num.partitions": "1",
                   "transaction.state.log.num.partitions": "1"}
# A cluster's brokers give up on a cut or stalled peer after 3 s rather than 30, and keep
# a lease of 6 s rather than the EmbeddedCluster's 2: three brokers and every client share
# this process, and on a loaded machine 2 s leases expire with no fault at all.
CLUSTER_DEFAULTS = {**BROKER_DEFAULTS, "request.timeout.ms": "3000",
                    "broker.session.timeout.ms": "6000", "broker.heartbeat.interval.ms": "1500"}


@contextlib.contextmanager
def started_target(args: argparse.Namespace, workload: Workload) -> Iterator[FaultTarget]:
    """The target the flags name: the bootstrap address, a cluster started for the run (its
    faults aimed at ``workload.topic``), or a broker started for the run."""
    if args.bootstrap:
        yield BootstrapTarget(args.bootstrap)
        return
    defaults = CLUSTER_DEFAULTS if args.cluster else BROKER_DEFAULTS
    overrides = {**defaults, **dict(o.split("=", 1) for o in args.override)}
    with tempfile.TemporaryDirectory(prefix="consistency-") as tmp:
        if args.cluster:
            from broker.testing import EmbeddedCluster

            with EmbeddedCluster(args.cluster, Path(tmp), **overrides) as cluster:
                yield ClusterTarget(cluster, workload.topic, workload.partitions)
            return
        if args.broker == "embedded":
            from broker.testing import EmbeddedBroker

            with EmbeddedBroker(Path(tmp), **overrides) as embedded:
                yield EmbeddedTarget(embedded)
            return
        from tests.support.broker import BrokerProcess

        process = BrokerProcess(Path(tmp), overrides).start()
        try:
            yield ProcessTarget(process)
        finally:
            if process.proc is not None and process.proc.poll() is None:
                process.kill()


def replication(args: argparse.Namespace) -> tuple[int, int | None]:
    """The topic's replication factor and min.insync.replicas: as given, else 3 replicas
    (no more than the cluster's brokers) and 2 in sync on a cluster, so that acks=all means
    what Kafka promises for it; 1 replica and the broker's setting on one broker."""
    rf = args.replication_factor or (min(3, args.cluster) if args.cluster else 1)
    min_isr = args.min_insync_replicas
    if min_isr is None and args.cluster:
        min_isr = min(2, rf)
    return rf, min_isr


def workload_of(args: argparse.Namespace) -> Workload:
    rf, min_isr = replication(args)
    return Workload(
        # a cluster's faults aim at the topic's leaders: it is named before the run
        topic=f"consistency-{uuid.uuid4().hex[:8]}" if args.cluster else "",
        partitions=args.partitions, replication_factor=rf, min_insync_replicas=min_isr,
        producers=args.producers, consumers=args.consumers, duration_s=args.duration,
        records=args.records, rate=args.rate, transactional=args.txn, txn_size=args.txn_size,
        abort_ratio=args.abort_ratio, faults=[f for f in args.faults.split(",") if f],
        fault_interval_s=args.fault_interval,
        fault_duration_s=args.fault_duration if args.fault_duration is not None
        else args.fault_interval / 2,
        fault_count=args.fault_count,
        drain_timeout_s=args.drain_timeout, seed=args.seed)


def summary(result: Result, png: Path | None, examples: int) -> dict[str, Any]:
    h = result.history
    acked = sum(1 for s in h.sends if h.acknowledged(s))
    return {"bench": "consistency", "topic": result.topic, "seconds": round(result.seconds, 2),
            "transactional": result.workload.transactional,
            "faults": [f.kind for f in result.faults],
            "fault_errors": sum(1 for f in result.faults if f.error),
            "acknowledged_per_s": round(acked / max(result.seconds, 1e-9), 1),
            "client_errors": len(result.errors),
            "transactions": {o.value: sum(1 for v in h.txns.values() if v is o)
                             for o in set(h.txns.values())},
            **result.analysis.to_dict(examples), "png": str(png) if png else None}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--bootstrap", help="check this cluster (no faults) instead of starting one")
    ap.add_argument("--cluster", type=int, default=0, metavar="N",
                    help="start an EmbeddedCluster of N brokers (and etcd) for the run")
    ap.add_argument("--broker", choices=("process", "embedded"), default="process",
                    help="how the broker started for the run runs")
    ap.add_argument("--override", action="append", default=[], metavar="key=value",
                    help="a server.properties key for the broker(s) started for the run")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of producing")
    ap.add_argument("--records", type=int, default=20_000, help="records at most, in all")
    ap.add_argument("--rate", type=float, default=200.0, help="records/s per producer")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2,
                    help="consumers reading while producers run (the drain comes after)")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--replication-factor", type=int, default=None,
                    help="the topic's (default: 3 with --cluster, at most N; else 1)")
    ap.add_argument("--min-insync-replicas", type=int, default=None,
                    help="the topic's (default: 2 with --cluster, at most the replication "
                    "factor; else the broker's)")
    ap.add_argument("--txn", action="store_true", help="transactional producers, "
                    "read_committed consumers")
    ap.add_argument("--txn-size", type=int, default=10, help="records per transaction")
    ap.add_argument("--abort-ratio", type=float, default=0.1,
                    help="share of transactions aborted on purpose")
    ap.add_argument("--faults", default="", help="comma-separated kinds, injected in turn: "
                    "kill, stop, pause, power-loss; with --cluster kill, stop, pause, "
                    "isolate, partition, slow, move-leader, unclean-failover")
    ap.add_argument("--fault-interval", type=float, default=5.0,
                    help="seconds between the end of one fault and the next")
    ap.add_argument("--fault-duration", type=float, default=None,
                    help="seconds each fault lasts (default: half the interval)")
    ap.add_argument("--fault-count", type=int, default=None,
                    help="inject this many faults, producing until they are over "
                    "(default: faults until the producers stop)")
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--png", default="consistency.png", help="the timeline ('' for none)")
    ap.add_argument("--examples", type=int, default=5, help="cases shown for each kind")
    args = ap.parse_args(argv)
    if args.cluster and args.bootstrap:
        ap.error("--cluster and --bootstrap exclude each other")
    if args.cluster < 0:
        ap.error("--cluster needs at least one broker")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    workload = workload_of(args)
    with started_target(args, workload) as target:
        result = run_check(target, workload)
    png = None
    if args.png:
        from bench.consistency.timeline import draw

        png = draw(result, Path(args.png))
    rows = [{"bench": "consistency", **f.to_dict()} for f in result.faults]
    rows.append(summary(result, png, args.examples))
    for row in rows:
        print(json.dumps(row) if args.json else row, flush=True)
    return 0 if result.analysis.ok else 1


if __name__ == "__main__":
    sys.exit(main())
