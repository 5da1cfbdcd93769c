"""The broker's real parts on a tmp dir, without sockets, with time in the test's hands.

``build`` takes them from the broker's composition root (broker/wiring.py), the very wiring of
``Broker.start``, on a ManualClock: time moves only on ``clock.advance(ms)``, so a test can say
"not at 2999 ms, at 3000 ms" and never sleeps. Unlike the broker, produce and fetch waits run
on that clock too (one Timer for all). Build inside a running event loop (pytest-asyncio):
delayed answers are futures, and their callbacks run on the loop, hence ``settle`` after each
advance. Fsyncs still run on the ReplicaManager's flusher threads, as in the broker. The
broker's periodic jobs (retention, checkpoints, offset expiry, the time-based flusher) and the
cleaner threads are not started: a test calls the job itself
(``replica_manager.apply_retention()``) when it wants one. The wall clock is the manual
clock's (``wall_ms``: the build's real time plus every advance), so timestamps, deadlines and
retention's "now" are exact in tests.

``parse`` turns a kafka-python request object into the broker's Request by the connection's
own parser, so handler tests get what a handler really gets, whatever shape Request takes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.apis.context import ApiContext
from broker.config import BrokerConfig
from broker.group.coordinator import GroupCoordinator
from broker.group.offsets_store import OffsetsStore
from broker.log.manager import LogManager
from broker.metadata.file_store import MetadataStore
from broker.metadata.producer_ids import ProducerIdManager
from broker.metadata.topic_admin import TopicAdmin
from broker.network.connection import Connection
from broker.network.request import Request
from broker.network.request_channel import RequestChannel
from broker.replica.fetch_session import FetchSessionCache
from broker.replica.replica_manager import ReplicaManager
from broker.txn import TransactionCoordinator
from broker.wiring import Owners
from purgatory import ManualClock, Timer

CLIENT_ID = "unit-test"
CLIENT_PEER = ("127.0.0.1", 50123)


@dataclass
class Components:
    config: BrokerConfig
    clock: ManualClock
    timer: Timer
    metadata: MetadataStore
    log_manager: LogManager
    producer_ids: ProducerIdManager
    replica_manager: ReplicaManager
    topics: TopicAdmin
    offsets_store: OffsetsStore
    coordinator: GroupCoordinator
    fetch_sessions: FetchSessionCache
    context: ApiContext
    transactions: TransactionCoordinator
    owners: Owners
    closed: bool = False

    def wall_ms(self) -> int:
        """The broker's wall clock (moves with ``clock``)."""
        return self.clock.wall_ms()

    async def advance(self, ms: float) -> None:
        """Move the manual clock, then let the callbacks of what completed run."""
        self.clock.advance(ms)
        await settle()

    async def close(self) -> None:
        """Broker.stop's order: flush every log, stop the timer and flushers, then the logs
        (which writes the clean-shutdown marker and releases the dir lock)."""
        if self.closed:
            return
        self.closed = True
        self.transactions.shutdown()
        rm = self.replica_manager
        await rm.flush_all()
        rm.timer.close()
        rm.shutdown()
        self.log_manager.shutdown()


async def settle(rounds: int = 8) -> None:
    """A few loop iterations: enough for chained future callbacks to run, never a real wait."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def broker_config(log_dir: Path, overrides: dict[str, str] | None = None) -> BrokerConfig:
    """The broker's defaults with ``overrides``, logs under ``log_dir``, no metrics listener."""
    return BrokerConfig.from_dict({"log.dirs": str(log_dir), "metrics.listener": "",
                                   **(overrides or {})})


def build(log_dir: Path, overrides: dict[str, str] | None = None,
          clock: ManualClock | None = None, offsets_topic: bool = True) -> Components:
    """Every owner of the broker, from the composition root Broker.start uses; with
    ``offsets_topic``, __consumer_offsets exists, as once a group's first FindCoordinator has
    created it."""
    cfg = broker_config(log_dir, overrides)
    clock = clock if clock is not None else ManualClock()
    owners = Owners(cfg, clock)  # produce and fetch waits on the manual clock too
    owners.load()
    if offsets_topic:
        owners.offsets_store.ensure_topic()
    return Components(cfg, clock, owners.timer, owners.metadata, owners.log_manager,
                      owners.producer_ids, owners.replica_manager, owners.topics,
                      owners.offsets_store, owners.groups, owners.fetch_sessions, owners.context,
                      owners.transactions, owners)


# -- requests as a handler receives them ---------------------------------------------------------

class _Transport(asyncio.Transport):
    """What a Connection needs of a socket: a peer name, and somewhere to write and close."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return CLIENT_PEER if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True


def parse(request: Any, correlation_id: int = 1) -> Request:
    """Encode ``request`` as a client would and parse it with a Connection's own parser."""
    request.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
    frame = bytes(request.encode(header=True, framed=True))
    parsed: list[Request] = []
    channel = RequestChannel(1, -1, dispatch=lambda r: None)
    channel.submit = parsed.append  # type: ignore[method-assign]  # take it, do not queue it
    conn = Connection(channel, serial=False, max_frame=1 << 30)
    transport = _Transport()
    conn.connection_made(transport)
    conn.data_received(frame)
    assert not transport.closed, f"the connection refused the request: {request}"
    [req] = parsed
    return req


def wire_roundtrip(request: Request, response: Any) -> Any:
    """The response as a client reads it: encoded for the request's version, then decoded."""
    version = request.version
    return type(response).decode(response.encode(version=version), version=version)

