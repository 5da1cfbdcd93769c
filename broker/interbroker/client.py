"""The inter-broker client: one connection per peer broker, as Kafka's brokers keep one
NetworkClient per purpose (TransactionMarkerChannelManager, the replica fetchers).

Pieces, each small:
- ``InterBrokerSettings.from_config``: the listener brokers talk to each other on, chosen by
  Kafka's KafkaConfig rules (``inter.broker.listener.name`` or ``security.inter.broker.protocol``,
  never both; the listener must be one of this broker's), its security protocol, TLS context
  and SASL login (``sasl.mechanism.inter.broker.protocol``, username and password from the
  listener's ``listener.name.<l>.<mechanism>.sasl.jaas.config`` as Kafka's broker reads them),
  ``request.timeout.ms`` and the reconnect backoff.
- ``PlainClient`` / ``ScramClient``: the client side of the SASL exchanges our server speaks.
- ``BrokerConnection``: one socket: TLS by the transport, ApiVersions, SaslHandshake and
  SaslAuthenticate, then requests pipelined by correlation id; a request not answered within
  ``request.timeout.ms`` closes the connection (as Kafka's NetworkClient does: the stream can
  no longer be trusted to line up), failing every request in flight on it.
- ``InterBrokerClient``: the connection manager, one per broker (owned by the cluster node):
  finds a peer's endpoint in the cluster metadata by node id at each connection attempt (a
  restarted peer may come back on another port), reconnects with exponential backoff and
  jitter (Kafka's ClusterConnectionStates), and bounds each ``send`` by the request timeout.

Invariants: requests on one connection are written in the order ``send`` was called and their
answers matched by correlation id; a connection that failed is never reused; nothing here
logs a password or token.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from broker.config import BrokerConfig
from broker.config_error import ConfigError
from broker.security.jaas import server_login_module
from broker.security.sasl import PLAIN, SUPPORTED_MECHANISMS
from broker.security.scram import MECHANISMS as SCRAM_MECHANISMS
from broker.security.scram import ScramMechanism
from broker.security.ssl import _load_key_store as load_key_store
from broker.security.ssl import normalise_pem
from protocol.errors import ErrorCode
from protocol.registry import APIS

logger = structlog.get_logger("broker.interbroker")

_INT32 = struct.Struct(">i")  # a frame's size, a response's correlation id
API_VERSIONS_KEY = 18
API_VERSIONS_VERSION = 3
SASL_HANDSHAKE_VERSION = 1
SASL_AUTHENTICATE_VERSION = 2
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
Resolver = Callable[[int], "tuple[str, int] | None"]
#: A test's fault on the link to a peer (broker.testing.cluster), awaited with the peer's node
#: id before each request and connection: it delays, or raises BrokerUnavailable (a cut).
LinkFault = Callable[[int], Awaitable[None]]


class InterBrokerError(Exception):
    """A request to another broker did not get an answer."""


class BrokerUnavailable(InterBrokerError):
    """The peer is not live in the cluster, or cannot be connected to (retriable)."""


class RequestTimedOut(InterBrokerError):
    """No answer within request.timeout.ms; the connection was closed."""


class AuthenticationFailed(InterBrokerError):
    """The peer refused this broker's TLS or SASL credentials."""


# -- settings ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InterBrokerSettings:
    listener: str
    security_protocol: str
    sasl_mechanism: str | None = None
    username: str = ""
    password: str = field(default="", repr=False)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False)
    request_timeout_ms: int = 30_000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    client_id: str = "broker"

    @classmethod
    def from_config(cls, cfg: BrokerConfig) -> InterBrokerSettings:
        """Kafka's rules (KafkaConfig.interBrokerListenerName and its validation); one
        ConfigError line where Kafka would refuse to start."""
        listener, protocol = inter_broker_listener(cfg)
        mechanism = None
        username = password = ""
        if protocol in SASL_PROTOCOLS:
            mechanism = cfg["sasl.mechanism.inter.broker.protocol"]
            enabled = cfg.listener_value(listener, "sasl.enabled.mechanisms")
            if mechanism not in enabled:
                raise ConfigError(
                    f"sasl.mechanism.inter.broker.protocol={mechanism} must be included in "
                    f"sasl.enabled.mechanisms when SASL is used for inter-broker communication")
            if mechanism not in SUPPORTED_MECHANISMS:
                raise ConfigError(f"sasl.mechanism.inter.broker.protocol={mechanism}: "
                                  f"supported: {', '.join(SUPPORTED_MECHANISMS)}")
            username, password = _login(cfg, listener, mechanism)
        context = client_ssl_context(cfg, listener) if protocol in TLS_PROTOCOLS else None
        return cls(listener, protocol, mechanism, username, password, context,
                   request_timeout_ms=cfg["request.timeout.ms"],
                   reconnect_backoff_ms=cfg["minibroker.reconnect.backoff.ms"],
                   reconnect_backoff_max_ms=cfg["minibroker.reconnect.backoff.max.ms"],
                   client_id=f"broker-{cfg['node.id']}-inter-broker")


def inter_broker_listener(cfg: BrokerConfig) -> tuple[str, str]:
    """(listener name, security protocol): ``inter.broker.listener.name`` when given, else the
    listener named as ``security.inter.broker.protocol`` (PLAINTEXT by default); giving both
    is an error, and the listener must be one this broker advertises."""
    named = cfg["inter.broker.listener.name"].strip().upper()
    given_protocol = "security.inter.broker.protocol" in cfg.static
    if named and given_protocol:
        raise ConfigError("Only one of inter.broker.listener.name and "
                          "security.inter.broker.protocol should be set.")
    protocols = cfg.security_protocol_map()
    listener = named or cfg["security.inter.broker.protocol"].strip().upper()
    advertised = {name.upper() for name in cfg.advertised_endpoints()}
    if listener not in advertised:
        key = "inter.broker.listener.name" if named else "security.inter.broker.protocol"
        raise ConfigError(f"{key}: the inter-broker listener {listener} must be a listener "
                          f"name defined in advertised.listeners (have: "
                          f"{', '.join(sorted(advertised))})")
    return listener, protocols.get(listener, listener)


def _login(cfg: BrokerConfig, listener: str, mechanism: str) -> tuple[str, str]:
    """username and password of the listener's login module for ``mechanism``."""
    key = f"{mechanism.lower()}.sasl.jaas.config"
    jaas = cfg.listener_value(listener, key)
    jaas = getattr(jaas, "value", jaas)
    where = f"listener.name.{listener.lower()}.{key}"
    if not jaas:
        raise ConfigError(f"{where} is required: the broker logs in to other brokers with "
                          f"its username and password")
    try:
        options = server_login_module(str(jaas)).options
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not options.get("username") or "password" not in options:
        raise ConfigError(f"{where} needs username and password options for the "
                          f"inter-broker login")
    return options["username"], options["password"]


def client_ssl_context(cfg: BrokerConfig, listener: str) -> ssl.SSLContext:
    """The client side of the listener's TLS, as Kafka's broker builds its inter-broker
    channel from the same ``ssl.*`` keys: the trust store checks the peer, the key store (when
    set) is this broker's certificate, and ``ssl.endpoint.identification.algorithm=https``
    (the default) checks the peer's host name."""

    def value(key: str) -> str:
        return str(cfg.listener_value(listener, key) or "")

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if value("ssl.truststore.location"):
            ctx.load_verify_locations(
                cadata=normalise_pem(Path(value("ssl.truststore.location")).read_text()))
        elif value("ssl.truststore.certificates"):
            ctx.load_verify_locations(cadata=normalise_pem(value("ssl.truststore.certificates")))
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if value("ssl.keystore.location"):
            load_key_store(ctx, Path(value("ssl.keystore.location")).read_text(),
                           value("ssl.key.password"))
        elif value("ssl.keystore.certificate.chain"):
            load_key_store(ctx, value("ssl.keystore.certificate.chain") + "\n"
                           + value("ssl.keystore.key"), value("ssl.key.password"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"listener {listener}: the inter-broker TLS client cannot load its "
                          f"stores: {exc}") from None
    ctx.check_hostname = value("ssl.endpoint.identification.algorithm").lower() == "https"
    return ctx


# -- SASL, the client side -----------------------------------------------------------------------

class PlainClient:
    """RFC 4616: one message, no answer to check."""

    def __init__(self, username: str, password: str) -> None:
        self._token = f"\0{username}\0{password}".encode()
        self.complete = False

    def evaluate(self, challenge: bytes | None) -> bytes | None:
        if challenge is None:
            return self._token
        self.complete = True
        return None


class ScramClient:
    """RFC 5802 without channel binding (gs2 header ``n,,``), as Kafka's ScramSaslClient:
    client-first, then the proof, then the server's signature checked."""

    def __init__(self, mechanism: ScramMechanism, username: str, password: str) -> None:
        self._mech = mechanism
        self._password = password
        name = username.replace("=", "=3D").replace(",", "=2C")
        import secrets  # here: hashlib and hmac load at the first SCRAM login, not at start

        self._nonce = secrets.token_urlsafe(24)
        self._first_bare = f"n={name},r={self._nonce}"
        self._auth_message = b""
        self._salted = b""
        self._state = "first"
        self.complete = False

    def evaluate(self, challenge: bytes | None) -> bytes | None:
        if self._state == "first":
            self._state = "final"
            return f"n,,{self._first_bare}".encode()
        if challenge is None:
            raise AuthenticationFailed("no SCRAM challenge from the peer")
        if self._state == "final":
            return self._final(challenge.decode())
        if self._state == "verify":
            self._verify(challenge.decode())
            return None
        raise AuthenticationFailed(f"unexpected SCRAM message in state {self._state}")

    def _final(self, server_first: str) -> bytes:
        attrs = dict(part.split("=", 1) for part in server_first.split(",") if "=" in part)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s", ""), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or not salt or not iterations.isdigit():
            raise AuthenticationFailed("invalid SCRAM server first message")
        mech = self._mech
        self._salted = mech.salted_password(self._password, base64.b64decode(salt),
                                            int(iterations))
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
        self._auth_message = f"{self._first_bare},{server_first},{without_proof}".encode()
        client_key = mech.client_key(self._salted)
        signature = mech.hmac(mech.hash(client_key), self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._state = "verify"
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _verify(self, server_final: str) -> None:
        import hmac

        expected = self._mech.hmac(self._mech.server_key(self._salted), self._auth_message)
        if not server_final.startswith("v=") or not hmac.compare_digest(
                base64.b64decode(server_final[2:]), expected):
            raise AuthenticationFailed("invalid SCRAM server signature")
        self._state = "complete"
        self.complete = True


def sasl_client(settings: InterBrokerSettings) -> PlainClient | ScramClient:
    if settings.sasl_mechanism == PLAIN:
        return PlainClient(settings.username, settings.password)
    mechanism = SCRAM_MECHANISMS.get(settings.sasl_mechanism or "")
    if mechanism is None:
        raise AuthenticationFailed(f"mechanism {settings.sasl_mechanism} is not served")
    return ScramClient(mechanism, settings.username, settings.password)


# -- one connection --------------------------------------------------------------------------------

class BrokerConnection:
    """One connection to a peer broker, ready once ``open`` returns."""

    def __init__(self, node_id: int, host: str, port: int, settings: InterBrokerSettings) -> None:
        self.node_id = node_id
        self.host, self.port = host, port
        self.settings = settings
        self.versions: dict[int, tuple[int, int]] = {}  # api key -> the peer's (min, max)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, tuple[asyncio.Future[Any], Any, int]] = {}
        self._next_correlation = 0
        self._read_task: asyncio.Task[None] | None = None
        self.closed = False
        self.error: BaseException | None = None
        self.fault: LinkFault | None = None

    async def open(self) -> BrokerConnection:
        """Connect, negotiate ApiVersions, authenticate; the whole within the request timeout."""
        s = self.settings
        timeout = s.request_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout):
                self._reader, self._writer = await asyncio.open_connection(
                    self.host, self.port, ssl=s.ssl_context,
                    server_hostname=self.host if s.ssl_context is not None else None)
                self._read_task = asyncio.get_running_loop().create_task(
                    self._read_loop(), name=f"inter-broker-read-{self.node_id}")
                await self._negotiate_versions()
                if s.sasl_mechanism is not None:
                    await self._authenticate()
        except TimeoutError:
            self.close(RequestTimedOut("connection setup timed out"))
            raise BrokerUnavailable(f"broker {self.node_id} at {self.host}:{self.port}: "
                                    f"connection setup took longer than {timeout} s") from None
        except ssl.SSLError as e:
            self.close(e)
            raise AuthenticationFailed(f"broker {self.node_id}: TLS failed: "
                                       f"{e.reason or e}") from None
        except OSError as e:
            self.close(e)
            raise BrokerUnavailable(f"broker {self.node_id} at {self.host}:{self.port}: "
                                    f"{e.strerror or e}") from None
        except BaseException as e:
            self.close(e)
            raise
        return self

    async def _negotiate_versions(self) -> None:
        req = ApiVersionsRequest[API_VERSIONS_VERSION](
            client_software_name="mini-broker", client_software_version="1")
        resp = await self._exchange(API_VERSIONS_KEY, API_VERSIONS_VERSION, req)
        if resp.error_code != 0:
            raise BrokerUnavailable(f"broker {self.node_id}: ApiVersions answered "
                                    f"{ErrorCode(resp.error_code).name}")
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}

    async def _authenticate(self) -> None:
        s = self.settings
        req = SaslHandshakeRequest[SASL_HANDSHAKE_VERSION](mechanism=s.sasl_mechanism)
        resp = await self._exchange(17, SASL_HANDSHAKE_VERSION, req)
        if resp.error_code != 0:
            raise AuthenticationFailed(f"broker {self.node_id}: SaslHandshake answered "
                                       f"{ErrorCode(resp.error_code).name} (the peer enables "
                                       f"{resp.mechanisms})")
        client = sasl_client(s)
        token = client.evaluate(None)
        while token is not None:
            req = SaslAuthenticateRequest[SASL_AUTHENTICATE_VERSION](auth_bytes=token)
            resp = await self._exchange(36, SASL_AUTHENTICATE_VERSION, req)
            if resp.error_code != 0:
                raise AuthenticationFailed(f"broker {self.node_id}: authentication as "
                                           f"{s.username!r} failed: {resp.error_message}")
            token = client.evaluate(bytes(resp.auth_bytes))
        if not client.complete:
            raise AuthenticationFailed(f"broker {self.node_id}: SASL exchange incomplete")

    def version(self, api_key: int, newest: int) -> int:
        """The newest version of ``api_key`` both sides speak, up to ``newest``."""
        peer = self.versions.get(api_key)
        ours = APIS.get(api_key)
        if peer is None or ours is None:
            raise InterBrokerError(f"broker {self.node_id} does not serve API {api_key}")
        version = min(newest, peer[1], ours.max_version)
        if version < max(peer[0], ours.min_version):
            raise InterBrokerError(f"no common version of API {api_key} with broker "
                                   f"{self.node_id}")
        return version

    async def send(self, api_key: int, build: Callable[[int], Any], newest: int) -> Any:
        """``build(version)``'s request, answered; RequestTimedOut (and the connection closed)
        when the answer does not come within request.timeout.ms."""
        if self.fault is not None:
            await self.fault(self.node_id)
        version = self.version(api_key, newest)
        return await self._exchange(api_key, version, build(version))

    async def _exchange(self, api_key: int, version: int, request: Any) -> Any:
        if self.closed or self._writer is None:
            raise BrokerUnavailable(f"connection to broker {self.node_id} is closed")
        self._next_correlation = (self._next_correlation + 1) & 0x7FFFFFFF
        correlation = self._next_correlation
        request.with_header(correlation_id=correlation, client_id=self.settings.client_id)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[correlation] = (future, request, api_key)
        self._writer.write(bytes(request.encode(header=True, framed=True)))
        timeout = self.settings.request_timeout_ms / 1000
        try:
            # asyncio.timeout, not wait_for: a cancellation that comes with the answer must
            # still cancel the caller (Python 3.11's wait_for returns the answer instead).
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            self.close(RequestTimedOut("request timed out"))
            raise RequestTimedOut(f"broker {self.node_id}: no answer to API {api_key} within "
                                  f"{self.settings.request_timeout_ms} ms") from None
        finally:
            self._pending.pop(correlation, None)

    async def _read_loop(self) -> None:
        reader = self._reader
        assert reader is not None
        try:
            while True:
                (size,) = _INT32.unpack(await reader.readexactly(4))
                frame = await reader.readexactly(size)
                (correlation,) = _INT32.unpack_from(frame)
                entry = self._pending.get(correlation)
                if entry is None:
                    raise InterBrokerError(f"answer with unknown correlation id {correlation}")
                future, request, api_key = entry
                version = request.API_VERSION
                header = 5 if api_key != API_VERSIONS_KEY and request.flexible_version_q(
                    version) else 4
                response = APIS[api_key].response.decode(frame[header:], version=version)
                if not future.done():
                    future.set_result(response)
        except asyncio.CancelledError:
            raise
        except (asyncio.IncompleteReadError, OSError) as e:
            self._fail(BrokerUnavailable(f"broker {self.node_id} closed the connection ({e})"))
        except Exception as e:  # an answer that cannot be read: the stream is lost
            logger.warning("inter-broker answer unreadable", node_id=self.node_id,
                           error=repr(e))
            self._fail(BrokerUnavailable(f"broker {self.node_id}: unreadable answer ({e})"))

    def _fail(self, error: BaseException) -> None:
        self.closed = True
        self.error = error
        for future, _request, _key in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()

    def close(self, error: BaseException | None = None) -> None:
        """Close now; every request in flight fails with ``error``."""
        if self._read_task is not None and self._read_task is not asyncio.current_task():
            self._read_task.cancel()
        self._fail(error or BrokerUnavailable(f"connection to broker {self.node_id} closed"))

    async def wait_closed(self) -> None:
        if self._read_task is not None:
            # Waited on, not awaited: its own end (cancelled or failed) is not ours to raise,
            # while a cancellation of the caller still reaches the caller.
            await asyncio.wait([self._read_task])
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()


# -- the connection manager ----------------------------------------------------------------------

@dataclass
class _NodeState:
    """Kafka's ClusterConnectionStates entry for one node."""

    connection: BrokerConnection | None = None
    failures: int = 0
    next_attempt: float = 0.0  # loop time before which no new attempt is made
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class InterBrokerClient:
    """This broker's connections to the other brokers, by node id."""

    def __init__(self, settings: InterBrokerSettings, resolve: Resolver) -> None:
        """``resolve(node_id)``: the live broker's (host, port) on the inter-broker listener,
        None when it is not live (asked at every connection attempt)."""
        self.settings = settings
        self.resolve = resolve
        self._nodes: dict[int, _NodeState] = {}
        self.connects = 0  # connections made (metrics, tests)
        self._closed = False
        self.fault: LinkFault | None = None

    def set_fault(self, fault: LinkFault | None) -> None:
        """A test's fault on every link of this broker, the open connections' included."""
        self.fault = fault
        for state in self._nodes.values():
            if state.connection is not None:
                state.connection.fault = fault

    async def send(self, node_id: int, api_key: int, build: Callable[[int], Any],
                   newest: int) -> Any:
        """One request to ``node_id``, answered, or BrokerUnavailable / RequestTimedOut /
        AuthenticationFailed; connecting (with backoff) counts towards the request timeout."""
        deadline = asyncio.get_running_loop().time() + self.settings.request_timeout_ms / 1000
        connection = await self.connection(node_id, deadline)
        return await connection.send(api_key, build, newest)

    async def connection(self, node_id: int, deadline: float | None = None) -> BrokerConnection:
        """A ready connection to ``node_id``: the open one, else a new one, attempts spaced by
        the reconnect backoff until ``deadline`` (loop time)."""
        if self._closed:
            raise BrokerUnavailable("the inter-broker client is closed")
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.settings.request_timeout_ms / 1000
        state = self._nodes.setdefault(node_id, _NodeState())
        async with state.lock:
            while True:
                known = state.connection
                if known is not None and not known.closed:
                    return known
                wait = state.next_attempt - loop.time()
                if wait > 0:
                    if loop.time() + wait > deadline:
                        raise BrokerUnavailable(f"broker {node_id}: reconnect backoff runs "
                                                f"past the request timeout")
                    await asyncio.sleep(wait)
                try:
                    state.connection = await self._connect(node_id)
                except AuthenticationFailed:
                    self._backoff(state)
                    raise
                except BrokerUnavailable:
                    self._backoff(state)
                    if state.next_attempt > deadline:
                        raise
                    continue
                state.failures = 0
                state.next_attempt = 0.0
                return state.connection

    async def _connect(self, node_id: int) -> BrokerConnection:
        if self.fault is not None:
            await self.fault(node_id)
        endpoint = self.resolve(node_id)
        if endpoint is None:
            raise BrokerUnavailable(f"broker {node_id} is not live on listener "
                                    f"{self.settings.listener}")
        connection = await BrokerConnection(node_id, *endpoint, self.settings).open()
        connection.fault = self.fault
        self.connects += 1
        logger.info("connected to broker", node_id=node_id, host=endpoint[0], port=endpoint[1],
                    listener=self.settings.listener)
        return connection

    def _backoff(self, state: _NodeState) -> None:
        """Exponential from reconnect.backoff.ms to its max, 20% jitter (Kafka's
        ExponentialBackoff as ClusterConnectionStates uses it)."""
        s = self.settings
        base = min(s.reconnect_backoff_ms * (2 ** state.failures), s.reconnect_backoff_max_ms)
        state.failures += 1
        jittered = base * random.uniform(0.8, 1.2)
        state.next_attempt = asyncio.get_running_loop().time() + jittered / 1000

    def disconnect(self, node_id: int) -> None:
        """Drop the connection to ``node_id`` (its requests in flight fail)."""
        state = self._nodes.get(node_id)
        if state is not None and state.connection is not None:
            state.connection.close()
            state.connection = None

    async def close(self) -> None:
        self._closed = True
        for state in self._nodes.values():
            if state.connection is not None:
                state.connection.close()
                await state.connection.wait_closed()
        self._nodes.clear()
