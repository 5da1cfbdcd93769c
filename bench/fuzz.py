"""Mutated requests of every served API at a live broker, while a calm client keeps producing.

    python -m bench.fuzz --json [--frames 1000000] [--connections 16] [--seed 1]
    python -m bench.fuzz --json --frames 100000 --failures failures.jsonl
    python -m bench.fuzz --json --replay failures.jsonl
    python -m bench.fuzz --json --cost

A broker on loopback (tests.support.broker.BrokerProcess, topics fuzz-a with 3 partitions,
fuzz-b and calm) takes `--frames` requests built from the JSON specs of every served API and
version (tests/property/messages.py: the fuzz topics, a group, real record batches, boundary
and random integers), 90% of them then mutated (negative lengths, bytes, bits, cuts; the rest
is `--valid-share`), over `--connections` raw sockets, one request at a time each (see
Fuzzer); a connection the broker closes is replaced, so is one whose request stays parked
(long polls, joins) for two seconds. A confluent-kafka producer
(acks=all) writes 200 records/s on its own topic all along.

Goals: no internal error (a "request failed" line in the broker's log: an exception out of a
handler), no error at the calm producer, the broker still up. Rows: `progress` every 100,000
frames, one `internal_error` row per distinct error (API, innermost frame, exception; count,
versions, up to five requests that raised it, hex), then `summary`. `--failures PATH` also
writes those requests, one JSON object per line; `--replay PATH` sends each alone to a fresh
broker.

`--cost` only times protocol.validate.schema_violation on decoded Produce and Fetch requests,
next to the decode it follows on every request.

CreateTopics and CreatePartitions asking for more than 16 partitions are not sent: the broker
would create them all, and a million frames of that measures the disk, not the network layer.
"""

from __future__ import annotations

import argparse
import json
import random
import selectors
import socket
import struct
import sys
import tempfile
import time
import timeit
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.api_message import ApiMessage

from protocol.registry import API_VERSIONS_KEY, APIS, ApiSpec
from protocol.validate import schema_violation
from tests.property.live import (
    CalmProducer,
    LogTail,
    internal_errors,
    signature,
)
from tests.property.messages import (
    BATCHES,
    SERVED,
    Builder,
    floods_partitions,
    mutate,
    request_frame,
)
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic

PARKED_AFTER = 2.0  # seconds without the probe's answer: the request is parked; new socket
SUSPECTS_KEPT = 10.0  # seconds a closed connection's in-flight requests are remembered
ALL_APIS = sorted({spec.name for spec, _ in SERVED})
SEEDED = [("fuzz-a", range(3)), ("fuzz-b", range(1))]


def start_broker(data_dir: Path) -> BrokerProcess:
    broker = BrokerProcess(data_dir, {"group.initial.rebalance.delay.ms": "0"}).start()
    create_topic(broker.bootstrap, "fuzz-a", partitions=3)
    create_topic(broker.bootstrap, "fuzz-b")
    create_topic(broker.bootstrap, "calm")
    _seed(broker)
    return broker


def _seed(broker: BrokerProcess) -> None:
    """A few batches in every fuzz partition, so that fetches read from the first frame on
    (and a replayed request meets data as it did during the run)."""
    produce = APIS[0]
    topic = produce.request.TopicProduceData
    request = produce.request(version=9, transactional_id=None, acks=1, timeout_ms=5000,
                              topic_data=[topic(name=name, partition_data=[
                                  topic.PartitionProduceData(index=p, records=BATCHES[1])
                                  for p in parts]) for name, parts in SEEDED])
    body = bytes(ApiMessage.encode(request, version=9))
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        for n in range(3):
            sock.sendall(request_frame(produce, 9, body, n))
            got = b""
            while len(got) < 4 or len(got) < 4 + struct.unpack_from(">i", got)[0]:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise RuntimeError("the broker closed the seeding connection")
                got += chunk


# -- what is sent ----------------------------------------------------------------------------


class Corpus:
    """Valid encodings of every served (API, version), mutated on the way out."""

    def __init__(self, rnd: random.Random, valid_share: float, per_version: int = 16) -> None:
        self.rnd = rnd
        self.valid_share = valid_share
        by_api: dict[str, list[tuple[ApiSpec, int, bytes]]] = {}
        for spec, version in SERVED:
            for _ in range(per_version):
                message = Builder(rnd).message(spec.request, version)
                body = bytes(ApiMessage.encode(message, version=version))
                by_api.setdefault(spec.name, []).append((spec, version, body))
        self.by_api = [by_api[name] for name in ALL_APIS]
        self.skipped = 0

    def next(self) -> tuple[ApiSpec, int, bytes]:
        """Every API equally often, whatever its number of versions."""
        while True:
            spec, version, body = self.rnd.choice(self.rnd.choice(self.by_api))
            if self.rnd.random() >= self.valid_share:
                body = mutate(body, self.rnd)
            if floods_partitions(spec, version, body):
                self.skipped += 1
                continue
            return spec, version, body


# -- the raw connections ---------------------------------------------------------------------


@dataclass
class Conn:
    sock: socket.socket
    peer: str
    inbuf: bytearray = field(default_factory=bytearray)
    probe: int = 0  # correlation id of the ApiVersions probe behind the request in flight
    request: tuple[ApiSpec, int, bytes] | None = None
    sent_at: float = 0.0


class Fuzzer:
    """One mutated request at a time per connection, each followed by an ApiVersions probe:
    responses come in request order, so the probe's answer says the request is done with (even
    one with no response, acks=0), and a close right after it says it was refused. Every
    request sent is thus one the broker read, and an internal error names its request exactly.
    Pipelining several would mostly measure requests the broker never read: most mutated
    requests close their connection."""

    def __init__(self, port: int, corpus: Corpus, connections: int) -> None:
        self.port = port
        self.corpus = corpus
        self.sel = selectors.DefaultSelector()
        self.correlation = 0
        self.sent = self.answered = self.closed_by_broker = self.abandoned = 0
        self.suspects: dict[str, tuple[float, tuple[ApiSpec, int, bytes]]] = {}
        self.conns = [self._open() for _ in range(connections)]

    def _open(self) -> Conn:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        host, port = sock.getsockname()[:2]
        conn = Conn(sock, f"{host}:{port}")
        self.sel.register(sock, selectors.EVENT_READ, conn)
        return conn

    def _replace(self, conn: Conn, by_broker: bool) -> None:
        if by_broker:
            self.closed_by_broker += 1
            if conn.request is not None:
                self.suspects[conn.peer] = (time.monotonic(), conn.request)
        else:
            self.abandoned += 1
        self.sel.unregister(conn.sock)
        conn.sock.close()
        self.conns[self.conns.index(conn)] = self._open()

    def _send(self, conn: Conn) -> bool:
        spec, version, body = self.corpus.next()
        self.correlation = (self.correlation + 2) & 0x3FFFFFFF
        conn.probe = self.correlation + 1
        data = request_frame(spec, version, body, self.correlation)
        data += request_frame(APIS[API_VERSIONS_KEY], 0, b"", conn.probe)
        conn.request = (spec, version, body)
        conn.sent_at = time.monotonic()
        self.sent += 1
        try:
            conn.sock.sendall(data)  # a few hundred bytes into an idle socket's buffer
        except OSError:
            return False
        return True

    def _read(self, conn: Conn) -> bool:
        try:
            chunk = conn.sock.recv(1 << 18)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not chunk:
            return False
        conn.inbuf += chunk
        buf = conn.inbuf
        while len(buf) >= 8:
            size, correlation = struct.unpack_from(">ii", buf)
            if len(buf) < 4 + size:
                break
            del buf[:4 + size]
            if correlation == conn.probe:
                self.answered += 1
                conn.request = None
        return True

    def run(self, frames: int, tick: Any) -> None:
        """Send `frames` requests; `tick()` runs about every half second."""
        next_tick = time.monotonic() + 0.5
        while True:
            for conn in list(self.conns):
                if conn.request is None and self.sent < frames and not self._send(conn):
                    self._replace(conn, by_broker=True)
            if self.sent >= frames and all(c.request is None for c in self.conns):
                return
            for key, _ in self.sel.select(timeout=0.01):
                conn = key.data
                if not self._read(conn):
                    self._replace(conn, by_broker=True)
            now = time.monotonic()
            for conn in list(self.conns):
                if conn.request is not None and now - conn.sent_at > PARKED_AFTER:
                    self._replace(conn, by_broker=False)
            if now >= next_tick:
                tick()
                next_tick = now + 0.5
                cutoff = now - SUSPECTS_KEPT
                self.suspects = {p: s for p, s in self.suspects.items() if s[0] >= cutoff}

    def close(self) -> None:
        for conn in self.conns:
            self.sel.unregister(conn.sock)
            conn.sock.close()


# -- what the broker said --------------------------------------------------------------------


class Findings:
    """Internal errors by signature, each with the requests that raised it."""

    def __init__(self, fuzzer: Fuzzer, tail: LogTail) -> None:
        self.fuzzer = fuzzer
        self.tail = tail
        self.count = 0
        self.closed_lines = 0
        self.by_signature: dict[str, dict[str, Any]] = {}
        self._pending: list[str] = []  # signatures waiting for their "closing connection" line
        self._unmatched: list[tuple[float, str, str]] = []  # closed, not yet seen by the client
        self.errors_other = 0  # error-level lines that are not "request failed"

    def tick(self) -> None:
        for line in self.tail.read():
            event = line.get("event")
            if event == "request failed":
                self.count += 1
                sig = signature(line)
                entry = self.by_signature.setdefault(
                    sig, {"count": 0, "versions": set(), "exception": line.get("exception"),
                          "suspects": []})
                entry["count"] += 1
                entry["versions"].add(line.get("version"))
                self._pending.append(sig)
            elif event == "closing connection":
                self.closed_lines += 1
                reason = str(line.get("reason", ""))
                if reason.startswith("internal error") and self._pending:
                    self._unmatched.append(
                        (time.monotonic(), self._pending.pop(0), str(line.get("peer"))))
            elif line.get("level") in ("error", "critical"):
                self.errors_other += 1
        self._match()

    def _match(self) -> None:
        """Attach the request the client had in flight on each connection closed by an
        internal error, once the client has seen that close itself."""
        waiting = []
        for seen, sig, peer in self._unmatched:
            held = self.fuzzer.suspects.get(peer)
            if held is None:
                if time.monotonic() - seen < SUSPECTS_KEPT:
                    waiting.append((seen, sig, peer))
                continue
            entry = self.by_signature[sig]
            spec, version, body = held[1]
            if len(entry["suspects"]) < 5:
                entry["suspects"].append(
                    {"api": spec.name, "version": version, "body": body.hex()})
        self._unmatched = waiting


def run(args: argparse.Namespace) -> None:
    emit = _emitter(args.json)
    rnd = random.Random(args.seed)
    corpus = Corpus(rnd, args.valid_share)
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp))
        try:
            tail = LogTail(broker.log_path)
            calm = CalmProducer(broker.bootstrap, "calm").start()
            fuzzer = Fuzzer(broker.port, corpus, args.connections)
            findings = Findings(fuzzer, tail)
            started = time.monotonic()
            last_report = 0

            def tick() -> None:
                nonlocal last_report
                findings.tick()
                if fuzzer.sent - last_report >= 100_000:
                    last_report = fuzzer.sent - fuzzer.sent % 100_000
                    emit({"kind": "progress", "frames": fuzzer.sent,
                          "seconds": round(time.monotonic() - started, 1),
                          "internal_errors": findings.count, "calm_acked": calm.acked,
                          "calm_errors": len(calm.errors)})
                if broker.proc is not None and broker.proc.poll() is not None:
                    raise RuntimeError("the broker died")

            try:
                fuzzer.run(args.frames, tick)
            finally:
                elapsed = time.monotonic() - started
                fuzzer.close()
                calm.stop()
            time.sleep(0.5)
            findings.tick()
            alive = broker.proc is not None and broker.proc.poll() is None
        finally:
            if broker.proc is not None and broker.proc.poll() is None:
                broker.stop()
    for sig, entry in sorted(findings.by_signature.items(), key=lambda kv: -kv[1]["count"]):
        emit({"kind": "internal_error", "signature": sig, "count": entry["count"],
              "versions": sorted(entry["versions"]), "exception": entry["exception"],
              "suspects": entry["suspects"]})
    if args.failures:
        with open(args.failures, "w") as f:
            for sig, entry in findings.by_signature.items():
                for suspect in entry["suspects"]:
                    f.write(json.dumps({"signature": sig, **suspect}) + "\n")
    emit({
        "kind": "summary", "frames": fuzzer.sent, "seconds": round(elapsed, 1),
        "frames_per_s": round(fuzzer.sent / elapsed), "internal_errors": findings.count,
        "distinct_internal_errors": len(findings.by_signature),
        "other_error_lines": findings.errors_other,
        "answered": fuzzer.answered, "closed_by_broker": fuzzer.closed_by_broker,
        "broker_close_lines": findings.closed_lines, "abandoned_parked": fuzzer.abandoned,
        "skipped_partition_floods": corpus.skipped, "calm_sent": calm.sent,
        "calm_acked": calm.acked, "calm_errors": len(calm.errors),
        "calm_error_sample": calm.errors[:3], "broker_alive": alive,
        "connections": args.connections, "seed": args.seed, "valid_share": args.valid_share,
    })


def replay(args: argparse.Namespace) -> None:
    """Each suspect alone on a fresh connection of a fresh (seeded) broker: which request
    raises, and what. What the run built up (partitions added by CreatePartitions, records,
    groups) is not rebuilt, so a request that needed it may pass here."""
    emit = _emitter(args.json)
    specs = {spec.name: spec for spec in APIS.values()}
    with open(args.replay) as f:
        suspects = [json.loads(line) for line in f if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        broker = start_broker(Path(tmp))
        try:
            tail = LogTail(broker.log_path)
            for n, s in enumerate(suspects):
                spec = specs[s["api"]]
                sock = socket.create_connection(("127.0.0.1", broker.port), timeout=3)
                sock.sendall(request_frame(spec, s["version"], bytes.fromhex(s["body"]), n + 1))
                try:
                    sock.recv(1 << 16)
                except TimeoutError:
                    pass
                sock.close()
                time.sleep(0.05)
                failed = internal_errors(tail.read())
                emit({"kind": "replay", "api": s["api"], "version": s["version"],
                      "body": s["body"], "raises": [signature(x) for x in failed],
                      "exception": failed[0].get("exception") if failed else None})
        finally:
            broker.stop()


def cost(args: argparse.Namespace) -> None:
    """What schema_violation adds to each request, against the decode it follows (timeit)."""
    emit = _emitter(args.json)
    produce, fetch = APIS[0].request, APIS[1].request
    cases = [
        ("Produce", 11, produce, _produce_request, 1, 1),
        ("Produce", 11, produce, _produce_request, 10, 10),
        ("Fetch", 16, fetch, _fetch_request, 1, 3),
        ("Fetch", 16, fetch, _fetch_request, 10, 10),
        ("Fetch", 11, fetch, _fetch_request, 1, 3),
    ]
    for name, version, cls, build, topics, partitions in cases:
        body = bytes(ApiMessage.encode(build(version, topics, partitions), version=version))
        message = cls.decode(body, version=version)
        assert schema_violation(message, version) is None
        check_ns = _best_ns(lambda m=message, v=version: schema_violation(m, v), 200_000)
        decode_ns = _best_ns(lambda b=body, v=version, c=cls: c.decode(b, version=v), 20_000)
        emit({"kind": "validate_cost", "api": name, "version": version, "topics": topics,
              "partitions_per_topic": partitions, "validate_ns": round(check_ns),
              "decode_ns": round(decode_ns),
              "validate_share_of_decode": round(check_ns / decode_ns, 3)})


def _best_ns(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def _produce_request(version: int, topics: int, partitions: int) -> Any:
    cls = APIS[0].request
    topic, part = cls.TopicProduceData, cls.TopicProduceData.PartitionProduceData
    return cls(version=version, transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[
        topic(name=f"topic-{t}", partition_data=[part(index=p, records=BATCHES[1])
                                                 for p in range(partitions)])
        for t in range(topics)])


def _fetch_request(version: int, topics: int, partitions: int) -> Any:
    cls = APIS[1].request
    topic, part = cls.FetchTopic, cls.FetchTopic.FetchPartition
    return cls(
        version=version, replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=52428800,
        isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
        topics=[topic(topic=f"topic-{t}", topic_id=uuid.UUID(int=t + 1), partitions=[
            part(partition=p, current_leader_epoch=-1, fetch_offset=100, last_fetched_epoch=-1,
                 log_start_offset=-1, partition_max_bytes=1048576)
            for p in range(partitions)]) for t in range(topics)],
        forgotten_topics_data=[])


def _emitter(as_json: bool) -> Any:
    def emit(row: dict[str, Any]) -> None:
        print(json.dumps(row) if as_json else row, flush=True)
    return emit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--valid-share", type=float, default=0.1,
                    help="share of requests sent unmutated (their values are still random)")
    ap.add_argument("--failures", default="", help="write the suspects of each internal error")
    ap.add_argument("--replay", default="", help="send each suspect of this file alone")
    ap.add_argument("--cost", action="store_true",
                    help="only time schema_violation on Produce and Fetch requests (no broker)")
    args = ap.parse_args()
    if args.cost:
        cost(args)
    elif args.replay:
        replay(args)
    else:
        run(args)


if __name__ == "__main__":
    sys.exit(main())
