"""Produce throughput of one broker against two, in cluster mode on one etcd.

    python -m bench.cluster --json [--partitions 4] [--producers 2] [--seconds 12]
                            [--warmup 3] [--size 1024]

Each size of cluster (one broker, then two) is fresh: a new key prefix in one etcd (tmpfs),
new data dirs, brokers started as `python -m broker` in cluster mode. A topic of --partitions
partitions, replication factor 1, is placed by hand: all on the one broker, or alternately on
the two (p0 on broker 1, p1 on broker 2, ...). The same load drives both: --producers
confluent-kafka producers, each in its own process, each sending --size-byte records round
robin over every partition (acks=1, linger 5 ms) as fast as the client takes them. After
--warmup seconds, for --seconds, each producer counts the records acknowledged and the parent
reads every broker's CPU time (/proc/<pid>/stat utime + stime) and the box's busy share
(/proc/stat: everything but idle and iowait). One line per size:

  brokers, partitions, producers, seconds, size
  records, mb, mb_per_s       acknowledged in the window, all producers
  broker_cpu_s                each broker's CPU seconds in the window
  broker_cpu_s_per_mb         their sum over the MB acknowledged
  box_busy                    the share of the box's CPU time that was busy (all processes)
  loadavg                     the 1-minute load average at the end

then a summary line: speedup (two brokers' mb_per_s over one's), cpu_per_mb_ratio (two's
broker_cpu_s_per_mb over one's) and the goal (speedup >= 1.6, ratio <= 1.1) with whether it
was met. On a box of two cores the producers and both brokers share the same cores, so the
speedup is bounded by the CPU left for the brokers (box_busy says how close to 1.0 it was).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.cluster.etcd_process import EtcdProcess
from tests.support.broker import BrokerProcess

TOPIC = "bench-cluster"
GOAL_SPEEDUP = 1.6
GOAL_CPU_RATIO = 1.1
TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def box_times() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU since boot; idle and iowait are not busy."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(values[:8])  # guest time is already counted in user
    return total - values[3] - values[4], total


# -- the producer process ------------------------------------------------------------------------


def producer_main(bootstrap: str, partitions: int, size: int, start: float, end: float,
                  acks: int | str = 1) -> None:
    """Send until the wall clock passes ``end``; count what is acknowledged in [start, end)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
                         "queue.buffering.max.kbytes": 65536, "broker.address.family": "v4",
                         "enable.idempotence": False})
    counted = {"records": 0, "errors": 0}

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            counted["errors"] += 1
        elif start <= time.time() < end:
            counted["records"] += 1

    value = os.urandom(size)
    n = 0
    while time.time() < end:
        try:
            producer.produce(TOPIC, value, partition=n % partitions, on_delivery=delivered)
            n += 1
        except BufferError:
            producer.poll(0.005)
            continue
        if n % 256 == 0:
            producer.poll(0)
    producer.flush(30)
    print(json.dumps(counted), flush=True)


# -- one size of cluster -------------------------------------------------------------------------


@dataclass
class Args:
    partitions: int
    producers: int
    seconds: float
    warmup: float
    size: int


def start_brokers(etcd: EtcdProcess, count: int, base: Path) -> list[BrokerProcess]:
    prefix = f"/bench-{uuid.uuid4().hex[:8]}"
    brokers = []
    for node_id in range(1, count + 1):
        brokers.append(BrokerProcess(base / f"{prefix[1:]}-b{node_id}", {
            "node.id": str(node_id), "minibroker.etcd.endpoints": etcd.endpoint,
            "minibroker.etcd.prefix": prefix, "metrics.listener": ""}).start(timeout=120))
    return brokers


def create_topic(brokers: list[BrokerProcess], partitions: int) -> None:
    """Partition p on broker (p mod brokers) + 1; waits until a producer's metadata sees every
    partition led."""
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assignment = [[p % len(brokers) + 1] for p in range(partitions)]
    admin.create_topics([NewTopic(TOPIC, partitions, -1, replica_assignment=assignment)],
                        operation_timeout=30)[TOPIC].result(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        topic = admin.list_topics(TOPIC, timeout=10).topics[TOPIC]
        leaders = [topic.partitions[p].leader for p in sorted(topic.partitions)]
        if leaders == [a[0] for a in assignment]:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{TOPIC} not led as assigned ({assignment}) within 60 s")


@dataclass
class Window:
    """What one measured window gave: records and errors of all producers, each broker's
    CPU seconds, the box's busy share and the load average at its end."""

    records: int
    errors: int
    broker_cpu_s: list[float]
    box_busy: float | None
    loadavg: float


def drive(module: str, brokers: list[BrokerProcess], args: Args) -> Window:
    """Run ``args.producers`` producer processes (``python -m <module> --producer ...``)
    against ``brokers`` and measure the window after the warm-up; stops the brokers."""
    try:
        bootstrap = ",".join(b.bootstrap for b in brokers)
        start = time.time() + 2.0 + args.warmup  # the producers' start-up, then the warm-up
        end = start + args.seconds
        procs = [subprocess.Popen(
            [sys.executable, "-m", module, "--producer", bootstrap,
             str(args.partitions), str(args.size), repr(start), repr(end)],
            stdout=subprocess.PIPE, text=True) for _ in range(args.producers)]
        pids = [b.proc.pid for b in brokers if b.proc is not None]
        time.sleep(max(0.0, start - time.time()))
        cpu0, box0 = [proc_cpu_s(p) for p in pids], box_times()
        time.sleep(max(0.0, end - time.time()))
        cpu1, box1 = [proc_cpu_s(p) for p in pids], box_times()
        loadavg = os.getloadavg()[0]
        counted = [json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1])
                   for p in procs]
    finally:
        for b in brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.stop()
    busy, total = box1[0] - box0[0], box1[1] - box0[1]
    return Window(sum(c["records"] for c in counted), sum(c["errors"] for c in counted),
                  [round(b - a, 3) for a, b in zip(cpu0, cpu1, strict=True)],
                  round(busy / total, 3) if total else None, round(loadavg, 2))


def measure(etcd: EtcdProcess, count: int, args: Args, base: Path) -> dict[str, Any]:
    brokers = start_brokers(etcd, count, base)
    try:
        create_topic(brokers, args.partitions)
    except BaseException:
        for b in brokers:
            b.stop()
        raise
    w = drive("bench.cluster", brokers, args)
    mb = w.records * args.size / 1e6
    cpu = w.broker_cpu_s
    return {"brokers": count, "partitions": args.partitions, "producers": args.producers,
            "seconds": args.seconds, "size": args.size, "records": w.records,
            "errors": w.errors, "mb": round(mb, 2),
            "mb_per_s": round(mb / args.seconds, 2), "broker_cpu_s": cpu,
            "broker_cpu_s_per_mb": round(sum(cpu) / mb, 4) if mb else None,
            "box_busy": w.box_busy, "loadavg": w.loadavg}


def summary(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    speedup = two["mb_per_s"] / one["mb_per_s"] if one["mb_per_s"] else None
    ratio = (two["broker_cpu_s_per_mb"] / one["broker_cpu_s_per_mb"]
             if one["broker_cpu_s_per_mb"] and two["broker_cpu_s_per_mb"] else None)
    return {"summary": True, "speedup": None if speedup is None else round(speedup, 3),
            "cpu_per_mb_ratio": None if ratio is None else round(ratio, 3),
            "goal": {"speedup": GOAL_SPEEDUP, "cpu_per_mb_ratio": GOAL_CPU_RATIO},
            "met": bool(speedup and ratio and speedup >= GOAL_SPEEDUP
                        and ratio <= GOAL_CPU_RATIO),
            "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--producer":
        bootstrap, partitions, size, start, end = sys.argv[2:7]
        producer_main(bootstrap, int(partitions), int(size), float(start), float(end))
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=12.0, help="the measured window")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=1024, help="record value bytes")
    ns = ap.parse_args(argv)
    args = Args(ns.partitions, ns.producers, ns.seconds, ns.warmup, ns.size)
    rows = []
    with EtcdProcess() as etcd, tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        for count in (1, 2):
            row = measure(etcd, count, args, Path(tmp))
            rows.append(row)
            print(json.dumps(row) if ns.json else row, flush=True)
    line = summary(rows[0], rows[1])
    print(json.dumps(line) if ns.json else line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
