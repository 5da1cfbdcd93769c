"""RequestChannel: N handler queues, a connection always hashed onto the same one.

One queue per connection keeps validation and offset assignment in arrival order, while
different connections proceed on different handler tasks (pipelined request processing,
docs/design.md). A handler may return a response, None (acks=0), or an awaitable that finishes
later (parked in a purgatory, or waiting for an fsync); the handler moves on at once and the
sequencer puts the response in its place.

Each request is timed through its phases (see broker/metrics.py) when metrics are on:
``received`` (parsed), ``dequeued`` (a handler took it), ``local_done`` (the handler returned
an awaitable: parked; 0.0 when it answered at once), then the response is ready here and the
connection times the write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from kafka.protocol.api_message import ApiMessage

from broker.logging import debug_enabled
from broker.network.connection import MuteReason
from broker.network.request import Request
from protocol.framing import encode_response
from protocol.registry import API_VERSIONS_KEY, FETCH_KEY, JOIN_GROUP_KEY, SYNC_GROUP_KEY

if TYPE_CHECKING:
    from broker.metrics import BrokerMetrics
    from broker.network.connection import Connection

log = structlog.get_logger("broker.network")

SLOW_REQUEST_MS = 1000
# APIs whose requests wait by design (long poll, rebalance): slow only if their own work is.
_WAITS_BY_DESIGN = frozenset({FETCH_KEY, JOIN_GROUP_KEY, SYNC_GROUP_KEY})

HandlerResult = ApiMessage | Awaitable[ApiMessage | None] | None
Handler = Callable[["Request"], HandlerResult]


class RequestChannel:
    def __init__(self, num_queues: int, max_queued_bytes: int, dispatch: Handler,
                 metrics: BrokerMetrics | None = None) -> None:
        self.queues: list[asyncio.Queue[Request | None]] = [
            asyncio.Queue() for _ in range(num_queues)
        ]
        self.max_queued_bytes = max_queued_bytes
        self.queued_bytes = 0
        self.connections: set[Connection] = set()
        self._memory_muted: set[Connection] = set()
        self._dispatch = dispatch
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Future[Any]] = set()
        self.metrics = metrics
        self.connections_opened = 0
        self.mute_events: dict[MuteReason, int] = {}  # times each reason was set
        self._debug = debug_enabled()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._handler_loop(q)) for q in self.queues]

    def mute_all(self) -> None:
        """Read no further requests (shutdown); what is queued still gets its answer."""
        for conn in self.connections:
            conn.set_mute(MuteReason.SHUTDOWN)

    async def stop(self) -> None:
        """Let queued requests and parked responses finish, then stop the handler tasks."""
        for q in self.queues:
            q.put_nowait(None)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pending:
            await asyncio.wait(self._pending, timeout=5)

    # -- connections and memory --------------------------------------------------------------
    def register(self, conn: Connection) -> None:
        self.connections.add(conn)
        self.connections_opened += 1

    def unregister(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self._memory_muted.discard(conn)

    def hold(self, conn: Connection, size: int) -> None:
        self.queued_bytes += size
        if 0 <= self.max_queued_bytes < self.queued_bytes:
            conn.set_mute(MuteReason.MEMORY)
            self._memory_muted.add(conn)

    def release(self, size: int) -> None:
        self.queued_bytes -= size
        if self._memory_muted and self.queued_bytes <= self.max_queued_bytes:
            muted, self._memory_muted = self._memory_muted, set()
            for conn in muted:
                conn.clear_mute(MuteReason.MEMORY)

    # -- requests ---------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        conn = request.connection
        self.queues[hash(conn.channel_id) % len(self.queues)].put_nowait(request)

    async def _handler_loop(self, queue: asyncio.Queue[Request | None]) -> None:
        while (request := await queue.get()) is not None:
            if request.connection.closed:
                continue
            try:
                self.handle(request)
            except Exception as exc:  # a bug must cost one connection, never this handler
                self._fail(request, exc)

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
        if result is None or isinstance(result, ApiMessage):
            self._respond(request, result)
            return
        request.local_done = time.monotonic()
        fut = asyncio.ensure_future(result)
        self._pending.add(fut)
        fut.add_done_callback(lambda f: self._finished(request, f))

    def _finished(self, request: Request, fut: asyncio.Future[Any]) -> None:
        self._pending.discard(fut)
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
                log.info("slow request", **self._detail(request, now))
            elif self._debug:
                log.debug("request", **self._detail(request, now))

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
        log.error("request failed", api=request.spec.name, version=request.version,
                  exc_info=exc)
        if request.stats is not None:
            request.stats.failed()
            request.stats = None  # counted; no latency for a request that got no answer
        request.connection.close(f"internal error handling {request.spec.name}")
        request.connection.finish(request, None)
