"""The inter-broker client against a real broker process: its settings from Kafka's keys, and
requests over PLAINTEXT, SASL_PLAINTEXT (PLAIN, SCRAM-SHA-512) and SASL_SSL (SCRAM-SHA-256 over
TLS with the peer's certificate and host checked), pipelined on one connection; the broker's
principal allowed cluster actions as a super user (Kafka's rule) while another user is refused;
reconnecting after the peer restarts; a request timeout while the peer is frozen.

The peer's endpoint is given by a resolver here (the broker's bound port); the cluster's
resolver (the metadata cache, by node id) is what the three-broker transaction test uses.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import WriteTxnMarkersRequest

from broker.config import BrokerConfig
from broker.config_error import ConfigError
from broker.interbroker.client import (
    AuthenticationFailed,
    BrokerUnavailable,
    InterBrokerClient,
    InterBrokerSettings,
    RequestTimedOut,
)
from protocol.errors import ErrorCode
from tests.support.broker import BrokerProcess
from tests.support.certs import Pki, make_pki, plain_jaas, secure_broker_overrides

SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
PLAIN_USERS = {"admin": "admin-secret", "broker": "broker-plain"}
BROKER_PW, OTHER_PW = "broker-scram-pw", "other-scram-pw"
PEER = 7  # the node id the resolver answers for
WAIT_S = 30
Marker = WriteTxnMarkersRequest.WritableTxnMarker


def login(module: str, user: str, password: str, extra: str = "") -> str:
    return f'{module} required username="{user}" password="{password}" {extra};'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    overrides = secure_broker_overrides(pki, PLAIN_USERS)
    overrides["super.users"] = "User:admin;User:broker"  # how Kafka lets brokers in
    b = BrokerProcess(tmp_path_factory.mktemp("peer"), overrides).start()
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap_for("SASL_PLAINTEXT"),
                             "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                             "sasl.username": "admin", "sasl.password": "admin-secret",
                             "broker.address.family": "v4"})
        for user, pw in (("broker", BROKER_PW), ("other", OTHER_PW)):
            for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
                upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(m, 4096),
                                                      pw.encode())
                admin.alter_user_scram_credentials([upsert])[user].result(WAIT_S)
        yield b
    finally:
        if b.proc is not None and b.proc.poll() is None:
            b.stop()


def settings(pki: Pki, listener: str, mechanism: str | None = None, user: str = "broker",
             password: str = BROKER_PW, **extra: str) -> InterBrokerSettings:
    """The settings as a broker of the cluster reads them from its own keys."""
    keys = {**secure_broker_overrides(pki, PLAIN_USERS), "inter.broker.listener.name": listener,
            "request.timeout.ms": "3000", "minibroker.reconnect.backoff.ms": "20",
            "minibroker.reconnect.backoff.max.ms": "200", **extra}
    if mechanism is not None:
        keys["sasl.mechanism.inter.broker.protocol"] = mechanism
        module = PLAIN_LOGIN if mechanism == "PLAIN" else SCRAM_LOGIN
        users = plain_jaas(PLAIN_USERS).removeprefix(f"{PLAIN_LOGIN} required ").rstrip(";")
        keys[f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"] = login(
            module, user, password, users if mechanism == "PLAIN" else "")
    return InterBrokerSettings.from_config(BrokerConfig.from_dict(keys))


def client_for(peer: BrokerProcess, s: InterBrokerSettings) -> InterBrokerClient:
    return InterBrokerClient(s, lambda node_id: ("127.0.0.1", peer.ports[s.listener])
                             if node_id == PEER else None)


def metadata(version: int) -> Any:
    return MetadataRequest[version](topics=None, allow_auto_topic_creation=False,
                                    include_topic_authorized_operations=False)


def marker_to_nowhere(version: int) -> Any:
    """A marker for a partition that does not exist: needs CLUSTER_ACTION (or ALTER)."""
    topic = Marker.WritableTxnMarkerTopic(name="no-such-topic", partition_indexes=[0])
    return WriteTxnMarkersRequest[version](markers=[Marker(
        producer_id=1, producer_epoch=0, transaction_result=True, coordinator_epoch=0,
        topics=[topic])])


def marker_error(response: Any) -> int:
    [marker] = response.markers
    [topic] = marker.topics
    [partition] = topic.partitions
    return int(partition.error_code)


# -- settings from Kafka's keys ------------------------------------------------------------------

def test_the_inter_broker_listener_follows_kafkas_rules(pki: Pki) -> None:
    base = secure_broker_overrides(pki, PLAIN_USERS)
    default = InterBrokerSettings.from_config(BrokerConfig.from_dict(base))
    assert (default.listener, default.security_protocol) == ("PLAINTEXT", "PLAINTEXT")
    by_protocol = InterBrokerSettings.from_config(BrokerConfig.from_dict(
        {**base, "security.inter.broker.protocol": "SASL_SSL",
         "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
         "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config":
             login(SCRAM_LOGIN, "broker", BROKER_PW)}))
    assert (by_protocol.listener, by_protocol.username) == ("SASL_SSL", "broker")
    assert by_protocol.ssl_context is not None and by_protocol.ssl_context.check_hostname
    with pytest.raises(ConfigError, match="Only one of inter.broker.listener.name and "
                                          "security.inter.broker.protocol"):
        InterBrokerSettings.from_config(BrokerConfig.from_dict(
            {**base, "inter.broker.listener.name": "PLAINTEXT",
             "security.inter.broker.protocol": "PLAINTEXT"}))
    with pytest.raises(ConfigError, match="must be a listener name defined in advertised"):
        InterBrokerSettings.from_config(BrokerConfig.from_dict(
            {**base, "inter.broker.listener.name": "INTERNAL"}))
    with pytest.raises(ConfigError, match="must be included in sasl.enabled.mechanisms"):
        settings(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256",
                 **{"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512"})
    with pytest.raises(ConfigError, match="jaas.config is required"):
        InterBrokerSettings.from_config(BrokerConfig.from_dict(
            {**base, "inter.broker.listener.name": "SASL_PLAINTEXT",
             "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512"}))
    assert "broker-scram-pw" not in repr(settings(pki, "SASL_PLAINTEXT", "SCRAM-SHA-512"))


# -- requests ------------------------------------------------------------------------------------

@pytest.mark.parametrize("listener, mechanism, password", [
    ("PLAINTEXT", None, ""), ("SASL_PLAINTEXT", "PLAIN", PLAIN_USERS["broker"]),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512", BROKER_PW), ("SASL_SSL", "SCRAM-SHA-256", BROKER_PW)])
async def test_pipelined_requests_on_one_connection(peer: BrokerProcess, pki: Pki,
                                                    listener: str, mechanism: str | None,
                                                    password: str) -> None:
    client = client_for(peer, settings(pki, listener, mechanism, password=password))
    try:
        answers = await asyncio.gather(*(client.send(PEER, 3, metadata, 12) for _ in range(20)))
        assert client.connects == 1
        assert all([b.port for b in a.brokers] == [peer.ports[listener]] for a in answers)
        connection = await client.connection(PEER)
        assert connection.version(3, 12) == 12  # negotiated from the peer's ApiVersions
        # User:broker may write markers: a super user, as Kafka's brokers are; over
        # PLAINTEXT it is User:ANONYMOUS, which is not (Kafka's rule as well).
        answer = await client.send(PEER, 27, marker_to_nowhere, 1)
        # UNKNOWN_TOPIC_OR_PARTITION once authorized, else CLUSTER_AUTHORIZATION_FAILED
        assert marker_error(answer) == (3 if mechanism else 31)
        with pytest.raises(BrokerUnavailable):
            await client.send(PEER + 1, 3, metadata, 12)  # not live: no endpoint
    finally:
        await client.close()


async def test_other_principals_and_wrong_passwords_are_refused(peer: BrokerProcess,
                                                                pki: Pki) -> None:
    other = client_for(peer, settings(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256", "other",
                                      OTHER_PW))
    wrong = client_for(peer, settings(pki, "SASL_SSL", "SCRAM-SHA-256", "broker", "nope"))
    try:
        answer = await other.send(PEER, 27, marker_to_nowhere, 1)
        assert marker_error(answer) == 31  # CLUSTER_AUTHORIZATION_FAILED
        with pytest.raises(AuthenticationFailed):
            await wrong.send(PEER, 3, metadata, 12)
    finally:
        await other.close()
        await wrong.close()


async def test_untrusted_peer_certificate_is_refused(peer: BrokerProcess, pki: Pki,
                                                     tmp_path: Path) -> None:
    stranger = make_pki(tmp_path / "other-ca")
    s = settings(pki, "SASL_SSL", "SCRAM-SHA-256",
                 **{"listener.name.sasl_ssl.ssl.truststore.location": str(stranger.ca_path)})
    client = client_for(peer, s)
    try:
        with pytest.raises(AuthenticationFailed, match="TLS"):
            await client.send(PEER, 3, metadata, 12)
    finally:
        await client.close()


async def test_reconnects_after_the_peer_restarts(peer: BrokerProcess, pki: Pki) -> None:
    client = client_for(peer, settings(pki, "SASL_PLAINTEXT", "SCRAM-SHA-512"))
    try:
        await client.send(PEER, 3, metadata, 12)
        first = await client.connection(PEER)
        await asyncio.to_thread(peer.stop)
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable):
            await client.send(PEER, 3, metadata, 12)  # down: attempts until the timeout
        assert time.monotonic() - started < 3.0 + 2.0
        assert first.closed
        await asyncio.to_thread(peer.start)  # same ports
        answer = await client.send(PEER, 3, metadata, 12)
        assert [b.port for b in answer.brokers] == [peer.ports["SASL_PLAINTEXT"]]
        assert client.connects == 2 and (await client.connection(PEER)) is not first
    finally:
        await client.close()


async def test_a_request_times_out_and_closes_the_connection(peer: BrokerProcess,
                                                             pki: Pki) -> None:
    client = client_for(peer, settings(pki, "PLAINTEXT"))
    assert peer.proc is not None
    try:
        await client.send(PEER, 3, metadata, 12)
        connection = await client.connection(PEER)
        os.kill(peer.proc.pid, signal.SIGSTOP)  # the peer answers nothing
        try:
            started = time.monotonic()
            pending = [asyncio.ensure_future(client.send(PEER, 3, metadata, 12))
                       for _ in range(3)]
            results = await asyncio.gather(*pending, return_exceptions=True)
            waited = time.monotonic() - started
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)
        assert all(isinstance(r, (RequestTimedOut, BrokerUnavailable)) for r in results)
        assert any(isinstance(r, RequestTimedOut) for r in results)
        assert 2.9 <= waited < 6.0  # request.timeout.ms=3000
        assert connection.closed
        answer = await client.send(PEER, 3, metadata, 12)  # a new connection
        assert [b.port for b in answer.brokers] == [peer.port] and client.connects == 2
    finally:
        await client.close()


# -- KIP-890 verification against a remote coordinator -------------------------------------------

async def test_verification_asks_the_remote_coordinator(peer: BrokerProcess, pki: Pki) -> None:
    """The peer coordinates a transaction that has partition 0 and not partition 1; asked
    through the client (AddPartitionsToTxn v4+, verify only) it answers as Kafka's
    coordinator: NONE, TRANSACTION_ABORTABLE, PRODUCER_FENCED for an old epoch, and
    CLUSTER_AUTHORIZATION_FAILED to a principal that is not a broker."""
    from kafka.protocol.admin import CreateTopicsRequest
    from kafka.protocol.metadata import FindCoordinatorRequest
    from kafka.protocol.producer import AddPartitionsToTxnRequest, InitProducerIdRequest

    from broker.interbroker.txn import RemoteTransactionVerifier

    tid, topic = "verified-txn", "verified"
    client = client_for(peer, settings(pki, "SASL_PLAINTEXT", "SCRAM-SHA-512"))
    other = client_for(peer, settings(pki, "SASL_PLAINTEXT", "SCRAM-SHA-256", "other",
                                      OTHER_PW))
    try:
        creatable = CreateTopicsRequest.CreatableTopic
        await client.send(PEER, 19, lambda v: CreateTopicsRequest[v](
            timeout_ms=10000, validate_only=False, topics=[creatable(
                name=topic, num_partitions=2, replication_factor=1, assignments=[],
                configs=[])]), 7)
        found = await client.send(PEER, 10, lambda v: FindCoordinatorRequest[v](
            key_type=1, coordinator_keys=[tid]), 4)
        assert found.coordinators[0].error_code == 0
        init = await client.send(PEER, 22, lambda v: InitProducerIdRequest[v](
            transactional_id=tid, transaction_timeout_ms=60000, producer_id=-1,
            producer_epoch=-1), 4)
        assert init.error_code == 0
        pid, epoch = init.producer_id, init.producer_epoch
        add_topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        added = await client.send(PEER, 24, lambda v: AddPartitionsToTxnRequest[v](
            v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[add_topic(name=topic, partitions=[0])]), 3)
        [result] = added.results_by_topic_v3_and_below
        assert [r.partition_error_code for r in result.results_by_partition] == [0]

        verifier = RemoteTransactionVerifier(0, None, client,  # type: ignore[arg-type]
                                             lambda _tid: 0, lambda _tid: False)
        tps = [(topic, 0), (topic, 1)]
        answer = await verifier.verify_on(PEER, tid, pid, epoch, tps)
        assert answer == {(topic, 0): ErrorCode.NONE, (topic, 1): ErrorCode.TRANSACTION_ABORTABLE}
        fenced = await verifier.verify_on(PEER, tid, pid, epoch - 1 if epoch else 5, tps)
        assert set(fenced.values()) == {ErrorCode.PRODUCER_FENCED}
        assert verifier.remote_requests == 2
        stranger = RemoteTransactionVerifier(0, None, other,  # type: ignore[arg-type]
                                             lambda _tid: 0, lambda _tid: False)
        refused = await stranger.verify_on(PEER, tid, pid, epoch, tps)
        assert set(refused.values()) == {ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
    finally:
        await client.close()
        await other.close()
