import struct

import pytest
from kafka.protocol.metadata import MetadataRequest

from protocol.framing import (
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    encode_response,
    parse_request_header,
    peek_key_version,
)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_frames_split_across_reads_and_joined_in_one():
    dec = FrameDecoder(1024)
    data = frame(b"abcdefgh") + frame(b"12345678")
    assert dec.feed(data[:3]) == []
    assert dec.feed(data[3:12]) == [b"abcdefgh"]
    assert dec.feed(data[12:]) == [b"12345678"]
    assert dec.buffered == 0


def test_oversized_frame_refused_before_buffering_the_body():
    dec = FrameDecoder(100)
    with pytest.raises(FrameTooLarge, match="socket.request.max.bytes"):
        dec.feed(struct.pack(">i", 101))


def test_negative_size_is_a_frame_error():
    with pytest.raises(FrameError):
        FrameDecoder(100).feed(struct.pack(">i", -5))


def test_request_header_v2_and_body_view():
    req = MetadataRequest[12](topics=None, allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
    req.with_header(correlation_id=42, client_id="cli")
    raw = bytes(req.encode(header=True))
    assert peek_key_version(raw) == (3, 12)
    header, body = parse_request_header(raw, flexible=True)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        3, 12, 42, "cli")
    decoded = MetadataRequest.decode(body, version=12)
    assert decoded.topics is None and decoded.allow_auto_topic_creation is False


def test_truncated_header_is_a_frame_error():
    with pytest.raises(FrameError):
        peek_key_version(b"\x00\x03")
    with pytest.raises(FrameError):
        parse_request_header(b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x09ab", flexible=True)


def test_response_header_v0_and_v1():
    assert encode_response(7, False, b"xy") == struct.pack(">ii", 6, 7) + b"xy"
    assert encode_response(7, True, b"xy") == struct.pack(">ii", 7, 7) + b"\x00xy"
