"""SASL authentication as Kafka's broker does it: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.

Three parts, none of which touches a socket:
- ``SaslServerConfig``: one SASL listener's settings (enabled mechanisms, PLAIN users from the
  listener's `plain.sasl.jaas.config`, the SCRAM store, `connections.max.reauth.ms`,
  `sasl.server.max.receive.size`), built once at start by ``sasl_server_config``.
- ``PlainServer`` and ``ScramServer``: one exchange each (Kafka's PlainSaslServer and
  ScramSaslServer), ``evaluate(token) -> token``.
- ``SaslAuthenticator``: one connection's state (Kafka's SaslServerAuthenticator): which request
  may come next, the handshake, each token, the session's expiry and re-authentication
  (KIP-368). The connection asks it what to admit; the SaslHandshake and SaslAuthenticate
  handlers ask it for their answers.

Errors reach the client as Kafka words them: a ``SaslAuthenticationError`` carries its message
to the client; any other ``SaslError`` answers with Kafka's generic "invalid credentials"
message (so nobody learns whether a user exists) and its own text only goes to the log. No
password, token or jaas text is ever logged.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import TYPE_CHECKING, Any

import structlog

from broker.config_error import ConfigError
from broker.security.jaas import server_login_module
from broker.security.principal import USER_TYPE, KafkaPrincipal, Session
from broker.security.scram import MECHANISMS as SCRAM_MECHANISMS
from broker.security.scram import ScramCredentialStore, ScramMechanism
from protocol.errors import ErrorCode
from protocol.registry import APIS

if TYPE_CHECKING:
    from broker.config import BrokerConfig

logger = structlog.get_logger("broker.security")

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
NO_MECHANISM = "NONE"  # the stats' mechanism label for failures before one was chosen

UNSUPPORTED_SASL_MECHANISM = ErrorCode.UNSUPPORTED_SASL_MECHANISM
ILLEGAL_SASL_STATE = ErrorCode.ILLEGAL_SASL_STATE
SASL_AUTHENTICATION_FAILED = ErrorCode.SASL_AUTHENTICATION_FAILED

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
API_VERSIONS_KEY = 18
_API_NAMES = {API_VERSIONS_KEY: "API_VERSIONS", SASL_HANDSHAKE_KEY: "SASL_HANDSHAKE",
              SASL_AUTHENTICATE_KEY: "SASL_AUTHENTICATE"}
MIN_REAUTH_INTERVAL_S = 1.0  # Kafka: at most one re-authentication a second per connection


class SaslError(Exception):
    """Kafka's SaslException: the client gets the generic message, the log gets this text."""


class SaslAuthenticationError(SaslError):
    """Kafka's SaslAuthenticationException: this message is what the client is told."""


# -- configuration ---------------------------------------------------------------------------------

@dataclass
class AuthenticationStats:
    """Kafka's successful/failed-(re)authentication totals, by (listener, mechanism). One per
    broker; failures before a mechanism was chosen count under mechanism "NONE"."""

    successes: dict[tuple[str, str], int] = field(default_factory=dict)
    failures: dict[tuple[str, str], int] = field(default_factory=dict)
    reauth_successes: dict[tuple[str, str], int] = field(default_factory=dict)
    reauth_failures: dict[tuple[str, str], int] = field(default_factory=dict)

    def record(self, listener: str, mechanism: str, ok: bool, reauth: bool = False) -> None:
        counts = ((self.reauth_successes if ok else self.reauth_failures) if reauth
                  else (self.successes if ok else self.failures))
        key = (listener, mechanism)
        counts[key] = counts.get(key, 0) + 1


@dataclass
class SaslServerConfig:
    listener: str
    mechanisms: tuple[str, ...]  # enabled, in configuration order
    plain_users: dict[str, str] = field(default_factory=dict, repr=False)  # user -> password
    scram: ScramCredentialStore | None = None
    reauth_ms: int = 0  # connections.max.reauth.ms; 0: sessions never expire
    max_receive_size: int = 524288  # sasl.server.max.receive.size
    # connection.failed.authentication.delay.ms: the failed answer goes out at once, the close
    # follows this much later, so the client reads the answer before the end of the stream.
    failed_close_delay_ms: int = 100
    stats: AuthenticationStats = field(default_factory=AuthenticationStats)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)  # seconds


def plain_users_of(jaas: str) -> dict[str, str]:
    """The `user_<name>="<password>"` options of a PlainLoginModule entry."""
    entry = server_login_module(jaas)
    if entry.login_module != PLAIN_LOGIN_MODULE:
        raise ValueError(f"the PLAIN jaas config names {entry.login_module}, "
                         f"not {PLAIN_LOGIN_MODULE}")
    return {k.removeprefix("user_"): v for k, v in entry.options.items()
            if k.startswith("user_")}


def sasl_server_config(cfg: BrokerConfig, listener_name: str, scram: ScramCredentialStore | None,
                       stats: AuthenticationStats) -> SaslServerConfig:
    """One SASL listener's settings from Kafka's keys; ConfigError where Kafka would not start
    (no mechanism, one we do not serve, PLAIN without its jaas config, a malformed jaas)."""
    raw = cfg.listener_value(listener_name, "sasl.enabled.mechanisms")
    names = raw.split(",") if isinstance(raw, str) else list(raw or [])
    mechanisms = tuple(dict.fromkeys(m.strip() for m in names if m.strip()))
    prefix = f"listener.name.{listener_name.lower()}"
    if not mechanisms:
        raise ConfigError(f"listener {listener_name}: No SASL mechanisms are enabled")
    unknown = [m for m in mechanisms if m not in SUPPORTED_MECHANISMS]
    if unknown:
        raise ConfigError(f"listener {listener_name}: sasl.enabled.mechanisms has {unknown}; "
                          f"supported: {', '.join(SUPPORTED_MECHANISMS)}")
    plain_users: dict[str, str] = {}
    for mech in mechanisms:
        key = f"{mech.lower()}.sasl.jaas.config"
        jaas = cfg.listener_value(listener_name, key)
        jaas = getattr(jaas, "value", jaas)  # a Password-like wrapper, if the config has one
        if mech == PLAIN:
            if not jaas:
                raise ConfigError(f"{prefix}.{key} is required for PLAIN on {listener_name}")
            try:
                plain_users = plain_users_of(str(jaas))
            except ValueError as exc:  # the message never quotes the text (passwords)
                raise ConfigError(f"{prefix}.{key}: {exc}") from None
        elif jaas:  # SCRAM reads the credential store; a jaas entry, if given, must be sound
            try:
                entry = server_login_module(str(jaas))
            except ValueError as exc:
                raise ConfigError(f"{prefix}.{key}: {exc}") from None
            if entry.login_module != SCRAM_LOGIN_MODULE:
                raise ConfigError(f"{prefix}.{key} names {entry.login_module}, "
                                  f"not {SCRAM_LOGIN_MODULE}")
    return SaslServerConfig(
        listener=listener_name, mechanisms=mechanisms, plain_users=plain_users, scram=scram,
        reauth_ms=int(cfg.listener_value(listener_name, "connections.max.reauth.ms") or 0),
        max_receive_size=int(cfg["sasl.server.max.receive.size"]), stats=stats,
        failed_close_delay_ms=cfg["connection.failed.authentication.delay.ms"])


# -- the mechanisms --------------------------------------------------------------------------------

class PlainServer:
    """RFC 4616 as Kafka's PlainSaslServer: `[authzid] NUL authcid NUL passwd`, checked against
    the jaas users; an authzid must be empty or the user itself."""

    mechanism = PLAIN

    def __init__(self, users: dict[str, str]) -> None:
        self._users = users
        self.complete = False
        self.authorization_id: str | None = None

    def evaluate(self, token: bytes) -> bytes:
        text = token.decode("utf-8", "replace")
        parts = text.split("\0", 3)
        if len(parts) != 3:
            raise SaslAuthenticationError(
                f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        authzid, username, password = parts
        if not username:
            raise SaslAuthenticationError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationError("Authentication failed: password not specified")
        expected = self._users.get(username)
        import hmac  # with hashlib (about 0.6 MB), at the first SASL/PLAIN login

        if expected is None or not hmac.compare_digest(password.encode(), expected.encode()):
            raise SaslAuthenticationError("Authentication failed: Invalid username or password")
        if authzid and authzid != username:
            raise SaslAuthenticationError("Authentication failed: Client requested an "
                                          "authorization id that is different from username")
        self.authorization_id = username
        self.complete = True
        return b""


# RFC 5802's grammar as Kafka's ScramMessages writes it (ASCII only).
_VALUE_SAFE = r"[\x01-\x2b\x2d-\x3c\x3e-\x7f]"
_SASLNAME = rf"(?:{_VALUE_SAFE}|=2C|=3D)+"
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"
_B64 = r"[a-zA-Z0-9/+]"
_BASE64 = rf"(?:{_B64}{{4}})*(?:{_B64}{{3}}=|{_B64}{{2}}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(
    rf"n,(?:a=(?P<authzid>{_SASLNAME}))?,(?:m={_VALUE},)?"
    rf"(?P<bare>n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})(?P<ext>{_EXTENSIONS}))")
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<channel>{_BASE64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),"
    rf"p=(?P<proof>{_BASE64})")


def _username(saslname: str) -> str:
    """RFC 5802's saslname escapes: `=2C` is `,` and `=3D` is `=`; any other `=` is invalid."""
    name = saslname.replace("=2C", ",")
    if "=" in name.replace("=3D", ""):
        raise ValueError("invalid username")
    return name.replace("=3D", "=")


def _nonce() -> str:
    """Kafka's server nonce: 130 random bits in base 36."""
    import secrets  # with hashlib (about 0.6 MB), at the first SCRAM exchange

    n = secrets.randbits(130)
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


class ScramServer:
    """RFC 5802 without channel binding (gs2 header `n`), as Kafka's ScramSaslServer: the stored
    key checks the client's proof, the server key signs the answer; no PBKDF2 here."""

    def __init__(self, mechanism: ScramMechanism, store: ScramCredentialStore | None) -> None:
        self._mech = mechanism
        self.mechanism = mechanism.name
        self._store = store
        self.complete = False
        self.authorization_id: str | None = None
        self._state = "first"
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._credential: Any = None

    def evaluate(self, token: bytes) -> bytes:
        try:
            if self._state == "first":
                return self._first(token.decode("utf-8", "replace"))
            if self._state == "final":
                return self._final(token.decode("utf-8", "replace"))
            raise SaslAuthenticationError(
                f"Unexpected challenge in Sasl server state {self._state}")
        except SaslError:
            self._state, self._credential = "failed", None
            raise

    def _first(self, message: str) -> bytes:
        m = _CLIENT_FIRST.fullmatch(message)
        if m is None:
            raise SaslError("Invalid SCRAM client first message format")
        ext = m["ext"]
        extensions = dict(kv.split("=", 1) for kv in ext[1:].split(",")) if ext else {}
        try:
            username = _username(m["saslname"])
        except ValueError:
            raise SaslError("Authentication failed: Credentials could not be obtained") from None
        if extensions.get("tokenauth", "").lower() == "true":  # no delegation tokens here
            raise SaslError(f"Token Authentication failed: Invalid tokenId : {username}")
        credential = (self._store.get(username, self._mech.name)
                      if self._store is not None else None)
        if credential is None:
            raise SaslError("Authentication failed: Invalid user credentials")
        authzid = m["authzid"] or ""
        if authzid and authzid != username:
            raise SaslAuthenticationError("Authentication failed: Client requested an "
                                          "authorization id that is different from username")
        if credential.iterations < self._mech.min_iterations:
            raise SaslError(f"Iterations {credential.iterations} is less than the minimum "
                            f"{self._mech.min_iterations} for {self._mech.name}")
        self.authorization_id = username
        self._credential = credential
        self._client_first_bare = m["bare"]
        self._nonce = m["nonce"] + _nonce()
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        self._state = "final"
        return self._server_first.encode()

    def _final(self, message: str) -> bytes:
        m = _CLIENT_FINAL.fullmatch(message)
        if m is None:
            raise SaslError("Invalid SCRAM client final message format")
        if not m["nonce"].endswith(self._nonce):
            raise SaslError("Invalid client nonce in the final client message.")
        # As Kafka, the channel binding is read but not compared: without channel binding
        # the gs2 header is "n,," or "n,a=<user>," and the signature covers it anyway.
        channel = base64.b64encode(base64.b64decode(m["channel"])).decode()
        without_proof = f"c={channel},r={m['nonce']}"
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        credential, mech = self._credential, self._mech
        proof = base64.b64decode(m["proof"])
        signature = mech.hmac(credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise SaslError("Invalid client credentials")
        client_key = bytes(a ^ b for a, b in zip(signature, proof, strict=True))
        import hmac  # loaded by mech.hmac above

        if not hmac.compare_digest(mech.hash(client_key), credential.stored_key):
            raise SaslError("Invalid client credentials")
        server_signature = mech.hmac(credential.server_key, auth_message)
        self._credential = None
        self._state = "complete"
        self.complete = True
        return b"v=" + base64.b64encode(server_signature)


SaslServer = PlainServer | ScramServer


# -- one connection ----------------------------------------------------------------------------

class State(Enum):
    HANDSHAKE_OR_VERSIONS = auto()  # nothing yet: ApiVersions (once) or SaslHandshake
    HANDSHAKE = auto()  # ApiVersions answered: SaslHandshake only
    AUTHENTICATE = auto()  # SaslHandshake v1 answered: SaslAuthenticate requests only
    RAW = auto()  # SaslHandshake v0 answered: bare tokens, no request header
    REAUTH_BAD_MECHANISM = auto()  # a re-authentication asked for another mechanism
    COMPLETE = auto()  # authenticated: every API


@dataclass(slots=True)
class AuthenticateResult:
    error_code: int
    error_message: str | None
    auth_bytes: bytes
    session_lifetime_ms: int
    close: bool  # the connection closes once this answer is written


class SaslAuthenticator:
    """Kafka's SaslServerAuthenticator for one connection, minus the socket."""

    def __init__(self, config: SaslServerConfig, session: Session, peer: str,
                 on_authenticated: Callable[[], None] | None = None) -> None:
        self.config = config
        self.session = session
        self.peer = peer
        self._on_authenticated = on_authenticated  # the connection lifts its SASL limits
        self.state = State.HANDSHAKE_OR_VERSIONS
        self.mechanism: str | None = None  # chosen by this (re-)authentication's handshake
        self._server: SaslServer | None = None
        self._kafka_headers = False  # SaslHandshake v1+: tokens come in SaslAuthenticate
        self.expires_at: float | None = None  # the session's end (config.clock), if any
        self._reauth_started = 0.0
        self._previous: tuple[KafkaPrincipal, str] | None = None  # re-authenticating: who

    # -- what the connection asks ------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Authenticated and not re-authenticating: requests go their normal way."""
        return self.state is State.COMPLETE

    @property
    def raw(self) -> bool:
        return self.state is State.RAW

    @property
    def reauthenticating(self) -> bool:
        return self._previous is not None

    def admit(self, api_key: int, version: int) -> str | None:
        """Before authentication (or during re-authentication): None when a request of this
        key may be handled now, else why the connection must close (Kafka's words)."""
        state = self.state
        if state is State.REAUTH_BAD_MECHANISM:
            return self.fail(f"SASL mechanism '{self.mechanism}' requested by client is not "
                             f"supported for re-authentication of mechanism "
                             f"'{self._previous[1] if self._previous else ''}'")
        if state is State.AUTHENTICATE:
            if api_key == SASL_AUTHENTICATE_KEY:
                return None
            return self.fail(f"Unexpected Kafka request of type {_api_name(api_key)} "
                             "during SASL authentication.")
        if api_key == SASL_HANDSHAKE_KEY:
            return None
        if api_key == API_VERSIONS_KEY and state is State.HANDSHAKE_OR_VERSIONS:
            if APIS[API_VERSIONS_KEY].supports(version):  # else retried with one we know
                self.state = State.HANDSHAKE
            return None
        if api_key == API_VERSIONS_KEY:
            return self.fail("Unexpected ApiVersions request received during SASL "
                             f"authentication state {state.name}")
        return self.fail(f"Unexpected Kafka request of type {_api_name(api_key)} "
                         "during SASL handshake.")

    def expired(self) -> bool:
        return self.expires_at is not None and self.config.clock() > self.expires_at

    def may_reauthenticate(self) -> bool:
        """A SaslHandshake on an authenticated connection begins a re-authentication when the
        session has a lifetime, at most once a second (else it is answered ILLEGAL_SASL_STATE)."""
        if self.expires_at is None:
            return False
        return not self._reauth_started or (
            self.config.clock() - self._reauth_started >= MIN_REAUTH_INTERVAL_S)

    def begin_reauthentication(self) -> None:
        assert self.state is State.COMPLETE and self.mechanism is not None
        self._reauth_started = self.config.clock()
        self._previous = (self.session.principal, self.mechanism)
        self.state = State.HANDSHAKE
        self._server = None

    # -- what the handlers ask -----------------------------------------------------------------
    def handshake(self, version: int, mechanism: str) -> tuple[int, list[str], bool]:
        """SaslHandshake: (error code, enabled mechanisms, close after the answer)."""
        enabled = list(self.config.mechanisms)
        if self.state not in (State.HANDSHAKE_OR_VERSIONS, State.HANDSHAKE):
            self.fail(f"Unexpected SaslHandshake in SASL state {self.state.name}")
            return ILLEGAL_SASL_STATE, enabled, True
        if mechanism not in enabled:
            self.mechanism = None
            self.fail(f"Unsupported SASL mechanism {mechanism}")
            return UNSUPPORTED_SASL_MECHANISM, enabled, True
        self.mechanism = mechanism
        self._kafka_headers = version >= 1
        if self._previous is not None and mechanism != self._previous[1]:
            self.state = State.REAUTH_BAD_MECHANISM  # answered; the next frame closes
            return 0, enabled, False
        if mechanism == PLAIN:
            self._server = PlainServer(self.config.plain_users)
        else:
            self._server = ScramServer(SCRAM_MECHANISMS[mechanism], self.config.scram)
        self.state = State.AUTHENTICATE if self._kafka_headers else State.RAW
        return 0, enabled, False

    def authenticate(self, version: int, token: bytes) -> AuthenticateResult:
        """SaslAuthenticate: one token of the exchange."""
        if self.state is not State.AUTHENTICATE or self._server is None:
            reason = f"Unexpected SaslAuthenticate in SASL state {self.state.name}"
            self.fail(reason)
            return AuthenticateResult(ILLEGAL_SASL_STATE, reason, b"", 0, True)
        try:
            response = self._evaluate(token)
        except SaslAuthenticationError as exc:
            self.fail(str(exc))
            return AuthenticateResult(SASL_AUTHENTICATION_FAILED, str(exc), b"", 0, True)
        except SaslError as exc:
            self.fail(str(exc))
            message = (f"Authentication failed during {self._what()} due to invalid "
                       f"credentials with SASL mechanism {self.mechanism}")
            return AuthenticateResult(SASL_AUTHENTICATION_FAILED, message, b"", 0, True)
        lifetime = self._succeeded() if self.state is State.COMPLETE else 0
        return AuthenticateResult(0, None, response, lifetime, False)

    def raw_token(self, token: bytes) -> bytes | None:
        """A bare token after SaslHandshake v0: the bare answer, or None when the connection
        must close (Kafka answers a failed bare exchange with nothing)."""
        try:
            response = self._evaluate(token)
        except SaslError as exc:
            self.fail(str(exc))
            return None
        if self.state is State.COMPLETE:
            self._succeeded()
        return response

    # -- inside ------------------------------------------------------------------------------
    def _evaluate(self, token: bytes) -> bytes:
        server = self._server
        assert server is not None
        response = server.evaluate(token)
        if server.complete:
            principal = KafkaPrincipal(USER_TYPE, server.authorization_id or "")
            if self._previous is not None and self._previous[0] != principal:
                old = self._previous[0]
                raise SaslAuthenticationError(
                    "Cannot change principals during re-authentication from "
                    f"{old.principal_type}.{old.name}: {principal.principal_type}.{principal.name}")
            self.session.principal = principal
            self.session.mechanism = server.mechanism
            self.state = State.COMPLETE
        return response

    def _succeeded(self) -> int:
        """Authentication done: the session's lifetime (ms, 0 = none), counted and logged."""
        cfg = self.config
        reauth = self._previous is not None
        lifetime = max(cfg.reauth_ms, 0)
        self.expires_at = cfg.clock() + lifetime / 1000 if lifetime else None
        self._previous = None
        self._server = None
        cfg.stats.record(cfg.listener, self.mechanism or NO_MECHANISM, True, reauth)
        logger.info("re-authenticated" if reauth else "authenticated", listener=cfg.listener,
                 mechanism=self.mechanism, principal=str(self.session.principal),
                 peer=self.peer, session_lifetime_ms=lifetime)
        if self._on_authenticated is not None:
            self._on_authenticated()
        return lifetime

    def fail(self, reason: str) -> str:
        """Count and log one failed (re-)authentication; returns ``reason``."""
        cfg = self.config
        mechanism = self.mechanism if self.mechanism in cfg.mechanisms else NO_MECHANISM
        reauth = self._previous is not None
        cfg.stats.record(cfg.listener, mechanism or NO_MECHANISM, False, reauth)
        logger.warning(f"{self._what()} failed", listener=cfg.listener, mechanism=mechanism,
                    peer=self.peer, reason=reason)
        self._server = None
        return reason

    def _what(self) -> str:
        return "re-authentication" if self._previous is not None else "authentication"


def _api_name(api_key: int) -> str:
    """Kafka's ApiKeys name (Metadata -> METADATA) for the log line."""
    name = _API_NAMES.get(api_key)
    if name is not None:
        return name
    spec = APIS.get(api_key)
    if spec is None:
        return str(api_key)
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", spec.name).upper()
