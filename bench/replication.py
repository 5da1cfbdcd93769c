"""acks=all produce throughput through replication: one leader and one follower.

    python -m bench.replication --json [--partitions 4] [--producers 1] [--seconds 8]
                                [--warmup 2] [--size 1024] [--flush-messages N] [--runs 1]

Two brokers in cluster mode on one etcd (tmpfs), started as `python -m broker`. A topic of
--partitions partitions, replication factor 2, every partition led by broker 1 and followed
by broker 2, min.insync.replicas=2: each acknowledgement waits for the follower's fetch to
report the batch, so the replica fetcher is on the path of every produce. --flush-messages
sets log.flush.interval.messages on both brokers (unset: Kafka's default, the OS decides).
--producers confluent-kafka producer processes (bench.cluster's, with acks=all) send
--size-byte records round robin over the partitions for --warmup then --seconds; each run
starts fresh brokers. One line per run:

  partitions, producers, seconds, size, flush_messages
  records, errors, mb_per_s       acknowledged in the window, all producers
  broker_cpu_s                    leader's and follower's CPU seconds in the window
  box_busy, loadavg               how loaded the machine was (see bench.cluster)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.cluster import TOPIC, Args, drive, producer_main
from broker.cluster.etcd_process import EtcdProcess
from tests.support.broker import BrokerProcess

LEADER, FOLLOWER = 1, 2


def start_pair(etcd: EtcdProcess, base: Path, flush_messages: int | None) -> list[BrokerProcess]:
    prefix = f"/bench-{uuid.uuid4().hex[:8]}"
    extra = {} if flush_messages is None else {
        "log.flush.interval.messages": str(flush_messages)}
    return [BrokerProcess(base / f"{prefix[1:]}-b{node}", {
        "node.id": str(node), "minibroker.etcd.endpoints": etcd.endpoint,
        "minibroker.etcd.prefix": prefix, "metrics.listener": "", **extra}).start(timeout=120)
        for node in (LEADER, FOLLOWER)]


def create_topic(bootstrap: str, partitions: int) -> None:
    """Every partition on [leader, follower], min.insync.replicas=2; waits for full ISRs."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, -1,
                                  replica_assignment=[[LEADER, FOLLOWER]] * partitions,
                                  config={"min.insync.replicas": "2"})],
                        operation_timeout=30)[TOPIC].result(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        meta = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
        if len(meta) == partitions and all(
                p.leader == LEADER and len(p.isrs) == 2 for p in meta.values()):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{TOPIC} not led by {LEADER} with a full ISR within 60 s")


def measure(etcd: EtcdProcess, base: Path, ns: argparse.Namespace) -> dict[str, Any]:
    brokers = start_pair(etcd, base, ns.flush_messages)
    try:
        create_topic(",".join(b.bootstrap for b in brokers), ns.partitions)
    except BaseException:
        for b in brokers:
            b.stop()
        raise
    args = Args(ns.partitions, ns.producers, ns.seconds, ns.warmup, ns.size)
    w = drive("bench.replication", brokers, args)
    return {"partitions": ns.partitions, "producers": ns.producers, "seconds": ns.seconds,
            "size": ns.size, "flush_messages": ns.flush_messages, "records": w.records,
            "errors": w.errors, "mb_per_s": round(w.records * ns.size / 1e6 / ns.seconds, 2),
            "broker_cpu_s": w.broker_cpu_s, "box_busy": w.box_busy, "loadavg": w.loadavg}


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--producer":
        bootstrap, partitions, size, start, end = sys.argv[2:7]
        producer_main(bootstrap, int(partitions), int(size), float(start), float(end),
                      acks="all")
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=8.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--size", type=int, default=1024, help="record value bytes")
    ap.add_argument("--flush-messages", type=int, default=None,
                    help="log.flush.interval.messages on both brokers (default: unset)")
    ap.add_argument("--runs", type=int, default=1, help="runs, each on fresh brokers")
    ns = ap.parse_args(argv)
    with EtcdProcess() as etcd, tempfile.TemporaryDirectory(prefix="bench-repl-") as tmp:
        for _ in range(ns.runs):
            row = measure(etcd, Path(tmp), ns)
            print(json.dumps(row) if ns.json else row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
