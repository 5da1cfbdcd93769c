"""SASL against a real broker with real clients: a SASL_PLAINTEXT listener beside a PLAINTEXT
one, PLAIN users from Kafka's listener jaas key, SCRAM users made through the Admin API.

confluent-kafka (librdkafka) and kafka-python authenticate with PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512 and round-trip records; a wrong password and an unknown user are refused with an
authentication error while an authenticated client keeps working; a client that skips SASL
has its connection closed; with connections.max.reauth.ms=2000 both clients re-authenticate
on the same connection (KIP-368) while producing across several session lifetimes.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka.protocol.metadata import MetadataRequest

from tests.support.broker import BrokerProcess

PLAIN_USERS = {"admin": "admin-secret", "alice": "alice-plain-pw"}
SCRAM_PW = "alice-scram-pw"  # not her PLAIN password: each login meets its own store
JAAS = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
        + " ".join(f'user_{u}="{p}"' for u, p in PLAIN_USERS.items()) + ";")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
WAIT_S = 30


def overrides(**extra: str) -> dict[str, str]:
    return {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": ",".join(MECHANISMS),
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            "auto.create.topics.enable": "false", **extra}


def confluent(broker: BrokerProcess, mechanism: str, user: str, password: str,
              **extra: object) -> dict:
    return {"bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
            "broker.address.family": "v4", "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
            **extra}


def kafka_python(broker: BrokerProcess, mechanism: str, user: str, password: str) -> dict:
    return {"bootstrap_servers": broker.bootstrap_for("SASL_PLAINTEXT"),
            "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": user, "sasl_plain_password": password}


def password(mechanism: str) -> str:
    return PLAIN_USERS["alice"] if mechanism == "PLAIN" else SCRAM_PW


def add_scram_user(admin: AdminClient, user: str, pw: str, iterations: int = 4096) -> None:
    """One request per mechanism: Kafka's controller alters a user at most once per request
    (two mechanisms for one user in one request are DUPLICATE_RESOURCE)."""
    for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(m, iterations),
                                              pw.encode())
        admin.alter_user_scram_credentials([upsert])[user].result(WAIT_S)


def new_topic(admin: AdminClient) -> str:
    topic = f"sasl-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(WAIT_S)
    return topic


def log_events(broker: BrokerProcess, event: str) -> list[dict]:
    return [line for line in broker.new_log_lines() if line.get("event") == event]


@pytest.fixture(scope="module")
def broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("sasl"), overrides()).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def admin(broker) -> AdminClient:
    """User:admin over PLAIN; it makes alice's SCRAM credentials as kafka-configs would."""
    a = AdminClient(confluent(broker, "PLAIN", "admin", PLAIN_USERS["admin"]))
    add_scram_user(a, "alice", SCRAM_PW, iterations=8192)
    return a


def test_scram_users_are_listed_salted_and_kept(admin, broker):
    described = admin.describe_user_scram_credentials(["alice"])["alice"].result(WAIT_S)
    assert sorted((i.mechanism, i.iterations) for i in described.scram_credential_infos) == [
        (ScramMechanism.SCRAM_SHA_256, 8192), (ScramMechanism.SCRAM_SHA_512, 8192)]
    with pytest.raises(Exception) as exc:  # Kafka's iteration bound
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
            "bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw")]
        )["bob"].result(WAIT_S)
    assert exc.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL
    both = [UserScramCredentialUpsertion("carol", ScramCredentialInfo(m, 4096), b"pw")
            for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)]
    with pytest.raises(Exception) as exc:  # one user twice in one request, as Kafka refuses
        admin.alter_user_scram_credentials(both)["carol"].result(WAIT_S)
    assert exc.value.args[0].code() == KafkaError.DUPLICATE_RESOURCE
    text = (broker.data_dir / "logs" / "mini-broker-topics.json").read_text()
    assert "alice" in text and SCRAM_PW not in text
    assert SCRAM_PW not in broker.log_text() and PLAIN_USERS["alice"] not in broker.log_text()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_round_trip(admin, broker, mechanism):
    topic = new_topic(admin)
    errors: list[KafkaError] = []
    producer = Producer(confluent(broker, mechanism, "alice", password(mechanism),
                                  error_cb=errors.append))
    for i in range(5):
        producer.produce(topic, f"{mechanism}-{i}".encode())
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer(confluent(broker, mechanism, "alice", password(mechanism),
                                  **{"group.id": f"g-{uuid.uuid4().hex[:6]}",
                                     "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < 5 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    consumer.close()
    assert got == [f"{mechanism}-{i}".encode() for i in range(5)]
    assert errors == []
    lines = [e for e in log_events(broker, "authenticated")
             if e["mechanism"] == mechanism and e["principal"] == "User:alice"]
    assert lines and all(e["listener"] == "SASL_PLAINTEXT" for e in lines)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_round_trip(admin, broker, mechanism):
    topic = new_topic(admin)
    producer = KafkaProducer(**kafka_python(broker, mechanism, "alice", password(mechanism)))
    for i in range(5):
        producer.send(topic, f"kp-{i}".encode())
    producer.flush(WAIT_S)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=5000,
                             **kafka_python(broker, mechanism, "alice", password(mechanism)))
    got = [m.value for m in consumer]
    consumer.close()
    assert got == [f"kp-{i}".encode() for i in range(5)]


@pytest.mark.parametrize("mechanism, user, pw, message", [
    ("PLAIN", "alice", "wrong", "Invalid username or password"),
    ("PLAIN", "alice", SCRAM_PW, "Invalid username or password"),  # her SCRAM password
    ("SCRAM-SHA-256", "alice", "wrong", "invalid credentials with SASL mechanism SCRAM-SHA-256"),
    ("SCRAM-SHA-512", "mallory", "mallory-pw",
     "invalid credentials with SASL mechanism SCRAM-SHA-512"),
])
def test_wrong_credentials_are_refused_and_others_keep_working(admin, broker, mechanism, user,
                                                              pw, message):
    topic = new_topic(admin)
    good = Producer(confluent(broker, "SCRAM-SHA-256", "alice", SCRAM_PW))
    good.produce(topic, b"before")
    assert good.flush(WAIT_S) == 0
    broker.new_log_lines()
    errors: list[KafkaError] = []
    bad = Producer(confluent(broker, mechanism, user, pw, error_cb=errors.append,
                             **{"reconnect.backoff.max.ms": 5000}))
    bad.produce(topic, b"never")
    deadline = time.monotonic() + WAIT_S
    while not errors and time.monotonic() < deadline:
        bad.poll(0.2)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION
    assert message in errors[0].str()
    good.produce(topic, b"after")  # the good client's connection is untouched
    assert good.flush(WAIT_S) == 0
    bad.purge()
    del bad  # destroyed: no more retries
    failures = [e for e in broker.new_log_lines() if e.get("event") == "authentication failed"]
    assert any(e["mechanism"] == mechanism for e in failures), failures
    assert pw not in broker.log_text()


def test_kafka_python_wrong_password_gets_sasl_authentication_failed(admin, broker, caplog):
    """kafka-python gives up bootstrapping; its attempts end in Kafka's error 58, which the
    broker counts as failed SCRAM-SHA-512 authentications."""
    broker.new_log_lines()
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(Exception) as exc:
        KafkaProducer(**kafka_python(broker, "SCRAM-SHA-512", "alice", "wrong-kp-pw"),
                      bootstrap_timeout_ms=5000)
    said = [repr(exc.value)] + [r.getMessage() for r in caplog.records]
    assert any("SaslAuthenticationFailedError" in m and "invalid credentials with SASL "
               "mechanism SCRAM-SHA-512" in m for m in said), (said[0], len(said))
    failures = [e for e in broker.new_log_lines() if e.get("event") == "authentication failed"]
    assert any(e["mechanism"] == "SCRAM-SHA-512" for e in failures)
    assert "wrong-kp-pw" not in broker.log_text()


def test_a_request_without_sasl_closes_that_connection_only(admin, broker):
    topic = new_topic(admin)
    good = Producer(confluent(broker, "PLAIN", "alice", PLAIN_USERS["alice"]))
    good.produce(topic, b"1")
    assert good.flush(WAIT_S) == 0
    broker.new_log_lines()
    host, port = broker.bootstrap_for("SASL_PLAINTEXT").split(":")
    request = MetadataRequest[1](topics=None)
    request.with_header(correlation_id=1, client_id="no-sasl")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        assert sock.recv(4096) == b""  # closed, nothing answered
    failures = [e for e in broker.new_log_lines() if e.get("event") == "authentication failed"]
    assert any(e["reason"] == "Unexpected Kafka request of type METADATA during SASL handshake."
               and e["mechanism"] == "NONE" for e in failures), failures
    good.produce(topic, b"2")
    assert good.flush(WAIT_S) == 0
    # the PLAINTEXT listener beside it still serves without SASL
    with socket.create_connection(
            ("127.0.0.1", broker.ports["PLAINTEXT"]), timeout=10) as sock:
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        (size,) = struct.unpack(">i", sock.recv(4))
        assert size > 0


def test_reauthentication_across_several_session_lifetimes(tmp_path):
    b = BrokerProcess(tmp_path, overrides(**{
        "listener.name.sasl_plaintext.connections.max.reauth.ms": "2000"})).start()
    try:
        admin = AdminClient(confluent(b, "PLAIN", "admin", PLAIN_USERS["admin"]))
        add_scram_user(admin, "alice", SCRAM_PW)
        topic = new_topic(admin)
        errors: list[KafkaError] = []
        producer = Producer(confluent(b, "SCRAM-SHA-512", "alice", SCRAM_PW,
                                      error_cb=errors.append))
        kp = KafkaProducer(**kafka_python(b, "PLAIN", "alice", PLAIN_USERS["alice"]))
        delivered: list[bool] = []
        end = time.monotonic() + 7
        n = 0
        while time.monotonic() < end:
            producer.produce(topic, f"c{n}".encode(),
                             on_delivery=lambda err, _m: delivered.append(err is None))
            kp.send(topic, f"k{n}".encode()).get(WAIT_S)
            producer.poll(0.25)
            n += 1
        assert producer.flush(WAIT_S) == 0
        kp.close()
        assert len(delivered) == n and all(delivered) and errors == []
        lines = b.new_log_lines()
        reauth = [e for e in lines if e.get("event") == "re-authenticated"
                  and e["principal"] == "User:alice"]
        by_mechanism = {m: sum(1 for e in reauth if e["mechanism"] == m)
                        for m in ("SCRAM-SHA-512", "PLAIN")}  # librdkafka, kafka-python
        assert by_mechanism["SCRAM-SHA-512"] >= 2 and by_mechanism["PLAIN"] >= 2, by_mechanism
        assert not [e for e in lines if e.get("reason") == "SASL session expired"
                    and e.get("principal") == "User:alice"]
        url = f"http://127.0.0.1:{b.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            exposition = resp.read().decode()
        counted = re.search(r'minibroker_reauthentications_total\{listener="SASL_PLAINTEXT",'
                            r'mechanism="SCRAM-SHA-512",result="success"\} (\d+)', exposition)
        assert counted and int(counted.group(1)) >= by_mechanism["SCRAM-SHA-512"], exposition
        # a deleted SCRAM credential refuses the next login
        admin.alter_user_scram_credentials([UserScramCredentialDeletion(
            "alice", ScramMechanism.SCRAM_SHA_512)])["alice"].result(WAIT_S)
        errors.clear()
        late = Producer(confluent(b, "SCRAM-SHA-512", "alice", SCRAM_PW,
                                  error_cb=errors.append))
        late.produce(topic, b"x")
        deadline = time.monotonic() + WAIT_S
        while not errors and time.monotonic() < deadline:
            late.poll(0.2)
        assert errors and errors[0].code() == KafkaError._AUTHENTICATION
        late.purge()
        del late
    finally:
        b.stop()
