"""The reference Java client, kafka-clients (version in the Makefile's JAVA_JARS), as its users
use it: a producer per codec with headers and explicit timestamps read back byte for byte, the
idempotent producer, seek by timestamp, the Admin client, classic consumer groups,
transactions (commit, abort, read_committed, fencing, sendOffsetsToTransaction), and the Admin
calls that manage logs (incrementalAlterConfigs and describeConfigs, deleteRecords,
describeLogDirs, describeTopics through DescribeTopicPartitions) with a compacted topic; the
consumer group protocol (group.protocol=consumer with the broker's uniform and range
assignors, and the Admin's view of such groups) and client telemetry, driven by
MiniBrokerConsumerProtocol.java.

tests/conformance/java/MiniBrokerConformance.java drives the client and prints what it saw, one
JSON line per scenario; the assertions are all here. One JVM runs every scenario against one
broker (a JVM start costs a second), then each test checks its scenario. Without java, javac or
the jars (`make java-client-deps`) the tests skip, and the reason is also raised as a warning.
"""

from __future__ import annotations

import base64
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka.protocol.metadata import ApiVersionsResponse
from prometheus_client.parser import text_string_to_metric_families

from tests.conformance import java_support
from tests.conformance.conftest import GROUP_OVERRIDES
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    CODEC_ID,
    CODECS,
    Got,
    Rec,
    assert_idempotent_batches,
    assert_roundtrip,
    confluent_consume,
    disk_batches,
    partition_dir,
    sample_records,
    unique_topic,
    watermarks,
)
from tests.support.requests import api_versions_request
from tests.support.wire import Wire

IDEMPOTENT_PARTITIONS, IDEMPOTENT_PER_PARTITION = 6, 100
GROUP_PARTITIONS, GROUP_PER_PARTITION = 6, 50
ASSIGNORS = ["range", "cooperative-sticky"]
TIMESTAMPED = 20
# CreateTime an hour ago: inside every default retention, apart from the broker's clock.
BASE_TS = (int(time.time()) - 3600) * 1000
ZERO_UUID = "AAAAAAAAAAAAAAAAAAAAAA"  # Uuid.ZERO_UUID: a topic without id
CLEANER_BACKOFF_MS = 100  # a static broker setting, so the log admin test can override it


def _token(b: bytes | None) -> str:
    """The program's byte encoding: "-" is null, "=" + base64 is bytes (empty included)."""
    return "-" if b is None else "=" + base64.b64encode(b).decode()


def _bytes(token: str) -> bytes | None:
    return None if token == "-" else base64.b64decode(token[1:])


def _write_records(path: Path, records: list[Rec]) -> None:
    lines = []
    for r in records:
        fields = [str(r.timestamp), _token(r.key), _token(r.value)]
        for k, v in r.headers:
            fields += [_token(k.encode()), _token(v)]
        lines.append("\t".join(fields) + "\n")
    path.write_text("".join(lines))


def _got(row: list) -> Got:
    offset, ts, ts_type, key, value, headers = row
    hs = tuple((_bytes(k).decode(), _bytes(v)) for k, v in headers)
    return Got(offset, Rec(_bytes(key), _bytes(value), hs, ts), ts_type)


def _value(step: dict):
    """A step's value; its error, if any, fails the test with the Java exception chain."""
    assert "error" not in step, step["error"]
    return step["value"]


@dataclass
class Shared:
    broker: BrokerProcess
    run: java_support.Run
    specs: dict[str, str]  # test's name for a scenario -> its spec on the command line
    topics: dict[str, str]
    records: dict[str, list[Rec]]

    def __getitem__(self, name: str) -> dict:
        result = self.run[self.specs[name]]
        assert "error" not in result, f"{name}: {result['error']}\n{self.run.stderr[-4000:]}"
        return result


@pytest.fixture(scope="module")
def client() -> java_support.JavaClient:
    return java_support.require()


@pytest.fixture(scope="module")
def java_broker(client, tmp_path_factory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("java-broker"),
                      {**GROUP_OVERRIDES, "transaction.state.log.num.partitions": "3",
                       "log.cleaner.backoff.ms": str(CLEANER_BACKOFF_MS)}).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.kill()


@pytest.fixture(scope="module")
def shared(client, java_broker, tmp_path_factory) -> Shared:
    """Every scenario in one JVM, in this order; each test then reads its own line."""
    work = tmp_path_factory.mktemp("java-records")
    specs: dict[str, str] = {"version": "version"}
    topics: dict[str, str] = {}
    records: dict[str, list[Rec]] = {}
    for i, codec in enumerate(CODECS):
        records[codec] = sample_records(40, seed=i, both_null=True)
        path = work / f"{codec}.txt"
        _write_records(path, records[codec])
        topics[codec] = unique_topic(f"java-{codec}")
        specs[codec] = f"roundtrip:{codec}:{topics[codec]}:{path}"
    topics["idempotent"] = unique_topic("java-idem")
    specs["idempotent"] = (f"idempotent:{topics['idempotent']}:{IDEMPOTENT_PARTITIONS}:"
                           f"{IDEMPOTENT_PER_PARTITION}")
    topics["timestamps"] = unique_topic("java-ts")
    specs["timestamps"] = f"timestamps:{topics['timestamps']}:{BASE_TS}:{TIMESTAMPED}"
    topics["admin"] = unique_topic("java-admin")
    specs["admin"] = f"admin:{topics['admin']}"
    for assignor in ASSIGNORS:
        topics[assignor] = unique_topic(f"java-group-{assignor}")
        specs[assignor] = (f"group:{topics[assignor]}:{topics[assignor]}-g:{GROUP_PARTITIONS}:"
                           f"{GROUP_PER_PARTITION}:{assignor}")
    run = java_support.run(client, java_broker.bootstrap, list(specs.values()), timeout=240)
    return Shared(java_broker, run, specs, topics, records)


def test_client_version(client, shared: Shared) -> None:
    assert shared["version"]["version"] == client.version


@pytest.mark.parametrize("codec", CODECS)
def test_roundtrip_every_codec(shared: Shared, codec: str) -> None:
    """Keys, values and headers (null, empty, binary, duplicate, non-ASCII) and CreateTime
    timestamps come back byte for byte, to the Java consumer and to librdkafka alike; the
    broker stores the batches with the producer's codec."""
    result, sent, topic = shared[codec], shared.records[codec], shared.topics[codec]
    assert result["acked"] == [[i, r.timestamp] for i, r in enumerate(sent)]
    assert_roundtrip([_got(row) for row in result["records"]], sent)
    assert_roundtrip(confluent_consume(shared.broker.bootstrap, topic, len(sent)), sent)
    batches = disk_batches(shared.broker.data_dir / "logs", topic)
    assert sum(b.record_count for b in batches) == len(sent)
    # The Java producer compresses every batch, even a lone record.
    assert {b.codec for b in batches} == {CODEC_ID[codec]}, [(b.codec, b.record_count)
                                                            for b in batches]
    assert any(b.record_count > 1 for b in batches)


def test_idempotent_producer(shared: Shared) -> None:
    """enable.idempotence, acks=all, five requests in flight over six partitions: every record
    acknowledged once at a dense offset, in send order, and stored once."""
    result, topic = shared["idempotent"], shared.topics["idempotent"]
    assert result["failed"] == []
    n = IDEMPOTENT_PER_PARTITION
    expected = {(p, o): _token(f"{p}:{o}".encode())
                for p in range(IDEMPOTENT_PARTITIONS) for o in range(n)}
    acked = [(p, o, v) for p, o, v in result["acked"]]
    assert len(acked) == len(expected), f"{len(acked)} acknowledgements for {len(expected)}"
    assert {(p, o): v for p, o, v in acked} == expected
    consumed = Counter((p, o, v) for p, o, v in result["consumed"])
    assert [k for k, c in consumed.items() if c > 1] == [], "records consumed twice"
    assert {(p, o): v for p, o, v in consumed} == expected
    log_dir = shared.broker.data_dir / "logs"
    for p in range(IDEMPOTENT_PARTITIONS):
        assert watermarks(shared.broker.bootstrap, topic, p) == (0, n)
        assert_idempotent_batches(log_dir, topic, p, n)
    # Small batches, several per partition: the producer had batches to pipeline.
    assert all(len(disk_batches(log_dir, topic, p)) >= 3 for p in range(IDEMPOTENT_PARTITIONS))


def test_seek_by_timestamp(shared: Shared) -> None:
    """offsetsForTimes answers the first offset whose timestamp is at or after the target (none
    past the last), the consumer seeks there and reads that record; Admin.listOffsets answers
    earliest, latest, maxTimestamp and forTimestamp."""
    result = shared["timestamps"]
    assert (result["beginning"], result["end"]) == (0, TIMESTAMPED)
    stamps = [BASE_TS + 1000 * i for i in range(TIMESTAMPED)]
    assert len(result["answers"]) == 10
    for row in result["answers"]:
        want = next((i for i, ts in enumerate(stamps) if ts >= row["target"]), None)
        assert row["offset"] == want, row
        if want is None:
            assert row["timestamp"] is None, row
            continue
        assert row["timestamp"] == stamps[want], row
        assert (row["first_offset"], row["first_timestamp"]) == (want, stamps[want]), row
    listed = {k: _value(v) for k, v in result["listOffsets"].items()}
    assert listed == {
        "earliest": [0, -1],
        "latest": [TIMESTAMPED, -1],
        "maxTimestamp": [TIMESTAMPED - 1, stamps[-1]],
        "forTimestamp": [3, stamps[3]],
    }


def _steps(shared: Shared) -> dict:
    return shared["admin"]["steps"]


def test_admin_topics(shared: Shared) -> None:
    """createTopics (a duplicate refused), listTopics, describeTopics, createPartitions,
    deleteTopics, and describeTopics of a deleted topic."""
    steps, prefix = _steps(shared), shared.topics["admin"]
    one, two = f"{prefix}-one", f"{prefix}-two"
    node = _value(steps["describeCluster"])["nodes"][0][0]
    assert _value(steps["createTopics"]) == "ok"
    again = steps["createTopicsAgain"]
    assert again.get("error", "").startswith(
        "org.apache.kafka.common.errors.TopicExistsException"), again
    names = _value(steps["listTopics"])
    assert {one, two} <= set(names)
    assert not [n for n in names if n.startswith("__")], f"internal topics listed: {names}"

    described = _value(steps["describeTopics"])
    assert described[one]["partitions"] == [[0, node, 1, 1]]
    assert described[two]["partitions"] == [[p, node, 1, 1] for p in range(2)]
    ids = {d["topicId"] for d in described.values()}
    assert len(ids) == 2 and ZERO_UUID not in ids, ids
    assert not any(d["internal"] for d in described.values())

    grown = _value(steps["createPartitions"])[two]
    assert grown["partitions"] == [[p, node, 1, 1] for p in range(4)]
    assert grown["topicId"] == described[two]["topicId"]

    assert not {one, two} & set(_value(steps["deleteTopics"]))
    gone = steps["describeDeletedTopic"]
    assert gone.get("error", "").startswith(
        "org.apache.kafka.common.errors.UnknownTopicOrPartitionException"), gone


def test_admin_configs_and_cluster(shared: Shared) -> None:
    steps = _steps(shared)
    configs = {k: v[:2] for k, v in _value(steps["describeConfigs"]).items()}
    assert configs["retention.ms"] == ["3600000", "DYNAMIC_TOPIC_CONFIG"]
    assert configs["cleanup.policy"] == ["delete", "DYNAMIC_TOPIC_CONFIG"]
    assert configs["segment.bytes"] == ["1073741824", "DEFAULT_CONFIG"]
    broker = _value(steps["describeBrokerConfigs"])
    assert broker["num.partitions"] == "1" and broker["message.max.bytes"] == "1048588", broker
    assert broker["offsets.topic.num.partitions"] == GROUP_OVERRIDES[
        "offsets.topic.num.partitions"]

    cluster = _value(steps["describeCluster"])
    assert cluster["nodes"] == [[1, "127.0.0.1", shared.broker.port]]
    assert cluster["controller"] == 1
    assert cluster["clusterId"]


def test_admin_config_types(shared: Shared) -> None:
    configs = _value(_steps(shared)["describeConfigs"])
    types = {k: configs[k][2] for k in ("retention.ms", "cleanup.policy", "segment.bytes",
                                        "message.timestamp.type", "max.message.bytes")}
    assert types == {"retention.ms": "LONG", "cleanup.policy": "LIST", "segment.bytes": "INT",
                     "message.timestamp.type": "STRING", "max.message.bytes": "INT"}


def test_admin_consumer_groups(shared: Shared) -> None:
    """listConsumerGroups, listGroups and describeConsumerGroups of a live member, then of the
    Empty group; listConsumerGroupOffsets, alterConsumerGroupOffsets,
    deleteConsumerGroupOffsets, deleteConsumerGroups."""
    steps, prefix = _steps(shared), shared.topics["admin"]
    group, two = f"{prefix}-g", f"{prefix}-two"
    member = steps["groupMember"]
    assert member["consumed"] and member["report"]["errors"] == [], member

    assert _value(steps["listConsumerGroups"])[group] == ["Stable", "Classic"]
    assert _value(steps["listGroups"])[group] == ["Stable", "Classic", "consumer"]
    live = _value(steps["describeConsumerGroups"])
    assert {k: v for k, v in live.items() if k != "members"} == {
        "state": "Stable", "type": "Classic", "assignor": "range", "coordinator": 1,
        "simple": False}
    assert [(m["clientId"], m["memberIdSet"], m["partitions"]) for m in live["members"]] == [
        ("admin-member", True, [0, 1, 2, 3])]
    # Offset, metadata and the leader epoch the consumer committed with (0: a new topic).
    committed = {f"{two}:{p}": [3, "", 0] for p in range(4)}
    assert _value(steps["listConsumerGroupOffsets"]) == committed

    empty = _value(steps["describeEmptyGroup"])
    assert (empty["state"], empty["members"]) == ("Empty", [])
    # Admin commits carry no leader epoch.
    rewound = {**committed, f"{two}:0": [1, "rewound", None]}
    assert _value(steps["alterConsumerGroupOffsets"]) == rewound
    del rewound[f"{two}:1"]
    assert _value(steps["deleteConsumerGroupOffsets"]) == rewound
    assert group not in _value(steps["deleteConsumerGroups"])


def test_admin_member_host_as_kafka_reports_it(shared: Shared) -> None:
    live = _value(_steps(shared)["describeConsumerGroups"])
    assert [m["host"] for m in live["members"]] == ["/127.0.0.1"]


def _assert_three_two_late(result: dict, sticky: bool) -> None:
    """The three/two/late group scenario: 2+2+2, then 3+3 after a leave (with a sticky
    assignor the two who stayed kept what they had), every record processed exactly once, the
    late member reading exactly the last phase, and the commits at the end."""
    n = GROUP_PER_PARTITION
    for name, report in result["members"].items():
        assert report["errors"] == [], f"{name}: {report['errors']}"
    phases = result["phases"]
    assert all(phase["complete"] for phase in phases.values()), phases
    three, two = phases["three"]["assignment"], phases["two"]["assignment"]
    assert sorted(len(a) for a in three) == [2, 2, 2] and sorted(sum(three, [])) == list(
        range(GROUP_PARTITIONS)), three
    assert sorted(len(a) for a in two) == [3, 3] and sorted(sum(two, [])) == list(
        range(GROUP_PARTITIONS)), two
    if sticky:
        assert all(set(before) <= set(after) for before, after in zip(three, two, strict=False))

    rows = result["rows"]
    seen = Counter((p, o) for _m, p, o, _v in rows)
    assert [k for k, c in seen.items() if c > 1] == [], "records processed twice"
    phase_names = ["one", "two", "three"]
    expected = {(p, o): _token(f"{phase_names[o // n]}:{p}:{o % n}".encode())
                for p in range(GROUP_PARTITIONS) for o in range(3 * n)}
    assert {(p, o): v for _m, p, o, v in rows} == expected
    late = sorted((p, o) for m, p, o, _v in rows if m == "late")
    assert late == sorted((p, o) for p in range(GROUP_PARTITIONS) for o in range(2 * n, 3 * n))
    assert result["committed"] == {str(p): 3 * n for p in range(GROUP_PARTITIONS)}


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_classic_group(shared: Shared, assignor: str) -> None:
    """group.protocol=classic, commitSync after each batch: three members share six partitions
    2+2+2; one leaves and the other two take its partitions over 3+3 from its committed
    offsets; both stop; a new member with auto.offset.reset=none resumes exactly at the
    committed offsets. Every record is processed exactly once."""
    _assert_three_two_late(shared[assignor], sticky=assignor == "cooperative-sticky")


# -- transactions -------------------------------------------------------------------------------
# In a JVM of their own, after the scenarios above: a broker without transactions makes every
# transactional call wait for max.block.ms, which must not cost the other tests their run.

@dataclass
class BrokerRun:
    """A broker of its own and one JVM's scenario results, looked up by scenario name."""

    broker: BrokerProcess
    run: java_support.Run
    specs: dict[str, str]
    topics: dict[str, str]

    def __getitem__(self, name: str) -> dict:
        result = self.run[self.specs[name]]
        assert "error" not in result, f"{name}: {result['error']}\n{self.run.stderr[-4000:]}"
        return result


@pytest.fixture(scope="module")
def txn_shared(client, java_broker, shared) -> BrokerRun:
    topics = {"txn": unique_topic("java-txn"), "fence": unique_topic("java-fence"),
              "in": unique_topic("java-ctp-in"), "out": unique_topic("java-ctp-out")}
    specs = {"txn": f"txn:{topics['txn']}", "fence": f"fence:{topics['fence']}",
             "txnOffsets": f"txnOffsets:{topics['in']}:{topics['out']}:{topics['in']}-g"}
    run = java_support.run(client, java_broker.bootstrap, list(specs.values()), timeout=240)
    return BrokerRun(java_broker, run, specs, topics)


def _values(rows: list) -> list[str]:
    return [v for _o, v in rows]


def _five(prefix: str) -> list[str]:
    return [f"{prefix}-{i}" for i in range(5)]


def test_transaction_commit_and_abort(txn_shared: BrokerRun) -> None:
    """initTransactions, then committed, aborted (after a flush) and committed transactions:
    a read_committed KafkaConsumer reads the two committed ones in order and nothing of the
    aborted one, a read_uncommitted one reads all three; the end offset is the same for both
    isolation levels once nothing is open (15 records and 3 markers)."""
    result = txn_shared["txn"]
    committed = _values(result["readCommitted"])
    assert committed == _five("first") + _five("last"), committed
    assert _values(result["readUncommitted"]) == _five("first") + _five("aborted") + _five("last")
    offsets = [o for o, _v in result["readUncommitted"]]
    assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] == 16, offsets
    assert (result["endCommitted"], result["endUncommitted"]) == (18, 18)
    assert watermarks(txn_shared.broker.bootstrap, txn_shared.topics["txn"]) == (0, 18)


def test_transaction_zombie_fenced(txn_shared: BrokerRun) -> None:
    """A second producer initialised with the same transactional.id fences the first: its
    commitTransaction fails with ProducerFencedException, its records are aborted, and the
    second producer's transaction is what read_committed reads."""
    result = txn_shared["fence"]
    error = result["zombieCommit"].get("error", "")
    assert error.startswith("org.apache.kafka.common.errors.ProducerFencedException"), result
    assert _values(result["readCommitted"]) == [f"fresh-{i}" for i in range(3)]


def test_transaction_send_offsets(txn_shared: BrokerRun) -> None:
    """sendOffsetsToTransaction with the consumer's groupMetadata(): the group's offsets are
    committed with the transaction and only then; an aborted transaction leaves them as they
    were, and its output is never read_committed."""
    result, topic = txn_shared["txnOffsets"], txn_shared.topics["in"]
    offsets = result["offsets"]
    assert (offsets["commitConsumed"], offsets["abortConsumed"]) == (10, 6), offsets
    assert offsets["commitBefore"] == {}, offsets
    after = {f"{topic}:{p}": [5, "", None] for p in range(2)}
    assert offsets["commitAfter"] == after, offsets
    assert offsets["abortBefore"] == after and offsets["abortAfter"] == after, offsets
    out = _values(result["output"])
    assert out[-1] == "END"
    assert sorted(out[:-1]) == sorted(f"IN:{p}:{n}" for p in range(2) for n in range(5)), out


# -- log admin ----------------------------------------------------------------------------------
# In a JVM of its own (it changes a broker setting, and puts it back), after the others as the
# tests come last in the file.

COMPACT_KEYS = 20  # as in the Java program
PLAIN_RECORDS = 100
WIDE_PARTITIONS = 7
DESCRIBE_TOPIC_PARTITIONS = 75  # API key
LONG_MAX = str(2**63 - 1)
ERRORS = "org.apache.kafka.common.errors."


@dataclass
class LogAdmin:
    broker: BrokerProcess
    prefix: str
    steps: dict


@pytest.fixture(scope="module")
def log_admin(client, java_broker) -> LogAdmin:
    prefix = unique_topic("java-logs")
    spec = f"logAdmin:{prefix}"
    run = java_support.run(client, java_broker.bootstrap, [spec], timeout=240)
    result = run[spec]
    assert "error" not in result, f"{result['error']}\n{run.stderr[-4000:]}"
    return LogAdmin(java_broker, prefix, result["steps"])


def _refused(step: dict, exception: str) -> None:
    assert "value" not in step, f"accepted: {step}"
    assert step["error"].startswith(ERRORS + exception), step["error"]


def test_incremental_alter_topic_configs(log_admin: LogAdmin) -> None:
    """SET on a topic shows in describeConfigs as DYNAMIC_TOPIC_CONFIG, with Kafka's types and
    synonyms (the override, then the broker key it falls back on); DELETE goes back to the
    default; validateOnly changes nothing; refused values leave the topic as it was."""
    steps = log_admin.steps
    assert _value(steps["createTopics"]) == "ok"
    c = _value(steps["alterTopic"])
    assert c["cleanup.policy"] == ["compact", "DYNAMIC_TOPIC_CONFIG", "LIST", False, [
        ["cleanup.policy", "compact", "DYNAMIC_TOPIC_CONFIG"],
        ["log.cleanup.policy", "delete", "DEFAULT_CONFIG"]]]
    assert c["min.cleanable.dirty.ratio"] == ["0.01", "DYNAMIC_TOPIC_CONFIG", "DOUBLE", False, [
        ["min.cleanable.dirty.ratio", "0.01", "DYNAMIC_TOPIC_CONFIG"],
        ["log.cleaner.min.cleanable.ratio", "0.5", "DEFAULT_CONFIG"]]]
    assert c["delete.retention.ms"][:4] == ["1000", "DYNAMIC_TOPIC_CONFIG", "LONG", False]
    assert c["min.compaction.lag.ms"][:2] == ["0", "DYNAMIC_TOPIC_CONFIG"]
    assert c["segment.bytes"][:3] == ["16384", "DYNAMIC_TOPIC_CONFIG", "INT"]
    assert c["max.compaction.lag.ms"] == [LONG_MAX, "DEFAULT_CONFIG", "LONG", False, [
        ["log.cleaner.max.compaction.lag.ms", LONG_MAX, "DEFAULT_CONFIG"]]]

    assert _value(steps["deleteTopicConfig"])["delete.retention.ms"] == [
        "86400000", "DEFAULT_CONFIG", "LONG", False,
        [["log.cleaner.delete.retention.ms", "86400000", "DEFAULT_CONFIG"]]]
    assert _value(steps["validateOnly"])["segment.ms"][:2] == ["600000", "DYNAMIC_TOPIC_CONFIG"]
    _refused(steps["invalidRatio"], "InvalidConfigurationException")
    _refused(steps["lagAboveMax"], "InvalidConfigurationException")


def test_incremental_alter_list_config(log_admin: LogAdmin) -> None:
    """APPEND and SUBTRACT edit a list config (cleanup.policy) element by element."""
    steps = log_admin.steps
    assert _value(steps["appendPolicy"])["cleanup.policy"][:2] == [
        "delete,compact", "DYNAMIC_TOPIC_CONFIG"]
    assert _value(steps["subtractPolicy"])["cleanup.policy"][:2] == [
        "compact", "DYNAMIC_TOPIC_CONFIG"]
    assert _value(steps["restorePolicy"])["cleanup.policy"][:2] == ["delete", "DEFAULT_CONFIG"]


def test_incremental_alter_broker_configs(log_admin: LogAdmin) -> None:
    """A dynamic broker key: the static setting, a cluster default over it, a per-broker value
    over both (synonyms in Kafka's order of precedence), and back to static once both are
    deleted; a key that cannot change at run time is refused."""
    steps = log_admin.steps
    static = ["log.cleaner.backoff.ms", str(CLEANER_BACKOFF_MS), "STATIC_BROKER_CONFIG"]
    default = ["log.cleaner.backoff.ms", "15000", "DEFAULT_CONFIG"]
    assert _value(steps["brokerStatic"])["log.cleaner.backoff.ms"] == [
        str(CLEANER_BACKOFF_MS), "STATIC_BROKER_CONFIG", "LONG", False, [static, default]]
    cluster = ["log.cleaner.backoff.ms", "250", "DYNAMIC_DEFAULT_BROKER_CONFIG"]
    assert _value(steps["clusterDefault"])["log.cleaner.backoff.ms"] == [
        "250", "DYNAMIC_DEFAULT_BROKER_CONFIG", "LONG", False, [cluster, static, default]]
    assert _value(steps["perBroker"])["log.cleaner.backoff.ms"] == [
        "150", "DYNAMIC_BROKER_CONFIG", "LONG", False,
        [["log.cleaner.backoff.ms", "150", "DYNAMIC_BROKER_CONFIG"], cluster, static, default]]
    assert _value(steps["brokerReset"])["log.cleaner.backoff.ms"] == [
        str(CLEANER_BACKOFF_MS), "STATIC_BROKER_CONFIG", "LONG", False, [static, default]]
    # Kafka's ConfigAdminManager turns the broker's refusal into INVALID_REQUEST.
    _refused(steps["readOnlyBrokerKey"], "InvalidRequestException")


def test_compacted_topic_read_back(log_admin: LogAdmin) -> None:
    """A topic turned compacted by incrementalAlterConfigs: once cleaned, the Java consumer reads
    each key once, at the offset and with the value of its last acknowledged update."""
    compacted = _value(log_admin.steps["compacted"])
    acked, rows = compacted["acked"], compacted["rows"]
    assert len(acked) == COMPACT_KEYS + 1
    offsets = [o for o, _k, _v in rows]
    assert offsets == sorted(set(offsets)), offsets
    assert {k: [o, v] for o, k, v in rows} == acked, f"after {compacted['reads']} reads"
    assert len(rows) == len(acked), rows


def test_delete_records(log_admin: LogAdmin) -> None:
    """deleteRecords answers the new low watermark, which listOffsets(earliest) and a consumer
    reading from the beginning agree with; beyond the high watermark is OFFSET_OUT_OF_RANGE,
    -1 means the high watermark, and a compacted topic refuses (POLICY_VIOLATION)."""
    steps = log_admin.steps
    assert _value(steps["deleteRecords"]) == [40, 40, 40]
    _refused(steps["deleteRecordsBeyondEnd"], "OffsetOutOfRangeException")
    _refused(steps["deleteRecordsCompacted"], "PolicyViolationException")
    assert _value(steps["deleteRecordsToHighWatermark"]) == PLAIN_RECORDS
    plain = f"{log_admin.prefix}-plain"
    assert watermarks(log_admin.broker.bootstrap, plain) == (PLAIN_RECORDS, PLAIN_RECORDS)


def test_describe_log_dirs(log_admin: LogAdmin) -> None:
    """The broker's one log dir, without error, its disk's total and usable bytes, and each
    partition's size as the sum of its segments on disk."""
    dirs = _value(log_admin.steps["describeLogDirs"])
    logs = log_admin.broker.data_dir / "logs"
    assert list(dirs) == [str(logs)], dirs
    d = dirs[str(logs)]
    assert d["error"] is None
    assert 0 < d["usableBytes"] <= d["totalBytes"], d
    replicas = d["replicas"]
    plain = f"{log_admin.prefix}-plain"
    on_disk = sum(p.stat().st_size for p in partition_dir(logs, plain).glob("*.log"))
    assert replicas[f"{plain}-0"] == [on_disk, 0, False]
    for p in range(WIDE_PARTITIONS):
        assert replicas[f"{log_admin.prefix}-wide-{p}"] == [0, 0, False]
    assert f"{log_admin.prefix}-compacted-0" in replicas


def test_describe_topics_paged(log_admin: LogAdmin) -> None:
    """describeTopics by name with three partitions per response: the broker serves
    DescribeTopicPartitions (else the client falls back to Metadata, silently), and the client
    follows its cursor to all seven partitions."""
    wire = Wire(log_admin.broker.port)
    try:
        versions = wire.request(api_versions_request(), ApiVersionsResponse)
    finally:
        wire.close()
    served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert served.get(DESCRIBE_TOPIC_PARTITIONS) == (0, 0), served.get(DESCRIBE_TOPIC_PARTITIONS)
    d = _value(log_admin.steps["describeTopicsPaged"])
    assert d["partitions"] == [[p, 1, 1, 1] for p in range(WIDE_PARTITIONS)]
    assert d["topicId"] != ZERO_UUID and not d["internal"]
    assert {"READ", "WRITE", "DESCRIBE"} <= set(d["authorizedOperations"] or []), d
    _refused(log_admin.steps["describeUnknownTopic"], "UnknownTopicOrPartitionException")


# -- security -----------------------------------------------------------------------------------
# A broker of its own with one SASL_SSL listener and ACLs on; each identity is a client
# properties file, as Java users write them. MiniBrokerSecurity is compiled with the other
# sources and run by java_support.run with its main class swapped in.

SECURITY_RECORDS = 20


@dataclass
class SecurityRun:
    run: java_support.Run
    specs: dict[str, str]
    prefix: str

    def __getitem__(self, name: str) -> dict:
        result = self.run[self.specs[name]]
        assert "error" not in result, f"{name}: {result['error']}\n{self.run.stderr[-4000:]}"
        return result


def _client_properties(path: Path, pki, mechanism: str, user: str, password: str) -> Path:
    module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism == "PLAIN"
              else "org.apache.kafka.common.security.scram.ScramLoginModule")
    path.write_text("\n".join([
        "security.protocol=SASL_SSL",
        f"sasl.mechanism={mechanism}",
        f'sasl.jaas.config={module} required username="{user}" password="{password}";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={pki.ca_path}",
    ]) + "\n")
    return path


@pytest.fixture(scope="module")
def security_run(client, tmp_path_factory) -> Iterator[SecurityRun]:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from tests.support.certs import confluent_config, make_pki, secure_broker_overrides

    root = tmp_path_factory.mktemp("java-security")
    pki = make_pki(root / "pki")
    plain = {"admin": "admin-secret", "alice": "alice-plain-secret"}
    broker = BrokerProcess(root / "broker", {
        **GROUP_OVERRIDES, **secure_broker_overrides(pki, plain, listeners=("SASL_SSL",))}
    ).start()
    try:
        bootstrap = broker.bootstrap_for("SASL_SSL")
        admin = AdminClient(confluent_config(bootstrap, "SASL_SSL", "PLAIN", "admin",
                                             plain["admin"], pki.ca_path))
        upsert = UserScramCredentialUpsertion(
            "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"alice-scram")
        admin.alter_user_scram_credentials([upsert])["alice"].result(30)
        props = {
            "admin": _client_properties(root / "admin.properties", pki, "PLAIN", "admin",
                                        plain["admin"]),
            "plain": _client_properties(root / "alice-plain.properties", pki, "PLAIN", "alice",
                                        plain["alice"]),
            "scram": _client_properties(root / "alice-scram.properties", pki, "SCRAM-SHA-512",
                                        "alice", "alice-scram"),
        }
        prefix = unique_topic("java-sec")
        other = unique_topic("java-other")
        specs = {
            "createScram": f"createTopic:{props['admin']}:{prefix}-scram:2",
            "createPlain": f"createTopic:{props['admin']}:{prefix}-plain:2",
            "createOther": f"createTopic:{props['admin']}:{other}:1",
            "acls": f"acls:{props['admin']}:alice:{prefix}",
            "scram": f"roundtrip:{props['scram']}:{prefix}-scram:{prefix}-scram-g:"
                     f"{SECURITY_RECORDS}",
            "plain": f"roundtrip:{props['plain']}:{prefix}-plain:{prefix}-plain-g:"
                     f"{SECURITY_RECORDS}",
            "denied": f"denied:{props['scram']}:{other}",
        }
        run = java_support.run(client, bootstrap, list(specs.values()), timeout=180,
                               main="MiniBrokerSecurity")
        yield SecurityRun(run, specs, prefix)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()


def test_security_admin_acls(security_run: SecurityRun) -> None:
    """Admin createAcls, describeAcls (alice's four bindings), deleteAcls (the DENY, returned
    as deleted) and describeAcls again, over SASL_SSL as the PLAIN super user."""
    for name in ("createScram", "createPlain", "createOther"):
        assert security_run[name]["created"]
    steps, p = security_run["acls"], security_run.prefix
    assert _value(steps["createAcls"]) == "ok"
    allowed = [f"GROUP PREFIXED {p} User:alice * READ ALLOW",
               f"TOPIC PREFIXED {p} User:alice * READ ALLOW",
               f"TOPIC PREFIXED {p} User:alice * WRITE ALLOW"]
    deny = f"TOPIC LITERAL {p}-tmp User:alice * DESCRIBE DENY"
    assert _value(steps["describeAcls"]) == sorted([*allowed, deny])
    assert _value(steps["deleteAcls"]) == [deny]
    assert _value(steps["describeAfterDelete"]) == allowed


@pytest.mark.parametrize("mechanism", ["scram", "plain"])
def test_security_roundtrip(security_run: SecurityRun, mechanism: str) -> None:
    """alice over SASL_SSL (SCRAM-SHA-512, then PLAIN): the idempotent producer's records all
    acknowledged, read once by a classic group that commits them all."""
    result = security_run[mechanism]
    assert len(result["acked"]) == SECURITY_RECORDS
    assert result["values"] == sorted(f"v{i}" for i in range(SECURITY_RECORDS))
    topic = f"{security_run.prefix}-{mechanism}"
    acked = Counter(p for p, _o in result["acked"])
    assert result["committed"] == {f"{topic}-{p}": n for p, n in acked.items()}


def test_security_denied(security_run: SecurityRun) -> None:
    """A produce to a topic alice has no ACL for fails with TopicAuthorizationException; her
    CreateAcls with ClusterAuthorizationException."""
    result = security_run["denied"]
    _refused(result["produce"], "TopicAuthorizationException")
    _refused(result["createAcls"], "ClusterAuthorizationException")


# -- the consumer group protocol ----------------------------------------------------------------
# group.protocol=consumer (KIP-848): MiniBrokerConsumerProtocol in one JVM against a broker of
# its own, with consumer-group sessions and heartbeats short enough (the group.consumer.*
# overrides, below Kafka's minimums) that each rebalance takes a heartbeat or two.

CONSUMER_PROTOCOL_OVERRIDES = {
    **GROUP_OVERRIDES,
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.heartbeat.interval.ms": "500",
}
REMOTE_ASSIGNORS = ["uniform", "range"]
CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE = 68, 69  # API keys


@pytest.fixture(scope="module")
def consumer_protocol(client, tmp_path_factory) -> Iterator[BrokerRun]:
    broker = BrokerProcess(tmp_path_factory.mktemp("java-consumer-protocol"),
                           CONSUMER_PROTOCOL_OVERRIDES).start()
    try:
        specs: dict[str, str] = {"version": "version"}
        topics: dict[str, str] = {}
        for assignor in REMOTE_ASSIGNORS:
            topics[assignor] = unique_topic(f"java-cg-{assignor}")
            specs[assignor] = (f"group:{topics[assignor]}:{topics[assignor]}-g:"
                               f"{GROUP_PARTITIONS}:{GROUP_PER_PARTITION}:{assignor}")
        topics["admin"] = unique_topic("java-cg-admin")
        specs["admin"] = f"admin:{topics['admin']}:{topics['admin']}-g:{GROUP_PARTITIONS}"
        run = java_support.run(client, broker.bootstrap, list(specs.values()), timeout=240,
                               main="MiniBrokerConsumerProtocol")
        yield BrokerRun(broker, run, specs, topics)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()


def test_consumer_protocol_apis_served(client, consumer_protocol: BrokerRun) -> None:
    """ConsumerGroupHeartbeat up to v1, which the Java client (4.x) needs for a pattern
    subscription and where member ids are the client's own (KIP-1082), and
    ConsumerGroupDescribe from v0."""
    assert consumer_protocol["version"]["version"] == client.version
    wire = Wire(consumer_protocol.broker.port)
    try:
        versions = wire.request(api_versions_request(), ApiVersionsResponse)
    finally:
        wire.close()
    served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert served.get(CONSUMER_GROUP_HEARTBEAT) == (0, 1), served.get(CONSUMER_GROUP_HEARTBEAT)
    assert served.get(CONSUMER_GROUP_DESCRIBE, (None,))[0] == 0, served.get(
        CONSUMER_GROUP_DESCRIBE)


@pytest.mark.parametrize("assignor", REMOTE_ASSIGNORS)
def test_consumer_protocol_group(consumer_protocol: BrokerRun, assignor: str) -> None:
    """group.protocol=consumer with group.remote.assignor, commitSync after each batch: three
    members share six partitions 2+2+2; one leaves and the other two take its partitions over
    3+3 from its committed offsets; both stop; a new member with auto.offset.reset=none resumes
    exactly at the committed offsets. Every record is processed exactly once."""
    _assert_three_two_late(consumer_protocol[assignor], sticky=assignor == "uniform")


def test_consumer_protocol_admin(consumer_protocol: BrokerRun) -> None:
    """describeConsumerGroups of a live consumer-protocol group (ConsumerGroupDescribe): type
    Consumer, Stable, the group's assignor, epochs, and each member as the consumer knows
    itself (its own member id), with its assignment equal to its target; listGroups and
    listConsumerGroups show the type; once both members left, the group is Empty."""
    steps = consumer_protocol["admin"]["steps"]
    topic = consumer_protocol.topics["admin"]
    group = f"{topic}-g"
    members = steps["members"]
    assert members["split"], members
    for name, report in steps["reports"].items():
        assert report["errors"] == [], f"{name}: {report['errors']}"

    live = _value(steps["describeConsumerGroups"])
    assert {k: live[k] for k in ("state", "type", "assignor", "coordinator", "simple")} == {
        "state": "Stable", "type": "Consumer", "assignor": "uniform", "coordinator": 1,
        "simple": False}, live
    assert live["groupEpoch"] is not None and live["groupEpoch"] > 0, live
    assert live["targetAssignmentEpoch"] == live["groupEpoch"], live
    described = live["members"]
    assert [m["clientId"] for m in described] == ["admin-0", "admin-1"]
    assert {m["clientId"]: m["memberId"] for m in described} == members["memberIds"]
    owned: list[str] = []
    for m in described:
        assert m["host"] == "/127.0.0.1", m
        assert len(m["partitions"]) == GROUP_PARTITIONS // 2, m
        assert m["target"] == m["partitions"], m
        assert m["memberEpoch"] is not None and 0 < m["memberEpoch"] <= live["groupEpoch"], m
        owned += m["partitions"]
    assert sorted(owned) == sorted(f"{topic}-{p}" for p in range(GROUP_PARTITIONS))

    assert _value(steps["listGroups"])[group] == ["Stable", "Consumer", "consumer"]
    assert _value(steps["listConsumerGroups"])[group] == ["Stable", "Consumer"]
    empty = _value(steps["describeEmptyGroup"])
    assert (empty["state"], empty["type"], empty["members"]) == ("Empty", "Consumer", [])


# -- client telemetry ---------------------------------------------------------------------------
# The Java producer and consumer push telemetry by default (enable.metrics.push): each case is a
# broker of its own, asking for metrics every 500 ms, or configured as it ships (telemetry not
# advertised); what the broker saw is read from its Prometheus endpoint.

TELEMETRY_CASES = {
    "requested": {"minibroker.client.telemetry.metrics": "org.apache.kafka.",
                  "minibroker.client.telemetry.push.interval.ms": "500"},
    "default": {},
}
TELEMETRY_MS = 3000


def _broker_samples(broker: BrokerProcess) -> dict[tuple[str, tuple], float]:
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


@dataclass
class TelemetryRun:
    case: str
    result: dict
    stderr: str
    samples: dict[tuple[str, tuple], float]

    def requests(self, api: str) -> float:
        return sum(v for (name, labels), v in self.samples.items()
                   if name == "minibroker_requests_total" and ("api", api) in labels)

    def pushes(self) -> dict[str, float]:
        return {dict(labels)["result"]: v for (name, labels), v in self.samples.items()
                if name == "minibroker_client_telemetry_pushes_total"}


@pytest.fixture(scope="module", params=list(TELEMETRY_CASES))
def java_telemetry(request, client, tmp_path_factory) -> Iterator[TelemetryRun]:
    case = request.param
    broker = BrokerProcess(tmp_path_factory.mktemp(f"java-telemetry-{case}"),
                           TELEMETRY_CASES[case]).start()
    try:
        spec = f"telemetry:{unique_topic('java-telemetry')}:{TELEMETRY_MS}"
        run = java_support.run(client, broker.bootstrap, [spec], timeout=120,
                               main="MiniBrokerConsumerProtocol")
        yield TelemetryRun(case, run[spec], run.stderr, _broker_samples(broker))
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()


def test_telemetry_with_java_clients(java_telemetry: TelemetryRun) -> None:
    """A producer and a consumer running three seconds: they work, and nothing about
    telemetry shows in their log (warnings and errors). Asked for metrics, the broker
    advertises telemetry: it gives each an instance id (clientInstanceId), they push and every
    push is accepted. As configured by default, telemetry is not advertised (Kafka without a
    telemetry receiver): the clients never ask for a subscription and push nothing."""
    run = java_telemetry
    result = run.result
    assert "error" not in result, f"{result['error']}\n{run.stderr[-4000:]}"
    assert result["sent"] > 0 and result["read"] == result["sent"], result
    problems = [line for line in run.stderr.splitlines()
                if "telemetry" in line.lower() or "uncaught" in line.lower()]
    assert not problems, "\n".join(problems[:20])
    if run.case == "requested":
        ids = [_value(result["producerInstanceId"]), _value(result["consumerInstanceId"])]
        assert ZERO_UUID not in ids and ids[0] != ids[1], ids
        assert run.pushes().get("accepted", 0) >= 2 and set(run.pushes()) == {"accepted"}, (
            run.pushes())
    else:
        assert run.requests("Produce") > 0
        assert run.requests("GetTelemetrySubscriptions") == 0
        assert run.requests("PushTelemetry") == 0
