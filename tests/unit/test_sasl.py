"""SASL as Kafka's broker does it: the mechanisms (RFC 4616, RFC 5802/7677), the jaas text, and
a Connection on a SASL listener fed real frames (the gate, one request at a time, bare v0
tokens, close after a failure, re-authentication and expiry on a manual clock).

The connection is the broker's own, its requests handled inline by the real handler modules
(SaslHandshake, SaslAuthenticate, ApiVersions); other requests are recorded, not handled.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from broker.apis import api_versions, sasl_authenticate, sasl_handshake
from broker.client_telemetry import ClientTelemetry
from broker.config import BrokerConfig, ConfigError
from broker.metadata.file_store import MetadataStore
from broker.network.connection import Connection
from broker.network.mute import MuteReason
from broker.network.request_channel import RequestChannel
from broker.security import sasl as sasl_mod
from broker.security.jaas import parse_jaas_config, server_login_module
from broker.security.listener import PLAINTEXT_LISTENER, ListenerSecurity
from broker.security.principal import Session
from broker.security.sasl import (
    ILLEGAL_SASL_STATE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    AuthenticationStats,
    PlainServer,
    SaslAuthenticationError,
    SaslError,
    SaslServerConfig,
    ScramServer,
    sasl_server_config,
)
from broker.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, ScramCredentialStore
from protocol.registry import APIS, ApiSpec

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
              'username="admin" password="admin-secret" '
              'user_admin="admin-secret" user_alice="alice-secret";')
LISTENER = "SASL_PLAINTEXT"


# -- a config object with BrokerConfig's two accessors ---------------------------------------------

class Cfg:
    """``listener_value`` and ``[]`` as BrokerConfig gives them, from a flat dict."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = {"sasl.server.max.receive.size": 524288,
                       "connections.max.reauth.ms": 0,
                       "connection.failed.authentication.delay.ms": 100, **values}

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def listener_value(self, listener: str, key: str) -> Any:
        prefixed = f"listener.name.{listener.lower()}.{key}"
        if prefixed in self.values:
            return self.values[prefixed]
        return None if key.endswith("sasl.jaas.config") else self.values.get(key)


# -- SCRAM as a client computes it ---------------------------------------------------------------

def scram_final(mech, password: str, client_first_bare: str, server_first: str,
                gs2: str = "n,,") -> tuple[str, str]:
    """(client-final message, the server signature it must answer) for ``password``."""
    fields = dict(kv.split("=", 1) for kv in server_first.split(","))
    salted = mech.salted_password(password, base64.b64decode(fields["s"]), int(fields["i"]))
    without_proof = f"c={base64.b64encode(gs2.encode()).decode()},r={fields['r']}"
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    client_key = mech.client_key(salted)
    signature = mech.hmac(mech.hash(client_key), auth_message)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_sig = mech.hmac(mech.server_key(salted), auth_message)
    return (f"{without_proof},p={base64.b64encode(proof).decode()}",
            "v=" + base64.b64encode(server_sig).decode())


def add_user(store: ScramCredentialStore, mech, user: str, password: str,
             salt: bytes = b"salt-of-test", iterations: int = 4096) -> None:
    salted = mech.salted_password(password, salt, iterations)
    [result] = store.alter([], [SimpleNamespace(name=user, mechanism=mech.type,
                                                iterations=iterations, salt=salt,
                                                salted_password=salted)])
    assert result.error_code == 0


@pytest.fixture
def store(tmp_path) -> ScramCredentialStore:
    metadata = MetadataStore(tmp_path)
    metadata.load()
    return ScramCredentialStore(metadata)


# -- jaas ------------------------------------------------------------------------------------------

def test_jaas_plain_users_and_the_grammar_kafka_reads():
    entry = server_login_module(PLAIN_JAAS)
    assert entry.login_module.endswith("PlainLoginModule") and entry.control_flag == "REQUIRED"
    assert entry.options["user_alice"] == "alice-secret"
    # comments, single quotes, escapes, bare words with dots and dashes, several entries
    [a, b] = parse_jaas_config("A required /* x */ k1='v\\'1' k-2=x.y // rest\n; B optional;")
    assert a.options == {"k1": "v'1", "k-2": "x.y"} and b.control_flag == "OPTIONAL"
    assert "alice-secret" not in repr(entry)  # options (passwords) never shown


@pytest.mark.parametrize("text, message", [
    ("", "Login module not specified in JAAS config"),
    ("A", "Login module control flag not specified in JAAS config"),
    ("A maybe;", "Invalid login module control flag 'maybe' in JAAS config"),
    ("A required k=1;", "Value not specified for key 'k' in JAAS config"),
    ("A required k;", "Value not specified for key 'k' in JAAS config"),
    ('A required k="v"', "JAAS config entry not terminated by semi-colon"),
    ("A required; B required;",
     "JAAS config property contains 2 login modules, should be 1 module"),
])
def test_jaas_errors_are_kafkas(text, message):
    with pytest.raises(ValueError) as exc:
        server_login_module(text)
    assert str(exc.value) == message


def test_sasl_server_config_from_kafkas_keys(store):
    prefix = f"listener.name.{LISTENER.lower()}"
    cfg = Cfg({"sasl.enabled.mechanisms": ["PLAIN", "SCRAM-SHA-256"],
               f"{prefix}.plain.sasl.jaas.config": PLAIN_JAAS,
               f"{prefix}.connections.max.reauth.ms": 5000})
    stats = AuthenticationStats()
    sc = sasl_server_config(cfg, LISTENER, store, stats)
    assert sc.mechanisms == ("PLAIN", "SCRAM-SHA-256") and sc.reauth_ms == 5000
    assert sc.failed_close_delay_ms == 100
    assert sc.plain_users == {"admin": "admin-secret", "alice": "alice-secret"}
    assert sc.scram is store and sc.stats is stats and sc.listener == LISTENER
    assert "alice-secret" not in repr(sc)


@pytest.mark.parametrize("values, words", [
    ({"sasl.enabled.mechanisms": ["GSSAPI"]}, "GSSAPI"),  # Kafka's default: not served here
    ({"sasl.enabled.mechanisms": []}, "No SASL mechanisms are enabled"),
    ({"sasl.enabled.mechanisms": ["PLAIN"]}, "plain.sasl.jaas.config is required"),
    ({"sasl.enabled.mechanisms": ["PLAIN"],
      "listener.name.sasl_plaintext.plain.sasl.jaas.config": 'X required user_a="pw";'},
     "not org.apache.kafka.common.security.plain.PlainLoginModule"),
    ({"sasl.enabled.mechanisms": ["PLAIN"],
      "listener.name.sasl_plaintext.plain.sasl.jaas.config": 'X required user_a="secret-pw"'},
     "not terminated by semi-colon"),
    ({"sasl.enabled.mechanisms": ["SCRAM-SHA-512"],
      "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": "Y required;"},
     "ScramLoginModule"),
])
def test_sasl_server_config_refuses_what_kafka_would_not_start_with(store, values, words):
    with pytest.raises(ConfigError) as exc:
        sasl_server_config(Cfg(values), LISTENER, store, AuthenticationStats())
    assert words in str(exc.value)
    assert "secret-pw" not in str(exc.value)


# -- PLAIN -----------------------------------------------------------------------------------------

USERS = {"alice": "alice-secret", "bob": "b"}


def test_plain_accepts_the_user_with_an_empty_or_equal_authzid():
    for token in (b"\0alice\0alice-secret", b"alice\0alice\0alice-secret"):
        server = PlainServer(USERS)
        assert server.evaluate(token) == b"" and server.complete
        assert server.authorization_id == "alice"


@pytest.mark.parametrize("token, message", [
    (b"\0alice\0wrong", "Authentication failed: Invalid username or password"),
    (b"\0nobody\0alice-secret", "Authentication failed: Invalid username or password"),
    (b"bob\0alice\0alice-secret",
     "Authentication failed: Client requested an authorization id that is different from "
     "username"),
    (b"\0\0pw", "Authentication failed: username not specified"),
    (b"\0alice\0", "Authentication failed: password not specified"),
    (b"alice-secret", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
    (b"\0alice\0alice-secret\0x", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
])
def test_plain_refusals_say_what_kafka_says(token, message):
    server = PlainServer(USERS)
    with pytest.raises(SaslAuthenticationError) as exc:
        server.evaluate(token)
    assert str(exc.value) == message and not server.complete


# -- SCRAM -----------------------------------------------------------------------------------------

def test_scram_sha_256_rfc7677_test_vector(store, monkeypatch):
    """RFC 7677 section 3: user "user", password "pencil", the RFC's salt, nonces and
    iterations give exactly the RFC's server-first and server-final messages."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    add_user(store, SCRAM_SHA_256, "user", "pencil", salt=salt, iterations=4096)
    monkeypatch.setattr(sasl_mod, "_nonce", lambda: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server = ScramServer(SCRAM_SHA_256, store)
    first = server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = server.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                            b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.authorization_id == "user"


@pytest.mark.parametrize("mech", [SCRAM_SHA_256, SCRAM_SHA_512], ids=lambda m: m.name)
def test_scram_exchange_with_a_fresh_server_nonce(store, mech):
    add_user(store, mech, "alice", "s3cret", iterations=8192)
    server = ScramServer(mech, store)
    bare = "n=alice,r=clientnonce123"
    first = server.evaluate(f"n,,{bare}".encode()).decode()
    nonce = dict(kv.split("=", 1) for kv in first.split(","))["r"]
    assert nonce.startswith("clientnonce123") and len(nonce) > len("clientnonce123") + 10
    assert first.endswith(",i=8192")
    final, expected = scram_final(mech, "s3cret", bare, first)
    assert server.evaluate(final.encode()).decode() == expected
    assert server.complete and server.authorization_id == "alice"


def test_scram_wrong_password_unknown_user_and_wrong_mechanism_fail(store):
    add_user(store, SCRAM_SHA_256, "alice", "right")
    server = ScramServer(SCRAM_SHA_256, store)
    first = server.evaluate(b"n,,n=alice,r=abc").decode()
    final, _ = scram_final(SCRAM_SHA_256, "wrong", "n=alice,r=abc", first)
    with pytest.raises(SaslError, match="Invalid client credentials") as exc:
        server.evaluate(final.encode())
    assert not isinstance(exc.value, SaslAuthenticationError)  # the client gets the generic text
    with pytest.raises(SaslError, match="Invalid user credentials"):
        ScramServer(SCRAM_SHA_256, store).evaluate(b"n,,n=nobody,r=abc")
    with pytest.raises(SaslError, match="Invalid user credentials"):  # no SHA-512 credential
        ScramServer(SCRAM_SHA_512, store).evaluate(b"n,,n=alice,r=abc")


@pytest.mark.parametrize("first", [
    b"y,,n=alice,r=abc",  # channel binding flags: only "n" is served
    b"p=tls-unique,,n=alice,r=abc",
    b"n,,n=alice",
    b"n,,r=abc,n=alice",
    b"n,,n=al,ice,r=abc",
    b"",
])
def test_scram_malformed_client_first(store, first):
    add_user(store, SCRAM_SHA_256, "alice", "pw")
    with pytest.raises(SaslError, match="Invalid SCRAM client first message format"):
        ScramServer(SCRAM_SHA_256, store).evaluate(first)


def test_scram_names_escapes_authzid_and_token_auth(store):
    add_user(store, SCRAM_SHA_256, "a,b=c", "pw")
    server = ScramServer(SCRAM_SHA_256, store)
    assert server.evaluate(b"n,,n=a=2Cb=3Dc,r=x").startswith(b"r=x")
    with pytest.raises(SaslError, match="client first message format"):  # "=" not escaped
        ScramServer(SCRAM_SHA_256, store).evaluate(b"n,,n=a=41,r=x")
    with pytest.raises(SaslAuthenticationError, match="authorization id that is different"):
        ScramServer(SCRAM_SHA_256, store).evaluate(b"n,a=bob,n=a=2Cb=3Dc,r=x")
    # As Kafka, the authzid is compared as sent (escaped) with the user name (unescaped).
    with pytest.raises(SaslAuthenticationError, match="authorization id that is different"):
        ScramServer(SCRAM_SHA_256, store).evaluate(b"n,a=a=2Cb=3Dc,n=a=2Cb=3Dc,r=x")
    add_user(store, SCRAM_SHA_256, "bob", "pw")
    ok = ScramServer(SCRAM_SHA_256, store)  # an authzid equal to the user is fine
    assert ok.evaluate(b"n,a=bob,n=bob,r=x").startswith(b"r=x")
    with pytest.raises(SaslError, match="Token Authentication failed"):  # no delegation tokens
        ScramServer(SCRAM_SHA_256, store).evaluate(b"n,,n=a=2Cb=3Dc,r=x,tokenauth=true")
    plain_ext = ScramServer(SCRAM_SHA_256, store)  # other extensions are ignored
    assert plain_ext.evaluate(b"n,,n=a=2Cb=3Dc,r=x,tokenauth=false").startswith(b"r=x")


def test_scram_final_checks_nonce_and_format(store):
    add_user(store, SCRAM_SHA_256, "alice", "pw")
    for bad in (b"c=biws,r=other,p=AAAA", b"c=biws,p=AAAA", b"nonsense"):
        server = ScramServer(SCRAM_SHA_256, store)
        server.evaluate(b"n,,n=alice,r=abc")
        with pytest.raises(SaslError):
            server.evaluate(bad)
        assert not server.complete
    server = ScramServer(SCRAM_SHA_256, store)
    first = server.evaluate(b"n,,n=alice,r=abc").decode()
    nonce = first.split(",")[0][2:]
    with pytest.raises(SaslError, match="Invalid client credentials"):  # proof of wrong size
        server.evaluate(f"c=biws,r={nonce},p=AAAA".encode())


# -- a connection on a SASL listener ---------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


_SPECS = {
    17: (0, 1, SaslHandshakeRequest, SaslHandshakeResponse),
    36: (0, 2, SaslAuthenticateRequest, SaslAuthenticateResponse),
}


@pytest.fixture(autouse=True)
def sasl_apis(monkeypatch):
    """Serve SaslHandshake and SaslAuthenticate even before the registry lists them."""
    for key, (lo, hi, req, resp) in _SPECS.items():
        if key not in APIS:
            monkeypatch.setitem(APIS, key, ApiSpec(key, req.name.removesuffix("Request"),
                                                   lo, hi, req, resp, lo))


_HANDLERS = {17: sasl_handshake.handle, 36: sasl_authenticate.handle, 18: api_versions.handle}
# What these handlers read of the context: ApiVersions asks which group protocols are served.
_CONFIG = BrokerConfig.from_dict({})
_CONTEXT = SimpleNamespace(config=_CONFIG, telemetry=ClientTelemetry.of(_CONFIG))


class Client:
    """One connection on a SASL listener and a client's view of it: encode, feed, decode."""

    def __init__(self, config: SaslServerConfig, inline: bool = True,
                 max_frame: int = 1 << 20) -> None:
        self.others: list[Any] = []  # requests handed to the channel that are not SASL's
        self.queued: list[Any] = []  # not inline: what waits for the test to handle it
        self.channel = RequestChannel(1, 10**9, dispatch=self._dispatch)
        self.channel.submit = self._submit  # type: ignore[method-assign]
        self.inline = inline
        security = ListenerSecurity(LISTENER, "SASL_PLAINTEXT", sasl=config)
        self.conn = Connection(self.channel, serial=False, max_frame=max_frame,
                               security=security)
        self.transport = Transport()
        self.conn.connection_made(self.transport)
        self.correlation = 0
        self._read = 0
        self._versions: dict[int, tuple[Any, int]] = {}

    def _dispatch(self, request: Any) -> Any:
        handler = _HANDLERS.get(request.spec.key)
        if handler is None:
            self.others.append(request)
            return MetadataResponse(throttle_time_ms=0, brokers=[], cluster_id=None,
                                    controller_id=1, topics=[])
        return handler(_CONTEXT, request)  # type: ignore[arg-type]

    def _submit(self, request: Any) -> None:
        if self.inline:
            self.channel.handle(request)
        else:
            self.queued.append(request)

    def send(self, request: Any) -> None:
        self.correlation += 1
        request.with_header(correlation_id=self.correlation, client_id="t")
        self._versions[self.correlation] = (request, request.API_VERSION)
        self.conn.data_received(bytes(request.encode(header=True, framed=True)))

    def send_raw(self, token: bytes) -> None:
        self.conn.data_received(struct.pack(">i", len(token)) + token)

    def responses(self) -> list[Any]:
        """Responses written since the last call, decoded as the client reads them."""
        out = []
        for payload in self.transport.written[self._read:]:
            (correlation,) = struct.unpack_from(">i", payload, 4)
            request, version = self._versions[correlation]
            resp_class = {17: SaslHandshakeResponse, 36: SaslAuthenticateResponse,
                          18: ApiVersionsResponse, 3: MetadataResponse}[request.API_KEY]
            flexible = request.API_KEY != 18 and request.flexible_version_q(version)
            out.append(resp_class.decode(payload[9 if flexible else 8:], version=version))
        self._read = len(self.transport.written)
        return out

    def raw_responses(self) -> list[bytes]:
        out = [p[4:] for p in self.transport.written[self._read:]]
        self._read = len(self.transport.written)
        return out

    # -- whole exchanges -------------------------------------------------------------------
    def plain(self, user: str, password: str, handshake_version: int = 1,
              authenticate_version: int = 2) -> SaslAuthenticateResponse:
        self.responses()  # earlier answers the test did not read
        self.send(SaslHandshakeRequest[handshake_version](mechanism="PLAIN"))
        [hs] = self.responses()
        assert hs.error_code == 0
        self.send(SaslAuthenticateRequest[authenticate_version](
            auth_bytes=f"\0{user}\0{password}".encode()))
        [resp] = self.responses()
        return resp


def sasl_config(store: ScramCredentialStore | None = None, reauth_ms: int = 0,
                max_receive_size: int = 524288, clock: Any = None,
                mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
                failed_close_delay_ms: int = 0) -> SaslServerConfig:
    return SaslServerConfig(LISTENER, mechanisms, plain_users=dict(USERS), scram=store,
                            reauth_ms=reauth_ms, max_receive_size=max_receive_size,
                            stats=AuthenticationStats(), clock=clock or Clock(),
                            failed_close_delay_ms=failed_close_delay_ms)


def metadata_request() -> Any:
    return MetadataRequest[12](topics=[], allow_auto_topic_creation=False,
                               include_topic_authorized_operations=False)


def test_plain_over_the_connection_sets_the_session(store):
    client = Client(sasl_config(store))
    with structlog.testing.capture_logs() as logs:
        client.send(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"))
        [versions] = client.responses()
        assert versions.error_code == 0
        resp = client.plain("alice", "alice-secret")
    assert (resp.error_code, resp.error_message, resp.session_lifetime_ms) == (0, None, 0)
    session: Session = client.conn.session
    assert str(session.principal) == "User:alice" and session.mechanism == "PLAIN"
    assert not client.conn._gated  # no session lifetime: the request path has no gate
    assert client.conn.decoder.max_size == 1 << 20
    client.send(metadata_request())
    assert len(client.others) == 1 and not client.transport.closed
    [line] = [e for e in logs if e["event"] == "authenticated"]
    assert (line["listener"], line["mechanism"], line["principal"]) == (
        LISTENER, "PLAIN", "User:alice")
    assert "alice-secret" not in repr(logs)
    assert client.conn.auth.config.stats.successes == {(LISTENER, "PLAIN"): 1}


def test_a_request_before_authentication_closes_the_connection(store):
    client = Client(sasl_config(store))
    with structlog.testing.capture_logs() as logs:
        client.send(metadata_request())
    assert client.transport.closed and client.transport.written == []
    assert client.others == []
    [line] = [e for e in logs if e["log_level"] == "warning"]
    assert line["reason"] == "Unexpected Kafka request of type METADATA during SASL handshake."
    assert line["peer"] == "127.0.0.1:40000" and line["mechanism"] == "NONE"
    assert client.conn.auth.config.stats.failures == {(LISTENER, "NONE"): 1}


def test_saslauthenticate_before_the_handshake_and_a_second_apiversions_close(store):
    client = Client(sasl_config(store))
    client.send(SaslAuthenticateRequest[2](auth_bytes=b"\0alice\0alice-secret"))
    assert client.transport.closed and client.transport.written == []
    client = Client(sasl_config(store))
    client.send(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"))
    client.send(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"))
    assert len(client.responses()) == 1 and client.transport.closed


def test_after_the_handshake_only_saslauthenticate(store):
    client = Client(sasl_config(store))
    client.send(SaslHandshakeRequest[1](mechanism="PLAIN"))
    client.send(metadata_request())
    assert len(client.responses()) == 1 and client.transport.closed and not client.others


def test_wrong_password_answers_then_closes(store):
    client = Client(sasl_config(store))
    with structlog.testing.capture_logs() as logs:
        resp = client.plain("alice", "not-her-password")
    assert resp.error_code == SASL_AUTHENTICATION_FAILED
    assert resp.error_message == "Authentication failed: Invalid username or password"
    assert client.transport.closed  # after the answer was written
    assert str(client.conn.session.principal) == "User:ANONYMOUS"
    [line] = [e for e in logs if e["log_level"] == "warning"]
    assert line["mechanism"] == "PLAIN" and "not-her-password" not in repr(logs)
    assert client.conn.auth.config.stats.failures == {(LISTENER, "PLAIN"): 1}


async def test_failed_answer_then_close_after_kafkas_delay(store):
    """connection.failed.authentication.delay.ms: the answer goes out at once, nothing more is
    read, and the socket closes only after the delay, so the client reads the answer first."""
    client = Client(sasl_config(store, failed_close_delay_ms=100))
    client.send(SaslHandshakeRequest[1](mechanism="PLAIN"))
    await asyncio.sleep(0)  # answers leave at the end of the loop iteration
    [hs] = client.responses()
    assert hs.error_code == 0
    client.send(SaslAuthenticateRequest[2](auth_bytes=b"\0alice\0not-her-password"))
    await asyncio.sleep(0)
    [resp] = client.responses()
    assert resp.error_code == SASL_AUTHENTICATION_FAILED
    assert client.conn.closed and not client.transport.closed
    await asyncio.sleep(0.25)
    assert client.transport.closed


def test_scram_failure_gets_kafkas_generic_message(store):
    add_user(store, SCRAM_SHA_512, "alice", "right")
    client = Client(sasl_config(store))
    client.send(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-512"))
    client.send(SaslAuthenticateRequest[2](auth_bytes=b"n,,n=nobody,r=abc"))
    [_, resp] = client.responses()
    assert resp.error_code == SASL_AUTHENTICATION_FAILED
    assert resp.error_message == ("Authentication failed during authentication due to invalid "
                                  "credentials with SASL mechanism SCRAM-SHA-512")
    assert client.transport.closed


def test_unknown_mechanism_lists_the_enabled_ones_then_closes(store):
    client = Client(sasl_config(store, mechanisms=("SCRAM-SHA-256", "PLAIN")))
    client.send(SaslHandshakeRequest[1](mechanism="GSSAPI"))
    [resp] = client.responses()
    assert resp.error_code == UNSUPPORTED_SASL_MECHANISM
    assert resp.mechanisms == ["SCRAM-SHA-256", "PLAIN"]
    assert client.transport.closed


@pytest.mark.parametrize("mech", [SCRAM_SHA_256, SCRAM_SHA_512], ids=lambda m: m.name)
@pytest.mark.parametrize("version", [0, 1, 2])
def test_scram_over_saslauthenticate(store, mech, version):
    add_user(store, mech, "alice", "scram-pw")
    client = Client(sasl_config(store, reauth_ms=3000))
    client.send(SaslHandshakeRequest[1](mechanism=mech.name))
    client.responses()
    client.send(SaslAuthenticateRequest[version](auth_bytes=b"n,,n=alice,r=nonce1"))
    [first] = client.responses()
    assert first.error_code == 0 and first.session_lifetime_ms == 0
    final, expected = scram_final(mech, "scram-pw", "n=alice,r=nonce1", first.auth_bytes.decode())
    client.send(SaslAuthenticateRequest[version](auth_bytes=final.encode()))
    [last] = client.responses()
    assert last.error_code == 0 and last.auth_bytes.decode() == expected
    if version >= 1:
        assert last.session_lifetime_ms == 3000
    assert str(client.conn.session.principal) == "User:alice"
    assert client.conn.session.mechanism == mech.name


def test_requests_are_served_one_at_a_time_until_authenticated(store):
    client = Client(sasl_config(store), inline=False)
    client.send(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"))
    client.send(SaslHandshakeRequest[1](mechanism="PLAIN"))  # pipelined: waits
    assert len(client.queued) == 1 and client.conn.mute & MuteReason.SASL
    assert client.transport.paused
    client.channel.handle(client.queued.pop())
    assert len(client.queued) == 1  # answered: the handshake goes now
    client.channel.handle(client.queued.pop())
    client.send(SaslAuthenticateRequest[2](auth_bytes=b"\0alice\0alice-secret"))
    client.channel.handle(client.queued.pop())
    assert client.conn.mute == MuteReason(0) and not client.transport.paused
    # authenticated, no lifetime: pipelining is back
    client.send(metadata_request())
    client.send(metadata_request())
    assert len(client.queued) == 2


def test_frames_over_the_sasl_receive_size_close_before_authentication_only(store):
    client = Client(sasl_config(store, max_receive_size=100))
    with structlog.testing.capture_logs() as logs:
        client.send(SaslHandshakeRequest[1](mechanism="PLAIN"))
        client.send(SaslAuthenticateRequest[2](auth_bytes=b"\0alice\0" + b"x" * 200))
    assert client.transport.closed
    assert "invalid receive size" in [e for e in logs if e["log_level"] == "warning"][0]["reason"]
    client = Client(sasl_config(store, max_receive_size=100))
    assert client.plain("alice", "alice-secret").error_code == 0
    client.send(MetadataRequest[12](topics=[MetadataRequest[12].MetadataRequestTopic(
        topic_id=None, name="t" * 300)], allow_auto_topic_creation=False,
        include_topic_authorized_operations=False))
    assert len(client.others) == 1 and not client.transport.closed


def test_handshake_v0_then_bare_tokens(store):
    client = Client(sasl_config(store))
    client.send(SaslHandshakeRequest[0](mechanism="PLAIN"))
    [hs] = client.responses()
    assert hs.error_code == 0
    client.send_raw(b"\0alice\0alice-secret")
    assert client.raw_responses() == [b""]  # an empty token, size-prefixed
    assert str(client.conn.session.principal) == "User:alice"
    client.send(metadata_request())
    assert len(client.others) == 1


def test_bare_scram_tokens_and_a_bare_failure_closes_without_an_answer(store):
    add_user(store, SCRAM_SHA_256, "alice", "pw")
    client = Client(sasl_config(store))
    client.send(SaslHandshakeRequest[0](mechanism="SCRAM-SHA-256"))
    client.responses()
    client.send_raw(b"n,,n=alice,r=xyz")
    [first] = client.raw_responses()
    final, expected = scram_final(SCRAM_SHA_256, "pw", "n=alice,r=xyz", first.decode())
    client.send_raw(final.encode())
    assert client.raw_responses() == [expected.encode()]
    assert client.conn.session.mechanism == "SCRAM-SHA-256"
    client = Client(sasl_config(store))
    client.send(SaslHandshakeRequest[0](mechanism="PLAIN"))
    client.responses()
    client.send_raw(b"\0alice\0wrong")
    assert client.raw_responses() == [] and client.transport.closed


def test_sasl_requests_after_authentication_are_illegal_state(store):
    client = Client(sasl_config(store))
    client.plain("alice", "alice-secret")
    client.send(SaslAuthenticateRequest[2](auth_bytes=b"\0alice\0alice-secret"))
    client.send(SaslHandshakeRequest[1](mechanism="PLAIN"))  # no session lifetime: no reauth
    [auth, hs] = client.responses()
    assert auth.error_code == ILLEGAL_SASL_STATE
    assert auth.error_message == "SaslAuthenticate request received after successful " \
                                 "authentication"
    assert hs.error_code == ILLEGAL_SASL_STATE and not client.transport.closed


def test_sasl_requests_on_a_plaintext_listener_are_illegal_state():
    channel = RequestChannel(1, 10**9, dispatch=lambda r: _HANDLERS[r.spec.key](None, r))
    conn = Connection(channel, serial=False, max_frame=1 << 20, security=PLAINTEXT_LISTENER)
    transport = Transport()
    conn.connection_made(transport)
    channel.submit = channel.handle  # type: ignore[method-assign]
    for n, req in enumerate((SaslHandshakeRequest[1](mechanism="PLAIN"),
                             SaslAuthenticateRequest[1](auth_bytes=b"x")), 1):
        req.with_header(correlation_id=n, client_id="t")
        conn.data_received(bytes(req.encode(header=True, framed=True)))
    assert conn.auth is None and len(transport.written) == 2
    hs = SaslHandshakeResponse.decode(transport.written[0][8:], version=1)
    auth = SaslAuthenticateResponse.decode(transport.written[1][8:], version=1)
    assert hs.error_code == ILLEGAL_SASL_STATE == auth.error_code and not transport.closed


# -- KIP-368: session lifetime and re-authentication -----------------------------------------------

def test_reauthentication_renews_the_session_and_expiry_closes(store):
    clock = Clock()
    client = Client(sasl_config(store, reauth_ms=2000, clock=clock))
    assert client.plain("alice", "alice-secret").session_lifetime_ms == 2000
    assert client.conn._gated  # watching the session's lifetime
    clock.now += 1.5
    client.send(metadata_request())
    assert len(client.others) == 1
    with structlog.testing.capture_logs() as logs:
        resp = client.plain("alice", "alice-secret")  # re-authentication, same principal
    assert resp.error_code == 0 and resp.session_lifetime_ms == 2000
    assert [e["event"] for e in logs if e["log_level"] == "info"] == ["re-authenticated"]
    assert client.conn.auth.config.stats.reauth_successes == {(LISTENER, "PLAIN"): 1}
    clock.now += 1.9  # 3.4 s after the first login, 1.9 s after the second: still valid
    client.send(metadata_request())
    assert len(client.others) == 2 and not client.transport.closed
    clock.now += 0.2
    client.send(metadata_request())  # expired: closed, not answered
    assert client.transport.closed and len(client.others) == 2


def test_reauthentication_as_someone_else_fails_and_closes(store):
    clock = Clock()
    client = Client(sasl_config(store, reauth_ms=2000, clock=clock))
    client.plain("alice", "alice-secret")
    clock.now += 1.2
    resp = client.plain("bob", "b")
    assert resp.error_code == SASL_AUTHENTICATION_FAILED
    assert resp.error_message == ("Cannot change principals during re-authentication from "
                                  "User.alice: User.bob")
    assert client.transport.closed and str(client.conn.session.principal) == "User:alice"
    assert client.conn.auth.config.stats.reauth_failures == {(LISTENER, "PLAIN"): 1}


def test_reauthentication_with_another_mechanism_closes_at_the_next_frame(store):
    add_user(store, SCRAM_SHA_256, "alice", "pw")
    clock = Clock()
    client = Client(sasl_config(store, reauth_ms=2000, clock=clock))
    client.plain("alice", "alice-secret")
    clock.now += 1.2
    client.send(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-256"))
    [hs] = client.responses()
    assert hs.error_code == 0 and not client.transport.closed
    client.send(SaslAuthenticateRequest[2](auth_bytes=b"n,,n=alice,r=abc"))
    assert client.transport.closed and client.responses() == []


def test_reauthentication_at_most_once_a_second(store):
    clock = Clock()
    client = Client(sasl_config(store, reauth_ms=10_000, clock=clock))
    client.plain("alice", "alice-secret")
    clock.now += 0.1
    assert client.plain("alice", "alice-secret").error_code == 0  # the first one may be soon
    clock.now += 0.5
    client.send(SaslHandshakeRequest[1](mechanism="PLAIN"))
    [hs] = client.responses()
    assert hs.error_code == ILLEGAL_SASL_STATE and not client.transport.closed


def test_reauthentication_waits_for_the_answers_before_it(store):
    clock = Clock()
    client = Client(sasl_config(store, reauth_ms=2000, clock=clock), inline=False)
    client.send(SaslHandshakeRequest[1](mechanism="PLAIN"))
    client.channel.handle(client.queued.pop())
    client.send(SaslAuthenticateRequest[2](auth_bytes=b"\0alice\0alice-secret"))
    client.channel.handle(client.queued.pop())
    client.responses()
    client.send(metadata_request())
    client.send(SaslHandshakeRequest[1](mechanism="PLAIN"))
    assert len(client.queued) == 1 and client.conn.mute & MuteReason.SASL
    assert client.conn.auth.ready  # not begun while the Metadata is unanswered
    client.channel.handle(client.queued.pop())
    assert len(client.queued) == 1 and not client.conn.auth.ready
