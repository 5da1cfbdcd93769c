"""The Connection's byte paths: frames received into owned buffers (BufferedProtocol), and the
responses of one loop iteration leaving in one write, over asyncio's and uvloop's transports,
plain and TLS, as well as over a recording transport."""

from __future__ import annotations

import asyncio
import ssl
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from broker.network.connection import Connection
from broker.network.request_channel import RequestChannel
from protocol.framing import FrameDecoder, encode_response
from tests.support.certs import make_pki
from tests.unit.test_mute import RecordingTransport, frame, make

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def produce_frame(correlation_id: int, records: bytes) -> bytes:
    req = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        ProduceRequest.TopicProduceData(name="t", partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])
    req.with_header(correlation_id=correlation_id, client_id="t")
    return bytes(req.encode(header=True, framed=True))


def metadata_frame(correlation_id: int, topics: int) -> bytes:
    req = MetadataRequest[4](topics=[MetadataRequest[4].MetadataRequestTopic(name=f"t{i:040d}")
                                     for i in range(topics)], allow_auto_topic_creation=False)
    req.with_header(correlation_id=correlation_id, client_id="t")
    return bytes(req.encode(header=True, framed=True))


def records_of(request: Any) -> memoryview:
    return request.body.topic_data[0].partition_data[0].records


# -- frames: owned, writable, never reused ---------------------------------------------------

def test_small_frames_are_copied_out_of_the_shared_buffer_into_their_own() -> None:
    conn, _, _, submitted = make()
    conn.data_received(produce_frame(1, b"a" * 100) + produce_frame(2, b"b" * 100))
    first, second = (records_of(r) for r in submitted)
    assert not first.readonly and isinstance(first.obj, bytearray)
    assert first.obj is not second.obj
    conn.data_received(produce_frame(3, b"c" * 100))  # the next read reuses the shared buffer
    assert bytes(first) == b"a" * 100 and bytes(second) == b"b" * 100
    first[0:1] = b"z"  # a handler may write into its frame (offsets assigned in place)
    assert bytes(records_of(submitted[2]))[:1] == b"c"


def test_a_large_frame_is_received_straight_into_its_own_buffer() -> None:
    conn, _, _, submitted = make()
    data = produce_frame(7, bytes(range(256)) * 400)  # ~100 KiB, above the direct threshold
    conn.buffer_updated(_receive(conn, data[:1000]))
    target = conn.get_buffer(-1)
    assert len(target) == len(data) - 1000  # exactly the rest of this frame, nothing after
    frame_buffer = target.obj
    assert isinstance(frame_buffer, bytearray) and len(frame_buffer) == len(data) - 4
    target[:] = data[1000:]  # what the kernel does: one copy, into the frame itself
    conn.buffer_updated(len(target))
    [request] = submitted
    assert records_of(request).obj is frame_buffer and not records_of(request).readonly
    assert bytes(records_of(request)) == bytes(range(256)) * 400


def _receive(conn: Connection, data: bytes) -> int:
    buf = conn.get_buffer(-1)
    buf[:len(data)] = data
    return len(data)


def test_decoder_direct_path_split_anywhere() -> None:
    bodies = [bytes([i]) * n for i, n in enumerate((10, 300, 5, 1000, 0, 64))]
    data = b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    for step in (1, 3, 7, 64, 333, len(data)):
        dec = FrameDecoder(2000, direct_min=32)
        out: list[bytearray] = []
        for i in range(0, len(data), step):
            out += dec.feed(data[i:i + step])
            assert dec.buffered <= 1004
        assert out == bodies and dec.buffered == 0
        assert all(type(f) is bytearray for f in out)


def test_the_size_limit_holds_when_it_is_lowered_while_a_large_frame_arrives() -> None:
    dec = FrameDecoder(1000, direct_min=32)
    assert dec.feed(struct.pack(">i", 500) + b"x" * 100) == []
    dec.max_size = 200  # e.g. SASL's receive size, from a (re-)authentication
    with pytest.raises(Exception, match="exceeds"):
        dec.feed(b"x" * 400)


# -- responses: one write per connection per iteration ----------------------------------------

class CountingTransport(RecordingTransport):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def write(self, data: bytes) -> None:
        self.calls += 1
        super().write(data)

    def writelines(self, parts: list[bytes]) -> None:
        self.calls += 1
        self.written.extend(parts)


def connected() -> tuple[list[Any], RequestChannel, Connection, CountingTransport]:
    """A connection on a counting transport whose channel only collects what is submitted."""
    submitted: list[Any] = []
    channel = RequestChannel(1, 10**9, dispatch=lambda r: None)
    channel.submit = submitted.append  # type: ignore[method-assign]
    conn = Connection(channel, serial=False, max_frame=1 << 20)
    transport = CountingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return submitted, channel, conn, transport


async def test_responses_completed_in_one_iteration_leave_in_one_write() -> None:
    submitted, channel, conn, transport = connected()
    conn.data_received(frame(1) + frame(2) + frame(3))
    held = channel.queued_bytes
    conn.finish(submitted[1], b"2")
    conn.finish(submitted[0], b"1")
    conn.finish(submitted[2], [b"3", memoryview(b"a"), bytearray(b"b")])  # a gather list
    assert transport.written == [] and conn.inflight == 3
    assert channel.queued_bytes == held + 1 + 1 + 3  # held until the socket takes them
    await asyncio.sleep(0)
    assert transport.calls == 1
    assert transport.written == [b"1", b"2", b"3", memoryview(b"a"), bytearray(b"b")]
    assert conn.inflight == 0 and channel.queued_bytes == 0


async def test_close_writes_the_answers_already_completed_first() -> None:
    submitted, channel, conn, transport = connected()
    conn.data_received(frame(1) + frame(2))
    conn.finish(submitted[0], b"1")
    conn.close("bad input after a good request")
    assert transport.written == [b"1"] and transport.closed
    await asyncio.sleep(0)
    assert transport.written == [b"1"]


# -- over real sockets: asyncio and uvloop, plain and TLS --------------------------------------

def _contexts(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    pki = make_pki(directory)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(pki.broker.cert, pki.broker.key)
    client = ssl.create_default_context(cafile=str(pki.ca_path))
    return server, client


async def _exchange(tls: tuple[ssl.SSLContext, ssl.SSLContext] | None) -> None:
    loop = asyncio.get_running_loop()
    seen: list[Any] = []
    conns: list[Connection] = []
    channel = RequestChannel(1, 10**9, dispatch=lambda r: None)

    def submit(request: Any) -> None:  # answer at once: odd ones as a gather list
        seen.append(request)
        cid = request.header.correlation_id
        body = struct.pack(">i", cid) * (cid * 1000)
        parts: Any = [body[:7], memoryview(body)[7:]] if cid % 2 else body
        request.connection.finish(request, encode_response(cid, False, parts))

    channel.submit = submit  # type: ignore[method-assign]

    class BufferedOnly(Connection):
        def data_received(self, data: bytes) -> None:
            raise AssertionError("the transport must read through get_buffer/buffer_updated")

    def factory() -> Connection:
        conn = BufferedOnly(channel, serial=False, max_frame=1 << 22)
        conns.append(conn)
        return conn

    server = await loop.create_server(factory, "127.0.0.1", 0, ssl=tls[0] if tls else None)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls[1] if tls else None,
        server_hostname="127.0.0.1" if tls else None)
    sent = [produce_frame(1, b"s" * 50), metadata_frame(2, 3), produce_frame(3, b"L" * 300_000),
            metadata_frame(4, 2500), produce_frame(5, b"m" * 20_000), produce_frame(6, b"t")]
    writer.write(b"".join(sent))
    for cid in range(1, 7):
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        payload = await reader.readexactly(size)
        assert struct.unpack_from(">i", payload)[0] == cid
        assert payload[4:] == struct.pack(">i", cid) * (cid * 1000)
    writer.close()
    server.close()
    await server.wait_closed()
    assert [r.header.correlation_id for r in seen] == [1, 2, 3, 4, 5, 6]
    assert bytes(records_of(seen[2])) == b"L" * 300_000
    assert not records_of(seen[2]).readonly and isinstance(records_of(seen[2]).obj, bytearray)
    assert len(seen[3].body.topics) == 2500
    assert bytes(records_of(seen[4])) == b"m" * 20_000
    assert conns[0].decoder.buffered == 0


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("loop_name", list(LOOPS))
def test_frames_and_responses_over_a_real_socket(loop_name: str, tls: bool,
                                                 tmp_path: Path) -> None:
    contexts = _contexts(tmp_path) if tls else None
    loop = LOOPS[loop_name]()
    try:
        loop.run_until_complete(asyncio.wait_for(_exchange(contexts), 20))
    finally:
        loop.close()


async def test_flush_responses_writes_the_ready_batch_within_the_iteration() -> None:
    from broker.network.connection import flush_responses

    submitted, channel, conn, transport = connected()
    conn.data_received(frame(1) + frame(2))
    conn.finish(submitted[0], b"1")
    conn.finish(submitted[1], b"2")
    flush_responses()  # what a handler does before it yields
    assert transport.written == [b"1", b"2"] and transport.calls == 1
    await asyncio.sleep(0)  # the scheduled turn finds nothing left
    assert transport.calls == 1
