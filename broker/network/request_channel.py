"""RequestChannel: requests from every connection, served round robin, within a memory budget.

Each connection's requests wait in their own FIFO, so validation and offset assignment stay in
arrival order per connection (pipelined request processing, docs/design.md); connections with
work take turns, one request per turn, so a client sending as fast as it can gets one turn per
round like everyone else and a calm client's request waits for at most one request of each busy
connection. The handler tasks give the event loop back every ``TURN_BUDGET_S`` of handling, so
socket reads, timers and the metrics endpoint are served in between.

A handler may return a response, None (acks=0), or a Completion of one
(broker/replica/delayed_result.py): answered now if it is done, else from the callback that
completes it (parked in a purgatory, or waiting for an fsync or a coordinator's write); the
handler moves on at once and the sequencer puts the response in its place. Memory:
broker/network/memory.py; connection limits: quotas.py.

Each request is timed through its phases (see broker/metrics.py) when metrics are on:
``received`` (parsed), ``dequeued`` (a handler took it), ``local_done`` (the handler returned
a Completion; 0.0 when it answered with a response), then the response is ready here and the
connection times the write.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog
from kafka.protocol.api_message import ApiMessage

from broker.logging import debug_enabled
from broker.network.memory import MemoryBudget
from broker.network.mute import MuteReason
from broker.network.quotas import ConnectionQuotas
from broker.network.request import RELEASED, Request
from broker.replica.delayed_result import Completion
from protocol.errors import InvalidRequest
from protocol.framing import encode_response
from protocol.registry import API_VERSIONS_KEY, FETCH_KEY, JOIN_GROUP_KEY, SYNC_GROUP_KEY
from protocol.templates import TEMPLATES

if TYPE_CHECKING:
    from broker.metrics.collector import BrokerMetrics
    from broker.network.connection import Connection

logger = structlog.get_logger("broker.network")

SLOW_REQUEST_MS = 1000
# APIs whose requests wait by design (long poll, rebalance): slow only if their own work is.
_WAITS_BY_DESIGN = frozenset({FETCH_KEY, JOIN_GROUP_KEY, SYNC_GROUP_KEY})
# Handling time after which a handler task yields to the event loop (seconds).
TURN_BUDGET_S = 0.002
# Requests of one connection waiting for their turn before that connection stops being read:
# a greedy client's next requests wait in its socket, not in the loop's reads and parses
# ahead of everyone else's.
MAX_WAITING_PER_CONNECTION = 4
UNLIMITED = 2**31 - 1  # Kafka's Int.MaxValue defaults of the connection limits

# What a handler answers at once: a message, or a response encoded from a template.
_ANSWERS = (ApiMessage, *TEMPLATES)
HandlerResult = ApiMessage | Completion[ApiMessage | None] | None
Handler = Callable[["Request"], HandlerResult]


class RequestChannel:
    def __init__(self, num_handlers: int, max_queued_bytes: int, dispatch: Handler,
                 metrics: BrokerMetrics | None = None, *, max_connections: int = UNLIMITED,
                 max_connections_per_ip: int = UNLIMITED, idle_ms: int = 600_000) -> None:
        self.num_handlers = num_handlers
        self.memory = MemoryBudget(max_queued_bytes)
        self.quotas = ConnectionQuotas(max_connections, max_connections_per_ip)
        self.idle_ms = idle_ms
        self.connections: dict[Connection, str] = {}  # connection -> client ip
        self._waiting: dict[Connection, deque[Request]] = {}  # requests not yet handled
        self._ready: deque[Connection] = deque()  # connections with waiting requests, in turn
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._dispatch = dispatch
        self._tasks: list[asyncio.Task[None]] = []
        # Requests whose answer is awaited, by what they wait on: the one bound method below
        # is every such Completion's continuation, so nothing is built per parked request.
        self._pending: dict[Completion[Any], Request] = {}
        self._on_answer = self._answered
        self.metrics = metrics
        self.connections_opened = 0
        self.mute_events: dict[MuteReason, int] = {}  # times each reason was set
        self._debug = debug_enabled()

    @property
    def max_queued_bytes(self) -> int:
        return self.memory.max_bytes

    @property
    def queued_bytes(self) -> int:
        return self.memory.used

    def waiting_requests(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._handler_loop())
                       for _ in range(self.num_handlers)]
        if self.idle_ms > 0:
            self._tasks.append(asyncio.create_task(self._idle_sweeper()))

    def mute_all(self) -> None:
        """Read no further requests (shutdown); what is queued still gets its answer."""
        for conn in self.connections:
            conn.set_mute(MuteReason.SHUTDOWN)

    async def stop(self) -> None:
        """Let queued requests and parked responses finish, then stop the handler tasks."""
        self._stopping = True
        self._wakeup.set()
        await asyncio.gather(*self._tasks[:self.num_handlers], return_exceptions=True)
        for t in self._tasks[self.num_handlers:]:
            t.cancel()
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=5)

    # -- connections and memory --------------------------------------------------------------
    def register(self, conn: Connection, ip: str) -> bool:
        """Admit a new connection unless it is over a connection limit."""
        if not self.quotas.admit(ip):
            return False
        self.connections[conn] = ip
        self.connections_opened += 1
        return True

    def unregister(self, conn: Connection) -> None:
        ip = self.connections.pop(conn, None)
        if ip is not None:
            self.quotas.release(ip)
        self._waiting.pop(conn, None)
        self.memory.forget(conn)

    def hold(self, conn: Connection, size: int) -> None:
        if conn in self.connections:
            self.memory.hold(conn, size)

    def release(self, conn: Connection, size: int) -> None:
        self.memory.release(conn, min(size, conn.held_bytes))

    async def _idle_sweeper(self) -> None:
        """connections.max.idle.ms: close connections with no traffic and nothing in flight."""
        interval = max(self.idle_ms / 10, 10) / 1000
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections):
                idle_ms = (now - conn.last_active) * 1000
                if idle_ms >= self.idle_ms and not conn.inflight and not conn.closed:
                    self.quotas.closed_idle(conn.peer, idle_ms)
                    conn.close_quietly()

    # -- requests: per-connection FIFOs served round robin ------------------------------------
    def submit(self, request: Request) -> None:
        conn = request.connection
        queue = self._waiting.get(conn)
        if queue is None:
            queue = self._waiting[conn] = deque()
        if not queue:
            self._ready.append(conn)
            self._wakeup.set()
        queue.append(request)
        if len(queue) >= MAX_WAITING_PER_CONNECTION:
            conn.set_mute(MuteReason.BACKLOG)

    async def _handler_loop(self) -> None:
        ready, waiting = self._ready, self._waiting
        turn_started = time.monotonic()
        while True:
            if not ready:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                turn_started = time.monotonic()
                continue
            conn = ready.popleft()
            queue = waiting.get(conn)
            if not queue:
                continue
            request = queue.popleft()
            if queue:
                ready.append(conn)  # its next request waits for everyone else's turn
            else:  # an idle connection keeps no empty queue (a deque is ~600 bytes)
                del waiting[conn]
            if conn.mute & MuteReason.BACKLOG and len(queue) < MAX_WAITING_PER_CONNECTION:
                conn.clear_mute(MuteReason.BACKLOG)
            if not conn.closed:
                try:
                    self.handle(request)
                except Exception as exc:  # a bug must cost one connection, never this handler
                    self._fail(request, exc)
            if time.monotonic() - turn_started > TURN_BUDGET_S:
                await asyncio.sleep(0)  # let reads, timers and the metrics endpoint run
                turn_started = time.monotonic()

    def handle(self, request: Request) -> None:
        request.dequeued = time.monotonic()
        metrics = self.metrics
        if metrics is not None:
            # The stats of this (API, version), bound once: one dict lookup on an int.
            header = request.header
            stats = metrics.stats.get(header.api_key << 16 | header.api_version)
            if stats is None or request.body is None:
                stats = metrics.stats_for(request)
            request.stats = stats
        try:
            result = self._dispatch(request)
        except Exception as exc:
            self._fail(request, exc)
            return
        if result is None or isinstance(result, _ANSWERS):
            self._respond(request, result)
            return
        request.local_done = time.monotonic()
        if result.done():  # completed while the handler ran: answer now
            self._finished(request, result)
            return
        # A delayed operation's answer: sent from the callback that completes it. Its builder
        # holds what the answer needs; the decoded request is let go meanwhile.
        request.body = RELEASED
        self._pending[result] = request
        result.on_done(self._on_answer)

    def _answered(self, fut: Completion[Any]) -> None:
        self._finished(self._pending.pop(fut), fut)

    def _finished(self, request: Request, fut: Completion[Any]) -> None:
        if fut.cancelled():
            request.connection.close("request cancelled at shutdown")
        elif (exc := fut.exception()) is not None:
            self._fail(request, exc)
        else:
            try:
                self._respond(request, fut.result())
            except Exception as exc:  # never leave the connection waiting for this answer
                self._fail(request, exc)

    def _respond(self, request: Request, response: ApiMessage | None) -> None:
        conn = request.connection
        if not request.expects_response:
            request.ready = time.monotonic()
            self._completed(request, response)
            conn.finish(request, None)
            return
        if response is None:
            self._fail(request, RuntimeError(f"the {request.spec.name} handler gave no response"))
            return
        version = request.version if request.body is not None else 0
        try:
            body = response.encode(version=version)
        except Exception as exc:  # a handler built a response its version cannot carry
            self._fail(request, exc)
            return
        # ApiVersions always answers with response header v0, so old clients can read it.
        flexible = request.spec.key != API_VERSIONS_KEY and request.spec.flexible(version)
        payload = encode_response(request.header.correlation_id, flexible, body)
        request.ready = time.monotonic()
        self._completed(request, response)
        conn.finish(request, payload)

    def _completed(self, request: Request, response: ApiMessage | None) -> None:
        """Metrics, the slow-request line and the debug line, once the response is built."""
        now = request.ready
        stats = request.stats
        if stats is not None:
            stats.completed(request, response, now)
        elapsed_ms = (now - request.received) * 1000
        if elapsed_ms > SLOW_REQUEST_MS or self._debug:
            parked = request.local_done
            remote_ms = (now - parked) * 1000 if parked else 0.0
            if elapsed_ms > SLOW_REQUEST_MS and (
                    request.spec.key not in _WAITS_BY_DESIGN
                    or elapsed_ms - remote_ms > SLOW_REQUEST_MS):
                logger.info("slow request", **self._detail(request, now))
            elif self._debug:
                logger.debug("request", **self._detail(request, now))

    @staticmethod
    def _detail(request: Request, now: float) -> dict[str, Any]:
        """Per-request fields for the log: names, sizes and times, never the payload."""
        parked = request.local_done
        local_end = parked or now
        conn = request.connection
        return {
            "api": request.spec.name, "version": request.version,
            "correlation_id": request.header.correlation_id,
            "client_id": request.header.client_id, "peer": conn.peer,
            "channel": conn.channel_id, "bytes": request.size,
            "queue_ms": round((request.dequeued - request.received) * 1000, 3),
            "local_ms": round((local_end - request.dequeued) * 1000, 3),
            "remote_ms": round((now - parked) * 1000, 3) if parked else 0.0,
            "ms": round((now - request.received) * 1000, 3),
        }

    def _fail(self, request: Request, exc: BaseException) -> None:
        if isinstance(exc, InvalidRequest):  # bad input, refused as Kafka's parser refuses it
            request.connection.close(
                f"malformed {request.spec.name} v{request.version} request: {exc}")
        else:
            logger.error("request failed", api=request.spec.name, version=request.version,
                      exc_info=exc)
        if request.stats is not None:
            request.stats.failed()
            request.stats = None  # counted; no latency for a request that got no answer
        request.connection.close(f"internal error handling {request.spec.name}")
        request.connection.finish(request, None)
