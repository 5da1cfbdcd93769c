"""FrameDecoder and the request header readers under arbitrary bytes: the only thing they may
raise is FrameError (the connection closes), and no frame above the limit ever comes out."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.framing import FrameDecoder, FrameError, parse_request_header, peek_key_version

LIMIT = 512
FAST = settings(max_examples=400, deadline=None, database=None)


def _framed(bodies: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(b)) + b for b in bodies)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


@FAST
@given(bodies=st.lists(st.binary(max_size=LIMIT), max_size=8),
       cuts=st.lists(st.integers(min_value=0), max_size=20))
def test_valid_stream_split_anywhere_gives_back_its_frames(bodies, cuts) -> None:
    decoder = FrameDecoder(LIMIT)
    out: list[bytes] = []
    for chunk in _split(_framed(bodies), cuts):
        out += decoder.feed(chunk)
    assert out == bodies
    assert decoder.buffered == 0


@FAST
@given(limit=st.integers(min_value=0, max_value=LIMIT),
       chunks=st.lists(st.one_of(
           st.binary(max_size=64),
           # Mostly plausible sizes, so frames do come out (and some sit right at the limit).
           st.integers(min_value=-4, max_value=LIMIT + 4).map(lambda n: struct.pack(">i", n)),
       ), max_size=30))
def test_arbitrary_bytes_raise_only_frame_errors(limit, chunks) -> None:
    decoder = FrameDecoder(limit)
    fed = taken = 0
    for chunk in chunks:
        try:
            frames = decoder.feed(chunk)
        except FrameError:
            return  # the connection closes here; nothing after matters
        fed += len(chunk)
        for frame in frames:
            assert len(frame) <= limit
            taken += 4 + len(frame)
        # Every byte is either handed out (with its size prefix) or still buffered.
        assert taken + decoder.buffered == fed


@FAST
@given(frame=st.binary(max_size=64), flexible=st.booleans())
def test_request_header_readers_raise_only_frame_errors(frame, flexible) -> None:
    try:
        key, version = peek_key_version(frame)
        header, body = parse_request_header(frame, flexible)
    except FrameError:
        return
    assert (header.api_key, header.api_version) == (key, version)
    assert frame.endswith(bytes(body))
