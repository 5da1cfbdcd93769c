"""One parsed request on its way through the broker, with the times of its phases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.network.sequencer import Slot
from protocol.framing import RequestHeaderView
from protocol.registry import ApiSpec

if TYPE_CHECKING:
    from broker.metrics import RequestStats
    from broker.network.connection import Connection


@dataclass(slots=True)
class Request:
    connection: Connection
    header: RequestHeaderView
    spec: ApiSpec
    body: Any  # the decoded request; None for an ApiVersions of a version we do not serve
    slot: Slot | None
    size: int
    received: float
    dequeued: float = 0.0
    local_done: float = 0.0  # set only when the handler returned an awaitable (parked)
    stats: RequestStats | None = None  # metrics on: this request's (API, version) counters

    @property
    def version(self) -> int:
        return self.header.api_version
