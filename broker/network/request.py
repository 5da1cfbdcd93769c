"""One parsed request on its way through the broker: the single owner of its life and timings.

Parsed by its Connection, queued by the RequestChannel, handled, then (when it expects a
response) held by the connection's sequencer until its response is written. The times of each
phase live here and nowhere else, so metrics and the slow-request log read one object.

A request parked on a delayed operation (a long poll may wait for minutes) gives up its decoded
body: its handler took what the answer needs, and thousands of parked fetches would otherwise
each keep a tree of codec objects alive for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from broker.network.sequencer import Payload
from protocol.framing import RequestHeaderView
from protocol.registry import ApiSpec

if TYPE_CHECKING:
    from broker.metrics.instruments import RequestStats
    from broker.network.connection import Connection


class _Released:
    """What ``Request.body`` holds once the request is parked (never None: None says that an
    ApiVersions request came in a version we do not serve)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<body released while parked>"


RELEASED: Final[Any] = _Released()


@dataclass(slots=True, eq=False)
class Request:
    connection: Connection
    header: RequestHeaderView
    spec: ApiSpec
    body: Any  # the decoded request; None for an ApiVersions of a version we do not serve;
    # RELEASED once parked on a delayed operation
    expects_response: bool  # False only for Produce with acks=0
    size: int  # request bytes held against queued.max.request.bytes until answered
    received: float  # parsed off the socket
    dequeued: float = 0.0  # a handler took it
    local_done: float = 0.0  # set only when the handler returned an awaitable (parked)
    ready: float = 0.0  # the response was built
    write_started: float = 0.0  # the response was handed to the transport (metrics on)
    payload: Payload | None = None  # the encoded response, while it waits in the sequencer
    response_size: int = 0  # its length, counted against the memory budget until sent
    stats: RequestStats | None = None  # metrics on: this request's (API, version) counters
    close_after: bool = False  # close the connection once this response is written

    @property
    def version(self) -> int:
        return self.header.api_version
