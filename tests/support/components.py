"""The broker's real parts on a tmp dir, without sockets, with time in the test's hands.

``build`` wires them exactly as broker/server.py's ``Broker.start`` does, except that the one
Timer runs on a ManualClock: time moves only on ``clock.advance(ms)``, so a test can say "not
at 2999 ms, at 3000 ms" and never sleeps. Build inside a running event loop (pytest-asyncio):
delayed answers are futures, and their callbacks run on the loop, hence ``settle`` after each
advance. Fsyncs still run on the ReplicaManager's flusher threads, as in the broker. The
broker's periodic jobs (retention, checkpoints, offset expiry, the time-based flusher) are not
started: a test calls the job itself (``replica_manager.apply_retention()``) when it wants one.
The transaction coordinator's wall clock follows the manual clock too (``wall_ms``: the build's
real time plus the manual clock's ms), so its timestamps and deadlines are exact in tests.

``parse`` turns a kafka-python request object into the broker's Request by the connection's
own parser, so handler tests get what a handler really gets, whatever shape Request takes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.client_telemetry import ClientTelemetry
from broker.config import BrokerConfig
from broker.context import ApiContext, Node
from broker.fetch_session import FetchSessionCache
from broker.group.coordinator import GroupConfig, GroupCoordinator
from broker.group.offsets_store import OffsetsStore
from broker.log.manager import LogManager
from broker.metadata import MetadataStore
from broker.network.connection import Connection
from broker.network.request import Request
from broker.network.request_channel import RequestChannel
from broker.producer_ids import ProducerIdManager
from broker.replica_manager import ReplicaManager
from broker.security.authorizer import Authorizer
from broker.security.scram import ScramCredentialStore
from broker.topic_admin import TopicAdmin, log_config
from broker.txn import TransactionCoordinator
from broker.wallclock import now_ms
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
    closed: bool = False

    def wall_ms(self) -> int:
        """The wall clock the transaction coordinator stamps with (moves with ``clock``)."""
        return self.transactions._wall_ms()

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
    """Every owner of the broker, wired as Broker.__init__ and Broker.start wire them; with
    ``offsets_topic``, __consumer_offsets exists, as once a group's first FindCoordinator has
    created it."""
    cfg = broker_config(log_dir, overrides)
    clock = clock if clock is not None else ManualClock()
    # Broker.__init__
    log_dirs = [Path(d) for d in cfg["log.dirs"]]
    metadata = MetadataStore(log_dirs[0])
    log_manager = LogManager(log_dirs, log_config(cfg, {}))
    producer_ids = ProducerIdManager(log_dirs[0])
    # Broker.start, up to the listener
    for d in log_dirs:
        d.mkdir(parents=True, exist_ok=True)
    metadata.load()
    producer_ids.load()
    timer = Timer(clock)
    rm = ReplicaManager(cfg["log.flush.interval.ms"], timer)
    topics = TopicAdmin(cfg, metadata, log_manager, rm)
    log_manager.load()
    topics.open_all()
    store = OffsetsStore(rm, topics, cfg["offsets.topic.num.partitions"])
    coordinator = GroupCoordinator(GroupConfig.of(cfg), timer, store, rm.partitions.__contains__)
    coordinator.start()
    if offsets_topic:
        store.ensure_topic()
    wall_base = now_ms() - int(clock.time())
    transactions = TransactionCoordinator(
        cfg, timer, rm, topics, producer_ids,
        lambda pid, partitions, commit: coordinator.handle_txn_completion(  # type: ignore[attr-defined]
            pid, partitions, commit),
        store.partition_for, wall_ms=lambda: wall_base + int(clock.time()))
    transactions.start()
    rm.verify_transaction = transactions.verify_partition
    node = Node(cfg["node.id"], *cfg.advertised, metadata.cluster_id)
    sessions = FetchSessionCache()
    context = ApiContext(node, cfg, topics, rm, coordinator, sessions, producer_ids, transactions,
                         Authorizer.of(cfg, metadata), ScramCredentialStore(metadata),
                         ClientTelemetry.of(cfg))
    return Components(cfg, clock, timer, metadata, log_manager, producer_ids, rm, topics, store,
                      coordinator, sessions, context, transactions)


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

