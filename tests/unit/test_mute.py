"""Mute flags of a Connection: reading pauses while any reason is set, resumes when all clear."""

import asyncio

from kafka.protocol.metadata import ApiVersionsRequest

from broker.network import connection as conn_mod
from broker.network.connection import Connection
from broker.network.mute import MuteReason
from broker.network.request_channel import RequestChannel


class RecordingTransport(asyncio.Transport):
    """The asyncio.Transport surface a Connection uses, recording what it was asked to do."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.pauses = 0
        self.written: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str):
        return ("127.0.0.1", 1) if name == "peername" else None

    def pause_reading(self) -> None:
        assert not self.paused
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        assert self.paused
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def writelines(self, parts: list[bytes]) -> None:  # one call, each part recorded
        self.written.extend(parts)

    def get_write_buffer_size(self) -> int:
        return 0  # everything written was taken at once

    def close(self) -> None:
        self.closed = True


def frame(correlation_id: int) -> bytes:
    req = ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
    req.with_header(correlation_id=correlation_id, client_id="t")
    return bytes(req.encode(header=True, framed=True))


def make(serial: bool = False, max_bytes: int = 10**9):
    submitted = []
    channel = RequestChannel(1, max_bytes, dispatch=lambda r: None)
    channel.submit = submitted.append  # observe what the connection hands over
    conn = Connection(channel, serial=serial, max_frame=1 << 20)
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, channel, transport, submitted


def test_serial_mode_dispatches_one_request_at_a_time():
    conn, channel, transport, submitted = make(serial=True)
    conn.data_received(frame(1) + frame(2))
    assert len(submitted) == 1
    assert conn.mute == MuteReason.SERIAL and transport.paused
    conn.finish(submitted[0], b"resp1")
    assert len(submitted) == 2  # the next one goes as soon as the first is answered
    assert transport.paused
    conn.finish(submitted[1], b"resp2")
    assert not transport.paused and conn.mute == MuteReason(0)
    assert transport.written == [b"resp1", b"resp2"]


def test_pipelined_mode_dispatches_everything_and_answers_in_order():
    conn, channel, transport, submitted = make()
    conn.data_received(frame(1) + frame(2) + frame(3))
    assert len(submitted) == 3 and not transport.paused
    conn.finish(submitted[2], b"3")
    conn.finish(submitted[0], b"1")
    assert transport.written == [b"1"]
    conn.finish(submitted[1], b"2")
    assert transport.written == [b"1", b"2", b"3"]


def test_memory_mute_until_bytes_are_released():
    size = len(frame(1)) - 4
    conn, channel, transport, submitted = make(max_bytes=size)
    conn.data_received(frame(1))
    assert not transport.paused  # exactly at the limit
    conn.data_received(frame(2))
    assert conn.mute & MuteReason.MEMORY and transport.paused
    assert channel.queued_bytes == 2 * size
    conn.finish(submitted[0], b"1")
    assert not transport.paused and channel.queued_bytes == size


def test_inflight_cap_mutes_and_two_reasons_need_both_cleared(monkeypatch):
    monkeypatch.setattr(conn_mod, "MAX_INFLIGHT_PER_CONNECTION", 2)
    size = len(frame(1)) - 4
    conn, channel, transport, submitted = make(max_bytes=size)
    conn.data_received(frame(1) + frame(2))
    assert conn.mute == MuteReason.INFLIGHT | MuteReason.MEMORY
    assert transport.pauses == 1
    conn.set_mute(MuteReason.SERIAL)
    conn.clear_mute(MuteReason.SERIAL)
    assert transport.paused  # still two reasons
    conn.finish(submitted[0], b"1")  # below the cap, and memory back at the limit
    assert not transport.paused and conn.mute == MuteReason(0)


def test_connection_lost_releases_held_bytes():
    conn, channel, transport, submitted = make()
    conn.data_received(frame(1) + frame(2))
    assert channel.queued_bytes > 0
    conn.connection_lost(None)
    assert channel.queued_bytes == 0 and conn not in channel.connections


def test_a_handler_without_a_response_closes_the_connection_instead_of_an_empty_frame():
    """A request that expects an answer and gets none must not leave the client waiting."""
    channel = RequestChannel(1, 10**9, dispatch=lambda r: None)
    conn = Connection(channel, serial=False, max_frame=1 << 20)
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    channel.submit = channel.handle  # type: ignore[method-assign]  # handle inline
    conn.data_received(frame(7))
    assert transport.closed and conn.closed
    assert transport.written == []
    conn.connection_lost(None)  # what the transport does once closed
    assert channel.queued_bytes == 0  # the request's bytes were given back
