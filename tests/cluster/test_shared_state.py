"""The state every broker of a cluster shares (ACLs, SCRAM credentials, topic configs, dynamic
broker configs, producer id blocks),
each test against a real etcd and the in-process store (``backend``), two brokers being two
clients of one store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from kafka.protocol.admin import CreateAclsResponse

from broker.cluster.producer_id_block import (
    LATEST_PRODUCER_ID_BLOCK,
    ClusterProducerIdManager,
    ProducerIdBlock,
    claim_block,
)
from broker.cluster.shared_state import EtcdSharedState, decode_acls, enum_name, kafka_name
from broker.cluster.store import Put
from broker.metadata.dynamic_config import (
    CONNECTION_KEYS,
    TOPIC_DEFAULT_KEYS,
    DynamicBrokerConfig,
)
from broker.replica.delayed_result import Completion
from broker.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    ResourceType,
)
from broker.security.authorizer import Authorizer
from broker.security.principal import KafkaPrincipal, Session
from broker.security.scram import SCRAM_SHA_256, ScramCredentialStore
from protocol.errors import ErrorCode, KafkaError
from tests.cluster.conftest import Backend
from tests.support.components import broker_config

pytestmark = pytest.mark.timeout(60)


# -- producer id blocks ---------------------------------------------------------------------------

async def test_blocks_follow_each_other_and_are_kafkas_document(backend: Backend) -> None:
    other = await backend.new_client()
    first = await claim_block(backend.store, 1)
    second = await claim_block(other, 2)
    assert (first.first, first.last, second.first, second.last) == (0, 999, 1000, 1999)
    kv = await backend.store.get(LATEST_PRODUCER_ID_BLOCK)
    assert kv is not None
    assert json.loads(kv.value) == {"version": 1, "broker": 2, "block_start": "1000",
                                    "block_end": "1999"}


async def test_racing_claims_never_share_a_block(backend: Backend) -> None:
    clients = [backend.store] + [await backend.new_client() for _ in range(3)]
    blocks = await asyncio.gather(*(claim_block(c, i) for i, c in enumerate(clients)
                                    for _ in range(3)))
    starts = sorted(b.first for b in blocks)
    assert starts == [i * 1000 for i in range(12)]


async def test_two_brokers_hand_out_distinct_ids_and_prefetch_the_next_block(
        backend: Backend) -> None:
    a = ClusterProducerIdManager(backend.store, 1)
    b = ClusterProducerIdManager(await backend.new_client(), 2)
    await a.start()
    await b.start()
    try:
        ids_a = [a.generate() for _ in range(950)]
        assert await backend.eventually(lambda: a._prefetched is not None, 5)
        ids_b = [b.generate() for _ in range(10)]
        ids_a += [a.generate() for _ in range(100)]  # crosses into the prefetched block
        assert len(set(ids_a)) == len(ids_a) == 1050
        assert not set(ids_a) & set(ids_b)
        assert ids_a[:3] == [0, 1, 2] and ids_b[0] == 1000
        assert ids_a[-1] == 2049  # the third block (2000..2999), a's second
        assert a.blocks_claimed == 2
    finally:
        await a.stop()
        await b.stop()


async def test_no_block_at_hand_is_coordinator_load_in_progress(backend: Backend) -> None:
    m = ClusterProducerIdManager(backend.store, 1)  # not started: no block yet
    with pytest.raises(KafkaError) as e:
        m.generate()
    assert e.value.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert await backend.eventually(lambda: m._prefetched is not None, 5)
    assert m.generate() == 0  # the block claimed meanwhile
    await m.stop()


async def test_a_malformed_block_is_refused(backend: Backend) -> None:
    await backend.store.put(LATEST_PRODUCER_ID_BLOCK, b'{"version":1}')
    with pytest.raises(ValueError):
        await claim_block(backend.store, 1)
    with pytest.raises(ValueError):
        ProducerIdBlock.decode(b'{"broker":1,"block_start":"9","block_end":"3"}')


# -- ACLs and SCRAM credentials ------------------------------------------------------------------

def binding(name: str, principal: str = "User:alice", op: AclOperation = AclOperation.READ,
            pattern: str = "LITERAL", rtype: str = "TOPIC") -> AclBinding:
    return AclBinding.from_json({"resource_type": rtype, "resource_name": name,
                                 "pattern_type": pattern, "principal": principal, "host": "*",
                                 "operation": op.name, "permission_type": "ALLOW"})


def session(user: str) -> Session:
    return Session(KafkaPrincipal("User", user), "10.0.0.1", "PLAINTEXT")


async def two_brokers(backend: Backend) -> tuple[EtcdSharedState, EtcdSharedState]:
    a = EtcdSharedState(backend.store)
    b = EtcdSharedState(await backend.new_client())
    await a.start()
    await b.start()
    return a, b


async def flushed(state: EtcdSharedState) -> None:
    await state.flushed()


def test_kafka_names_round_trip() -> None:
    for name in ("TOPIC", "TRANSACTIONAL_ID", "DESCRIBE_CONFIGS", "IDEMPOTENT_WRITE", "ALLOW"):
        assert enum_name(kafka_name(name)) == name
    assert kafka_name("TRANSACTIONAL_ID") == "TransactionalId"


async def test_an_acl_created_on_one_broker_is_enforced_by_the_other(backend: Backend) -> None:
    a, b = await two_brokers(backend)
    try:
        auth_a = Authorizer(a, enabled=True)
        auth_b = Authorizer(b, enabled=True)
        assert not auth_b.authorize(session("alice"), AclOperation.READ, ResourceType.TOPIC, "t")
        assert auth_a.create_acls([binding("t"), binding("pre", pattern="PREFIXED")]) == [
            None, None]
        await flushed(a)
        kv = await backend.store.get("/kafka-acl/Topic/t")
        assert kv is not None and json.loads(kv.value) == {"version": 1, "acls": [
            {"principal": "User:alice", "permissionType": "Allow", "operations": "Read",
             "host": "*"}]}
        assert await backend.store.get("/kafka-acl-extended/prefixed/Topic/pre") is not None
        assert await backend.eventually(lambda: auth_b.authorize(
            session("alice"), AclOperation.READ, ResourceType.TOPIC, "t"), 5)
        assert auth_b.authorize(session("alice"), AclOperation.READ, ResourceType.TOPIC,
                                "prefixed-topic")
        assert not auth_b.authorize(session("bob"), AclOperation.READ, ResourceType.TOPIC, "t")
        # deleted through b: gone from the store and from a's decisions
        [deleted] = auth_b.delete_acls(
            [AclBindingFilter(ResourceType.TOPIC, "t", PatternType.LITERAL)])
        assert deleted == [binding("t")]
        await flushed(b)
        assert await backend.store.get("/kafka-acl/Topic/t") is None
        assert await backend.eventually(lambda: not auth_a.authorize(
            session("alice"), AclOperation.READ, ResourceType.TOPIC, "t"), 5)
    finally:
        await a.stop()
        await b.stop()


async def test_concurrent_creations_on_one_resource_all_land(backend: Backend) -> None:
    a, b = await two_brokers(backend)
    try:
        auth_a = Authorizer(a, enabled=True)
        auth_b = Authorizer(b, enabled=True)
        for i in range(5):
            auth_a.create_acls([binding("shared", principal=f"User:a{i}")])
            auth_b.create_acls([binding("shared", principal=f"User:b{i}")])
        await asyncio.gather(flushed(a), flushed(b))
        kv = await backend.store.get("/kafka-acl/Topic/shared")
        assert kv is not None
        principals = {e["principal"] for e in json.loads(kv.value)["acls"]}
        assert principals == {f"User:{s}{i}" for s in "ab" for i in range(5)}

        def all_seen() -> bool:
            return all(auth.authorize(session(f"{s}{i}"), AclOperation.READ, ResourceType.TOPIC,
                                      "shared")
                       for auth in (auth_a, auth_b) for s in "ab" for i in range(5))
        assert await backend.eventually(all_seen, 5)
    finally:
        await a.stop()
        await b.stop()


async def test_a_scram_user_made_on_one_broker_is_known_to_the_other(backend: Backend) -> None:
    a, b = await two_brokers(backend)
    try:
        await backend.store.put("/config/users/alice",
                                b'{"version":1,"config":{"consumer_byte_rate":"1024"}}')
        mech = SCRAM_SHA_256
        salted = mech.salted_password("secret", b"salt", 4096)

        class Up:
            name, mechanism, iterations, salt, salted_password = (
                "alice", mech.type, 4096, b"salt", salted)
        [result] = ScramCredentialStore(a).alter([], [Up()])
        assert result.error_code == 0
        await flushed(a)
        kv = await backend.store.get("/config/users/alice")
        assert kv is not None
        config = json.loads(kv.value)["config"]
        assert config["consumer_byte_rate"] == "1024"  # the user's other configs kept
        assert config["SCRAM-SHA-256"].startswith("salt=c2FsdA==,stored_key=")
        assert config["SCRAM-SHA-256"].endswith(",iterations=4096")
        on_b = ScramCredentialStore(b)
        assert await backend.eventually(lambda: on_b.get("alice", mech.name) is not None, 5)
        cred = on_b.get("alice", mech.name)
        assert cred is not None and cred.stored_key == mech.stored_key(salted)

        class Del:
            name, mechanism = "alice", mech.type
        [gone] = on_b.alter([Del()], [])
        assert gone.error_code == 0
        await flushed(b)
        kv = await backend.store.get("/config/users/alice")
        assert kv is not None and "SCRAM-SHA-256" not in json.loads(kv.value)["config"]
        assert await backend.eventually(
            lambda: ScramCredentialStore(a).get("alice", mech.name) is None, 5)
    finally:
        await a.stop()
        await b.stop()


async def test_malformed_keys_are_skipped(backend: Backend) -> None:
    await backend.store.txn([], [Put("/kafka-acl/Topic/bad", b"not json"),
                                 Put("/kafka-acl/Topic/good", json.dumps({"version": 1, "acls": [
                                     {"principal": "User:x", "permissionType": "Allow",
                                      "operations": "Write", "host": "*"}]}).encode()),
                                 Put("/kafka-acl-changes/acl_changes_1", b"whatever"),
                                 Put("/config/users/eve", b"[]")])
    a = EtcdSharedState(backend.store)
    await a.start()
    try:
        assert [d["resource_name"] for d in a.acls] == ["good"]
        assert a.acls[0]["operation"] == "WRITE"
        assert a.scram_credentials == {}
    finally:
        await a.stop()
    assert decode_acls("/kafka-acl-changes/x", b"") == []


async def test_a_write_that_cannot_be_made_fails_its_answer(own_backend: Backend) -> None:
    a = EtcdSharedState(own_backend.store, write_attempts=2, retry_s=0.05)
    await a.start()
    try:
        auth = Authorizer(a, enabled=True)
        await own_backend.take_down()
        [created] = auth.create_acls([binding("lost")])
        assert created is None
        refused = CreateAclsResponse.AclCreationResult(error_code=42, error_message="bad")
        answered = a.answer(CreateAclsResponse(throttle_time_ms=0, results=[
            CreateAclsResponse.AclCreationResult(error_code=0, error_message=None), refused]))
        done = a.flushed()
        assert await own_backend.eventually(done.done, 30)
        assert done.exception() is not None
        # Answered, not a closed connection: what was to be stored timed out (retriable),
        # what was refused before any write keeps its error.
        assert isinstance(answered, Completion) and answered.done()
        ok, bad = answered.result().results
        assert ok.error_code == ErrorCode.REQUEST_TIMED_OUT and "not stored" in ok.error_message
        assert (bad.error_code, bad.error_message) == (42, "bad")
        await own_backend.bring_back()
        # the view is listed again from the store: the change it does not have is gone
        assert await own_backend.eventually(lambda: not auth.authorize(
            session("alice"), AclOperation.READ, ResourceType.TOPIC, "lost"), 30)
    finally:
        await a.stop()


async def test_topic_configs_altered_on_one_broker_reach_the_other(backend: Backend) -> None:
    await backend.store.put("/config/topics/t", b'{"version":1,"config":{"retention.ms":"5"}}')
    a, b = await two_brokers(backend)
    seen: list[tuple[str, dict[str, str] | None]] = []
    b.on_topic_configs_changed(lambda topic, configs: seen.append((topic, configs)))
    try:
        assert a.topic_overrides("t") == {"retention.ms": "5"}
        assert a.topic_overrides("none") is None
        a.change_topic_configs("t", {"max.message.bytes": "1024"})
        assert a.topic_overrides("t") == {"max.message.bytes": "1024"}  # at once, here
        await flushed(a)
        kv = await backend.store.get("/config/topics/t")
        assert kv is not None and json.loads(kv.value) == {
            "version": 1, "config": {"max.message.bytes": "1024"}}
        assert await backend.eventually(lambda: seen == [("t", {"max.message.bytes": "1024"})],
                                        5)
        await backend.store.delete("/config/topics/t")  # the controller deleted the topic
        assert await backend.eventually(lambda: seen[-1] == ("t", None), 5)
        assert b.topic_overrides("t") is None
        # an alter racing the deletion does not make the topic's configs again
        a.change_topic_configs("t", {"retention.ms": "1"})
        await flushed(a)
        assert await backend.store.get("/config/topics/t") is None
        assert a.topic_overrides("t") is None  # its view is the store's again
    finally:
        await a.stop()
        await b.stop()


async def test_the_cluster_default_altered_on_one_broker_reaches_the_other(
        backend: Backend, tmp_path: Path) -> None:
    a, b = await two_brokers(backend)
    try:
        config_a = broker_config(tmp_path / "a", {"node.id": "1"})
        config_b = broker_config(tmp_path / "b", {"node.id": "2"})
        dynamic_a = DynamicBrokerConfig(config_a, a)
        dynamic_b = DynamicBrokerConfig(config_b, b)
        dynamic_a.load()
        dynamic_b.load()
        dynamic_a.add_reconfigurable(CONNECTION_KEYS | TOPIC_DEFAULT_KEYS, lambda c: None)
        told: list[int] = []
        dynamic_b.add_reconfigurable(CONNECTION_KEYS, lambda c: told.append(c["max.connections"]))
        dynamic_a.alter("", {"max.connections": "77"})
        dynamic_a.alter("1", {"log.retention.ms": "5000"})  # a's own: not b's business
        await flushed(a)
        kv = await backend.store.get("/config/brokers/<default>")
        assert kv is not None and json.loads(kv.value) == {
            "version": 1, "config": {"max.connections": "77"}}
        assert await backend.store.get("/config/brokers/1") is not None
        assert await backend.eventually(lambda: told == [77], 5)
        assert config_b["max.connections"] == 77
        assert config_b["log.retention.ms"] != 5000 and config_a["log.retention.ms"] == 5000
        # a per-broker key is refused at the cluster level, as Kafka refuses it
        with pytest.raises(KafkaError):
            dynamic_a.alter("", {"listeners": "PLAINTEXT://127.0.0.1:1"})
        # a broker started later takes the stored default in at start
        c = EtcdSharedState(await backend.new_client())
        await c.start()
        try:
            config_c = broker_config(tmp_path / "c", {"node.id": "3"})
            DynamicBrokerConfig(config_c, c).load()
            assert config_c["max.connections"] == 77
        finally:
            await c.stop()
    finally:
        await a.stop()
        await b.stop()
