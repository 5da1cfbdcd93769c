"""One client socket: the "processor" of Kafka's network layer, as an asyncio.BufferedProtocol.

It receives frames into buffers it owns (protocol/framing.py: the kernel copies into a shared
receive buffer, or straight into a large frame's own bytearray), parses them continuously and
hands each request to the RequestChannel without waiting for its response. Reading pauses while
any mute reason is set (memory, in-flight cap, serial mode) and resumes when all are clear.

Responses come back through the sequencer in request order, and those completed within one
loop iteration leave together: the first one ready asks the thread's WriteFlusher for a turn
(one ``loop.call_soon`` for all connections), which writes each connection's batch with one
``transport.writelines``: one system call per connection per iteration, however many requests
it pipelined (uvloop sends each write at once). A response of 64 KiB or more goes at once,
with whatever is ready before it: a client that does not read it is then seen (pause_writing)
before the loop reads more of its requests. A response is bytes or a gather list of parts.
Without a running loop (unit tests, the in-process benchmark) the batch is written at once.

With metrics on, the write of each batch is timed. What asyncio lets us see: the write call
(the hand-over, microseconds), and, when the transport's buffer passes its high-water mark
(64 KiB, a slow reader or a big fetch), pause_writing and then resume_writing once it drained:
responses written meanwhile count as sent only then.

On a SASL listener a SaslAuthenticator decides what may come before authentication (Kafka's
SaslServerAuthenticator): ApiVersions and SaslHandshake, then SaslAuthenticate, one request at
a time (SASL mute) so each answer is known before the next frame is read, frames no larger
than sasl.server.max.receive.size, bare tokens after SaslHandshake v0. Once authenticated the
gate is off, unless the session has a lifetime (connections.max.reauth.ms): then each frame is
checked for the re-authentication's SaslHandshake and for the session's expiry. A failed
authentication's answer is written and then the connection closes (``Request.close_after``).
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from broker.network.mute import MuteReason
from broker.network.request import Request
from broker.network.sequencer import Payload, ResponseSequencer, payload_size
from broker.security.listener import PLAINTEXT_LISTENER, ListenerSecurity
from broker.security.principal import Session
from broker.security.sasl import SASL_HANDSHAKE_KEY, SaslAuthenticator
from protocol.framing import (
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    parse_request_header,
    peek_key_version,
)
from protocol.registry import API_VERSIONS_KEY, APIS
from protocol.validate import schema_violation

if TYPE_CHECKING:
    from broker.network.request_channel import RequestChannel

logger = structlog.get_logger("broker.network")
_channel_ids = itertools.count(1)

MAX_INFLIGHT_PER_CONNECTION = 128
# A response this large is written when it is ready instead of at the end of the iteration
# (the transports' default high-water mark: past it, pause_writing tells of a slow reader).
WRITE_AT_ONCE_BYTES = 64 * 1024
_SIZE = struct.Struct(">i")
_KEY = struct.Struct(">h")
# What the SASL gate says of the next frame.
_PARSE, _CONSUMED, _STOP = 0, 1, 2


class WriteFlusher:
    """Once per loop iteration, every connection with responses ready writes them: one
    callback scheduled for all of them, at the first response ready in the iteration."""

    __slots__ = ("loop", "_dirty")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._dirty: list[Connection] = []

    def add(self, conn: Connection) -> None:
        dirty = self._dirty
        if not dirty:
            self.loop.call_soon(self._run)
        dirty.append(conn)

    def run(self) -> None:
        """Write now what is ready (e.g. at the end of a handler's turn, before it yields: the
        answers leave in this iteration instead of the next); the scheduled turn then finds
        less or nothing to do."""
        if self._dirty:
            self._run()

    def _run(self) -> None:
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            try:
                conn.flush()
            except Exception as exc:  # a bug costs one connection, never the others' answers
                logger.error("response write failed", peer=conn.peer, channel=conn.channel_id,
                          exc_info=exc)
                conn.close("internal error writing responses")


_threads = threading.local()


def flush_responses() -> None:
    """Write every connection's ready responses of this thread's loop now."""
    flusher: WriteFlusher | None = getattr(_threads, "flusher", None)
    if flusher is not None:
        flusher.run()


def _flusher() -> WriteFlusher | None:
    """The running loop's flusher (one per thread and loop); None without a running loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    flusher: WriteFlusher | None = getattr(_threads, "flusher", None)
    if flusher is None or flusher.loop is not loop:
        flusher = _threads.flusher = WriteFlusher(loop)
    return flusher


class Connection(asyncio.BufferedProtocol):
    # Slotted, and what is often empty made on first use: thousands of connections may each
    # hold nothing but a parked long poll, and each byte here is paid per connection.
    __slots__ = ("channel", "security", "session", "channel_id", "serial", "decoder",
                 "transport", "peer", "closed", "mute", "_paused", "_pending", "inflight",
                 "held_bytes", "_write_buffered", "last_active", "_registered", "sequencer",
                 "_flusher", "_timed", "_write_started", "_draining", "_undrained",
                 "_max_frame", "auth", "_gated", "_wake_when_idle")

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
        # Frames not yet dispatched (serial mode, SASL): None when there are none.
        self._pending: deque[bytearray] | None = None
        self.inflight = 0
        self.held_bytes = 0  # request and response bytes counted against the memory budget
        self._write_buffered = 0  # of which: unsent bytes in the transport's buffer
        self.last_active = time.monotonic()  # for connections.max.idle.ms
        self._registered = False
        self.sequencer: ResponseSequencer[Request] = ResponseSequencer(self._responses_ready)
        self._flusher: WriteFlusher | None = None  # set in connection_made, with the loop
        self._timed = channel.metrics is not None
        self._write_started = 0.0  # when the latest response was handed to the transport
        self._draining = False  # the transport holds unsent bytes (metrics on only)
        self._undrained: list[Request] | None = None  # sent while draining (metrics on)
        self._max_frame = max_frame
        # SASL listeners: the authenticator, and whether frames pass its gate (the only test
        # the request path makes per frame; off once authenticated without a session lifetime)
        self.auth: SaslAuthenticator | None = None
        self._gated = False
        # Dispatch again when nothing is in flight: serial mode, or the SASL mute is set.
        self._wake_when_idle = serial
        if security.uses_sasl and security.sasl is not None:
            self.auth = SaslAuthenticator(security.sasl, self.session, self.peer,
                                          on_authenticated=self._authenticated)
            self._gated = True
            self.decoder.max_size = min(max_frame, security.sasl.max_receive_size)

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self._flusher = _flusher()
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.session.client_host = peer[0] if peer else ""
        self._registered = self.channel.register(self, peer[0] if peer else "?")
        if not self._registered:  # over a connection limit: refused, counted and logged there
            self.closed = True
            transport.close()
            return
        logger.debug("connection opened", peer=self.peer, channel=self.channel_id)
        if self.security.ssl_context is not None and not self._tls_principal(transport):
            return
        if self.auth is not None:
            self.auth.peer = self.peer
        elif self.security.uses_sasl:
            self.close(f"listener {self.security.name} has no SASL settings")

    def _tls_principal(self, transport: asyncio.BaseTransport) -> bool:
        """The principal of the client's certificate, taken here because the TLS handshake is
        done and the client's first request may arrive in the same read as its last handshake
        message. False (closed) when no ssl.principal.mapping.rules rule applies, as Kafka."""
        try:
            self.session.principal = self.security.principal_builder(
                transport.get_extra_info("ssl_object"))
        except ValueError as exc:
            self.close(f"TLS client certificate not mapped to a principal: {exc}")
            return False
        return True

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        self._received(self.decoder.buffer_updated, nbytes)

    def data_received(self, data: bytes) -> None:
        """Bytes already read (tests, the in-process benchmark): received as a read would."""
        if self.closed:
            return
        self._received(self.decoder.feed, data)

    def _received(self, decode: Callable[[Any], list[bytearray]], arg: Any) -> None:
        self.last_active = time.monotonic()
        try:
            frames = decode(arg)
        except FrameTooLarge as exc:
            if self.auth is not None and not self.auth.ready:  # Kafka's InvalidReceiveException
                self.auth.fail("Failing SASL authentication due to invalid receive size "
                               f"({exc})")
                self.close_quietly()
            else:
                self.close(str(exc))
            return
        except FrameError as exc:
            self.close(str(exc))
            return
        if frames:
            pending = self._pending
            if pending is None:
                self._pending = deque(frames)
            else:
                pending.extend(frames)
            self._dispatch()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.sequencer.clear()
        self._pending = None
        if self._registered:
            self.channel.unregister(self)  # gives back every byte it held
            logger.debug("connection closed", peer=self.peer, channel=self.channel_id)

    # -- request path ----------------------------------------------------------------------
    def _dispatch(self) -> None:
        pending = self._pending
        while pending and not self.closed:
            if self.serial and self.inflight:
                return
            if self._gated:
                verdict = self._sasl_gate()
                if verdict == _STOP:
                    return
                if verdict == _CONSUMED:
                    continue
            request = self._parse(pending.popleft())
            if request is not None:
                if self.serial:
                    self.set_mute(MuteReason.SERIAL)
                self.channel.submit(request)
        if not pending and self._pending is pending:
            self._pending = None

    def _parse(self, frame: bytearray) -> Request | None:
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

    # -- SASL ----------------------------------------------------------------------------------
    def _sasl_gate(self) -> int:
        """The next frame under SASL: parse it (_PARSE), handled here (_CONSUMED: a bare
        token), or not now (_STOP: waiting for the answer in flight, or closed)."""
        auth = self.auth
        assert auth is not None
        pending = self._pending
        assert pending
        frame = pending[0]
        if auth.ready:  # authenticated, with a session lifetime
            if (len(frame) >= 2 and _KEY.unpack_from(frame)[0] == SASL_HANDSHAKE_KEY
                    and auth.may_reauthenticate()):
                if self.inflight:  # the answers before it go first
                    self._wake_when_idle = True
                    self.set_mute(MuteReason.SASL)
                    return _STOP
                auth.begin_reauthentication()
                self.decoder.max_size = min(self._max_frame, auth.config.max_receive_size)
                return _PARSE
            if auth.expired():
                logger.info("closing connection", peer=self.peer, channel=self.channel_id,
                         reason="SASL session expired", principal=str(self.session.principal))
                self.close_quietly()
                return _STOP
            return _PARSE
        if self.inflight:
            self._wake_when_idle = True
            self.set_mute(MuteReason.SASL)
            return _STOP
        if auth.raw:  # after SaslHandshake v0: a bare token, answered bare, in order
            token = pending.popleft()
            response = auth.raw_token(token)
            if response is None:
                self.close_quietly()
                return _STOP
            self._write(_SIZE.pack(len(response)) + response)
            return _CONSUMED
        try:
            api_key, version = peek_key_version(frame)
        except FrameError:
            return _PARSE  # the parser closes it with the reason
        if auth.admit(api_key, version) is not None:  # refused, counted and logged there
            self.close_quietly()
            return _STOP
        return _PARSE

    def _authenticated(self) -> None:
        """The authenticator's news: requests of any size and API from now on; the gate stays
        only to watch a session lifetime."""
        auth = self.auth
        assert auth is not None
        self.decoder.max_size = self._max_frame
        self._gated = auth.expires_at is not None

    def finish(self, request: Request, payload: Payload | None) -> None:
        """Called by the channel when a request is done; ``payload`` is its encoded response
        (bytes, or a gather list of parts), None when it expects none (or when it failed and
        this connection is closing)."""
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
            request.response_size = (len(payload) if type(payload) is not list
                                     else payload_size(payload))
            self.channel.hold(self, request.response_size)  # until the socket has taken it
            self.sequencer.complete(request, payload)  # type: ignore[arg-type]
            if request.response_size >= WRITE_AT_ONCE_BYTES and self.sequencer.has_ready:
                # Large: nothing to gain by waiting, and a client that does not read it must
                # be seen (pause_writing, the WRITE mute) before more of its requests are read.
                self.flush()

    def _responses_ready(self) -> None:
        """The sequencer's news that a batch begins: it leaves at the end of the loop's
        iteration with every other connection's (at once without a running loop)."""
        flusher = self._flusher
        if flusher is None:
            self.flush()
        else:
            flusher.add(self)

    def response_allowance(self) -> int:
        """Response bytes this connection may still be given (its share of the budget)."""
        return self.channel.memory.allowance(self)

    def flush(self) -> None:
        """Write every ready response with one call, then account for them as sent."""
        ready = self.sequencer.take()
        if not ready:
            return
        if len(ready) == 1:  # the common case: one response, one bytes object or gather list
            parts: Any = ready[0].payload
        else:
            parts = []
            for request in ready:
                payload = request.payload
                if type(payload) is list:
                    parts += payload
                else:
                    parts.append(payload)
        transport = self.transport
        if transport is not None and not self.closed:
            if self._timed:
                self._write_started = time.monotonic()
            if type(parts) is not list:
                transport.write(parts)
            elif len(parts) == 1:
                transport.write(parts[0])
            else:
                transport.writelines(parts)
            self.last_active = time.monotonic()
        self._on_sent(ready)

    def _write(self, payload: bytes) -> None:
        """A write outside the sequence (a bare SASL token, answered when nothing is in flight)."""
        if self.transport is not None and not self.closed:
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

    def _on_sent(self, sent: list[Request]) -> None:
        # The requests' bytes and their responses' are done with; what the transport could not
        # send yet stays counted as its buffer.
        held = 0
        for request in sent:
            held += request.size + request.response_size
            request.payload = b""
        self.channel.release(self, held)
        self._sync_write_buffer()
        now = time.monotonic() if self._timed else 0.0
        for request in sent:
            stats = request.stats
            if stats is not None:
                request.write_started = self._write_started
                if self._draining:
                    if self._undrained is None:
                        self._undrained = []
                    self._undrained.append(request)
                else:
                    stats.sent(request.received, request.ready, request.write_started, now)
            if request.close_after:  # a failed authentication: its answer is out, now close
                self._close_after_answer()
            self._done_one()

    def _close_after_answer(self) -> None:
        """A failed authentication's answer is out: read nothing more, and close after
        connection.failed.authentication.delay.ms, as Kafka delays it. Closing at once can put
        the end of the stream (or a reset, with client bytes unread) right behind the answer,
        and a client may then see a dropped connection instead of Kafka's error."""
        delay_ms = self.auth.config.failed_close_delay_ms if self.auth is not None else 0
        transport = self.transport
        if self.closed or transport is None or delay_ms <= 0:
            self.close_quietly()
            return
        self.closed = True
        asyncio.get_running_loop().call_later(delay_ms / 1000, transport.close)

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
            undrained, self._undrained = self._undrained, None
            for r in undrained:
                r.stats.sent(r.received, r.ready, r.write_started, end)  # type: ignore[union-attr]

    def _done_one(self) -> None:
        self.inflight -= 1
        if self.inflight < MAX_INFLIGHT_PER_CONNECTION:
            self.clear_mute(MuteReason.INFLIGHT)
        if self._wake_when_idle and not self.inflight:
            self._wake_when_idle = self.serial
            self.clear_mute(MuteReason.SERIAL | MuteReason.SASL)
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
        logger.warning("closing connection", peer=self.peer, channel=self.channel_id, reason=reason)
        if self.sequencer.has_ready:  # answers completed before the close still go out first
            self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def close_quietly(self) -> None:
        """Close without a warning (an idle timeout is not bad input; the quota counts it)."""
        if self.closed:
            return
        if self.sequencer.has_ready:  # answers completed before the close still go out first
            self.flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()
