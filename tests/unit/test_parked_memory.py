"""What a parked long poll keeps alive. Thousands of idle consumers each hold one parked Fetch,
so the broker's memory per connection is the sum of these objects: the classes on that path
stay slotted (no instance dict), and a parked request keeps nothing of its decoded body."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker import apis
from broker.network.connection import Connection
from broker.network.request import RELEASED, Request
from broker.network.request_channel import RequestChannel
from broker.network.sequencer import ResponseSequencer
from broker.replica.delayed_fetch import DelayedFetch
from broker.replica.delayed_result import Completion
from broker.replica.fetch_session import CachedPartition
from broker.replica.replica_manager import PartitionFetch
from broker.security.principal import Session
from protocol.framing import FrameDecoder, RequestHeaderView
from tests.support.components import CLIENT_ID, Components, build, settle
from tests.support.requests import correlation_id_of, fetch_request, fetch_response
from tests.unit.test_mute import RecordingTransport

TOPIC = "idle"

PER_PARKED_FETCH = [Connection, Session, FrameDecoder, ResponseSequencer, Request,
                    RequestHeaderView, DelayedFetch, Completion, PartitionFetch, CachedPartition]


@pytest.mark.parametrize("cls", PER_PARKED_FETCH, ids=lambda c: c.__name__)
def test_what_a_parked_fetch_holds_has_no_instance_dict(cls: type) -> None:
    assert cls.__dictoffset__ == 0, f"{cls.__name__} instances carry a __dict__"


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs")
    yield c
    await c.close()


def _codec_objects() -> int:
    """kafka-python Fetch objects alive: decoded requests, their topics and partitions."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if _is_fetch_codec(type(o)))


def _is_fetch_codec(t: type) -> bool:
    module = t.__dict__.get("__module__")
    return (isinstance(module, str) and module.startswith("kafka.protocol")
            and t.__name__.startswith("Fetch"))


async def test_a_parked_fetch_keeps_nothing_of_its_decoded_request(parts: Components) -> None:
    parts.topics.create_topic(TOPIC, 1, {})
    handled: list[Request] = []

    def dispatch(request: Request):  # type: ignore[no-untyped-def]
        handled.append(request)
        return apis.HANDLERS[request.spec.key](parts.context, request)

    channel = RequestChannel(1, 10**9, dispatch)
    conn = Connection(channel, serial=False, max_frame=1 << 20)
    transport = RecordingTransport()
    conn.connection_made(transport)
    channel.start()
    client = fetch_request([(TOPIC, 0, 0)], max_wait_ms=30_000)
    client.with_header(correlation_id=7, client_id=CLIENT_ID)
    frame = bytes(client.encode(header=True, framed=True))
    del client
    before = _codec_objects()

    conn.data_received(frame)
    await settle()
    [parked] = handled
    assert not transport.written and conn.inflight == 1  # parked on the empty partition
    assert parked.body is RELEASED
    assert _codec_objects() == before  # the decoded FetchRequest, topics, partitions: gone

    await parts.advance(30_000)  # still answered at its timeout, from what the handler kept
    answer = b"".join(transport.written)[4:]
    [p] = fetch_response(answer).responses[0].partitions
    assert (correlation_id_of(answer), p.error_code, p.high_watermark) == (7, 0, 0)
    await channel.stop()
