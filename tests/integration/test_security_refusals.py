"""Refusals, each with Kafka's answer, while a well-behaved client keeps working beside them.

One broker (SASL_PLAINTEXT and SASL_SSL listeners, PLAIN and SCRAM-SHA-256 enabled, ACLs on,
User:admin super user). Throughout the module alice (SCRAM-SHA-256 over SASL_SSL) produces a
record every few milliseconds and a consumer in her group reads them; after every refusal she
must still be making progress, and at the end every record she was acknowledged has been read.
bob is a PLAIN user with no ACL at first: his produce, consume, group join, topic creation and
ACL change are refused with Kafka's error codes; once the admin grants him ACLs the same calls
succeed. Last, a restart: the ACLs and SCRAM credentials are still there.
"""

from __future__ import annotations

import re
import struct
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol.admin.acl import DescribeAclsRequest, DescribeAclsResponse
from kafka.protocol.consumer.group import JoinGroupRequest, JoinGroupResponse
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from tests.conformance.conftest import GROUP_OVERRIDES
from tests.support.broker import BrokerProcess
from tests.support.certs import (
    Pki,
    confluent_config,
    kafka_python_config,
    make_pki,
    secure_broker_overrides,
)
from tests.support.requests import (
    api_versions_request,
    fetch_request,
    fetch_response,
    produce_request,
    produce_response,
    record_batch,
)
from tests.support.wire import Wire

PLAIN_USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
MECHANISMS = ("PLAIN", "SCRAM-SHA-256")  # SCRAM-SHA-512 left out: the unknown-mechanism case
ALICE_SCRAM = "alice-scram"
CAROL_SCRAM = "carol-scram"
WAIT_S = 30

# Kafka's error codes
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58


@dataclass
class Steady:
    """alice, producing and consuming the whole time: the client nothing may disturb."""

    conf: dict
    topic: str
    acked: list[bytes] = field(default_factory=list)
    read: list[bytes] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    flushed: threading.Event = field(default_factory=threading.Event)  # the producer is done
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Steady:
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for t in self.threads:
            t.start()
        return self

    def _produce(self) -> None:
        producer = Producer({**self.conf, "acks": "all", "linger.ms": 0,
                             "error_cb": lambda e: self.errors.append(f"producer: {e}")})

        def on_delivery(err, msg) -> None:  # type: ignore[no-untyped-def]
            if err is not None:
                self.errors.append(f"delivery: {err}")
            else:
                self.acked.append(msg.value())

        i = 0
        while not self.stop.is_set():
            producer.produce(self.topic, f"steady-{i}".encode(), on_delivery=on_delivery)
            producer.poll(0.02)
            i += 1
        producer.flush(WAIT_S)
        self.flushed.set()

    def _consume(self) -> None:
        consumer = Consumer({**self.conf, "group.id": "sec-steady", "enable.auto.commit": True,
                             "auto.offset.reset": "earliest",
                             "error_cb": lambda e: self.errors.append(f"consumer: {e}")})
        consumer.subscribe([self.topic])
        drain_until = None
        while True:
            msg = consumer.poll(0.2)
            if msg is not None:
                if msg.error() is None:
                    self.read.append(msg.value())
                elif msg.error().code() != KafkaError._PARTITION_EOF:
                    self.errors.append(f"consume: {msg.error()}")
            if self.stop.is_set():
                drain_until = drain_until or time.monotonic() + WAIT_S
                # Only once the producer has flushed: an acknowledgement can still arrive.
                caught_up = self.flushed.is_set() and set(self.acked) <= set(self.read)
                if caught_up or time.monotonic() > drain_until:
                    break
        consumer.close()

    def progressing(self) -> None:
        """More records acknowledged and read within a few seconds, and no error so far."""
        acked, read = len(self.acked), len(self.read)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (len(self.acked) < acked + 5
                                               or len(self.read) < read + 5):
            time.sleep(0.05)
        assert self.errors == [], self.errors
        assert len(self.acked) >= acked + 5 and len(self.read) >= read + 5, (
            f"alice stalled: acked {acked} -> {len(self.acked)}, read {read} -> {len(self.read)}")

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(WAIT_S * 2)


@dataclass
class Env:
    broker: BrokerProcess
    pki: Pki
    admin: AdminClient
    steady: Steady
    bob_topic: str = ""  # bob's, once test_refused_then_granted granted it

    def conf(self, user: str, listener: str = "SASL_PLAINTEXT", mechanism: str = "PLAIN",
             password: str | None = None) -> dict:
        return confluent_config(self.broker.bootstrap_for(listener), listener, mechanism, user,
                                PLAIN_USERS[user] if password is None else password,
                                self.pki.ca_path)

    def port(self, listener: str) -> int:
        return self.broker.ports[listener]


def _admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient(confluent_config(broker.bootstrap_for("SASL_PLAINTEXT"), "SASL_PLAINTEXT",
                                        "PLAIN", "admin", PLAIN_USERS["admin"]))


def _scram(admin: AdminClient, user: str, password: str) -> None:
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password.encode())
    admin.alter_user_scram_credentials([upsert])[user].result(WAIT_S)


def _acl(rtype: ResourceType, name: str, principal: str, op: AclOperation,
         pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, AclPermissionType.ALLOW)


def _grant(admin: AdminClient, bindings: list[AclBinding]) -> None:
    for f in admin.create_acls(bindings).values():
        f.result(WAIT_S)


def _topic(admin: AdminClient, name: str, partitions: int = 1) -> str:
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(WAIT_S)
    return name


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("security-refusals")
    pki = make_pki(root / "pki")
    broker = BrokerProcess(root / "broker", {
        **GROUP_OVERRIDES,
        **secure_broker_overrides(pki, PLAIN_USERS, mechanisms=MECHANISMS,
                                  listeners=("SASL_PLAINTEXT", "SASL_SSL"))}).start()
    steady = None
    try:
        admin = _admin(broker)
        _scram(admin, "alice", ALICE_SCRAM)
        topic = _topic(admin, "sec-steady", 2)
        _grant(admin, [_acl(ResourceType.TOPIC, topic, "User:alice", AclOperation.WRITE),
                       _acl(ResourceType.TOPIC, topic, "User:alice", AclOperation.READ),
                       _acl(ResourceType.GROUP, "sec-steady", "User:alice", AclOperation.READ)])
        conf = confluent_config(broker.bootstrap_for("SASL_SSL"), "SASL_SSL", "SCRAM-SHA-256",
                                "alice", ALICE_SCRAM, pki.ca_path)
        steady = Steady(conf, topic).start()
        e = Env(broker, pki, admin, steady)
        e.steady.progressing()
        yield e
    finally:
        if steady is not None:
            steady.finish()
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()


# -- raw wire helpers ---------------------------------------------------------------------------


def sasl_handshake(wire: Wire, mechanism: str) -> SaslHandshakeResponse:
    return wire.request(SaslHandshakeRequest(mechanism=mechanism, version=1),
                        SaslHandshakeResponse)


def plain_login(wire: Wire, user: str, password: str) -> SaslAuthenticateResponse:
    """SaslHandshake v1 then SaslAuthenticate v2 with PLAIN's one token (authzid empty)."""
    assert sasl_handshake(wire, "PLAIN").error_code == 0
    token = b"\0" + user.encode() + b"\0" + password.encode()
    return wire.request(SaslAuthenticateRequest(auth_bytes=token, version=2),
                        SaslAuthenticateResponse)


def logged_in(env: Env, user: str) -> Wire:
    wire = Wire(env.port("SASL_PLAINTEXT"))
    resp = plain_login(wire, user, PLAIN_USERS[user])
    assert resp.error_code == 0, resp
    return wire


def _frame(wire: Wire, request) -> bytes:  # type: ignore[no-untyped-def]
    """One request's response frame (correlation id first)."""
    wire.send(request)
    return wire.read_frame()


def join_group_error(wire: Wire, group: str) -> int:
    join = JoinGroupRequest(group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=6000,
                            member_id="", group_instance_id=None, protocol_type="consumer",
                            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(
                                name="range", metadata=b"")], reason=None, version=6)
    return wire.request(join, JoinGroupResponse).error_code


def auth_failures(env: Env, listener: str, mechanism: str) -> float:
    """The broker's failed-authentication count for a listener and mechanism (/metrics)."""
    url = f"http://127.0.0.1:{env.broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    labels = f'listener="{listener}",mechanism="{mechanism}",result="failure"'
    m = re.search(r"^minibroker_authentications_total\{" + re.escape(labels) + r"\} (\S+)$",
                  text, flags=re.M)
    return float(m.group(1)) if m else 0.0


def _kafka_error(exc: BaseException) -> KafkaError:
    assert isinstance(exc, KafkaException), repr(exc)
    return exc.args[0]


# -- authentication ---------------------------------------------------------------------------


def test_no_sasl_on_a_sasl_listener(env: Env) -> None:
    """ApiVersions is served before authentication; Metadata is not: the connection closes
    without an answer, as Kafka's SaslServerAuthenticator closes it."""
    wire = Wire(env.port("SASL_PLAINTEXT"))
    try:
        wire.send(api_versions_request())
        assert struct.unpack_from(">i", wire.read_frame())[0] == 1
        wire.send(MetadataRequest(topics=None, allow_auto_topic_creation=False, version=9))
        closed, sent = wire.closed_by_broker(5)
        assert closed and sent == b"", sent
    finally:
        wire.close()
    env.steady.progressing()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_wrong_password_confluent(env: Env, mechanism: str) -> None:
    """librdkafka reports an authentication error and delivers nothing."""
    errors: list[KafkaError] = []
    producer = Producer({**env.conf("alice", "SASL_SSL", mechanism, "not-her-password"),
                         "error_cb": errors.append, "message.timeout.ms": 3000})
    failed: list = []
    producer.produce("sec-steady", b"never", on_delivery=lambda e, _m: failed.append(e))
    producer.flush(10)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert failed and failed[0] is not None
    assert "steady" not in str(errors)  # nothing about the topic: refused before any request
    env.steady.progressing()


def test_wrong_password_kafka_python(env: Env) -> None:
    """kafka-python gives up bootstrapping (KafkaTimeoutError) after its logins fail; the
    broker counts them as failed PLAIN authentications on that listener."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    before = auth_failures(env, "SASL_PLAINTEXT", "PLAIN")
    conf = kafka_python_config(env.broker.bootstrap_for("SASL_PLAINTEXT"), "SASL_PLAINTEXT",
                               "PLAIN", "bob", "wrong")
    with pytest.raises(KafkaTimeoutError):
        producer = KafkaProducer(**conf, bootstrap_timeout_ms=3000, max_block_ms=3000)
        try:
            producer.send("sec-steady", b"never").get(5)
        finally:
            producer.close(1)
    assert auth_failures(env, "SASL_PLAINTEXT", "PLAIN") > before
    env.steady.progressing()


def test_wrong_password_on_the_wire(env: Env) -> None:
    """SASL_AUTHENTICATION_FAILED with Kafka's message, then the connection is closed."""
    wire = Wire(env.port("SASL_PLAINTEXT"))
    try:
        resp = plain_login(wire, "bob", "wrong")
        assert resp.error_code == SASL_AUTHENTICATION_FAILED, resp
        assert resp.error_message == "Authentication failed: Invalid username or password"
        assert wire.closed_by_broker(5)[0]
    finally:
        wire.close()
    env.steady.progressing()


def test_unknown_mechanism_on_the_wire(env: Env) -> None:
    """UNSUPPORTED_SASL_MECHANISM with the enabled list, then closed."""
    for mechanism in ("FOO", "SCRAM-SHA-512"):
        wire = Wire(env.port("SASL_PLAINTEXT"))
        try:
            resp = sasl_handshake(wire, mechanism)
            assert resp.error_code == UNSUPPORTED_SASL_MECHANISM, resp
            assert resp.mechanisms == list(MECHANISMS)
            assert wire.closed_by_broker(5)[0]
        finally:
            wire.close()
    env.steady.progressing()


def test_unknown_mechanism_confluent(env: Env) -> None:
    """librdkafka configured for SCRAM-SHA-512, which this broker does not enable: an
    authentication error naming the mechanisms the broker offers."""
    errors: list[KafkaError] = []
    producer = Producer({**env.conf("alice", "SASL_SSL", "SCRAM-SHA-512", ALICE_SCRAM),
                         "error_cb": errors.append, "message.timeout.ms": 3000})
    producer.produce("sec-steady", b"never")
    producer.flush(10)
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth and "Unsupported SASL mechanism" in auth[0].str(), errors
    assert "PLAIN,SCRAM-SHA-256" in auth[0].str(), auth[0].str()
    env.steady.progressing()


def test_plaintext_client_on_the_tls_listener(env: Env) -> None:
    """Kafka bytes where a TLS ClientHello belongs: the handshake fails and the broker closes
    the connection, sending at most a TLS alert, never a Kafka response."""
    wire = Wire(env.port("SASL_SSL"))
    try:
        wire.send(api_versions_request())
        closed, sent = wire.closed_by_broker(5)
        assert closed
        assert sent == b"" or sent[0] == 0x15, sent[:16]  # 0x15: a TLS alert record
    finally:
        wire.close()
    env.steady.progressing()


# -- authorization ----------------------------------------------------------------------------


def test_refused_then_granted(env: Env) -> None:
    """bob without ACLs: produce and fetch TOPIC_AUTHORIZATION_FAILED, JoinGroup
    GROUP_AUTHORIZATION_FAILED, CreateTopics TOPIC_AUTHORIZATION_FAILED, CreateAcls
    CLUSTER_AUTHORIZATION_FAILED; once the admin grants them, each succeeds."""
    admin = env.admin
    topic = env.bob_topic = _topic(admin, f"sec-bob-{uuid.uuid4().hex[:6]}")
    group, new_topic = f"{topic}-g", f"{topic}-new"
    bob_admin = AdminClient(env.conf("bob"))
    mine = _acl(ResourceType.TOPIC, topic, "User:bob", AclOperation.ALL)

    wire = logged_in(env, "bob")
    try:
        described = wire.request(DescribeAclsRequest(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
            principal_filter=None, host_filter=None, operation=1, permission_type=1, version=3),
            DescribeAclsResponse)
        assert described.error_code == CLUSTER_AUTHORIZATION_FAILED, described
        assert produce_response(_frame(wire, produce_request(
            topic, record_batch([b"denied"]), acks=-1)))[0] == TOPIC_AUTHORIZATION_FAILED
        fetched = fetch_response(_frame(wire, fetch_request([(topic, 0, 0)],
                                                                  max_wait_ms=0)))
        assert fetched.responses[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED
        assert join_group_error(wire, group) == GROUP_AUTHORIZATION_FAILED
    finally:
        wire.close()
    env.steady.progressing()

    # Through librdkafka: the producer's delivery report, the consumer's error event.
    errs: list = []
    producer = Producer({**env.conf("bob"), "message.timeout.ms": 5000})
    producer.produce(topic, b"denied", on_delivery=lambda e, _m: errs.append(e))
    producer.flush(10)
    assert errs and errs[0] is not None
    assert errs[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errs
    assert _consumer_error(env, topic, group) == KafkaError.GROUP_AUTHORIZATION_FAILED

    with pytest.raises(KafkaException) as created:
        bob_admin.create_topics([NewTopic(new_topic, 1, 1)])[new_topic].result(WAIT_S)
    assert _kafka_error(created.value).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as acl:
        next(iter(bob_admin.create_acls([mine]).values())).result(WAIT_S)
    assert _kafka_error(acl.value).code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # (DescribeAcls is checked on the wire above: confluent-kafka 2.16's describe_acls
    # returns an empty list for the broker's CLUSTER_AUTHORIZATION_FAILED answer.)
    with pytest.raises(KafkaException) as scram:
        _scram(bob_admin, "bob", "bob-scram")
    assert _kafka_error(scram.value).code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    env.steady.progressing()

    # Group READ alone: the group is his, the topic not yet: the consumer gets
    # TOPIC_AUTHORIZATION_FAILED.
    _grant(admin, [_acl(ResourceType.GROUP, group, "User:bob", AclOperation.READ)])
    assert _consumer_error(env, topic, group) == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # Granted: the same calls succeed.
    _grant(admin, [mine, _acl(ResourceType.TOPIC, new_topic, "User:bob", AclOperation.CREATE)])
    producer = Producer(env.conf("bob"))
    errs.clear()
    for i in range(5):
        producer.produce(topic, f"bob-{i}".encode(), on_delivery=lambda e, _m: errs.append(e))
    assert producer.flush(WAIT_S) == 0 and errs == [None] * 5, errs
    consumer = Consumer({**env.conf("bob"), "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 5 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None:
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    assert got == [f"bob-{i}".encode() for i in range(5)]
    bob_admin.create_topics([NewTopic(new_topic, 1, 1)])[new_topic].result(WAIT_S)
    # CREATE does not imply DESCRIBE: bob does not see it, the admin does.
    assert new_topic not in bob_admin.list_topics(timeout=WAIT_S).topics
    assert new_topic in admin.list_topics(timeout=WAIT_S).topics
    env.steady.progressing()


def _consumer_error(env: Env, topic: str, group: str) -> int:
    """The first error a subscribed librdkafka consumer of bob's gets (its code)."""
    consumer = Consumer({**env.conf("bob"), "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is not None:
                return msg.error().code()
            assert msg is None, f"bob read {msg.value()!r}"
        raise AssertionError("no error reported to bob's consumer")
    finally:
        consumer.close()


def test_metadata_lists_only_describable_topics(env: Env) -> None:
    """bob sees his own topics and not alice's."""
    topics = AdminClient(env.conf("bob")).list_topics(timeout=WAIT_S).topics
    assert "sec-steady" not in topics
    visible = AdminClient(env.conf("alice")).list_topics(timeout=WAIT_S).topics
    assert "sec-steady" in visible
    env.steady.progressing()


def test_well_behaved_client_read_everything(env: Env) -> None:
    """alice, after all the refusals above: every acknowledged record read, no error."""
    env.steady.finish()
    assert env.steady.errors == [], env.steady.errors
    assert len(env.steady.acked) > 50
    assert set(env.steady.acked) <= set(env.steady.read)


def test_acls_and_scram_users_survive_a_restart(env: Env) -> None:
    """After a clean restart the ACLs (describe_acls) and SCRAM credentials (a login by a
    user made before it) are what they were."""
    admin = env.admin
    _scram(admin, "carol", CAROL_SCRAM)
    topic = _topic(admin, f"sec-carol-{uuid.uuid4().hex[:6]}")
    _grant(admin, [_acl(ResourceType.TOPIC, "sec-carol-", "User:carol", AclOperation.WRITE,
                        ResourcePatternType.PREFIXED)])
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    before = sorted(map(str, admin.describe_acls(everything).result(WAIT_S)))
    users = admin.describe_user_scram_credentials().result(WAIT_S)
    assert {"alice", "carol"} <= set(users)

    env.broker.restart()
    admin = _admin(env.broker)
    assert sorted(map(str, admin.describe_acls(everything).result(WAIT_S))) == before
    assert set(admin.describe_user_scram_credentials().result(WAIT_S)) == set(users)
    errs: list = []
    producer = Producer(confluent_config(env.broker.bootstrap_for("SASL_SSL"), "SASL_SSL",
                                         "SCRAM-SHA-256", "carol", CAROL_SCRAM, env.pki.ca_path))
    producer.produce(topic, b"after restart", on_delivery=lambda e, _m: errs.append(e))
    assert producer.flush(WAIT_S) == 0 and errs == [None], errs
    # bob's grants too: he may still write his topic, and still not read alice's.
    wire = logged_in(env, "bob")
    try:
        assert produce_response(_frame(wire, produce_request(
            env.bob_topic, record_batch([b"bob after restart"]), acks=-1)))[0] == 0
        fetched = fetch_response(_frame(wire, fetch_request([("sec-steady", 0, 0)],
                                                            max_wait_ms=0)))
        assert fetched.responses[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED
    finally:
        wire.close()
