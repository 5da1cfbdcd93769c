"""RequestChannel: N handler queues, a connection always hashed onto the same one.

One queue per connection keeps validation and offset assignment in arrival order (seed 004),
while different connections proceed on different handler tasks. A handler may return a
response, None (acks=0), or an awaitable that finishes later (parked in a purgatory, or waiting
for an fsync); the handler moves on at once and the sequencer puts the response in its place.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from kafka.protocol.api_message import ApiMessage

from broker.network.connection import MuteReason
from broker.network.sequencer import Slot
from protocol.framing import RequestHeaderView, encode_response
from protocol.registry import API_VERSIONS_KEY, ApiSpec

if TYPE_CHECKING:
    from broker.network.connection import Connection

log = structlog.get_logger("broker.network")

HandlerResult = ApiMessage | Awaitable[ApiMessage | None] | None
Handler = Callable[["Request"], HandlerResult]


@dataclass(slots=True)
class Request:
    connection: Connection
    header: RequestHeaderView
    spec: ApiSpec
    body: Any  # the decoded request; None for an ApiVersions of a version we do not serve
    slot: Slot | None
    size: int
    received: float

    @property
    def version(self) -> int:
        return self.header.api_version


class RequestChannel:
    def __init__(self, num_queues: int, max_queued_bytes: int, dispatch: Handler) -> None:
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
            self.handle(request)

    def handle(self, request: Request) -> None:
        try:
            result = self._dispatch(request)
        except Exception as exc:
            self._fail(request, exc)
            return
        if result is None or isinstance(result, ApiMessage):
            self._respond(request, result)
            return
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
            self._respond(request, fut.result())

    def _respond(self, request: Request, response: ApiMessage | None) -> None:
        conn = request.connection
        if response is None or request.slot is None:
            conn.finish(request, None)
            return
        version = request.version if request.body is not None else 0
        try:
            body = response.encode(version=version)
        except Exception as exc:  # a handler built a response its version cannot carry
            self._fail(request, exc)
            return
        # ApiVersions always answers with response header v0, so old clients can read it.
        flexible = request.spec.key != API_VERSIONS_KEY and request.spec.flexible(version)
        conn.finish(request, encode_response(request.header.correlation_id, flexible, body))
        elapsed_ms = (time.monotonic() - request.received) * 1000
        if elapsed_ms > 1000 and request.spec.key not in (1,):
            log.info("slow request", api=request.spec.name, ms=round(elapsed_ms))

    def _fail(self, request: Request, exc: BaseException) -> None:
        log.error("request failed", api=request.spec.name, version=request.version,
                  exc_info=exc)
        request.connection.close(f"internal error handling {request.spec.name}")
        request.connection.finish(request, None)
