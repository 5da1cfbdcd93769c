"""One client socket: the "processor" of Kafka's network layer, as an asyncio.Protocol.

It parses frames continuously and hands each request to the RequestChannel without waiting for
its response; responses come back through the sequencer in request order. Reading pauses while
any mute reason is set (memory, in-flight cap, serial mode) and resumes when all are clear.

With metrics on, the write of each response is timed. What asyncio lets us see: the
``transport.write`` call (uvloop buffers small writes and sends them at the end of the loop
iteration, so for those this is the hand-over, microseconds), and, when the transport's buffer
passes its high-water mark (64 KiB, a slow reader or a big fetch), pause_writing and then
resume_writing once it drained: responses written meanwhile count as sent only then. The
high-water mark is left at its default on purpose: lowering it to 0 to observe every send
would make uvloop write each response at once instead of coalescing them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from enum import IntFlag
from typing import TYPE_CHECKING

import structlog

from broker.network.request import Request
from broker.network.sequencer import ResponseSequencer
from broker.security.listener import PLAINTEXT_LISTENER, ListenerSecurity
from broker.security.principal import Session
from protocol.framing import FrameDecoder, FrameError, parse_request_header, peek_key_version
from protocol.registry import API_VERSIONS_KEY, APIS
from protocol.validate import schema_violation

if TYPE_CHECKING:
    from broker.network.request_channel import RequestChannel

log = structlog.get_logger("broker.network")
_channel_ids = itertools.count(1)

MAX_INFLIGHT_PER_CONNECTION = 128


class MuteReason(IntFlag):
    MEMORY = 1  # over its share of queued.max.request.bytes, or the broker over the whole
    INFLIGHT = 2  # this connection has too many requests in flight
    SERIAL = 4  # serial mode: one request at a time, as Kafka's processor does
    SHUTDOWN = 8  # the broker is draining: no new requests
    WRITE = 16  # the client is not reading: its transport's buffer passed the high-water mark
    BACKLOG = 32  # requests of this connection already wait for a handler turn


class Connection(asyncio.Protocol):
    def __init__(self, channel: RequestChannel, serial: bool, max_frame: int,
                 security: ListenerSecurity = PLAINTEXT_LISTENER) -> None:
        self.channel = channel
        self.security = security
        self.session = Session(listener=security.name,
                               security_protocol=security.security_protocol)
        self.channel_id = next(_channel_ids)
        self.serial = serial
        self.decoder = FrameDecoder(max_frame)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.closed = False
        self.mute = MuteReason(0)
        self._paused = False
        self._pending: deque[bytes] = deque()  # parsed frames not yet dispatched (serial mode)
        self.inflight = 0
        self.held_bytes = 0  # request and response bytes counted against the memory budget
        self._write_buffered = 0  # of which: unsent bytes in the transport's buffer
        self.last_active = time.monotonic()  # for connections.max.idle.ms
        self._registered = False
        self.sequencer: ResponseSequencer[Request] = ResponseSequencer(self._write, self._on_sent)
        self._timed = channel.metrics is not None
        self._write_started = 0.0  # when the latest response was handed to the transport
        self._draining = False  # the transport holds unsent bytes (metrics on only)
        self._undrained: list[Request] = []

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.session.client_host = peer[0] if peer else ""
        self._registered = self.channel.register(self, peer[0] if peer else "?")
        if not self._registered:  # over a connection limit: refused, counted and logged there
            self.closed = True
            transport.close()
            return
        log.info("connection opened", peer=self.peer, channel=self.channel_id)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_active = time.monotonic()
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            self.close(str(exc))
            return
        if frames:
            self._pending.extend(frames)
            self._dispatch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.sequencer.clear()
        self._pending.clear()
        if self._registered:
            self.channel.unregister(self)  # gives back every byte it held
            log.info("connection closed", peer=self.peer, channel=self.channel_id)

    # -- request path ----------------------------------------------------------------------
    def _dispatch(self) -> None:
        while self._pending and not self.closed:
            if self.serial and self.inflight:
                return
            request = self._parse(self._pending.popleft())
            if request is not None:
                if self.serial:
                    self.set_mute(MuteReason.SERIAL)
                self.channel.submit(request)

    def _parse(self, frame: bytes) -> Request | None:
        try:
            api_key, version = peek_key_version(frame)
            spec = APIS.get(api_key)
            if spec is None:
                self.close(f"unknown api key {api_key}")
                return None
            supported = spec.supports(version)
            if not supported and api_key != API_VERSIONS_KEY:
                self.close(f"unsupported version {version} of {spec.name}")
                return None
            # An ApiVersions request of a version we do not know is parsed as v0 (KIP-511).
            flexible = supported and spec.flexible(version)
            header, body_view = parse_request_header(frame, flexible)
            body = spec.request.decode(body_view, version=version) if supported else None
            problem = schema_violation(body, version) if body is not None else None
            if problem is not None:
                self.close(f"malformed {spec.name} v{version} request: {problem}")
                return None
        except FrameError as exc:
            self.close(str(exc))
            return None
        except Exception as exc:  # a body that does not match its schema
            self.close(f"malformed {APIS[api_key].name} v{version} request: {exc!r}")
            return None
        expects = body is None or body.expect_response()
        size = len(frame)
        request = Request(self, header, spec, body, expects, size, time.monotonic())
        if expects:
            self.sequencer.reserve(request)
        self.inflight += 1
        self.channel.hold(self, size)
        if self.inflight >= MAX_INFLIGHT_PER_CONNECTION:
            self.set_mute(MuteReason.INFLIGHT)
        return request

    def finish(self, request: Request, payload: bytes | None) -> None:
        """Called by the channel when a request is done; ``payload`` is its encoded response,
        None when it expects none (or when it failed and this connection is closing)."""
        if not request.expects_response:
            self.channel.release(self, request.size)
            if request.stats is not None:
                ready = request.ready
                request.stats.sent(request.received, ready, ready, ready)
            if not self.closed:
                self._done_one()
        elif payload is None:
            self.close(f"no response to a {request.spec.name} request that expects one")
        elif not self.closed:
            request.response_size = len(payload)
            self.channel.hold(self, request.response_size)  # until the socket has taken it
            self.sequencer.complete(request, payload)

    def response_allowance(self) -> int:
        """Response bytes this connection may still be given (its share of the budget)."""
        return self.channel.memory.allowance(self)

    def _write(self, payload: bytes) -> None:
        if self.transport is not None and not self.closed:
            if self._timed:
                self._write_started = time.monotonic()
            self.transport.write(payload)
            self.last_active = time.monotonic()

    def _sync_write_buffer(self) -> None:
        """Count what the transport still holds unsent (it sends what the socket takes at once)."""
        if self.transport is None or self.closed:
            return
        size = self.transport.get_write_buffer_size()
        delta, self._write_buffered = size - self._write_buffered, size
        if delta > 0:
            self.channel.hold(self, delta)
        elif delta < 0:
            self.channel.release(self, -delta)

    def _on_sent(self, request: Request) -> None:
        # The request's bytes and its response's are done with; what the transport could not
        # send yet stays counted as its buffer.
        self.channel.release(self, request.size + request.response_size)
        self._sync_write_buffer()
        stats = request.stats
        if stats is not None:
            request.write_started = self._write_started
            if self._draining:
                self._undrained.append(request)
            else:
                stats.sent(request.received, request.ready, request.write_started,
                           time.monotonic())
        self._done_one()

    # -- write flow: the transport's buffer passed its high-water mark, then drained ---------
    def pause_writing(self) -> None:
        self._draining = True
        self.set_mute(MuteReason.WRITE)

    def resume_writing(self) -> None:
        self._draining = False
        self._sync_write_buffer()
        self.clear_mute(MuteReason.WRITE)
        if self._undrained:
            end = time.monotonic()
            undrained, self._undrained = self._undrained, []
            for r in undrained:
                r.stats.sent(r.received, r.ready, r.write_started, end)  # type: ignore[union-attr]

    def _done_one(self) -> None:
        self.inflight -= 1
        if self.inflight < MAX_INFLIGHT_PER_CONNECTION:
            self.clear_mute(MuteReason.INFLIGHT)
        if self.serial and not self.inflight:
            self.clear_mute(MuteReason.SERIAL)
            self._dispatch()

    # -- mute flags ------------------------------------------------------------------------
    def set_mute(self, reason: MuteReason) -> None:
        if not self.mute & reason:
            events = self.channel.mute_events
            events[reason] = events.get(reason, 0) + 1
        self.mute |= reason
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def clear_mute(self, reason: MuteReason) -> None:
        if not self.mute & reason:
            return
        self.mute &= ~reason
        if self._paused and not self.mute and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def close(self, reason: str) -> None:
        """Close on bad input: logged once, nothing else on the broker is touched."""
        if self.closed:
            return
        log.warning("closing connection", peer=self.peer, channel=self.channel_id, reason=reason)
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def close_quietly(self) -> None:
        """Close without a warning (an idle timeout is not bad input; the quota counts it)."""
        if self.closed:
            return
        self.closed = True
        if self.transport is not None:
            self.transport.close()
