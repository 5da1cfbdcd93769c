"""What the log cleaner does and what it costs: its throughput on a dirty compacted log, and
producer throughput while it runs against the same producer with it idle.

    python -m bench.cleaner --json [--mb 64] [--seconds 8] [--quick] [--override key=value]

A fresh broker on an ephemeral 127.0.0.1 port with a temporary data dir and
log.cleaner.backoff.ms=100. Backlogs are written into compacted topics (16 MB segments,
min.cleanable.dirty.ratio 0.01) held back from the cleaner by min.compaction.lag.ms of a
day; IncrementalAlterConfigs setting it to 0 lets the cleaner at one, and the clean is over
when the cleaner-offset-checkpoint file reaches the backlog's last segment. Records are
VALUE_BYTES-byte values, UPDATES_PER_KEY per key, so a clean keeps about a third of them.

1. `clean`: a backlog of --mb MB cleaned with nothing else running: MB/s of dirty log read
   (wall clock from the alter to the checkpoint), and the cleaner's own figures from its
   `cleaned log` lines.
2. `produce`: librdkafka (acks=1, linger.ms=5) streams 100-byte values over STREAM_KEYS keys
   for --seconds each (4 MB segments) into a plain topic, into a compacted topic the cleaner
   is held off (min.compaction.lag.ms of a day: the same appends, no cleaning), and into a
   compacted one (ratio 0.01) that the cleaner cleans again after every roll (that phase
   lasts until the cleaner has cleaned once, however short --seconds): records/s of each,
   the ratios of the last to the other two, and the cleaner's work meanwhile (its seconds
   over the phase's). The cleaner's threads take the GIL from the event loop: that is the
   cost.

`--quick` makes everything small (a smoke test). Not asserted anywhere: machines differ.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from tests.support.broker import BrokerProcess

UPDATES_PER_KEY = 3
VALUE_BYTES = 512
SEGMENT_BYTES = 16 << 20
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
STREAM_VALUE = b"v" * 100
STREAM_KEYS = 50_000
STREAM_SEGMENT_BYTES = 4 << 20
# A phase measured "while cleaning" goes on until the cleaner has cleaned at least once: on a
# loaded machine a short phase may otherwise end before the cleaner's first pass.
STREAM_MAX_SECONDS = 60.0
BROKER_OVERRIDES = {
    "log.cleaner.backoff.ms": "100",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
}
CHECKPOINT = "cleaner-offset-checkpoint"


def _producer(bootstrap: str, acks: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                     "acks": acks, "linger.ms": 5, "enable.idempotence": False,
                     "queue.buffering.max.messages": 500_000, "batch.size": 1 << 20})


def _send(producer: Producer, topic: str, on_delivery, **kw) -> None:
    while True:
        try:
            producer.produce(topic, partition=0, on_delivery=on_delivery, **kw)
            return
        except BufferError:
            producer.poll(0.001)


def _delivered() -> tuple[list, Callable]:
    failed: list = []

    def cb(err, _msg) -> None:
        if err is not None:
            failed.append(err)

    return failed, cb


def backlog(bootstrap: str, topic: str, mb: float) -> dict:
    """About `mb` MB of updates, UPDATES_PER_KEY per key spread over the whole backlog,
    CreateTime two hours back, then one record an hour later that rolls the active segment
    (segment.ms), so all of it is cleanable once the lag allows."""
    producer = _producer(bootstrap, "all")
    failed, cb = _delivered()
    records = int(mb * (1 << 20) / (VALUE_BYTES + 20))
    keys = max(1, records // UPDATES_PER_KEY)
    ts = int(time.time() * 1000) - 2 * HOUR_MS
    value = b"x" * VALUE_BYTES
    for n in range(records):
        _send(producer, topic, cb, key=b"k%d" % (n * 7919 % keys), value=value, timestamp=ts)
        if n % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)  # the roll record in a batch of its own, starting a segment
    _send(producer, topic, cb, key=b"roll", value=b"roll", timestamp=ts + HOUR_MS)
    left += producer.flush(120)
    if failed or left:
        raise RuntimeError(f"backlog: {len(failed)} failed ({failed[:1]}), {left} undelivered")
    return {"records": records + 1, "keys": keys}


def _dirty_bytes(log_dir: Path, topic: str) -> int:
    """Bytes of the segments the cleaner will read: all but the active (last) one."""
    segments = sorted((log_dir / f"{topic}-0").glob("*.log"))
    return sum(p.stat().st_size for p in segments[:-1])


def _checkpoint(log_dir: Path, topic: str) -> int | None:
    """The topic's first dirty offset from the cleaner's checkpoint file (Kafka's format: a
    version line, a count line, then `topic partition offset` lines)."""
    try:
        lines = (log_dir / CHECKPOINT).read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        parts = line.split()
        if len(parts) == 3 and parts[0] == topic and parts[1] == "0":
            return int(parts[2])
    return None


def _release(admin: AdminClient, topic: str) -> None:
    """min.compaction.lag.ms to 0: the backlog becomes cleanable."""
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0",
                    incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([res]).values():
        f.result(15)


def _clean_lines(broker: BrokerProcess, topic: str) -> list[dict]:
    """The cleaner's own account of each clean of the topic: bytes, records, seconds."""
    keys = ("dirty_section", "bytes_read", "bytes_written", "records_read", "records_removed",
            "map_utilization", "seconds")
    return [{k: line.get(k) for k in keys} for line in broker.new_log_lines()
            if line.get("event") == "cleaned log" and line.get("topic") == topic]


def stream(bootstrap: str, topic: str, seconds: float,
           until: Callable[[], bool] = lambda: True) -> dict:
    """100-byte records over STREAM_KEYS keys as fast as the producer takes them for
    `seconds`, and on until `until()` holds (at most STREAM_MAX_SECONDS), all delivered."""
    producer = _producer(bootstrap, "1")
    failed, cb = _delivered()
    keys = [b"s%d" % k for k in range(STREAM_KEYS)]
    sent = 0
    start = time.perf_counter()
    end = start + seconds
    give_up = start + max(seconds, STREAM_MAX_SECONDS)
    while (now := time.perf_counter()) < end or (now < give_up and not until()):
        for i in range(sent, sent + 1000):
            _send(producer, topic, cb, key=keys[i % STREAM_KEYS], value=STREAM_VALUE)
        sent += 1000
        producer.poll(0)
    left = producer.flush(120)
    elapsed = time.perf_counter() - start
    if failed or left:
        raise KafkaException(failed[0] if failed else f"{left} undelivered")
    return {"records": sent, "seconds": round(elapsed, 3),
            "records_per_s": round(sent / elapsed, 1)}


class CleanWatch(threading.Thread):
    """Polls the checkpoint every 10 ms from its start: `seconds` until it reached `target`
    (the cleaner's backoff included, up to log.cleaner.backoff.ms)."""

    def __init__(self, log_dir: Path, topic: str, target: int, timeout: float) -> None:
        super().__init__(name=f"watch-{topic}", daemon=True)
        self.log_dir, self.topic, self.target, self.timeout = log_dir, topic, target, timeout
        self.began = time.perf_counter()
        self.seconds: float | None = None

    def run(self) -> None:
        while time.perf_counter() - self.began < self.timeout:
            if (_checkpoint(self.log_dir, self.topic) or 0) >= self.target:
                self.seconds = time.perf_counter() - self.began
                return
            time.sleep(0.01)

    def result(self) -> float:
        self.join(self.timeout + 1)
        if self.seconds is None:
            raise TimeoutError(f"{self.topic}: not cleaned to {self.target} in "
                               f"{self.timeout}s (checkpoint "
                               f"{_checkpoint(self.log_dir, self.topic)})")
        return self.seconds


def _cleaner_figures(lines: list[dict]) -> dict:
    """The cleaner's own totals over its `cleaned log` lines: MB read and written, seconds."""
    read = sum(line["bytes_read"] or 0 for line in lines)
    seconds = sum(line["seconds"] or 0 for line in lines)
    return {"cleans": len(lines), "cleaner_read_mb": round(read / (1 << 20), 2),
            "cleaner_written_mb": round(sum(line["bytes_written"] or 0 for line in lines)
                                        / (1 << 20), 2),
            "cleaner_records_removed": sum(line["records_removed"] or 0 for line in lines),
            "cleaner_seconds": round(seconds, 3),
            "cleaner_mb_per_s": round(read / (1 << 20) / seconds, 2) if seconds else None}


def run(mb: float, seconds: float, overrides: dict[str, str],
        emit: Callable[[dict], None]) -> list[dict]:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp), {**BROKER_OVERRIDES, **overrides}).start()
        log_dir = broker.data_dir / "logs"
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap,
                                 "broker.address.family": "v4"})
            held = {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES),
                    "segment.ms": str(HOUR_MS // 2), "min.cleanable.dirty.ratio": "0.01",
                    "min.compaction.lag.ms": str(DAY_MS)}
            # Segments a phase fills several of at this machine's pace, so the cleaner has
            # rolled segments to clean whatever the phase's length (--quick: 0.5 s).
            segment_bytes = min(STREAM_SEGMENT_BYTES, max(256 << 10, int(seconds * (2 << 20))))
            stream_segments = {"segment.bytes": str(segment_bytes)}
            topics = [NewTopic("bench-backlog-1", 1, config=held),
                      NewTopic("bench-stream-delete", 1, config=stream_segments),
                      NewTopic("bench-stream-held", 1, config={
                          **stream_segments, "cleanup.policy": "compact",
                          "min.compaction.lag.ms": str(DAY_MS)}),
                      NewTopic("bench-stream-compact", 1, config={
                          **stream_segments, "cleanup.policy": "compact",
                          "min.cleanable.dirty.ratio": "0.01"})]
            for f in admin.create_topics(topics).values():
                f.result(15)

            # 1. The cleaner alone.
            made = backlog(broker.bootstrap, "bench-backlog-1", mb)
            dirty = _dirty_bytes(log_dir, "bench-backlog-1")
            watch = CleanWatch(log_dir, "bench-backlog-1", made["records"] - 1, 300)
            _release(admin, "bench-backlog-1")
            watch.start()
            took = watch.result()
            kept = _dirty_bytes(log_dir, "bench-backlog-1")
            row = {"bench": "clean", "dirty_mb": round(dirty / (1 << 20), 2),
                   "records": made["records"], "keys": made["keys"],
                   "value_bytes": VALUE_BYTES, "seconds": round(took, 3),
                   "mb_per_s": round(dirty / (1 << 20) / took, 2),
                   "kept_mb": round(kept / (1 << 20), 2),
                   **_cleaner_figures(_clean_lines(broker, "bench-backlog-1"))}
            rows.append(row)
            emit(row)

            # 2. The same keyed stream into a plain topic (the cleaner idle), then into a
            # compacted one, which the cleaner cleans again after every roll.
            alone = stream(broker.bootstrap, "bench-stream-delete", seconds)
            held = stream(broker.bootstrap, "bench-stream-held", seconds)
            busy = stream(broker.bootstrap, "bench-stream-compact", seconds,
                          until=lambda: bool(_clean_lines(broker, "bench-stream-compact")))
            during = _cleaner_figures(_clean_lines(broker, "bench-stream-compact"))
            row = {"bench": "produce", "seconds": seconds, "keys": STREAM_KEYS,
                   "value_bytes": len(STREAM_VALUE),
                   "alone_records_per_s": alone["records_per_s"],
                   "compacted_uncleaned_records_per_s": held["records_per_s"],
                   "while_cleaning_records_per_s": busy["records_per_s"],
                   "ratio": round(busy["records_per_s"] / alone["records_per_s"], 4),
                   "ratio_vs_uncleaned": round(busy["records_per_s"] / held["records_per_s"],
                                               4),
                   "cleaner_busy_fraction": round(during["cleaner_seconds"] / busy["seconds"], 3),
                   "phase_seconds": busy["seconds"],
                   **during}
            rows.append(row)
            emit(row)
        finally:
            broker.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--mb", type=float, default=64.0, help="size of the first backlog")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each produce phase")
    ap.add_argument("--quick", action="store_true", help="a 2 MB backlog and 0.5 s phases")
    ap.add_argument("--override", action="append", default=[], metavar="key=value")
    args = ap.parse_args()
    mb, seconds = (2.0, 0.5) if args.quick else (args.mb, args.seconds)
    run(mb, seconds, dict(o.split("=", 1) for o in args.override),
        lambda row: print(json.dumps(row) if args.json else row, flush=True))


if __name__ == "__main__":
    main()
