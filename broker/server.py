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

Start-up order: the owners that need no I/O, the listeners' security (a key store that cannot
be loaded is a ConfigError), then every listener and the metrics port bound but not yet
serving, and only then the log dirs: a port in use fails the start before any log is touched,
so the clean-shutdown marker is still there for the next start. Failures an operator can fix
(a port in use, a log dir that is not a writable directory or that another broker holds) are
one StartupError line each.

Time: one clock (``clock``: the loop's by default; broker.testing passes a manual one), handed
to every owner by the composition root (broker/wiring.py): the coordinators' timer, the
periodic jobs (retention, checkpoints, offset expiry) and the wall clock records, commits and
states are stamped with. Produce and fetch waits stay on the loop's clock: they are the
client's own request parameters, and a parked fetch holds back every later answer on its
connection. The time-based flusher and the cleaner threads keep real time.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from broker import apis
from broker.apis.context import ApiContext
from broker.cluster.broker_node import ClusterNode, ClusterReplicas
from broker.cluster.registration import BrokerInfo
from broker.cluster.settings import ClusterSettings
from broker.cluster.topic_controller import LeaderRebalance
from broker.config import BrokerConfig, ListenerSpec
from broker.interbroker.client import InterBrokerClient, InterBrokerSettings
from broker.interbroker.shutdown import controlled_shutdown
from broker.log.cleaner import CleanerConfig
from broker.log.manager import LogManager
from broker.logging import log_effective_config, ready_message
from broker.metadata.dynamic_config import CLEANER_KEYS, CONNECTION_KEYS, thread_count_check
from broker.metadata.file_store import MetadataStore
from broker.metadata.producer_ids import ProducerIdManager
from broker.metrics.collector import BrokerMetrics
from broker.metrics.http import MetricsServer
from broker.network.connection import Connection
from broker.network.request_channel import HandlerResult, Request, RequestChannel
from broker.replica.replica_manager import ReplicaManager
from broker.security.config_checks import check_listener_security
from broker.security.listener import ListenerSecurity
from broker.security.sasl import AuthenticationStats, sasl_server_config
from broker.security.scram import ScramCredentialStore
from broker.security.ssl import principal_builder, server_ssl_context
from broker.startup_error import StartupError
from broker.txn import TransactionCoordinator
from broker.wiring import CoordinatorLeadership, Owners, check_log_dirs
from purgatory import Clock, LoopClock, Timer

logger = structlog.get_logger("broker")


#: Wraps the dispatch of every request: ``(request, dispatch) -> result`` (fault injection).
DispatchFilter = Callable[[Request, Callable[[Request], HandlerResult]], HandlerResult]


class Broker:
    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None) -> None:
        """``clock`` is the broker's time (the coordinators' timer, the periodic jobs, the wall
        clock); the loop's by default."""
        self.config = config
        self.clock = clock
        self.dispatch_filter: DispatchFilter | None = None
        self.log_dirs = [Path(d) for d in config["log.dirs"]]
        # Built by start(), from the composition root.
        self.owners: Owners | None = None
        self.metadata: MetadataStore | None = None
        self.log_manager: LogManager | None = None
        self.producer_ids: ProducerIdManager | None = None
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
        #: Cluster mode only (``minibroker.etcd.endpoints`` set): this broker's part of it.
        self.cluster: ClusterNode | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: list[Timer] = []
        self._periodic: dict[str, Any] = {}  # the next run of each periodic job, by key
        self._periodic_tasks: set[asyncio.Task[Any]] = set()
        self._stopped = False

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind, then load, then serve (the module docstring says why in that order)."""
        cfg = self.config
        settings = ClusterSettings.from_config(cfg)  # ConfigError: the keys disagree
        # Cluster mode: the inter-broker listener and login, checked before anything binds.
        inter_broker = InterBrokerSettings.from_config(cfg) if settings.enabled else None
        loop = asyncio.get_running_loop()
        loop_clock = LoopClock(loop)
        clock = self.clock = self.clock or loop_clock
        owners = self.owners = Owners(cfg, clock, request_clock=loop_clock)
        self.metadata = owners.metadata
        self.log_manager = owners.log_manager
        self.producer_ids = owners.producer_ids
        specs = cfg.listener_specs()
        securities = self._listener_securities(specs, owners.scram)
        metrics_listener = cfg.metrics_listener
        if metrics_listener is not None:
            self.metrics = BrokerMetrics(cfg["node.id"])
        self.channel = RequestChannel(
            cfg["num.io.threads"], cfg["queued.max.request.bytes"], self._dispatch, self.metrics,
            max_connections=cfg["max.connections"],
            max_connections_per_ip=cfg["max.connections.per.ip"],
            idle_ms=cfg["connections.max.idle.ms"])
        try:
            await self._bind(specs, securities)
            if self.metrics is not None and metrics_listener is not None:
                self.metrics_server = MetricsServer(self.metrics, *metrics_listener)
                await self._bind_metrics(self.metrics_server)
            if settings.enabled:
                assert inter_broker is not None
                await self._check_cluster(settings, owners, inter_broker)
            owners.load()
        except BaseException:
            self._close_listeners()
            if self.cluster is not None:
                await self.cluster.stop()
            raise
        self._serve_owners(owners, loop)
        if self.cluster is not None:
            try:
                await self._join_cluster(self.cluster, owners, specs)
            except BaseException:
                self._close_listeners()
                await self.cluster.stop()
                raise
        for server in self.servers.values():
            await _start_serving(server)
        if self.metrics_server is not None:
            await self.metrics_server.serve()
        self._log_started(specs)

    async def _check_cluster(self, settings: ClusterSettings, owners: Owners,
                             inter_broker: InterBrokerSettings) -> None:
        """Before any log is loaded: the cluster id, and every log dir's meta.properties
        checked against it (a dir of another cluster or node is a StartupError line)."""
        cfg = self.config
        rebalance = (LeaderRebalance(cfg["leader.imbalance.check.interval.seconds"],
                                     cfg["leader.imbalance.per.broker.percentage"])
                     if cfg["auto.leader.rebalance.enable"] else None)
        cluster = self.cluster = ClusterNode(
            settings, unclean_leader_election=cfg["unclean.leader.election.enable"],
            rebalance=rebalance)
        cluster.client = InterBrokerClient(
            inter_broker, lambda node_id: cluster.endpoint(node_id, inter_broker.listener))
        check_log_dirs(self.log_dirs)
        await cluster.check_log_dirs(self.log_dirs)
        await cluster.load_shared_state()
        owners.use_cluster(cluster)
        self.producer_ids = owners.producer_ids

    async def _join_cluster(self, cluster: ClusterNode, owners: Owners,
                            specs: list[ListenerSpec]) -> None:
        """Once bound (the advertised ports known): register, run for controller, follow the
        partition states; NodeIdInUse is a StartupError line."""
        info = BrokerInfo(owners.node.node_id, dict(owners.node.endpoints),
                          {s.name: s.security_protocol for s in specs}, cluster.settings.rack)
        leadership = CoordinatorLeadership(owners.groups, owners.transactions, cluster.cache)
        replicas = ClusterReplicas(cluster.store, owners.replica_manager, owners.log_manager,
                                   owners.topics.log_config,
                                   min_insync_replicas=self.config["min.insync.replicas"],
                                   leadership=[leadership],
                                   fetchers=owners.replica_fetchers)
        await cluster.join(info, replicas)
        taken = cluster.taken
        if taken is not None:
            self._tasks.append(asyncio.create_task(self._leave_when_taken(cluster, taken)))

    async def _leave_when_taken(self, cluster: ClusterNode, taken: asyncio.Event) -> None:
        """Another broker registered this node id while this one was re-registering: this one
        must not act for it any more."""
        await taken.wait()
        logger.error("node id taken by another broker: leaving the cluster",
                     node_id=cluster.node_id)
        await cluster.stop()

    async def _bind(self, specs: list[ListenerSpec],
                    securities: dict[str, ListenerSecurity]) -> None:
        """Bind every listener, not yet accepting; StartupError naming the one that failed."""
        loop = asyncio.get_running_loop()
        serial = self.config["request.processing.mode"] == "serial"
        max_frame = self.config["socket.request.max.bytes"]
        channel = self.channel
        assert channel is not None
        for spec in specs:
            security = securities[spec.name]

            def connection(security: ListenerSecurity = security) -> Connection:
                return Connection(channel, serial, max_frame, security=security)

            try:
                if security.ssl_context is not None:
                    tls = self._tls_listener(spec, security.ssl_context, connection)
                    self.ports[spec.name] = tls.bind(spec.host, spec.port)
                    self.servers[spec.name] = tls
                else:
                    server = await loop.create_server(connection, spec.host or None, spec.port,
                                                      reuse_address=True, start_serving=False)
                    self.servers[spec.name] = server
                    self.ports[spec.name] = server.sockets[0].getsockname()[1]
            except OSError as exc:
                address = f"{spec.name}://{spec.host}:{spec.port}"
                raise _bind_failed(f"listener {address}", "listeners", spec.port, exc) from None
        self.server = self.servers[specs[0].name]
        self.port = self.ports[specs[0].name]

    async def _bind_metrics(self, server: MetricsServer) -> None:
        try:
            await server.start(serving=False)
        except OSError as exc:
            raise _bind_failed(f"metrics listener {server.url}", "metrics.listener",
                               server.port, exc) from None

    def _serve_owners(self, owners: Owners, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the loaded owners to the request path, the metrics and the periodic jobs."""
        cfg = self.config
        rm = self.replica_manager = owners.replica_manager
        self.transactions = owners.transactions
        self.context = owners.context
        self._timers = owners.timers
        node = owners.node
        advertised = cfg.advertised_endpoints()
        for name, port in self.ports.items():
            host, advertised_port = advertised[name]
            node.endpoints[name] = (host, advertised_port or port)
        node.host, node.port = node.endpoints[cfg.listener_specs()[0].name]
        log_manager = owners.log_manager
        cleaner = log_manager.start_cleaner(CleanerConfig.of(cfg), loop)
        owners.dynamic.add_reconfigurable(CLEANER_KEYS,
                                          lambda c: cleaner.reconfigure(CleanerConfig.of(c)),
                                          thread_count_check("log.cleaner.threads"))
        channel = self.channel
        assert channel is not None
        quotas = channel.quotas
        owners.dynamic.add_reconfigurable(CONNECTION_KEYS, lambda c: quotas.set_limits(
            c["max.connections"], c["max.connections.per.ip"]))
        if self.metrics is not None:
            self.metrics.observe(channel, rm, owners.groups, owners.metadata, log_manager,
                                 owners.transactions)
            self.metrics.observe_security(self.auth_stats, owners.authorizer,
                                          self.tls_handshake_failures)
            self.metrics.telemetry = owners.telemetry
        channel.start()
        self._every("log.retention.check.interval.ms", rm.apply_retention)
        self._every("log.flush.offset.checkpoint.interval.ms", self._checkpoint)
        self._every("replica.high.watermark.checkpoint.interval.ms",
                    rm.checkpoint_high_watermarks)
        self._every("offsets.retention.check.interval.ms", owners.groups.expire_offsets)
        if cfg["log.flush.interval.ms"] < 2**63 - 1:
            self._tasks.append(asyncio.create_task(rm.run_time_flusher()))

    def _log_started(self, specs: list[ListenerSpec]) -> None:
        """The ready line first (where to connect, where to scrape, where the data is), then
        the details."""
        cfg = self.config
        ms = self.metrics_server
        logger.info(ready_message({s.name: (s.host, self.ports[s.name]) for s in specs},
                               ms.url if ms is not None else None, cfg["log.dirs"]))
        owners = self.owners
        assert owners is not None
        logger.info("broker started", host=specs[0].host, port=self.port, listeners=self.ports,
                 security_protocols={s.name: s.security_protocol for s in specs},
                 node_id=owners.node.node_id, topics=len(owners.metadata.topics),
                 metrics=ms.url if ms is not None else None,
                 metrics_port=ms.port if ms is not None else None,
                 open_file_limit=owners.log_manager.open_file_limit)
        log_effective_config(cfg)

    def _close_listeners(self) -> None:
        for server in self.servers.values():
            server.close()
        if self.metrics_server is not None and self.metrics_server.server is not None:
            self.metrics_server.server.close()

    def _listener_securities(self, specs: list[ListenerSpec],
                             scram: ScramCredentialStore) -> dict[str, ListenerSecurity]:
        """Each listener's TLS context, principal builder and SASL settings (ConfigError when
        a key store cannot be loaded), built before anything is bound."""
        cfg = self.config
        check_listener_security(cfg)
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
        logger.warning("TLS handshake failed", listener=listener, peer=peer, reason=reason)

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
                    logger.error("periodic job failed", job=key, exc_info=t.exception())
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
        logger.info("broker shutting down")
        if self.cluster is not None:
            await self._controlled_shutdown(self.cluster)
            # Kafka's order: stop acting as controller and leader, then deregister, so the
            # cluster hears of it at once instead of after the session timeout.
            await self.cluster.stop()
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
            await rm.checkpoint_high_watermarks()  # Kafka's shutdown(checkpointHW = true)
            for timer in self._timers:
                timer.close()
            rm.shutdown()
        if self.log_manager is not None:
            self.log_manager.shutdown()
        logger.info("broker stopped cleanly")

    async def _controlled_shutdown(self, cluster: ClusterNode) -> None:
        """Kafka's first step of a broker's shutdown: leadership moved to other replicas while
        this broker still serves (``controlled.shutdown.enable``), once it is registered."""
        registration = cluster.membership.registration
        if (not self.config["controlled.shutdown.enable"] or registration is None
                or registration.epoch is None or registration.taken.is_set()):
            return
        await controlled_shutdown(cluster, self.config["controlled.shutdown.max.retries"],
                                  self.config["controlled.shutdown.retry.backoff.ms"])

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
        logger.warning("broker crashing on purpose (no flush, no clean-shutdown marker)")
        for server in self.servers.values():
            server.close()
        for timer in self.owners.timers if self.owners is not None else self._timers:
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
        rm = self.replica_manager
        if rm is None and self.owners is not None:
            rm = getattr(self.owners, "replica_manager", None)  # a start that failed half-way
        if rm is not None:
            rm.shutdown()
        if self.log_manager is not None:
            self.log_manager.abandon()
        logger.warning("broker crashed on purpose")


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

    def bind(self, host: str, port: int) -> int:
        """Binds as create_server does (every address of ``host``, all interfaces when empty),
        not yet accepting (``start_serving``); returns the first socket's bound port."""
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
        return self.sockets[0].getsockname()[1]

    async def start_serving(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self.sockets:
            self._spawn(self._accept(loop, sock))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        while True:
            try:
                client, address = await loop.sock_accept(sock)
            except OSError as exc:  # out of file descriptors, say: back off, keep serving
                logger.warning("accept failed", listener=self.listener, error=str(exc))
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


async def _start_serving(server: asyncio.base_events.Server | _TlsListener) -> None:
    await server.start_serving()


def _bind_failed(what: str, key: str, port: int, exc: OSError) -> StartupError:
    """One line naming the listener, its key and what to do."""
    if exc.errno == errno.EADDRINUSE:
        return StartupError(f"{what} ({key}): port {port} is in use, by another broker or "
                            f"process: stop it, or set another port in {key}")
    reason = exc.strerror or str(exc)
    return StartupError(f"{what} ({key}) cannot be bound: {reason}; set another address "
                        f"in {key}")


def _handshake_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return str(exc) or exc.__class__.__name__
