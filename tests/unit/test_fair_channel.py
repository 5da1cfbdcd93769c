"""The request channel's fairness and memory budget, on real Connections over a recording
transport: round robin between connections, the share of the budget per connection, response
bytes held until the socket takes them, and the WRITE mute of a client that does not read."""

from __future__ import annotations

import asyncio

from kafka.protocol.metadata import ApiVersionsResponse

from broker.network.connection import Connection
from broker.network.mute import MuteReason
from broker.network.request_channel import RequestChannel
from tests.unit.test_mute import RecordingTransport, frame


class SlowTransport(RecordingTransport):
    """A client that does not read: whatever is written stays in the transport's buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.buffered = 0

    def write(self, data: bytes) -> None:
        super().write(data)
        self.buffered += len(data)

    def get_write_buffer_size(self) -> int:
        return self.buffered


def answer(request):  # type: ignore[no-untyped-def]
    return ApiVersionsResponse(error_code=0, api_keys=[], throttle_time_ms=0)


def connect(channel: RequestChannel, transport: RecordingTransport | None = None,
            ip: str = "127.0.0.1") -> tuple[Connection, RecordingTransport]:
    conn = Connection(channel, serial=False, max_frame=1 << 20)
    transport = transport or RecordingTransport()
    transport.get_extra_info = lambda name: (ip, 1) if name == "peername" else None  # type: ignore[method-assign]
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_a_calm_connection_waits_for_one_request_of_a_busy_one_not_all() -> None:
    order: list[int] = []

    def dispatch(request):  # type: ignore[no-untyped-def]
        order.append(request.connection.channel_id)
        return answer(request)

    channel = RequestChannel(1, 10**9, dispatch)
    busy, _ = connect(channel)
    calm, _ = connect(channel)
    busy.data_received(b"".join(frame(i) for i in range(50)))
    calm.data_received(frame(1))
    channel.start()
    for _ in range(200):
        await asyncio.sleep(0)
        if len(order) == 51:
            break
    await channel.stop()
    assert len(order) == 51
    assert order.index(calm.channel_id) <= 1, order[:5]


async def test_one_connection_cannot_hold_more_than_its_share() -> None:
    size = len(frame(1))
    channel = RequestChannel(1, 4 * size, answer)
    a, ta = connect(channel)
    b, tb = connect(channel)
    b.data_received(frame(1))  # b holds bytes too: the budget is split in two
    a.data_received(b"".join(frame(i) for i in range(3)))
    assert a.mute & MuteReason.MEMORY and ta.paused  # 3 frames > half of 4
    assert not b.mute & MuteReason.MEMORY
    channel.start()
    for _ in range(50):
        await asyncio.sleep(0)
    await channel.stop()
    assert not a.mute and not ta.paused  # answered: its bytes are back, it reads again
    assert channel.queued_bytes == 0


async def test_a_client_that_does_not_read_keeps_its_responses_counted_and_is_muted() -> None:
    channel = RequestChannel(1, 10**9, answer)
    conn, transport = connect(channel, SlowTransport())
    conn.data_received(frame(1))
    channel.start()
    for _ in range(20):
        await asyncio.sleep(0)
    written = sum(len(w) for w in transport.written)
    assert written > 0 and conn.held_bytes == written  # still in the transport's buffer
    conn.pause_writing()  # what the transport does past its high-water mark
    assert conn.mute & MuteReason.WRITE and transport.paused
    transport.buffered = 0  # the client read it all
    conn.resume_writing()
    assert conn.held_bytes == 0 and not conn.mute and not transport.paused
    await channel.stop()


async def test_a_calm_connection_is_read_while_others_hold_the_budget_past_their_share() -> None:
    """Clients that never read can take the total past the budget (a fetch's first batch goes
    out past the allowance); a connection within its share is still read and answered."""
    channel = RequestChannel(1, 1000, answer)
    greedy = [connect(channel)[0] for _ in range(3)]
    for g in greedy:
        channel.hold(g, 1)  # three holders: a share of 333 each
    for g in greedy:
        channel.hold(g, 700)  # each far past its share: the broker holds 2103 of 1000
    assert all(g.mute & MuteReason.MEMORY for g in greedy)
    calm, tc = connect(channel)
    calm.data_received(frame(1))
    assert channel.memory.used > channel.max_queued_bytes
    assert not calm.mute & MuteReason.MEMORY and not tc.paused
    channel.start()
    for _ in range(50):
        await asyncio.sleep(0)
    await channel.stop()
    assert calm.held_bytes == 0 and tc.written  # answered
    assert all(g.mute & MuteReason.MEMORY for g in greedy)  # still over their share


async def test_a_calm_connections_fetch_allowance_survives_others_past_the_budget() -> None:
    """Clients that never read hold the total past the budget for good; a calm connection's
    fetches still get its share (before, they were answered empty for as long as that lasted:
    a consumer beside them read nothing)."""
    channel = RequestChannel(1, 1000, answer)
    greedy = [connect(channel)[0] for _ in range(3)]
    for g in greedy:
        channel.hold(g, 1)
    for g in greedy:
        channel.hold(g, 700)
    calm, _ = connect(channel)
    channel.hold(calm, 50)  # its fetch request: four holders, a share of 250
    assert channel.memory.used > channel.max_queued_bytes
    assert calm.response_allowance() == 200
    assert all(g.response_allowance() == 0 for g in greedy)


async def test_fetch_allowance_is_the_share_left() -> None:
    channel = RequestChannel(1, 1000, answer)
    a, _ = connect(channel)
    b, _ = connect(channel)
    channel.hold(a, 300)
    channel.hold(b, 100)
    assert channel.memory.share() == 500
    assert a.response_allowance() == 200 and b.response_allowance() == 400
    channel.hold(a, 300)  # over its share: muted, nothing more for it
    assert a.response_allowance() == 0 and a.mute & MuteReason.MEMORY


async def test_connections_over_the_per_ip_limit_are_refused_and_counted() -> None:
    channel = RequestChannel(1, 10**9, answer, max_connections_per_ip=2, max_connections=3)
    first, _ = connect(channel)
    connect(channel)
    third, t3 = connect(channel)
    assert third.closed and t3.closed
    assert channel.quotas.refused["max.connections.per.ip"] == 1
    other, t_other = connect(channel, ip="10.0.0.9")  # another address still gets in
    assert not other.closed
    fourth, t4 = connect(channel, ip="10.0.0.8")
    assert t4.closed and channel.quotas.refused["max.connections"] == 1
    first.connection_lost(None)  # a slot frees
    again, t_again = connect(channel)
    assert not again.closed and not t_again.closed
