"""Every real client (confluent-kafka, kafka-python, aiokafka, kcat, kafkajs, node-rdkafka,
Debian's python3-confluent-kafka; Java in tests/conformance/test_java.py) over SASL_PLAINTEXT
and SASL_SSL with each mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), against one broker with
ACLs on, configured with Kafka's own keys.

One broker per module: listeners PLAINTEXT, SASL_PLAINTEXT and SASL_SSL (ephemeral ports,
certificates from tests/support/certs.py), StandardAuthorizer with User:admin as super user.
The admin (PLAIN) creates alice's SCRAM credentials with AlterUserScramCredentials, as
`kafka-configs --alter --add-config 'SCRAM-SHA-512=[password=...]'` does, and grants her
prefixed ACLs; then each client produces as alice and consumes in a group that commits, and
the committed offsets are read back by the admin. alice's PLAIN password (the jaas entry) and
her SCRAM password differ, so a login can only succeed against the store its mechanism names.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
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

from tests.conformance.conftest import GROUP_OVERRIDES
from tests.conformance.test_debian_librdkafka import PYTHON as DEBIAN_PYTHON
from tests.conformance.test_debian_librdkafka import _require as require_debian_client
from tests.conformance.test_node_rdkafka import _node as node_for_node_rdkafka
from tests.support.broker import BrokerProcess
from tests.support.certs import (
    MECHANISMS,
    SASL_PROTOCOLS,
    Pki,
    aiokafka_config,
    confluent_config,
    kafka_python_config,
    kcat_args,
    make_pki,
    secure_broker_overrides,
)

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
NODE = shutil.which("node")
CONFORMANCE = Path(__file__).resolve().parents[1] / "conformance"
KAFKAJS = CONFORMANCE / "kafkajs" / "node_modules"
PLAIN_USERS = {"admin": "admin-secret", "alice": "alice-secret"}
SCRAM_PASSWORD = "alice-scram-secret"  # not her PLAIN password
SCRAM_ITERATIONS = {"SCRAM-SHA-256": 8192, "SCRAM-SHA-512": 4096}
RECORDS = 12
PARTITIONS = 2
WAIT_S = 30


@dataclass
class Secure:
    broker: BrokerProcess
    pki: Pki
    admin: AdminClient

    def password(self, mechanism: str) -> str:
        return PLAIN_USERS["alice"] if mechanism == "PLAIN" else SCRAM_PASSWORD


def admin_client(broker: BrokerProcess) -> AdminClient:
    """User:admin (the super user) over SASL_PLAINTEXT with PLAIN."""
    return AdminClient(confluent_config(broker.bootstrap_for("SASL_PLAINTEXT"), "SASL_PLAINTEXT",
                                        "PLAIN", "admin", PLAIN_USERS["admin"]))


def add_scram_user(admin: AdminClient, user: str, password: str,
                   iterations: dict[str, int]) -> None:
    """kafka-configs --alter --add-config 'SCRAM-SHA-256=[iterations=..,password=..]' as an
    Admin call (AlterUserScramCredentials), one request per mechanism: Kafka refuses a user
    named twice in one request (DUPLICATE_RESOURCE)."""
    for m, n in iterations.items():
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(getattr(ScramMechanism, m.replace("-", "_")), n),
            password.encode())
        admin.alter_user_scram_credentials([upsert])[user].result(WAIT_S)


def allow(admin: AdminClient, principal: str, rtype: ResourceType, prefix: str,
          operations: list[AclOperation]) -> None:
    bindings = [AclBinding(rtype, prefix, ResourcePatternType.PREFIXED, principal, "*", op,
                           AclPermissionType.ALLOW) for op in operations]
    for f in admin.create_acls(bindings).values():
        f.result(WAIT_S)


def create_topic(admin: AdminClient, topic: str, partitions: int = PARTITIONS) -> None:
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(WAIT_S)


def committed(admin: AdminClient, group: str) -> int:
    """The sum of the group's committed offsets, read by the admin."""
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    result = futures[group].result(WAIT_S)
    return sum(tp.offset for tp in result.topic_partitions if tp.offset >= 0)


@pytest.fixture(scope="module")
def secure(tmp_path_factory) -> Iterator[Secure]:
    root = tmp_path_factory.mktemp("security-clients")
    pki = make_pki(root / "pki")
    broker = BrokerProcess(root / "broker", {
        **GROUP_OVERRIDES, **secure_broker_overrides(pki, PLAIN_USERS)}).start()
    try:
        admin = admin_client(broker)
        add_scram_user(admin, "alice", SCRAM_PASSWORD, SCRAM_ITERATIONS)
        # READ and WRITE imply DESCRIBE (Kafka's implied operations); READ on a group is what
        # joining, syncing, fetching and committing offsets need.
        allow(admin, "User:alice", ResourceType.TOPIC, "sec-",
              [AclOperation.WRITE, AclOperation.READ])
        allow(admin, "User:alice", ResourceType.GROUP, "sec-", [AclOperation.READ])
        allow(admin, "User:ANONYMOUS", ResourceType.TOPIC, "plain-", [AclOperation.ALL])
        yield Secure(broker, pki, admin)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()


def sample(tag: str) -> list[tuple[bytes, bytes]]:
    return [(f"k{i}".encode(), f"{tag}-{i}".encode()) for i in range(RECORDS)]


# -- one round trip per client: produce every record, then read them all in a group that commits


def roundtrip_confluent(s: Secure, protocol: str, mechanism: str, topic: str, group: str,
                        recs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    conf = confluent_config(s.broker.bootstrap_for(protocol), protocol, mechanism, "alice",
                            s.password(mechanism), s.pki.ca_path)
    errors: list = []
    producer = Producer({**conf, "acks": "all", "linger.ms": 5})
    for k, v in recs:
        producer.produce(topic, v, k, on_delivery=lambda e, _m: e and errors.append(e))
    assert producer.flush(WAIT_S) == 0 and errors == [], errors
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    got: list[tuple[bytes, bytes]] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(recs) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.key(), msg.value()))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def roundtrip_kafka_python(s: Secure, protocol: str, mechanism: str, topic: str, group: str,
                           recs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    from kafka import KafkaConsumer, KafkaProducer

    conf = kafka_python_config(s.broker.bootstrap_for(protocol), protocol, mechanism, "alice",
                               s.password(mechanism), s.pki.ca_path)
    producer = KafkaProducer(**conf, acks="all", linger_ms=5)  # idempotent by default
    try:
        futures = [producer.send(topic, key=k, value=v) for k, v in recs]
        producer.flush(WAIT_S)
        for f in futures:
            f.get(WAIT_S)
    finally:
        producer.close(5)
    consumer = KafkaConsumer(topic, **conf, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False)
    got: list[tuple[bytes, bytes]] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while len(got) < len(recs) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                got += [(r.key, r.value) for r in batch]
        consumer.commit()
    finally:
        consumer.close()
    return got


def roundtrip_aiokafka(s: Secure, protocol: str, mechanism: str, topic: str, group: str,
                       recs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run() -> list[tuple[bytes, bytes]]:
        def conf() -> dict:
            return aiokafka_config(s.broker.bootstrap_for(protocol), protocol, mechanism,
                                   "alice", s.password(mechanism), s.pki.ca_path)

        producer = AIOKafkaProducer(**conf(), acks="all")
        await producer.start()
        try:
            for k, v in recs:
                await producer.send(topic, v, key=k)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, **conf(), group_id=group,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got: list[tuple[bytes, bytes]] = []
        try:
            deadline = time.monotonic() + WAIT_S
            while len(got) < len(recs) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                got += [(r.key, r.value) for batch in batches.values() for r in batch]
            await consumer.commit()
        finally:
            await consumer.stop()
        return got

    return asyncio.run(asyncio.wait_for(run(), WAIT_S * 2))


def roundtrip_kcat(s: Secure, protocol: str, mechanism: str, topic: str, group: str,
                   recs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    if KCAT is None:
        pytest.skip("kcat not on PATH (make test installs it)")
    conf = kcat_args(confluent_config(s.broker.bootstrap_for(protocol), protocol, mechanism,
                                      "alice", s.password(mechanism), s.pki.ca_path))
    lines = "".join(f"{k.decode()}:{v.decode()}\n" for k, v in recs)
    run = subprocess.run([KCAT, *conf, "-P", "-t", topic, "-K", ":"], input=lines,
                         capture_output=True, text=True, timeout=WAIT_S)
    assert run.returncode == 0, run.stderr
    # -G: a balanced consumer in the group; -c: stop (commit and leave) after that many.
    run = subprocess.run([KCAT, *conf, "-G", group, topic, "-c", str(len(recs)), "-q",
                          "-f", "%k:%s\n", "-X", "auto.offset.reset=earliest"],
                         capture_output=True, text=True, timeout=WAIT_S)
    assert run.returncode == 0, run.stderr
    return [tuple(line.encode().split(b":", 1)) for line in run.stdout.splitlines()]


# kafkajs as its users write it: `ssl` with the CA, `sasl` with a lower-case mechanism. The
# records come on stdin as JSON [[key, value], ...]; what the group read goes to stdout.
KAFKAJS_SCRIPT = r"""
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');
const [bootstrap, protocol, mechanism, username, password, ca, topic, groupId] =
  process.argv.slice(1);
const records = JSON.parse(fs.readFileSync(0, 'utf-8'));
const kafka = new Kafka({
  clientId: 'security-test', brokers: [bootstrap], logLevel: logLevel.ERROR,
  ssl: protocol === 'SASL_SSL' ? { ca: [fs.readFileSync(ca, 'utf-8')] } : false,
  sasl: { mechanism: mechanism.toLowerCase(), username, password },
});
(async () => {
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({ topic, acks: -1,
                        messages: records.map(([key, value]) => ({ key, value })) });
  await producer.disconnect();
  const consumer = kafka.consumer({ groupId });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  const got = [];
  await new Promise((resolve) => consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      got.push([message.key.toString(), message.value.toString()]);
      await consumer.commitOffsets([{ topic, partition,
                                      offset: (BigInt(message.offset) + 1n).toString() }]);
      if (got.length >= records.length) resolve();
    },
  }));
  await consumer.disconnect();
  console.log(JSON.stringify(got));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def roundtrip_kafkajs(s: Secure, protocol: str, mechanism: str, topic: str, group: str,
                      recs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    if NODE is None or not (KAFKAJS / "kafkajs").is_dir():
        pytest.fail(f"node or kafkajs missing ({KAFKAJS}): run `make test` (node-deps)")
    run = subprocess.run(
        [NODE, "-e", KAFKAJS_SCRIPT, s.broker.bootstrap_for(protocol), protocol, mechanism,
         "alice", s.password(mechanism), str(s.pki.ca_path), topic, group],
        input=json.dumps([[k.decode(), v.decode()] for k, v in recs]), capture_output=True,
        text=True, timeout=WAIT_S * 2, env={**os.environ, "NODE_PATH": str(KAFKAJS)})
    assert run.returncode == 0, run.stderr[-3000:]
    return [(k.encode(), v.encode()) for k, v in json.loads(run.stdout.splitlines()[-1])]


def _librdkafka_program(s: Secure, protocol: str, mechanism: str, topic: str, group: str,
                        recs: list[tuple[bytes, bytes]], command: list[str],
                        cwd: Path) -> list[tuple[bytes, bytes]]:
    """Run a program taking librdkafka's keys as a JSON file, the topic and the group, and the
    records on stdin; it prints {got, errors} on its last line."""
    conf = confluent_config(s.broker.bootstrap_for(protocol), protocol, mechanism, "alice",
                            s.password(mechanism), s.pki.ca_path)
    conf_path = s.broker.data_dir / f"{topic}.json"
    conf_path.write_text(json.dumps(conf))
    run = subprocess.run(
        [*command, str(conf_path), topic, group], cwd=cwd, capture_output=True, text=True,
        input=json.dumps([[k.decode(), v.decode()] for k, v in recs]), timeout=WAIT_S * 2)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["errors"] == [], result["errors"]
    return [(k.encode(), v.encode()) for k, v in result["got"]]


def roundtrip_node_rdkafka(s: Secure, protocol: str, mechanism: str, topic: str, group: str,
                           recs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """node-rdkafka/secure.js (librdkafka's keys, Debian's librdkafka underneath)."""
    node = node_for_node_rdkafka()  # skips with install.sh's reason when not built
    here = CONFORMANCE / "node_rdkafka"
    return _librdkafka_program(s, protocol, mechanism, topic, group, recs,
                               [node, "secure.js"], here)


def roundtrip_debian_confluent(s: Secure, protocol: str, mechanism: str, topic: str,
                               group: str, recs: list[tuple[bytes, bytes]],
                               ) -> list[tuple[bytes, bytes]]:
    """debian_librdkafka/secure.py under Debian's python3 (python3-confluent-kafka 1.7.0,
    librdkafka 2.0.2), isolated from the venv."""
    require_debian_client()  # skips with install.sh's reason when not installed
    here = CONFORMANCE / "debian_librdkafka"
    return _librdkafka_program(s, protocol, mechanism, topic, group, recs,
                               [DEBIAN_PYTHON, "-I", "secure.py"], here)


CLIENTS: dict[str, Callable] = {"confluent-kafka": roundtrip_confluent,
                                "kafka-python": roundtrip_kafka_python,
                                "aiokafka": roundtrip_aiokafka, "kcat": roundtrip_kcat,
                                "kafkajs": roundtrip_kafkajs,
                                "node-rdkafka": roundtrip_node_rdkafka,
                                "debian-confluent-kafka": roundtrip_debian_confluent}
# The whole matrix: 30 round trips take about 15 s on 2 cores, so none is marked slow.
MATRIX = [pytest.param(client, protocol, mechanism, id=f"{client}-{protocol}-{mechanism}")
          for client in CLIENTS for protocol in SASL_PROTOCOLS for mechanism in MECHANISMS]


@pytest.mark.parametrize(("client", "protocol", "mechanism"), MATRIX)
def test_roundtrip(secure: Secure, client: str, protocol: str, mechanism: str) -> None:
    """alice produces and consumes in a group: every record arrives once, and the group's
    committed offsets (read by the admin) cover them all."""
    tag = f"{client}-{protocol}-{mechanism}".lower()
    topic, group = f"sec-{tag}-{uuid.uuid4().hex[:6]}", f"sec-g-{tag}"
    create_topic(secure.admin, topic)
    recs = sample(tag)
    got = CLIENTS[client](secure, protocol, mechanism, topic, group, recs)
    assert sorted(got) == sorted(recs)
    assert committed(secure.admin, group) == RECORDS


def test_scram_users_described(secure: Secure) -> None:
    """DescribeUserScramCredentials lists alice's two mechanisms with their iterations, and
    only her: PLAIN users live in the jaas config, not in the credential store."""
    described = secure.admin.describe_user_scram_credentials().result(WAIT_S)
    assert set(described) == {"alice"}
    infos = {i.mechanism: i.iterations for i in described["alice"].scram_credential_infos}
    assert infos == {ScramMechanism.SCRAM_SHA_256: 8192, ScramMechanism.SCRAM_SHA_512: 4096}
    one = secure.admin.describe_user_scram_credentials(["alice"])["alice"].result(WAIT_S)
    assert len(one.scram_credential_infos) == 2


@pytest.mark.parametrize("listener", ["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL"])
def test_metadata_advertises_the_listener_used(secure: Secure, listener: str) -> None:
    """A client is told the broker's address on the listener it connected through."""
    user = {"PLAINTEXT": None, "SASL_PLAINTEXT": "admin", "SASL_SSL": "admin"}[listener]
    conf = confluent_config(secure.broker.bootstrap_for(listener), listener,
                            "PLAIN" if user else None, user or "", PLAIN_USERS.get(user or "", ""),
                            secure.pki.ca_path)
    md = AdminClient(conf).list_topics(timeout=WAIT_S)
    assert [(b.host, b.port) for b in md.brokers.values()] == [
        ("127.0.0.1", secure.broker.ports[listener])]


def test_plaintext_listener_still_works(secure: Secure) -> None:
    """The PLAINTEXT listener beside the SASL ones: its clients are User:ANONYMOUS, allowed
    what the ACLs give ANONYMOUS (topics `plain-*`), and see no other topic."""
    topic = f"plain-{uuid.uuid4().hex[:8]}"
    create_topic(secure.admin, topic, 1)
    create_topic(secure.admin, f"sec-hidden-{uuid.uuid4().hex[:6]}", 1)
    conf = confluent_config(secure.broker.bootstrap_for("PLAINTEXT"), "PLAINTEXT")
    producer = Producer(conf)
    for i in range(RECORDS):
        producer.produce(topic, f"p{i}".encode())
    assert producer.flush(WAIT_S) == 0
    consumer = Consumer({**conf, "group.id": "unused", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < RECORDS and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    listed = set(consumer.list_topics(timeout=WAIT_S).topics)
    consumer.close()
    assert got == [f"p{i}".encode() for i in range(RECORDS)]
    assert topic in listed and not any(t.startswith("sec-") for t in listed), listed
