"""Broker: the composition root. It builds every owner from the configuration, wires them,
serves the listeners and shuts down; nothing else in the broker imports it.

One server per entry of ``listeners``, each Connection handed its listener's
ListenerSecurity. A server made by create_server(ssl=...) drops a failed TLS handshake
silently (asyncio and uvloop log an OSError only in debug mode), so SSL and SASL_SSL listeners
accept sockets themselves and hand each to ``loop.connect_accepted_socket``, which raises on
failure (``_TlsListener``): logged once per connection with the listener and peer, counted in
``Broker.tls_handshake_failures``, that connection closed and nothing else touched.

Shutdown order follows Kafka's: stop accepting, let in-flight requests finish, flush every log,
then write the clean-shutdown marker so the next start skips recovery. ``crash`` is the other
way out, for tests that need recovery to run (broker.testing's kill): connections reset,
nothing flushed, no checkpoint, no marker.

Time: the group and transaction coordinators' timer and the periodic jobs (retention,
checkpoints, offset expiry) run on ``clock`` (the loop's by default; broker.testing passes a
manual one). Produce and fetch waits stay on the loop's clock: they are the client's own
request parameters, and a parked fetch holds back every later answer on its connection.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from broker import apis
from broker.client_telemetry import ClientTelemetry
from broker.config import BrokerConfig, ListenerSpec
from broker.context import ApiContext, Node
from broker.dynamic_config import (
    CLEANER_KEYS,
    CONNECTION_KEYS,
    DynamicBrokerConfig,
    thread_count_check,
)
from broker.fetch_session import FetchSessionCache
from broker.group.coordinator import GroupConfig, GroupCoordinator
from broker.group.offsets_store import OffsetsStore
from broker.log.cleaner import CleanerConfig
from broker.log.manager import LogManager
from broker.logging import redact
from broker.metadata import MetadataStore
from broker.metrics import BrokerMetrics, MetricsServer
from broker.network.connection import Connection
from broker.network.request_channel import HandlerResult, Request, RequestChannel
from broker.producer_ids import ProducerIdManager
from broker.replica_manager import ReplicaManager
from broker.security.authorizer import Authorizer
from broker.security.listener import ListenerSecurity
from broker.security.sasl import AuthenticationStats, sasl_server_config
from broker.security.scram import ScramCredentialStore
from broker.security.ssl import principal_builder, server_ssl_context
from broker.topic_admin import TopicAdmin, log_config
from broker.txn import TransactionCoordinator
from purgatory import Clock, LoopClock, Timer

log = structlog.get_logger("broker")


#: Wraps the dispatch of every request: ``(request, dispatch) -> result`` (fault injection).
DispatchFilter = Callable[[Request, Callable[[Request], HandlerResult]], HandlerResult]


class Broker:
    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None,
                 wall_ms: Callable[[], int] | None = None) -> None:
        """``clock`` drives the coordinators' timer and the periodic jobs and ``wall_ms`` is
        the transaction coordinator's wall clock (both real by default)."""
        self.config = config
        self.clock = clock
        self.wall_ms = wall_ms
        self.dispatch_filter: DispatchFilter | None = None
        self.log_dirs = [Path(d) for d in config["log.dirs"]]
        self.metadata = MetadataStore(self.log_dirs[0])
        self.log_manager = LogManager.for_broker(self.log_dirs, log_config(config, {}), config)
        self.producer_ids = ProducerIdManager(self.log_dirs[0])
        self.context: ApiContext | None = None
        self.channel: RequestChannel | None = None
        self.replica_manager: ReplicaManager | None = None
        self.transactions: TransactionCoordinator | None = None
        self.server: asyncio.base_events.Server | _TlsListener | None = None  # the first's
        self.servers: dict[str, asyncio.base_events.Server | _TlsListener] = {}  # by name
        self.port = 0  # the first listener's bound port
        self.ports: dict[str, int] = {}  # bound port by listener name
        # TLS handshakes that failed (plaintext client, untrusted certificate, timeout), by
        # listener; read by the metrics.
        self.tls_handshake_failures: dict[str, int] = {}
        self.auth_stats = AuthenticationStats()  # SASL logins, read by the metrics
        self.metrics: BrokerMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: list[Timer] = []
        self._periodic: dict[str, Any] = {}  # the next run of each periodic job, by key
        self._periodic_tasks: set[asyncio.Task[Any]] = set()
        self._stopped = False

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        for d in self.log_dirs:
            d.mkdir(parents=True, exist_ok=True)
        self.metadata.load()
        # Kafka's DynamicBrokerConfig: the stored dynamic configs count from the first read.
        dynamic = DynamicBrokerConfig(cfg, self.metadata)
        dynamic.load()
        self.producer_ids.load()
        loop = asyncio.get_running_loop()
        request_timer = Timer(loop)
        clock = self.clock = self.clock or LoopClock(loop)
        timer = request_timer if isinstance(clock, LoopClock) else Timer(clock)
        self._timers = list({id(t): t for t in (request_timer, timer)}.values())
        rm = self.replica_manager = ReplicaManager(cfg["log.flush.interval.ms"], request_timer)
        topics = TopicAdmin(cfg, self.metadata, self.log_manager, rm, dynamic)
        self.log_manager.load()
        topics.open_all()
        cleaner = self.log_manager.start_cleaner(CleanerConfig.of(cfg), loop)
        dynamic.add_reconfigurable(CLEANER_KEYS,
                                   lambda c: cleaner.reconfigure(CleanerConfig.of(c)),
                                   thread_count_check("log.cleaner.threads"))
        store = OffsetsStore(rm, topics, cfg["offsets.topic.num.partitions"])
        coordinator = GroupCoordinator(GroupConfig.of(cfg), timer, store,
                                       rm.partitions.__contains__)
        coordinator.start()
        wall = {} if self.wall_ms is None else {"wall_ms": self.wall_ms}
        transactions = self.transactions = TransactionCoordinator(
            cfg, timer, rm, topics, self.producer_ids, coordinator.handle_txn_completion,
            coordinator.partition_for, **wall)
        transactions.start()
        rm.verify_transaction = transactions.verify_partition
        specs = cfg.listener_specs()
        advertised = cfg.advertised_endpoints()
        node = Node(cfg["node.id"], *advertised[specs[0].name], self.metadata.cluster_id)
        authorizer = Authorizer.of(cfg, self.metadata)
        scram = ScramCredentialStore(self.metadata)
        self.context = ApiContext(node, cfg, topics, rm, coordinator, FetchSessionCache(),
                                  self.producer_ids, transactions, authorizer, scram,
                                  ClientTelemetry.of(cfg))
        securities = self._listener_securities(specs, scram)
        metrics_listener = cfg.metrics_listener
        if metrics_listener is not None:
            self.metrics = BrokerMetrics(node.node_id)
        self.channel = RequestChannel(
            cfg["num.io.threads"], cfg["queued.max.request.bytes"], self._dispatch, self.metrics,
            max_connections=cfg["max.connections"],
            max_connections_per_ip=cfg["max.connections.per.ip"],
            idle_ms=cfg["connections.max.idle.ms"])
        quotas = self.channel.quotas
        dynamic.add_reconfigurable(CONNECTION_KEYS, lambda c: quotas.set_limits(
            c["max.connections"], c["max.connections.per.ip"]))
        if self.metrics is not None and metrics_listener is not None:
            self.metrics.observe(self.channel, rm, coordinator, self.metadata, self.log_manager,
                                 transactions)
            self.metrics.observe_security(self.auth_stats, authorizer,
                                          self.tls_handshake_failures)
            self.metrics.telemetry = self.context.telemetry
            self.metrics_server = MetricsServer(self.metrics, *metrics_listener)
            await self.metrics_server.start()
        self.channel.start()
        serial = cfg["request.processing.mode"] == "serial"
        max_frame = cfg["socket.request.max.bytes"]
        channel = self.channel
        for spec in specs:
            security = securities[spec.name]

            def connection(security: ListenerSecurity = security) -> Connection:
                return Connection(channel, serial, max_frame, security=security)

            if security.ssl_context is not None:
                tls = self._tls_listener(spec, security.ssl_context, connection)
                self.servers[spec.name] = tls
                self.ports[spec.name] = tls.start(spec.host, spec.port)
            else:
                server = await loop.create_server(connection, spec.host or None, spec.port,
                                                  reuse_address=True)
                self.servers[spec.name] = server
                self.ports[spec.name] = server.sockets[0].getsockname()[1]
            host, port = advertised[spec.name]
            node.endpoints[spec.name] = (host, port or self.ports[spec.name])
        self.server = self.servers[specs[0].name]
        self.port = self.ports[specs[0].name]
        node.host, node.port = node.endpoints[specs[0].name]
        self._every("log.retention.check.interval.ms", rm.apply_retention)
        self._every("log.flush.offset.checkpoint.interval.ms", self._checkpoint)
        self._every("offsets.retention.check.interval.ms", coordinator.expire_offsets)
        if cfg["log.flush.interval.ms"] < 2**63 - 1:
            self._tasks.append(asyncio.create_task(rm.run_time_flusher()))
        ms = self.metrics_server
        log.info("broker started", host=specs[0].host, port=self.port, listeners=self.ports,
                 security_protocols={s.name: s.security_protocol for s in specs},
                 node_id=node.node_id, topics=len(self.metadata.topics),
                 metrics=ms.url if ms is not None else None,
                 metrics_port=ms.port if ms is not None else None,
                 config=redact({**dict(cfg.items()), **cfg.listener_overrides()}))

    def _listener_securities(self, specs: list[ListenerSpec],
                             scram: ScramCredentialStore) -> dict[str, ListenerSecurity]:
        """Each listener's TLS context, principal builder and SASL settings (ConfigError when
        a key store cannot be loaded), built before anything is bound."""
        cfg = self.config
        out = {}
        for spec in specs:
            parts: dict[str, Any] = {}
            if spec.security_protocol in ("SSL", "SASL_SSL"):
                parts["ssl_context"] = server_ssl_context(cfg, spec.name)
                parts["principal_builder"] = principal_builder(cfg, spec.name)
                self.tls_handshake_failures[spec.name] = 0
            if spec.security_protocol.startswith("SASL_"):
                parts["sasl"] = sasl_server_config(cfg, spec.name, scram, self.auth_stats)
            out[spec.name] = ListenerSecurity(spec.name, spec.security_protocol, **parts)
        return out

    def _tls_listener(self, spec: ListenerSpec, ctx: ssl.SSLContext,
                      connection: Callable[[], Connection]) -> _TlsListener:
        """The handshake gives up after 60 s (asyncio's default), or the idle limit if less."""
        idle_ms = self.config["connections.max.idle.ms"]
        timeout = min(60.0, idle_ms / 1000) if idle_ms > 0 else 60.0
        return _TlsListener(self, spec.name, ctx, connection, timeout)

    def _tls_failed(self, listener: str, peer: str, reason: str) -> None:
        self.tls_handshake_failures[listener] = self.tls_handshake_failures.get(listener, 0) + 1
        log.warning("TLS handshake failed", listener=listener, peer=peer, reason=reason)

    def _dispatch(self, request: Request) -> HandlerResult:
        if self.dispatch_filter is not None:
            return self.dispatch_filter(request, self._handle)
        return apis.HANDLERS[request.spec.key](self.context, request)

    def _handle(self, request: Request) -> HandlerResult:
        return apis.HANDLERS[request.spec.key](self.context, request)

    def _every(self, key: str, job: Callable[[], object]) -> None:
        """Runs ``job`` every ``key`` ms on the broker's clock, the next run timed from the end
        of the last (an awaitable job, such as a checkpoint, never overlaps itself)."""
        clock = self.clock
        assert clock is not None
        interval = self.config[key]

        def schedule() -> None:
            self._periodic[key] = clock.call_at(clock.time() + interval, run)

        def run() -> None:
            self._periodic.pop(key, None)
            result = job()
            if not inspect.isawaitable(result):
                schedule()
                return
            task = asyncio.ensure_future(result)
            self._periodic_tasks.add(task)

            def done(t: asyncio.Future[Any]) -> None:
                self._periodic_tasks.discard(t)
                if not t.cancelled() and t.exception() is not None:
                    log.error("periodic job failed", job=key, exc_info=t.exception())
                if not self._stopped:
                    schedule()

            task.add_done_callback(done)

        schedule()

    def _stop_periodic(self) -> None:
        self._stopped = True
        for handle in self._periodic.values():
            handle.cancel()
        self._periodic.clear()

    async def _checkpoint(self) -> None:
        """Kafka's recovery-point checkpoint: after a crash, recovery starts from here."""
        await asyncio.get_running_loop().run_in_executor(None, self.log_manager.checkpoint)

    async def stop(self) -> None:
        log.info("broker shutting down")
        rm = self.replica_manager
        for server in self.servers.values():
            server.close()
        if self.channel is not None:
            self.channel.mute_all()
            if self.transactions is not None:
                self.transactions.shutdown()
            if rm is not None:
                rm.complete_all_parked()
            await self.channel.stop()
            for conn in list(self.channel.connections):
                conn.close("broker shutting down")
        await self._stop_tasks()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if rm is not None:
            await rm.flush_all()
            for timer in self._timers:
                timer.close()
            rm.shutdown()
        self.log_manager.shutdown()
        log.info("broker stopped cleanly")

    async def _stop_tasks(self) -> None:
        self._stop_periodic()
        tasks = [*self._tasks, *self._periodic_tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def crash(self) -> None:
        """Stop as a killed process stops: every connection reset, nothing answered, flushed or
        checkpointed, no clean-shutdown marker; the files are closed as they are (what was
        written is in the kernel, as after a process crash) and the dir locks released, so
        the next start on these dirs runs recovery."""
        log.warning("broker crashing on purpose (no flush, no clean-shutdown marker)")
        for server in self.servers.values():
            server.close()
        for timer in self._timers:
            timer.close()
        channel = self.channel
        if channel is not None:
            for conn in list(channel.connections):
                conn.close_quietly()
                if conn.transport is not None:
                    conn.transport.abort()
            if self.transactions is not None:
                self.transactions.shutdown()
            if self.replica_manager is not None:
                self.replica_manager.complete_all_parked()
            await channel.stop()
        await self._stop_tasks()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.replica_manager is not None:
            self.replica_manager.shutdown()
        self.log_manager.abandon()
        log.warning("broker crashed on purpose")


class _TlsListener:
    """An SSL or SASL_SSL listener: its own accept loop, each accepted socket handed to
    ``loop.connect_accepted_socket`` with the listener's TLS context. That call raises when the
    handshake fails, which is the one place asyncio and uvloop let a server see it (a server
    made by create_server(ssl=...) drops a failed handshake silently)."""

    def __init__(self, broker: Broker, listener: str, ctx: ssl.SSLContext,
                 connection: Callable[[], Connection], timeout: float) -> None:
        self.broker = broker
        self.listener = listener
        self.ctx = ctx
        self.connection = connection
        self.timeout = timeout
        self.sockets: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, host: str, port: int) -> int:
        """Binds as create_server does (every address of ``host``, all interfaces when empty)
        and starts accepting; returns the first socket's bound port."""
        loop = asyncio.get_running_loop()
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        seen = set()
        try:
            for family, kind, proto, _name, address in infos:
                if (family, address) in seen:
                    continue
                seen.add((family, address))
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(128)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise
        for sock in self.sockets:
            self._spawn(self._accept(loop, sock))
        return self.sockets[0].getsockname()[1]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        while True:
            try:
                client, address = await loop.sock_accept(sock)
            except OSError as exc:  # out of file descriptors, say: back off, keep serving
                log.warning("accept failed", listener=self.listener, error=str(exc))
                await asyncio.sleep(0.1)
                continue
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else "?"
            self._spawn(self._handshake(loop, client, peer))

    async def _handshake(self, loop: asyncio.AbstractEventLoop, client: socket.socket,
                         peer: str) -> None:
        try:
            await loop.connect_accepted_socket(
                self.connection, client, ssl=self.ctx, ssl_handshake_timeout=self.timeout)
        except asyncio.CancelledError:
            client.close()
            raise
        except (OSError, ValueError, RuntimeError) as exc:
            # ssl.SSLError (a plaintext client, an untrusted or missing client certificate),
            # a reset, the handshake timeout.
            client.close()
            self.broker._tls_failed(self.listener, peer, _handshake_reason(exc))
        # On success the Connection took its principal from the certificate in
        # connection_made (a mapping failure closes it there).

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for sock in self.sockets:
            sock.close()


def _handshake_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return str(exc) or exc.__class__.__name__
