"""node-rdkafka (npm, pinned by tests/conformance/node_rdkafka/package-lock.json), compiled against
Debian's librdkafka: a round trip per codec read back byte for byte, records of another client
with binary headers, the idempotent producer, a group member resuming exactly after another's
commits, and a group of two sharing a topic's partitions.

node_rdkafka/conformance.js drives the client and prints what it saw in one JSON line; the
assertions are all here, and what the broker stored is checked independently (the venv's
confluent-kafka reads the records and the group's offsets back; the batches on disk carry the
producer's codec and its idempotent sequence numbers). node_rdkafka/install.sh builds the client
(`make test` runs it); when it could not, the test skips with the reason it recorded.

node-rdkafka hands header values to librdkafka as strings: a Buffer becomes its UTF-8 decoding,
cut at the first NUL byte, and null becomes "null". So what it produces carries text header
values; what another client produced is read back with binary header values intact, a null one
as an empty Buffer. It does not expose the timestamp type; the venv's read checks CreateTime.
"""

from __future__ import annotations

import base64
import ctypes
import json
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conformance.conftest import GROUP_OVERRIDES
from tests.conformance.support import (
    ScenarioRun,
    assert_exactly_once,
    assert_idempotent_scenario,
    committed_offsets,
    module_broker,
)
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    CODECS,
    Rec,
    assert_roundtrip,
    assert_stored_as_sent,
    confluent_consume,
    confluent_produce,
    create_topic,
    disk_batches,
    sample_records,
    unique_topic,
)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent / "node_rdkafka"
ADDON = HERE / "node_modules" / "node-rdkafka" / "build" / "Release" / "node-librdkafka.node"
UNAVAILABLE = ROOT / ".cache" / "node_rdkafka" / "unavailable"
INSTALL = "run tests/conformance/node_rdkafka/install.sh (`make test` does)"

IDEMPOTENT_PARTITIONS, IDEMPOTENT_PER_PARTITION = 4, 200
RESUME_PARTITIONS, RESUME_PER_PARTITION = 3, 40
GROUP_PARTITIONS, GROUP_PER_PARTITION = 4, 50
ASSIGNORS = ["range", "cooperative-sticky"]
ASSIGN, REVOKE = -175, -174  # librdkafka's ERR__ASSIGN_PARTITIONS, ERR__REVOKE_PARTITIONS


def _token(b: bytes | None) -> str:
    """The program's byte encoding: "-" is null, "=" + base64 is bytes (empty included)."""
    return "-" if b is None else "=" + base64.b64encode(b).decode()


def _bytes(token: str) -> bytes | None:
    return None if token == "-" else base64.b64decode(token[1:])


def _text_header(value: bytes | None) -> bytes:
    """A header value node-rdkafka can produce as it is: UTF-8 without NUL, else its hex."""
    if value is not None and b"\0" not in value:
        try:
            value.decode()
            return value
        except UnicodeDecodeError:
            pass
    return (value or b"").hex().encode()


def _producible(records: list[Rec]) -> list[Rec]:
    return [replace(r, headers=tuple((k, _text_header(v)) for k, v in r.headers))
            for r in records]


def _row_rec(row: list) -> tuple[int, Rec]:
    offset, ts, key, value, headers = row
    return offset, Rec(_bytes(key), _bytes(value),
                       tuple((k, _bytes(v)) for k, v in headers), ts)


def _assert_read_back(rows: list[list], sent: list[Rec]) -> None:
    """Offsets 0.., keys, values, headers and timestamps, record by record."""
    got = [_row_rec(row) for row in rows]
    assert len(got) == len(sent), f"read {len(got)} records, sent {len(sent)}"
    for i, ((offset, rec), want) in enumerate(zip(got, sent, strict=True)):
        assert (offset, rec) == (i, want), f"record {i}: read {offset}, {rec!r:.300}"


def _system_librdkafka() -> str:
    """The version of the librdkafka.so.1 the dynamic linker finds, asked directly."""
    lib = ctypes.CDLL("librdkafka.so.1")
    lib.rd_kafka_version_str.restype = ctypes.c_char_p
    return lib.rd_kafka_version_str().decode()


def _node() -> str:
    """node, when the client is built; otherwise a skip with the reason install.sh recorded
    (also raised as a warning, so that a plain `pytest -q` shows it)."""
    node = shutil.which("node")
    if node is not None and ADDON.exists():
        return node
    if UNAVAILABLE.exists():
        reason = f"node-rdkafka unavailable: {UNAVAILABLE.read_text().strip()}"
    elif node is None:
        reason = f"node is not on PATH: {INSTALL}"
    else:
        reason = f"node-rdkafka is not built ({ADDON} missing): {INSTALL}"
    warnings.warn(reason, stacklevel=2)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    _node()
    yield from module_broker(tmp_path_factory.mktemp("node-rdkafka-broker"), GROUP_OVERRIDES)


@pytest.fixture(scope="module")
def run(node_broker: BrokerProcess, tmp_path_factory) -> ScenarioRun:
    """Every scenario in one node process, in the plan's order; each test reads its part."""
    node = _node()
    work = tmp_path_factory.mktemp("node-rdkafka-plan")
    sent = {codec: _producible(sample_records(40, seed=i, both_null=True))
            for i, codec in enumerate(CODECS)}
    plan: dict = {"roundtrip": [
        {"codec": codec, "topic": unique_topic(f"nrd-{codec}"), "records": [
            [r.timestamp, _token(r.key), _token(r.value),
             [[_token(k.encode()), _token(v)] for k, v in r.headers]] for r in sent[codec]]}
        for codec in CODECS]}
    # Produced here by the venv's confluent-kafka, binary and null header values included.
    sent["read"] = sample_records(40, seed=99, both_null=True)
    plan["read"] = {"topic": unique_topic("nrd-read"), "count": len(sent["read"])}
    create_topic(node_broker.bootstrap, plan["read"]["topic"])
    confluent_produce(node_broker.bootstrap, plan["read"]["topic"], sent["read"],
                      compression="lz4")
    plan["idempotent"] = {"topic": unique_topic("nrd-idem"), "partitions": IDEMPOTENT_PARTITIONS,
                          "perPartition": IDEMPOTENT_PER_PARTITION}
    topic = unique_topic("nrd-resume")
    plan["resume"] = {"topic": topic, "group": f"{topic}-g", "partitions": RESUME_PARTITIONS,
                      "perPartition": RESUME_PER_PARTITION}
    plan["groups"] = []
    for assignor in ASSIGNORS:
        topic = unique_topic(f"nrd-group-{assignor}")
        plan["groups"].append({"topic": topic, "group": f"{topic}-g", "assignor": assignor,
                               "partitions": GROUP_PARTITIONS,
                               "perPartition": GROUP_PER_PARTITION, "members": 2})
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan))
    try:
        proc = subprocess.run([node, "conformance.js", node_broker.bootstrap, str(plan_path)],
                              cwd=HERE, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"conformance.js timed out; stderr:\n{e.stderr}") from None
    assert proc.returncode == 0, (
        f"conformance.js exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return ScenarioRun(node_broker, summary, plan, sent, proc.stderr)


def test_client_version(run: ScenarioRun) -> None:
    """The pinned node-rdkafka, running on the system's librdkafka with every codec."""
    lock = json.loads((HERE / "package-lock.json").read_text())
    assert run.summary["version"].removeprefix("v") == (
        lock["packages"]["node_modules/node-rdkafka"]["version"])
    assert run.summary["librdkafka"] == _system_librdkafka()
    assert {"gzip", "snappy", "lz4", "zstd"} <= set(run.summary["features"])


@pytest.mark.parametrize("codec", CODECS)
def test_roundtrip_every_codec(run: ScenarioRun, codec: str) -> None:
    """Keys and values (binary, empty, null), headers (duplicate, empty, non-ASCII) and
    CreateTime timestamps come back byte for byte, to node-rdkafka and to the venv's
    confluent-kafka alike; the broker stores the batches with the producer's codec."""
    result, sent = run[f"roundtrip:{codec}"], run.sent[codec]
    topic = run.plan["roundtrip"][CODECS.index(codec)]["topic"]
    assert result["errors"] == []
    assert result["acked"] == [{"partition": 0, "offset": i} for i in range(len(sent))]
    _assert_read_back(result["records"], sent)
    assert_roundtrip(confluent_consume(run.broker.bootstrap, topic, len(sent)), sent)
    batches = disk_batches(run.broker.data_dir / "logs", topic)
    assert sum(b.record_count for b in batches) == len(sent)
    assert_stored_as_sent(batches, codec)


def test_read_binary_headers(run: ScenarioRun) -> None:
    """What another client produced (lz4) reads back byte for byte, binary header values
    included; a null header value comes back as an empty Buffer."""
    result = run["read"]
    assert result["errors"] == []
    want = [replace(r, headers=tuple((k, b"" if v is None else v) for k, v in r.headers))
            for r in run.sent["read"]]
    _assert_read_back(result["records"], want)


def test_idempotent_producer(run: ScenarioRun) -> None:
    """enable.idempotence, five requests in flight, small batches over four partitions: every
    record acknowledged once at a dense offset, in send order, and stored once."""
    assert_idempotent_scenario(run, IDEMPOTENT_PARTITIONS, IDEMPOTENT_PER_PARTITION)


def _numbered(partitions: int, per_partition: int) -> dict[tuple[int, int], str]:
    return {(p, o): f"{p}:{o}" for p in range(partitions) for o in range(per_partition)}


def test_group_commit_and_resume(run: ScenarioRun) -> None:
    """A member processes the first half of every partition, committing each record
    (commitMessageSync), and leaves; a new member of the group, with auto.offset.reset=error,
    resumes exactly at the committed offsets: every record processed once."""
    result, spec = run["resume"], run.plan["resume"]
    half, per = RESUME_PER_PARTITION // 2, RESUME_PER_PARTITION
    assert result["errors"] == {"first": [], "second": []}, result["errors"]
    assert result["commitErrors"] == []
    everything = {str(p): per for p in range(RESUME_PARTITIONS)}
    assert result["committedByFirst"] == {str(p): half for p in range(RESUME_PARTITIONS)}
    assert result["committedAtEnd"] == everything
    rows = [tuple(r) for r in result["rows"]]
    assert_exactly_once(rows, _numbered(RESUME_PARTITIONS, per))
    assert sorted((p, o) for m, p, o, _v in rows if m == "second") == sorted(
        (p, o) for p in range(RESUME_PARTITIONS) for o in range(half, per))
    assert committed_offsets(run.broker.bootstrap, spec["group"], spec["topic"],
                      RESUME_PARTITIONS) == everything


@pytest.mark.parametrize("assignor", ASSIGNORS)
def test_group_of_two_shares_partitions(run: ScenarioRun, assignor: str) -> None:
    """A member takes every partition; a second one joins and the group splits them 2+2 (an
    eager rebalance with range, an incremental one with cooperative-sticky, where the first
    member keeps what it still owns); each member consumes only its own partitions, every
    record is processed once, and the group's offsets end at the end."""
    result = run[f"group:{assignor}"]
    spec = run.plan["groups"][ASSIGNORS.index(assignor)]
    assert result["errors"] == {"member-0": [], "member-1": []}, result["errors"]
    assert result["commitErrors"] == []
    assert result["protocol"] == ["COOPERATIVE" if assignor == "cooperative-sticky" else "EAGER"
                                  ] * 2
    alone, shared = result["assignments"]
    assert alone == [list(range(GROUP_PARTITIONS))]
    assert sorted(len(a) for a in shared) == [2, 2], shared
    assert sorted(sum(shared, [])) == list(range(GROUP_PARTITIONS)), shared
    # member-0's rebalance callbacks (assign -175, revoke -174); the last one revokes what it
    # owned when it closed.
    *history, last = result["rebalances"]["member-0"]
    assert history[0] == [ASSIGN, list(range(GROUP_PARTITIONS))] and last == [REVOKE, shared[0]]
    revoked = {p for code, ps in history if code == REVOKE for p in ps}
    if assignor == "cooperative-sticky":  # only what moved to member-1 was revoked
        assert revoked == set(shared[1]), history
    else:
        assert [REVOKE, list(range(GROUP_PARTITIONS))] in history, history
    assert result["finalAssignment"] == shared, "the group rebalanced while consuming"
    rows = [tuple(r) for r in result["rows"]]
    assert_exactly_once(rows, _numbered(GROUP_PARTITIONS, GROUP_PER_PARTITION))
    for i, owned in enumerate(shared):
        mine = {p for m, p, _o, _v in rows if m == f"member-{i}"}
        assert mine == set(owned), f"member-{i} consumed {mine}, was assigned {owned}"
    everything = {str(p): GROUP_PER_PARTITION for p in range(GROUP_PARTITIONS)}
    assert result["committed"] == everything
    assert committed_offsets(run.broker.bootstrap, spec["group"], spec["topic"],
                      GROUP_PARTITIONS) == everything
