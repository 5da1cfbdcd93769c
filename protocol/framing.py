"""Size-prefixed framing and the request/response headers; no I/O.

The size limit (socket.request.max.bytes) is checked on the 4-byte prefix, before a single byte
of the body is buffered, so an oversized request costs nothing but the connection.

Frames are received the way asyncio's BufferedProtocol hands bytes over: the transport asks
for a buffer (``get_buffer``), the kernel copies into it, and ``buffer_updated`` says how much.
Small frames land in one receive buffer shared by the connections of a thread (the loop reads
one socket at a time, and every frame is copied out before the next read) and are copied out
once, into a bytearray of their own. A frame larger than ``direct_min`` that is not complete
gets its own bytearray sized to the frame at once, and the rest of it is received straight into
that, so its bytes are copied only by the kernel. Either way a frame handed on is an owned,
writable bytearray that nothing reuses: handlers keep views of it (Produce's records are
assigned their offsets in place and written to disk later).
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

from kafka.protocol.api_header import RequestHeader

_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")
_RESPONSE_HEADER = struct.Struct(">ii")

# One receive buffer per thread (one event loop reads one socket at a time): a read of many
# small frames costs one system call, without a buffer of this size per connection.
RECEIVE_BUFFER_BYTES = 256 * 1024
# A frame above this size that is not complete yet is received into its own buffer directly.
DIRECT_MIN_BYTES = 16 * 1024

_threads = threading.local()

# Header v1 (client_id) and v2 (client_id + tagged fields), decoded by kafka-python's codecs
# straight from a memoryview so the request body is never copied to read the header.
_DECODE_HEADER_V1 = RequestHeader._struct.compiled_decode_from(
    1, compact=False, tagged=False, data_class=RequestHeader
)
_DECODE_HEADER_V2 = RequestHeader._struct.compiled_decode_from(
    2, compact=False, tagged=True, data_class=RequestHeader
)


class FrameError(Exception):
    """The byte stream cannot be trusted any more; the connection must close."""


class FrameTooLarge(FrameError):
    pass


def _receive_buffer() -> memoryview:
    """This thread's shared receive buffer (made on first use)."""
    view: memoryview | None = getattr(_threads, "receive", None)
    if view is None:
        view = _threads.receive = memoryview(bytearray(RECEIVE_BUFFER_BYTES))
    return view


class FrameDecoder:
    """Receives bytes (``get_buffer``/``buffer_updated``, or ``feed``) and hands out complete
    frames, without their size prefix, each an owned bytearray.

    Between reads it keeps either a short tail (a partial prefix, or the start of a small frame,
    copied back to the front of the shared buffer at the next read) or the large frame being
    received into directly.
    """

    __slots__ = ("max_size", "direct_min", "_rx", "_tail", "_base", "_frame", "_filled")

    def __init__(self, max_size: int, direct_min: int = DIRECT_MIN_BYTES) -> None:
        self.max_size = max_size
        self.direct_min = min(direct_min, RECEIVE_BUFFER_BYTES // 2)  # a tail fits the buffer
        self._rx = _receive_buffer()
        self._tail = b""  # bytes of the next frame(s) not yet handed out, at most direct_min
        self._base = 0  # where the tail ends in the shared buffer (the read goes after it)
        self._frame: bytearray | None = None  # a large frame being received into directly
        self._filled = 0  # its body bytes received so far

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next read goes: the rest of the large frame, else the shared buffer after
        the tail. Asking again without a ``buffer_updated`` in between is harmless."""
        frame = self._frame
        if frame is not None:
            return memoryview(frame)[self._filled:]
        rx, tail = self._rx, self._tail
        base = self._base = len(tail)
        if base:
            rx[:base] = tail
        return rx[base:]

    def buffer_updated(self, nbytes: int) -> list[bytearray]:
        """``nbytes`` were received into the last buffer given: the frames now complete."""
        frame = self._frame
        if frame is not None:
            self._filled += nbytes
            if self._filled < len(frame):
                return []
            self._frame = None
            self._check(len(frame))  # the limit may have been lowered since its prefix came
            return [frame]
        rx = self._rx
        end = self._base + nbytes
        frames: list[bytearray] = []
        pos = 0
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(rx, pos)
            if size < 0 or size > self.max_size:
                self._check(size)
            stop = pos + 4 + size
            if stop > end:
                if size > self.direct_min:  # its own buffer now; the rest goes straight there
                    have = end - pos - 4
                    frame = self._frame = bytearray(size)
                    frame[:have] = rx[pos + 4:end]
                    self._filled = have
                    self._tail = b""
                    return frames
                break
            frames.append(bytearray(rx[pos + 4:stop]))
            pos = stop
        self._tail = bytes(rx[pos:end]) if pos < end else b""
        return frames

    def feed(self, data: bytes) -> list[bytearray]:
        """Bytes already read (tests, in-process benchmarks): received as a transport would."""
        n = len(data)
        if not self._tail and self._frame is None and 0 < n <= len(self._rx):
            self._rx[:n] = data  # all of it fits the shared buffer: one read's worth
            self._base = 0
            return self.buffer_updated(n)
        frames: list[bytearray] = []
        view = memoryview(data)
        while view:
            buf = self.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            frames += self.buffer_updated(n)
            view = view[n:]
        return frames

    def _check(self, size: int) -> None:
        if size < 0:
            raise FrameError(f"negative frame size {size}")
        if size > self.max_size:
            raise FrameTooLarge(
                f"frame of {size} bytes exceeds socket.request.max.bytes={self.max_size}"
            )

    @property
    def buffered(self) -> int:
        """Bytes received and not handed out yet (size prefixes included)."""
        if self._frame is not None:
            return 4 + self._filled
        return len(self._tail)


@dataclass(slots=True)
class RequestHeaderView:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def peek_key_version(frame: bytes) -> tuple[int, int]:
    """API key and version, the two fields that decide how the rest is parsed."""
    if len(frame) < 8:
        raise FrameError(f"request of {len(frame)} bytes is shorter than a header")
    return _KEY_VERSION.unpack_from(frame, 0)


def parse_request_header(frame: bytes, flexible: bool) -> tuple[RequestHeaderView, memoryview]:
    """Decode header v1 or v2 and return it with a view of the body."""
    view = memoryview(frame)
    try:
        hdr, pos = (_DECODE_HEADER_V2 if flexible else _DECODE_HEADER_V1)(view, 0)
    except Exception as exc:  # kafka-python raises assorted errors on short/garbled input
        raise FrameError(f"malformed request header: {exc}") from exc
    header = RequestHeaderView(
        hdr.request_api_key, hdr.request_api_version, hdr.correlation_id, hdr.client_id
    )
    return header, view[pos:]


def encode_response(correlation_id: int, flexible_header: bool,
                    body: bytes | list[bytes]) -> bytes | list[bytes]:
    """Frame a response: size, correlation id, empty tagged fields when header v1. A body given
    as a list of parts (a gather list: a fixed part, then records as they were read) stays a
    list, with the header in front, so the parts are never joined before the socket."""
    if type(body) is list:
        size = sum(map(len, body))
        if flexible_header:
            return [_RESPONSE_HEADER.pack(size + 5, correlation_id) + b"\x00", *body]
        return [_RESPONSE_HEADER.pack(size + 4, correlation_id), *body]
    if flexible_header:
        return b"".join(
            (_RESPONSE_HEADER.pack(len(body) + 5, correlation_id), b"\x00", body)
        )
    return b"".join((_RESPONSE_HEADER.pack(len(body) + 4, correlation_id), body))
