"""The log side of many partitions on one broker: descriptors, memory, start, stop, recovery.

Builds ``--partitions`` logs (topics of ``--per-topic``) under a temp dir with a LogManager,
one small batch each, then measures, in this process:

* ``create_s``: creating them (mkdir and three files per partition: disk-bound);
* ``open_fds_per_partition`` after creation and after a clean start (/proc/self/fd);
* ``clean_start_s`` / ``clean_stop_s``: LogManager.load after a clean shutdown, and
  shutdown with nothing to flush;
* ``bytes_per_partition``: tracemalloc, what the loaded logs hold per partition after a
  clean start (deferred: nothing opened), and ``bytes_per_opened_partition`` once each was
  read (opened: segments, indexes, producer state, epochs), with the top lines of each;
* ``kill_restart_s``: load after an abandon (a SIGKILL: no marker), with every log holding
  one unflushed batch past a checkpointed recovery point, and ``recovery_bytes``, what that
  recovery reread (only the unflushed batches).

``python -m bench.partitions_log --json --partitions 20000`` prints one JSON object.
The soft open-file limit is raised to the hard one; with ``--raise-hard`` (root) the hard
limit too, when the partitions need more.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from broker.log.config import LogConfig
from broker.log.handles import raise_open_file_limit
from broker.log.manager import LogManager
from broker.log.recovery import STATS
from broker.logging import configure
from tests.support.requests import record_batch


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def build(root: Path, partitions: int, per_topic: int) -> tuple[float, int]:
    lm = LogManager([root], LogConfig())
    lm.load()
    batch = record_batch([b"x" * 100])
    t = time.perf_counter()
    before = open_fds()
    for p in range(partitions):
        log = lm.create_log(f"topic{p // per_topic}", p % per_topic)
        log.append(bytearray(batch), 0)
    created = time.perf_counter() - t
    fds = open_fds() - before
    lm.shutdown()
    return created, fds


def clean_cycle(root: Path, threads: int) -> dict[str, Any]:
    gc.collect()
    before = open_fds()
    t = time.perf_counter()
    lm = LogManager([root], LogConfig(), recovery_threads_per_data_dir=threads)
    lm.load()
    start_s = time.perf_counter() - t
    fds = open_fds() - before
    t = time.perf_counter()
    lm.shutdown()
    stop_s = time.perf_counter() - t
    gc.collect()
    tracemalloc.start()  # a second clean start, traced (tracing slows it down)
    lm = LogManager([root], LogConfig(), recovery_threads_per_data_dir=threads)
    logs = lm.load()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    snapshot = tracemalloc.take_snapshot()
    for log in logs.values():
        log.read(log.log_start_offset, 1 << 20)  # opens it
    gc.collect()
    held_open = tracemalloc.get_traced_memory()[0]
    opened = tracemalloc.take_snapshot()
    tracemalloc.stop()
    lm.shutdown()
    return {"clean_start_s": start_s, "clean_stop_s": stop_s, "fds": fds,
            "bytes": held, "bytes_opened": held_open, "logs": len(logs),
            "top": _top(snapshot), "top_opened": _top(opened)}


def _top(snapshot: tracemalloc.Snapshot) -> list[tuple[str, int]]:
    return [(f"{s.traceback[0].filename.split('/work/')[-1]}:{s.traceback[0].lineno}", s.size)
            for s in snapshot.statistics("lineno")[:10]]


def kill_cycle(root: Path, threads: int) -> dict[str, float]:
    lm = LogManager([root], LogConfig())
    logs = lm.load()
    batch = record_batch([b"y" * 100])
    unflushed = 0
    for log in logs.values():
        log.flush()
    lm.checkpoint()  # recovery points at the log ends
    for log in logs.values():
        unflushed += log.append(bytearray(batch), 0).size
    lm.abandon()  # as a SIGKILL
    STATS.reset()
    t = time.perf_counter()
    again = LogManager([root], LogConfig(), recovery_threads_per_data_dir=threads)
    again.load()
    restart_s = time.perf_counter() - t
    again.shutdown()
    return {"kill_restart_s": restart_s, "recovery_bytes": STATS.bytes,
            "unflushed_bytes": unflushed, "recovered_segments": STATS.segments}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", type=int, default=2000)
    parser.add_argument("--per-topic", type=int, default=100)
    parser.add_argument("--recovery-threads", type=int, default=2)
    parser.add_argument("--raise-hard", action="store_true")
    parser.add_argument("--dir", default=None, help="where to build the logs (a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.raise_hard:
        need = args.partitions + 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard < need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))
    configure("WARNING", "console")  # a log line per recovered log would be what is timed
    soft, hard = raise_open_file_limit()
    root = Path(tempfile.mkdtemp(prefix="partitions-log-", dir=args.dir))
    try:
        create_s, fds_created = build(root, args.partitions, args.per_topic)
        clean = clean_cycle(root, args.recovery_threads)
        killed = kill_cycle(root, args.recovery_threads)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = args.partitions
    out = {
        "bench": "partitions_log",
        "partitions": n,
        "open_file_limit": [soft, hard],
        "create_s": round(create_s, 2),
        "open_fds_after_create": fds_created,
        "open_fds_after_clean_start": clean["fds"],
        "clean_start_s": round(clean["clean_start_s"], 3),
        "clean_stop_s": round(clean["clean_stop_s"], 3),
        "bytes_per_partition": round(clean["bytes"] / n),
        "top_allocations": clean["top"],
        "bytes_per_opened_partition": round(clean["bytes_opened"] / n),
        "top_allocations_opened": clean["top_opened"],
        "kill_restart_s": round(killed["kill_restart_s"], 3),
        "recovery_threads": args.recovery_threads,
        "recovery_bytes": killed["recovery_bytes"],
        "unflushed_bytes": killed["unflushed_bytes"],
    }
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
