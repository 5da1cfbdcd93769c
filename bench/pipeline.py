"""Serial vs pipelined request processing, side by side in one run.

    python -m bench.pipeline --json [--records N] [--record-size 65536]
    python -m bench.pipeline --json --scenario longpoll [--seconds 10]
    python -m bench.pipeline --json --metrics on,off --repeat 5 [--scrape-interval 1]
    python -m bench.pipeline --json --security plaintext,sasl_ssl --repeat 3 [--modes pipelined]
    python -m bench.pipeline --json --saturation 1.25 --repeat 3 [--plot docs/img/pipeline.png]
    python -m bench.pipeline --json --scenario storage [--records N] [--repeat 5]

`produce`: the broker starts twice (serial, then pipelined) with log.flush.interval.messages=1,
so every batch is fsynced before its ack (the wait that pipelining overlaps); one
confluent-kafka producer (acks=all, batch.size 1 MiB, linger.ms 1, max.in.flight 5) sends N
records to one partition. Send latency is the time from produce() to the delivery report.
`longpoll`: end-to-end produce-to-consume latency at 1,000 records/s with fetch.wait.max.ms 500,
which only a DelayedFetch completed by the append event can make small.
`--metrics on,off`: the cost of metrics (broker/metrics.py). The produce scenario in pipelined
mode, with metrics on (and a scraper reading /metrics every --scrape-interval seconds, as
Prometheus would) and off (metrics.listener empty), back to back, --repeat times, alternating
which goes first; each run prints its row, then one summary row with the medians and their
ratio. With `--scenario requestpath` the same comparison runs in-process, without sockets or
storage: N produce frames through Connection -> RequestChannel -> a handler answering a
prebuilt response -> the sequencer -> a transport that drops the bytes, so the per-request cost
of the network layer and of the metrics on it is measured alone (an upper bound of the relative
cost: no append, no fsync, no client).
`--security plaintext,sasl_ssl`: the produce scenario over PLAINTEXT and over SASL_SSL (TLS and
SCRAM-SHA-256, certificates from tests/support/certs.py, no authorizer), back to back per mode,
--repeat times alternating which goes first; each run prints its row, then one `tls_cost` row
per mode with the medians and the median of the per-repetition ratios SASL_SSL / PLAINTEXT.
`--saturation 1.25`: latency at the serial model's saturation. Serial runs unthrottled first
(--saturation-runs times); the median records/s is the saturated throughput. Then serial and
pipelined each get load offered at 1.25x that rate (any fraction; above 1 is the seed's
experiment, a load only the pipelined model can carry), --repeat times alternating which goes
first, and a `saturation` row gives each mode's median p50/p95/p99/p99.9, the percentiles of
all runs pooled, and the median of the paired ratios pipelined / serial. `--plot PATH` (produce
scenario, with or without --saturation) writes a PNG of each mode's latency by percentile.
`--scenario storage`: the file system's own ceiling, no broker: the same bytes appended in
batch-size chunks, write-then-fsync (serial) against a write thread and an fsync thread
(overlapped, a group commit), and their ratio.
Each produce row also gives the producer's CPU (`client_cpu_s`), `box_busy` (the share of all
cores the broker and the producer used together over the run) and, with metrics on, where a
produce request waited: `remote_ms_mean` (parked until its fsync), `fsync_ms_mean`, and
`requests_per_fsync` (the group commit).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """User + system CPU time of this process, every thread (librdkafka's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)


class Scraper(threading.Thread):
    """Reads the broker's /metrics every `interval` seconds, as Prometheus would."""

    def __init__(self, port: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.interval = interval
        self.stopped = threading.Event()
        self.scrapes = 0
        self.bytes = 0

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            with urllib.request.urlopen(self.url, timeout=10) as resp:
                self.bytes = len(resp.read())
            self.scrapes += 1


def _gc_record(broker: BrokerProcess) -> dict:
    """The collector's cost over the run, from the broker's shutdown line ("gc pauses")."""
    for line in broker.new_log_lines():
        if line.get("event") == "gc pauses":
            return {"gc_collections": line["collections"],
                    "gc_total_pause_ms": line["total_pause_ms"],
                    "gc_max_pause_ms": max(line["max_pause_ms"])}
    return {}


def run_produce(mode: str, records: int, size: int, rate: int, extra: dict[str, str],
                batch_size: int = 1 << 20, scrape_interval: float = 0.0,
                security: str = "plaintext", latencies_out: list[float] | None = None) -> dict:
    """rate 0: as fast as the producer can (throughput); else records/s (latency at a load).
    security sasl_ssl: the producer connects over SASL_SSL with SCRAM-SHA-256.
    latencies_out: filled with every record's send latency (ms), for a plot."""
    scraper: Scraper | None = None
    with tempfile.TemporaryDirectory() as tmp:
        secure: dict[str, str] = {}
        if security == "sasl_ssl":
            from tests.support.certs import bench_broker_overrides, make_pki

            pki = make_pki(Path(tmp) / "pki")
            secure = bench_broker_overrides(pki)
        broker = BrokerProcess(Path(tmp), {
            "request.processing.mode": mode, "log.flush.interval.messages": "1", **secure,
            **extra,
        }).start()
        try:
            _create_topic(broker.bootstrap, "bench")
            client = {"bootstrap.servers": broker.bootstrap}
            if security == "sasl_ssl":
                from tests.support.certs import add_bench_user, bench_client_config

                add_bench_user(broker.bootstrap)
                client = bench_client_config(broker.bootstrap_for("SASL_SSL"), pki)
            if scrape_interval > 0 and broker.metrics_port:
                scraper = Scraper(broker.metrics_port, scrape_interval)
                scraper.start()
            producer = Producer({
                **client, "acks": "all", "linger.ms": 1,
                "batch.size": batch_size, "max.in.flight.requests.per.connection": 5,
                "message.max.bytes": 1 << 21, "queue.buffering.max.kbytes": 1 << 20,
            })
            producer.list_topics("bench", timeout=10)  # connected (and authenticated) first
            payload = os.urandom(size)
            latencies: list[float] = []
            errors = 0
            assert broker.proc is not None
            cpu_before = _cpu_seconds(broker.proc.pid)
            client_before = _own_cpu_seconds()

            def report(err, _msg, sent=0.0):  # type: ignore[no-untyped-def]
                nonlocal errors
                if err is not None:
                    errors += 1
                latencies.append((time.perf_counter() - sent) * 1000)

            start = time.perf_counter()
            for i in range(records):
                if rate:
                    target = start + i / rate
                    while (now := time.perf_counter()) < target:
                        producer.poll(min(target - now, 0.001))
                sent = time.perf_counter()
                while True:
                    try:
                        producer.produce("bench", payload,
                                         on_delivery=lambda e, m, s=sent: report(e, m, s))
                        break
                    except BufferError:
                        producer.poll(0.01)
                producer.poll(0)
            producer.flush(120)
            elapsed = time.perf_counter() - start
            cpu_after = _cpu_seconds(broker.proc.pid)
            client_cpu = _own_cpu_seconds() - client_before
            waits = _produce_waits(broker.metrics_port) if broker.metrics_port else {}
        finally:
            if scraper is not None:
                scraper.stopped.set()
                scraper.join(15)
            broker.stop()
        gc_record = _gc_record(broker)
    if latencies_out is not None:
        latencies_out.extend(latencies)
    return {
        "scenario": "produce", "mode": mode, "security": security, "records": records,
        "record_size": size,
        "target_rate": rate, "batch_size": batch_size,
        "metrics": "on" if broker.metrics_port else "off",
        "scrapes": scraper.scrapes if scraper is not None else 0,
        "errors": errors, "seconds": round(elapsed, 3),
        "mb_per_s": round(records * size / elapsed / 1e6, 2),
        "records_per_s": round(records / elapsed),
        # The broker's CPU time over the run: steadier than throughput on a busy machine.
        "broker_cpu_s": round(cpu_after - cpu_before, 3)
        if cpu_before is not None and cpu_after is not None else None,
        # The producer's CPU (this process: librdkafka's threads and the Python loop), and how
        # busy the machine's cores were with both: near 1.0, the box, not the model, sets the pace.
        "client_cpu_s": round(client_cpu, 3),
        "box_busy": round((cpu_after - cpu_before + client_cpu) / (elapsed * (os.cpu_count() or 1)),
                          3) if cpu_before is not None and cpu_after is not None else None,
        **{f"p{k}_ms": round(_pct(latencies, v), 2)
           for k, v in (("50", 50), ("95", 95), ("99", 99), ("999", 99.9))},
        **gc_record,
        **waits,
    }


def _produce_waits(port: int) -> dict:
    """Where a produce request's time went, from the broker's /metrics: the mean time parked
    waiting for its fsync (Kafka's remote time), and the fsyncs: how many, how long, and how
    many produce requests each covered on average (the group commit)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in ("minibroker_request_remote_time_seconds",
                            "minibroker_log_flush_time_seconds"):
            continue
        for sample in fam.samples:
            if sample.labels.get("api", "Produce") == "Produce" and sample.name.endswith(
                    ("_sum", "_count")):
                values[sample.name] = sample.value
    requests = values.get("minibroker_request_remote_time_seconds_count", 0)
    fsyncs = values.get("minibroker_log_flush_time_seconds_count", 0)
    if not requests or not fsyncs:
        return {}
    return {
        "produce_requests": int(requests),
        "remote_ms_mean": round(values["minibroker_request_remote_time_seconds_sum"]
                                / requests * 1e3, 3),
        "fsyncs": int(fsyncs),
        "fsync_ms_mean": round(values["minibroker_log_flush_time_seconds_sum"] / fsyncs * 1e3, 3),
        "requests_per_fsync": round(requests / fsyncs, 2),
    }


def run_storage(records: int, size: int, batch_size: int, repeat: int) -> None:
    """The file system's own ceiling for the produce scenario, with no broker and no client.

    The same bytes (records x size, in batch_size chunks) are appended to a file in a temp dir on
    the broker's file system, two ways: serial (write a chunk, fsync, then the next: the serial
    model's persistence) and overlapped (one thread writes the chunks in order, another fsyncs
    whatever is written, as the log dir writer does). overlapped / serial is the most pipelining
    can gain on this disk when parsing, validation and the client cost nothing."""
    chunk = os.urandom(batch_size)
    chunks = max(1, records * size // batch_size)
    rows: dict[str, list[dict]] = {"serial": [], "overlapped": []}
    for rep in range(repeat):
        for mode in ("serial", "overlapped") if rep % 2 == 0 else ("overlapped", "serial"):
            with tempfile.TemporaryDirectory() as tmp:
                fd = os.open(Path(tmp) / "00000000000000000000.log",
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    row = (_storage_serial if mode == "serial" else _storage_overlapped)(
                        fd, chunk, chunks)
                finally:
                    os.close(fd)
            row.update(scenario="storage", mode=mode, rep=rep, chunks=chunks,
                       batch_size=batch_size,
                       mb_per_s=round(chunks * batch_size / row["seconds"] / 1e6, 2))
            rows[mode].append(row)
            print(json.dumps(row), flush=True)
    medians = {m: statistics.median(r["mb_per_s"] for r in rows[m]) for m in rows}
    print(json.dumps({
        "scenario": "storage_ceiling", "repeat": repeat, "batch_size": batch_size,
        "median_mb_per_s_serial": medians["serial"],
        "median_mb_per_s_overlapped": medians["overlapped"],
        "ceiling_ratio_overlapped_over_serial": round(medians["overlapped"] / medians["serial"], 3),
        "median_write_ms_per_chunk": statistics.median(
            r["write_ms_per_chunk"] for r in rows["serial"]),
        "median_fsync_ms": statistics.median(r["fsync_ms"] for r in rows["serial"]),
    }), flush=True)


def _storage_serial(fd: int, chunk: bytes, chunks: int) -> dict:
    writes = fsyncs = 0.0
    start = time.perf_counter()
    for _ in range(chunks):
        t0 = time.perf_counter()
        os.write(fd, chunk)
        t1 = time.perf_counter()
        os.fsync(fd)
        writes += t1 - t0
        fsyncs += time.perf_counter() - t1
    seconds = time.perf_counter() - start
    return {"seconds": round(seconds, 4), "fsyncs": chunks,
            "write_ms_per_chunk": round(writes / chunks * 1e3, 3),
            "fsync_ms": round(fsyncs / chunks * 1e3, 3)}


def _storage_overlapped(fd: int, chunk: bytes, chunks: int) -> dict:
    written = 0
    cond = threading.Condition()

    def write_all() -> None:
        nonlocal written
        for _ in range(chunks):
            os.write(fd, chunk)
            with cond:
                written += 1
                cond.notify()

    fsyncs = 0
    fsync_seconds = 0.0
    start = time.perf_counter()
    writer = threading.Thread(target=write_all)
    writer.start()
    synced = 0
    while synced < chunks:
        with cond:
            while written <= synced:
                cond.wait()
            target = written
        t0 = time.perf_counter()
        os.fsync(fd)  # covers every chunk written before it began: a group commit
        fsync_seconds += time.perf_counter() - t0
        fsyncs += 1
        synced = target
    seconds = time.perf_counter() - start
    writer.join()
    # fsync_ms here is per fsync, each covering chunks_per_fsync chunks while the write thread
    # goes on appending to the same file (which makes an fsync slower than one alone).
    return {"seconds": round(seconds, 4), "fsyncs": fsyncs,
            "chunks_per_fsync": round(chunks / fsyncs, 2),
            "fsync_ms": round(fsync_seconds / fsyncs * 1e3, 3)}


def run_request_path(requests: int, metrics_on: bool) -> dict:
    """The in-process request path, metrics on or off: seconds per request, no I/O."""
    import asyncio
    import gc

    from kafka.protocol.producer import ProduceRequest, ProduceResponse

    from broker.logging import configure
    from broker.metrics.collector import BrokerMetrics
    from broker.network.connection import Connection
    from broker.network.request_channel import RequestChannel

    part = ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
        index=0, error_code=0, base_offset=0, log_append_time_ms=-1, log_start_offset=0,
        record_errors=[], error_message=None)
    response = ProduceResponse(responses=[ProduceResponse.TopicProduceResponse(
        name="bench", partition_responses=[part])], throttle_time_ms=0)
    req = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        ProduceRequest.TopicProduceData(name="bench", partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=b"x" * 100)])])
    frames = []
    for i in range(requests):
        req.with_header(correlation_id=i, client_id="bench")
        frames.append(bytes(req.encode(header=True, framed=True)))

    class NullTransport(asyncio.Transport):
        def get_extra_info(self, name: str, default: object = None) -> object:
            return ("127.0.0.1", 1) if name == "peername" else default

        def write(self, data: bytes) -> None:  # type: ignore[override]
            pass

        def get_write_buffer_size(self) -> int:
            return 0

    configure("WARNING", "json")  # no "connection opened" line in the output
    metrics = BrokerMetrics(node_id=1) if metrics_on else None
    channel = RequestChannel(1, 1 << 40, lambda r: response, metrics)
    channel.submit = channel.handle  # type: ignore[method-assign]  # no queue hop: no loop
    conn = Connection(channel, serial=False, max_frame=1 << 20)
    conn.connection_made(NullTransport())
    gc.collect()
    # Timed in chunks of 500 requests; the fastest chunk is the figure (as timeit's minimum):
    # on a shared machine a chunk that lost the CPU to another process is simply slower.
    chunk = 500
    chunks = []
    for i in range(0, len(frames), chunk):
        batch = frames[i:i + chunk]
        start = time.perf_counter()
        for f in batch:
            conn.data_received(f)
        chunks.append((time.perf_counter() - start) / len(batch))
    assert conn.inflight == 0
    return {"scenario": "requestpath", "metrics": "on" if metrics_on else "off",
            "requests": requests, "us_per_request": round(min(chunks) * 1e6, 3),
            "median_chunk_us_per_request": round(statistics.median(chunks) * 1e6, 3)}


def run_metrics_overhead(args: argparse.Namespace, extra: dict[str, str]) -> None:
    """Metrics on vs off, interleaved; prints each run, then the medians and their ratio."""
    settings = args.metrics.split(",")
    listener = {"on": "http://127.0.0.1:0/metrics", "off": ""}
    mode = "pipelined" if "," in args.modes else args.modes
    rows: dict[str, list[dict]] = {m: [] for m in settings}
    for rep in range(args.repeat):
        order = settings if rep % 2 == 0 else settings[::-1]
        for setting in order:
            if args.scenario == "requestpath":
                row = run_request_path(args.records, setting == "on")
            else:
                row = run_produce(mode, args.records, args.record_size, args.rate,
                                  {**extra, "metrics.listener": listener[setting]},
                                  args.batch_size,
                                  args.scrape_interval if setting == "on" else 0.0)
            row["rep"] = rep
            rows[setting].append(row)
            print(json.dumps(row) if args.json else row, flush=True)
    if args.scenario == "requestpath":
        us = {m: min(r["us_per_request"] for r in rows[m]) for m in settings}
        summary = {"scenario": "metrics_overhead_requestpath", "repeat": args.repeat,
                   "requests": args.records,
                   **{f"min_us_per_request_{m}": v for m, v in us.items()},
                   **{f"median_us_per_request_{m}": statistics.median(
                       r["us_per_request"] for r in rows[m]) for m in settings}}
        if "on" in us and "off" in us:
            summary["added_us_per_request"] = round(us["on"] - us["off"], 3)
            summary["ratio_on_off"] = round(us["on"] / us["off"], 4)
        print(json.dumps(summary) if args.json else summary, flush=True)
        return
    medians = {m: statistics.median(r["mb_per_s"] for r in rows[m]) for m in settings}
    summary: dict = {
        "scenario": "metrics_overhead", "mode": mode, "repeat": args.repeat,
        "records": args.records, "record_size": args.record_size,
        "batch_size": args.batch_size, "scrape_interval_s": args.scrape_interval,
        **{f"median_mb_per_s_{m}": round(v, 2) for m, v in medians.items()},
        **{f"median_p99_ms_{m}": statistics.median(r["p99_ms"] for r in rows[m])
           for m in settings},
    }
    cpu = {m: statistics.median(r["broker_cpu_s"] for r in rows[m]) for m in settings
           if all(r["broker_cpu_s"] is not None for r in rows[m])}
    for m, v in cpu.items():
        summary[f"median_broker_cpu_us_per_record_{m}"] = round(v / args.records * 1e6, 3)
    if "on" in medians and "off" in medians:
        summary["ratio_on_off"] = round(medians["on"] / medians["off"], 4)
        summary["overhead_pct"] = round((1 - medians["on"] / medians["off"]) * 100, 2)
        # Each repetition runs on and off back to back: the median of the per-repetition
        # ratios cancels drift in the machine's load better than the ratio of medians.
        pairs = [a["mb_per_s"] / b["mb_per_s"] for a, b in zip(rows["on"], rows["off"],
                                                              strict=True)]
        summary["median_paired_ratio_on_off"] = round(statistics.median(pairs), 4)
    if "on" in cpu and "off" in cpu:
        summary["cpu_ratio_on_off"] = round(cpu["on"] / cpu["off"], 4)
    print(json.dumps(summary) if args.json else summary, flush=True)


def run_tls_cost(args: argparse.Namespace, extra: dict[str, str]) -> None:
    """PLAINTEXT vs SASL_SSL per mode, interleaved; each run's row, then the medians and the
    median of the paired ratios per mode."""
    securities = args.security.split(",")
    for mode in args.modes.split(","):
        rows: dict[str, list[dict]] = {s: [] for s in securities}
        for rep in range(args.repeat):
            for security in securities if rep % 2 == 0 else securities[::-1]:
                row = run_produce(mode, args.records, args.record_size, args.rate, extra,
                                  args.batch_size, security=security)
                row["rep"] = rep
                rows[security].append(row)
                print(json.dumps(row) if args.json else row, flush=True)
        if len(securities) < 2:
            continue
        a, b = securities[:2]
        summary: dict = {"scenario": "tls_cost", "mode": mode, "repeat": args.repeat,
                         "records": args.records, "record_size": args.record_size}
        for s in (a, b):
            summary[f"median_mb_per_s_{s}"] = statistics.median(r["mb_per_s"] for r in rows[s])
            summary[f"median_p99_ms_{s}"] = statistics.median(r["p99_ms"] for r in rows[s])
            cpu = [r["broker_cpu_s"] for r in rows[s]]
            if all(c is not None for c in cpu):
                summary[f"median_broker_cpu_us_per_record_{s}"] = round(
                    statistics.median(cpu) / args.records * 1e6, 2)
        pairs = [y["mb_per_s"] / x["mb_per_s"] for x, y in zip(rows[a], rows[b], strict=True)]
        summary[f"median_paired_ratio_{b}_over_{a}"] = round(statistics.median(pairs), 4)
        print(json.dumps(summary) if args.json else summary, flush=True)


def run_saturation(args: argparse.Namespace, extra: dict[str, str]) -> dict[str, list[float]]:
    """Load offered at a fraction of the serial model's saturated throughput.

    First serial runs unthrottled: the median records/s is the saturated throughput. Then serial and
    pipelined each take --records at --saturation times that rate, --repeat times, alternating
    which goes first. Below 1, the serial model still queues behind every fsync it waits for;
    above 1 (the seed's experiment: one offered load that only the pipelined model can carry),
    its queue grows for the whole run while the pipelined one keeps up. An unthrottled run
    queues the whole run in the producer, so it understates what serial sustains when paced:
    the offered rows' mb_per_s show what each model carried.
    Returns every record's latency per mode, all runs pooled (for the plot)."""
    modes = args.modes.split(",")
    saturated_runs = []
    for run in range(args.saturation_runs):
        row = run_produce("serial", args.records, args.record_size, 0, extra, args.batch_size)
        row.update(phase="serial_saturated", rep=run)
        saturated_runs.append(row)
        print(json.dumps(row) if args.json else row, flush=True)
    saturated = {k: round(statistics.median(r[k] for r in saturated_runs), 2)
                 for k in ("records_per_s", "mb_per_s")}
    rate = max(1, round(saturated["records_per_s"] * args.saturation))
    rows: dict[str, list[dict]] = {m: [] for m in modes}
    curves: dict[str, list[float]] = {m: [] for m in modes}
    for rep in range(args.repeat):
        for mode in modes if rep % 2 == 0 else modes[::-1]:
            lat: list[float] = []
            row = run_produce(mode, args.records, args.record_size, rate, extra,
                              args.batch_size, latencies_out=lat)
            row.update(phase="offered", offered_fraction=args.saturation, rep=rep)
            rows[mode].append(row)
            curves[mode].extend(lat)
            print(json.dumps(row) if args.json else row, flush=True)
    summary: dict = {
        "scenario": "saturation", "records": args.records, "record_size": args.record_size,
        "repeat": args.repeat, "serial_saturated_records_per_s": saturated["records_per_s"],
        "serial_saturated_mb_per_s": saturated["mb_per_s"],
        "serial_saturated_range_records_per_s": [min(r["records_per_s"] for r in saturated_runs),
                                                 max(r["records_per_s"] for r in saturated_runs)],
        "offered_fraction": args.saturation,
        "offered_records_per_s": rate,
    }
    for m in modes:
        for k in ("mb_per_s", "p50_ms", "p95_ms", "p99_ms", "p999_ms"):
            summary[f"median_{k}_{m}"] = round(statistics.median(r[k] for r in rows[m]), 2)
        summary[f"range_p99_ms_{m}"] = [min(r["p99_ms"] for r in rows[m]),
                                        max(r["p99_ms"] for r in rows[m])]
        if curves[m]:
            for k, v in (("50", 50), ("95", 95), ("99", 99), ("999", 99.9)):
                summary[f"pooled_p{k}_ms_{m}"] = round(_pct(curves[m], v), 2)
    if "serial" in rows and "pipelined" in rows:
        for k in ("p50_ms", "p99_ms", "p999_ms"):
            pairs = [p[k] / s[k] for s, p in zip(rows["serial"], rows["pipelined"], strict=True)
                     if s[k]]
            summary[f"median_paired_{k}_pipelined_over_serial"] = round(
                statistics.median(pairs), 4)
    print(json.dumps(summary) if args.json else summary, flush=True)
    return curves


def plot_percentiles(curves: dict[str, list[float]], out: Path, title: str) -> None:
    """Latency by percentile, serial against pipelined, on a scale that spreads the tail
    (x: 1 / (1 - p), so p90, p99, p99.9 are evenly spaced), as HdrHistogram plots it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    marks = (50, 90, 99, 99.9)
    for mode, values in curves.items():
        if not values:
            continue
        values = sorted(values)
        n = len(values)
        # Up to the last rank whose percentile is below 100% (1/(1-p) is finite there).
        xs = [1 / (1 - i / n) for i in range(n)]
        line, = ax.plot(xs, values, label=f"{mode} (n={n})", linewidth=1.6)
        for p in marks:
            v = _pct(values, p)
            ax.plot([1 / (1 - p / 100)], [v], "o", color=line.get_color(), markersize=4)
            ax.annotate(f"{v:.0f}", (1 / (1 - p / 100), v), textcoords="offset points",
                        xytext=(4, 4), fontsize=8, color=line.get_color())
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([1 / (1 - p / 100) for p in (0, *marks)])
    ax.set_xticklabels(["p0", *(f"p{p:g}" for p in marks)])
    ax.set_xlabel("percentile")
    ax.set_ylabel("send latency, ms (produce() to delivery report)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run_longpoll(mode: str, seconds: float, rate: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), {"request.processing.mode": mode}).start()
        try:
            _create_topic(broker.bootstrap, "lp")
            consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench",
                                 "fetch.wait.max.ms": 500, "fetch.min.bytes": 1,
                                 "enable.auto.commit": False})
            consumer.assign([TopicPartition("lp", 0, 0)])
            producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1,
                                 "linger.ms": 0})
            latencies: list[float] = []
            stop = threading.Event()

            def consume() -> None:
                while not stop.is_set():
                    msg = consumer.poll(0.2)
                    if msg is not None and msg.error() is None:
                        sent = float(msg.value().decode())
                        latencies.append((time.perf_counter() - sent) * 1000)

            t = threading.Thread(target=consume)
            t.start()
            time.sleep(1.0)  # consumer connected and parked
            n = int(seconds * rate)
            begin = time.perf_counter()
            for i in range(n):
                target = begin + i / rate
                while (now := time.perf_counter()) < target:
                    time.sleep(min(target - now, 0.001))
                producer.produce("lp", str(time.perf_counter()).encode())
                producer.poll(0)
            producer.flush(10)
            time.sleep(1.0)
            stop.set()
            t.join()
            consumer.close()
        finally:
            broker.stop()
    return {
        "scenario": "longpoll", "mode": mode, "records": n, "received": len(latencies),
        "p50_ms": round(_pct(latencies, 50), 2), "p99_ms": round(_pct(latencies, 99), 2),
        "mean_ms": round(statistics.fmean(latencies), 2) if latencies else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--scenario", choices=["produce", "longpoll", "requestpath", "storage"],
                    default="produce")
    ap.add_argument("--modes", default="serial,pipelined")
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--record-size", type=int, default=65536)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=0,
                    help="records/s (produce: 0 = unthrottled; longpoll: default 1000)")
    ap.add_argument("--override", action="append", default=[], metavar="key=value")
    ap.add_argument("--batch-size", type=int, default=1 << 20,
                    help="producer batch.size (produce scenario)")
    ap.add_argument("--metrics", default="",
                    help="on,off: metrics overhead, pipelined produce with and without metrics")
    ap.add_argument("--repeat", type=int, default=5,
                    help="runs per setting (--metrics, --security)")
    ap.add_argument("--security", default="",
                    help="plaintext,sasl_ssl: the produce scenario over both, interleaved")
    ap.add_argument("--scrape-interval", type=float, default=1.0,
                    help="seconds between scrapes while metrics are on (0: none)")
    ap.add_argument("--saturation", type=float, default=0.0, metavar="FRACTION",
                    help="produce at FRACTION (e.g. 1.25) of serial's saturated records/s, "
                         "measured first; serial and pipelined --repeat times, alternating")
    ap.add_argument("--saturation-runs", type=int, default=3,
                    help="unthrottled serial runs whose median records/s is the saturation")
    ap.add_argument("--plot", type=Path, metavar="PATH",
                    help="produce scenario: a PNG of each mode's latency percentiles")
    args = ap.parse_args()
    extra = dict(o.split("=", 1) for o in args.override)
    if args.metrics:
        run_metrics_overhead(args, extra)
        return
    if args.security:
        run_tls_cost(args, extra)
        return
    if args.scenario == "storage":
        run_storage(args.records, args.record_size, args.batch_size, args.repeat)
        return
    curves: dict[str, list[float]] = {}
    size = f"{args.records:,} x {args.record_size // 1024} KiB, acks=all, fsync per message"
    if args.saturation:
        curves = run_saturation(args, extra)
        if args.plot:
            plot_percentiles(curves, args.plot, f"Serial vs pipelined at {args.saturation:g}x "
                             f"serial's saturated throughput\n({size}, {args.repeat} runs "
                             "each, pooled)")
        return
    for mode in args.modes.split(","):
        if args.scenario == "produce":
            lat: list[float] = []
            row = run_produce(mode, args.records, args.record_size, args.rate, extra,
                              args.batch_size, latencies_out=lat)
            curves[mode] = lat
        else:
            row = run_longpoll(mode, args.seconds, args.rate or 1000)
        print(json.dumps(row) if args.json else row, flush=True)
    if args.plot and curves:
        load = f"{args.rate:,} records/s offered" if args.rate else "unthrottled"
        plot_percentiles(curves, args.plot, f"Serial vs pipelined, {load}\n({size})")


if __name__ == "__main__":
    main()
