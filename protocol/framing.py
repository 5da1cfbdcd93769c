"""Size-prefixed framing and the request/response headers; no I/O.

The size limit (socket.request.max.bytes) is checked on the 4-byte prefix, before a single byte
of the body is buffered, so an oversized request costs nothing but the connection.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kafka.protocol.api_header import RequestHeader

_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hh")
_RESPONSE_HEADER = struct.Struct(">ii")

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


class FrameDecoder:
    """Accumulates bytes and yields complete frames (without their size prefix)."""

    __slots__ = ("_buf", "max_size")

    def __init__(self, max_size: int) -> None:
        self._buf = bytearray()
        self.max_size = max_size

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        while len(buf) >= 4:
            (size,) = _SIZE.unpack_from(buf, 0)
            if size < 0:
                raise FrameError(f"negative frame size {size}")
            if size > self.max_size:
                raise FrameTooLarge(
                    f"frame of {size} bytes exceeds socket.request.max.bytes={self.max_size}"
                )
            end = 4 + size
            if len(buf) < end:
                break
            frames.append(bytes(buf[4:end]))
            del buf[:end]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


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


def encode_response(correlation_id: int, flexible_header: bool, body: bytes) -> bytes:
    """Frame a response: size, correlation id, empty tagged fields when header v1."""
    if flexible_header:
        return b"".join(
            (_RESPONSE_HEADER.pack(len(body) + 5, correlation_id), b"\x00", body)
        )
    return b"".join((_RESPONSE_HEADER.pack(len(body) + 4, correlation_id), body))
