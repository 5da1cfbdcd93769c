"""bench.peers' idle workload: thousands of parked long-poll fetches on raw sockets.

One process holds every connection (kafka-python's protocol classes encode the requests, one
epoll selector reads the answers), so the broker sees n clients that each park one FetchRequest
v12 on an empty partition and then say nothing. Each connection first does an ApiVersions round
trip, in batches, so that the fetches start their timers when the harness thinks they do and the
accept backlog never overflows. The broker's CPU comes from /proc/<pid>/stat (all its threads),
its RSS from /proc/<pid>/status.
"""

from __future__ import annotations

import os
import selectors
import socket
import statistics
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import ApiVersionsRequest

BATCH = 50  # connections opened, then handshaken, at a time: below any accept backlog
LATE_TOLERANCE_MS = 1000.0  # answered later than its timeout by more than this: "late"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of the process so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


_CMSG_SPACE = socket.CMSG_SPACE(16)
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


def _kernel_time(ancdata: list[tuple[int, int, bytes]]) -> float:
    """When the kernel received the data (SO_TIMESTAMPNS, CLOCK_REALTIME), so that the time
    this one thread takes to read thousands of answers in a burst is not counted against the
    broker; time.time() if the kernel gave no timestamp."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec + nsec / 1e9
    return time.time()


def _encode(request: Any, correlation_id: int) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="bench-peers-idle")
    return bytes(request.encode(header=True, framed=True))


def _fetch_request(topic: str, wait_ms: int) -> Any:
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=1 << 20)
    return FetchRequest[12](
        replica_id=-1, max_wait_ms=wait_ms, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic=topic,
                                                                        partitions=[part])],
        forgotten_topics_data=[], rack_id="")


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    frames: list[tuple[float, bytes]] = field(default_factory=list)  # (arrival, frame)
    sent_at: float = 0.0
    closed: bool = False


def _pump(sel: selectors.BaseSelector, until: float, done: Any = None) -> None:
    """Read whatever arrives until `until` (monotonic) or until done() is true."""
    while (now := time.monotonic()) < until:
        if done is not None and done():
            return
        for key, _ in sel.select(min(until - now, 0.2)):
            c: _Conn = key.data
            try:
                chunk, ancdata, _flags, _addr = c.sock.recvmsg(1 << 16, _CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                chunk, ancdata = b"", []
            if not chunk:
                c.closed = True
                sel.unregister(c.sock)
                continue
            at = _kernel_time(ancdata)
            c.buf += chunk
            while len(c.buf) >= 4:
                (size,) = struct.unpack_from(">i", c.buf)
                if len(c.buf) < 4 + size:
                    break
                c.frames.append((at, bytes(c.buf[4:4 + size])))
                del c.buf[:4 + size]


def park_fetches(port: int, pid: int, topic: str, n: int, wait_ms: int,
                 window_s: float) -> dict[str, Any]:
    rss_before = proc_rss_mb(pid)
    sel = selectors.DefaultSelector()
    conns: list[_Conn] = []
    hello = _encode(ApiVersionsRequest[0](), 1)
    t0 = time.monotonic()
    try:
        for start in range(0, n, BATCH):
            batch = []
            for _ in range(start, min(n, start + BATCH)):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                c = _Conn(s)
                sel.register(s, selectors.EVENT_READ, c)
                s.sendall(hello)
                batch.append(c)
                conns.append(c)
            _pump(sel, time.monotonic() + 30, lambda b=batch: all(c.frames for c in b))
            if not all(c.frames for c in batch):
                raise TimeoutError(f"ApiVersions unanswered on connections {start}..")
        connect_s = time.monotonic() - t0
        fetch = _encode(_fetch_request(topic, wait_ms), 2)
        for c in conns:
            c.sock.sendall(fetch)
            c.sent_at = time.time()  # the clock of the kernel's receive timestamps
        last_sent = time.monotonic()
        sent_s = conns[-1].sent_at - conns[0].sent_at

        # The window: nothing is produced, every connection has one fetch parked.
        _pump(sel, last_sent + min(0.5, window_s / 4))
        early_in_window = sum(len(c.frames) > 1 for c in conns)
        cpu0, w0 = proc_cpu_s(pid), time.monotonic()
        rss = [proc_rss_mb(pid)]
        while (now := time.monotonic()) < w0 + window_s:
            _pump(sel, min(now + 1.0, w0 + window_s))
            rss.append(proc_rss_mb(pid))
        cpu_pct = (proc_cpu_s(pid) - cpu0) / (time.monotonic() - w0) * 100

        # Then every fetch should be answered at its timeout.
        deadline = last_sent + wait_ms / 1000 + max(5.0, LATE_TOLERANCE_MS / 1000 * 3)
        _pump(sel, deadline, lambda: all(len(c.frames) > 1 or c.closed for c in conns))
    finally:
        for c in conns:
            c.sock.close()
        sel.close()

    delays, errors = [], 0
    for c in conns:
        if len(c.frames) < 2:
            continue
        at, frame = c.frames[1]
        delays.append((at - c.sent_at) * 1000 - wait_ms)
        try:
            resp = FetchResponse.decode(frame, version=12, header=True)
            part = resp.responses[0].partitions[0]
            if resp.error_code or part.error_code:
                errors += 1
        except Exception:  # noqa: BLE001 - an undecodable answer is an error, counted
            errors += 1
    early = sum(d < -5 for d in delays)  # the broker starts its timer after our send
    late = sum(d > LATE_TOLERANCE_MS for d in delays)
    on_time = len(delays) - early - late
    return {
        "connections": n, "wait_ms": wait_ms, "window_s": window_s,
        "connect_s": round(connect_s, 2), "send_s": round(sent_s, 3),
        "rss_before_mb": round(rss_before, 1), "rss_mb": round(max(rss), 1),
        "rss_per_conn_kb": round((max(rss) - rss_before) * 1024 / n, 1),
        "cpu_pct": round(cpu_pct, 2),
        "answered": len(delays), "answered_at_timeout": on_time, "early": early, "late": late,
        "answered_in_window": early_in_window, "closed": sum(c.closed for c in conns),
        "fetch_errors": errors,
        "late_ms_p50": round(statistics.median(delays), 1) if delays else None,
        "late_ms_max": round(max(delays), 1) if delays else None,
        "all_answered_at_timeout": on_time == n and errors == 0,
    }

