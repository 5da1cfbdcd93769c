"""Named listeners and TLS against a real broker: one process with a PLAINTEXT listener, an SSL
listener and an mTLS listener (a custom name mapped to SSL, ssl.client.auth=required through
listener.name.mtls.*), driven by confluent-kafka and kafka-python. Certificates are made by the
test (tests/support/tls_certs.py)."""

from __future__ import annotations

import socket
import struct
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    confluent_consumer,
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
)
from tests.support.tls_certs import CertAuthority, Issued


@pytest.fixture
def pki(tmp_path: Path) -> CertAuthority:
    return CertAuthority(tmp_path / "pki")


@pytest.fixture
def tls_broker(broker_factory, pki: CertAuthority) -> BrokerProcess:
    broker = pki.server()
    return broker_factory({
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,MTLS://127.0.0.1:0",
        # SSL is advertised as localhost (port 0: the bound port), the others as bound
        "advertised.listeners": "SSL://localhost:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(broker.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca_path),
        "listener.name.mtls.ssl.client.auth": "required",
    })


def _ssl(pki: CertAuthority, client: Issued | None = None) -> dict:
    conf = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca_path)}
    if client is not None:
        conf |= {"ssl.certificate.location": str(client.cert),
                 "ssl.key.location": str(client.key)}
    return conf


def _consume(bootstrap: str, topic: str, count: int, extra: dict, timeout: float = 20) -> list:
    from confluent_kafka import TopicPartition

    errors: list = []
    consumer = confluent_consumer(bootstrap, errors, extra)
    got = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg.value())
    finally:
        consumer.close()
    assert len(got) == count, f"{len(got)} of {count} records; errors {errors}"
    return got


def _metadata_broker(bootstrap: str, extra: dict) -> tuple[str, int]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                         "socket.timeout.ms": 10000, **extra})
    brokers = admin.list_topics(timeout=15).brokers
    assert len(brokers) == 1
    b = next(iter(brokers.values()))
    return b.host, b.port


def _api_versions_over_plain_tcp(port: int) -> bytes:
    """An ApiVersions v0 request on a bare socket; what comes back before the broker closes.
    The broker must close it: a socket still open after 10 s (the handshake timeout is longer)
    raises TimeoutError."""
    body = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def _handshake_failures(broker: BrokerProcess) -> list[dict]:
    return [line for line in broker.new_log_lines() if line.get("event") == "TLS handshake failed"]


def test_listeners_bound_and_advertised_per_listener(tls_broker: BrokerProcess, pki):
    ports = tls_broker.ports
    assert set(ports) == {"PLAINTEXT", "SSL", "MTLS"}
    assert len(set(ports.values())) == 3 and all(ports.values())
    assert tls_broker.port == ports["PLAINTEXT"]  # the first listener, as before
    # Metadata names the listener the client came in on
    assert _metadata_broker(tls_broker.bootstrap_for("PLAINTEXT"), {}) == (
        "127.0.0.1", ports["PLAINTEXT"])
    assert _metadata_broker(tls_broker.bootstrap_for("SSL"), _ssl(pki)) == (
        "localhost", ports["SSL"])
    alice = pki.client("alice", CN="alice", OU="eng")
    assert _metadata_broker(tls_broker.bootstrap_for("MTLS"), _ssl(pki, alice)) == (
        "127.0.0.1", ports["MTLS"])


def test_confluent_and_kafka_python_over_ssl(tls_broker: BrokerProcess, pki):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = unique_topic("tls")
    bootstrap = tls_broker.bootstrap_for("SSL")
    create_topic(tls_broker.bootstrap, topic)
    sent = numbered(20, "ssl")
    offsets = confluent_produce(bootstrap, topic, sent, extra=_ssl(pki))
    assert offsets == list(range(20))
    assert _consume(bootstrap, topic, 20, _ssl(pki)) == [r.value for r in sent]

    producer = KafkaProducer(bootstrap_servers=bootstrap, security_protocol="SSL",
                             ssl_cafile=str(pki.ca_path), ssl_check_hostname=True,
                             request_timeout_ms=10000)
    try:
        meta = producer.send(topic, value=b"from kafka-python", partition=0).get(timeout=15)
        assert meta.offset == 20
    finally:
        producer.close(timeout=5)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, security_protocol="SSL",
                             ssl_cafile=str(pki.ca_path), enable_auto_commit=False,
                             consumer_timeout_ms=10000)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        values = [m.value for m in consumer][:21]
    finally:
        consumer.close()
    assert values == [r.value for r in sent] + [b"from kafka-python"]
    # Everything read over TLS is what a PLAINTEXT client reads
    assert _consume(tls_broker.bootstrap, topic, 21, {})[-1] == b"from kafka-python"


def test_mtls_required_refuses_a_client_without_a_certificate(tls_broker: BrokerProcess, pki):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    bootstrap = tls_broker.bootstrap_for("MTLS")
    topic = unique_topic("mtls")
    create_topic(tls_broker.bootstrap, topic)
    tls_broker.new_log_lines()  # from here on
    before = _handshake_failures(tls_broker)

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                         "socket.timeout.ms": 5000, **_ssl(pki)})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(bootstrap_servers=bootstrap, security_protocol="SSL",
                      ssl_cafile=str(pki.ca_path), bootstrap_timeout_ms=3000,
                      request_timeout_ms=3000)
    # a certificate from another CA is refused as well
    stranger = CertAuthority(pki.dir / "other").client("mallory", CN="mallory")
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                     **_ssl(pki, stranger)}).list_topics(timeout=5)

    # with a certificate the CA signed: served
    alice = pki.client("alice", CN="alice", OU="eng", O="Example", C="US")
    assert confluent_produce(bootstrap, topic, numbered(1, "mtls"),
                             extra=_ssl(pki, alice)) == [0]
    producer = KafkaProducer(bootstrap_servers=bootstrap, security_protocol="SSL",
                             ssl_cafile=str(pki.ca_path), ssl_certfile=str(alice.cert),
                             ssl_keyfile=str(alice.key), request_timeout_ms=10000)
    try:
        assert producer.send(topic, b"mtls-2", partition=0).get(timeout=15).offset == 1
    finally:
        producer.close(timeout=5)

    failures = [f for f in _handshake_failures(tls_broker) if f not in before]
    assert failures and {f["listener"] for f in failures} == {"MTLS"}
    assert all(f["level"] == "warning" and f["peer"].startswith("127.0.0.1:") for f in failures)
    # counted for the metrics, by listener
    url = f"http://127.0.0.1:{tls_broker.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    line = next(x for x in text.splitlines()
                if 'listener="MTLS"' in x and 'mechanism="SSL"' in x and "failure" in x
                and not x.startswith("#"))
    assert float(line.rsplit(" ", 1)[1]) >= 3


def test_plaintext_client_on_the_ssl_listener_is_refused_alone(tls_broker: BrokerProcess, pki):
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    topic = unique_topic("plain-on-tls")
    create_topic(tls_broker.bootstrap, topic)
    # a PLAINTEXT producer keeps a connection open across the refusal
    plain = KafkaProducer(bootstrap_servers=tls_broker.bootstrap, request_timeout_ms=10000)
    try:
        assert plain.send(topic, b"before", partition=0).get(timeout=15).offset == 0
        tls_broker.new_log_lines()
        # closed, no answer: by the failed handshake, not at the handshake timeout
        assert _api_versions_over_plain_tcp(tls_broker.ports["SSL"]) == b""
        with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
            KafkaProducer(bootstrap_servers=tls_broker.bootstrap_for("SSL"),
                          bootstrap_timeout_ms=3000, request_timeout_ms=3000)
        assert plain.send(topic, b"after", partition=0).get(timeout=15).offset == 1
    finally:
        plain.close(timeout=5)
    lines = tls_broker.new_log_lines()
    failures = [x for x in lines if x.get("event") == "TLS handshake failed"]
    assert failures and all(f["listener"] == "SSL" for f in failures)
    # one warning per refused connection, each from its own peer port; no traceback
    assert len({f["peer"] for f in failures}) == len(failures)
    assert not [x for x in lines if x.get("level") in ("error", "critical")]
    assert "Traceback" not in tls_broker.log_text()
    assert _consume(tls_broker.bootstrap, topic, 2, {}) == [b"before", b"after"]


def test_broker_refuses_to_start_with_a_tls_listener_but_no_key_store(tmp_path):
    broker = BrokerProcess(tmp_path / "nokeys", {"listeners": "SSL://127.0.0.1:0"})
    with pytest.raises(RuntimeError, match="needs a key store"):
        broker.start(timeout=20)
    assert broker.proc is not None and broker.proc.returncode == 2


def test_restart_keeps_every_listener_port(tls_broker: BrokerProcess, pki):
    before = dict(tls_broker.ports)
    tls_broker.restart()
    assert tls_broker.ports == before
    assert _metadata_broker(tls_broker.bootstrap_for("SSL"), _ssl(pki)) == (
        "localhost", before["SSL"])


def test_mtls_principal_from_the_certificate_is_what_acls_see(broker_factory, pki):
    """The certificate's DN, mapped by ssl.principal.mapping.rules, is the principal the
    authorizer judges, from the client's first request on: alice's certificate may write the
    topic, bob's (same CA, same listener) is refused with TOPIC_AUTHORIZATION_FAILED."""
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    server = pki.server()
    broker = broker_factory({
        "listeners": "PLAINTEXT://127.0.0.1:0,MTLS://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,MTLS:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(server.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca_path),
        "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]*),OU=eng$/$1/L,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",  # the PLAINTEXT admin below
    })
    topic = unique_topic("mtls-acl")
    create_topic(broker.bootstrap, topic)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4"})
    binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:alice",
                         "*", AclOperation.WRITE, AclPermissionType.ALLOW)
    admin.create_acls([binding])[binding].result(timeout=15)

    def produce(who: Issued) -> object:
        outcome: list = []
        producer = Producer({"bootstrap.servers": broker.bootstrap_for("MTLS"),
                             "broker.address.family": "v4", "message.timeout.ms": 15000,
                             **_ssl(pki, who)})
        producer.produce(topic, b"v", partition=0,
                         on_delivery=lambda err, msg: outcome.append(err or msg.offset()))
        producer.flush(20)
        assert len(outcome) == 1, "no delivery report"
        return outcome[0]

    assert produce(pki.client("alice", CN="Alice", OU="eng")) == 0
    refused = produce(pki.client("bob", CN="bob", OU="eng"))
    assert isinstance(refused, KafkaError)
    assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    denials = [e for e in broker.new_log_lines() if e.get("event") == "authorization denied"]
    assert {e["principal"] for e in denials} == {"User:bob"}, denials
