"""Debian 12's own Kafka client stack: librdkafka 2.0.2 (librdkafka1) through
python3-confluent-kafka 1.7.0, run by Debian's /usr/bin/python3 rather than the venv (whose
confluent-kafka wheel bundles a much newer librdkafka): a round trip per codec read back byte
for byte, the idempotent producer, and a group member resuming exactly after another's commits.

debian_librdkafka/conformance.py drives the client and prints what it saw in one JSON line; the
assertions are all here, and what the broker stored is checked independently (the venv's
confluent-kafka reads the records and the group's offsets back; the batches on disk carry the
producer's codec and its idempotent sequence numbers). debian_librdkafka/install.sh installs the
packages (`make test` runs it); when it could not, the test skips with the reason it recorded.

Records carry no null header value: python3-confluent-kafka 1.7.0 hands it to Python without
taking a reference to None, and the interpreter aborts ("deallocating None") at exit
(confluent-kafka-python issue 1191, fixed in 1.8.2). A NUL byte stands in for it.
"""

from __future__ import annotations

import base64
import json
import subprocess
import warnings
from collections.abc import Iterator
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
    Got,
    Rec,
    assert_roundtrip,
    assert_stored_as_sent,
    confluent_consume,
    disk_batches,
    sample_records,
    unique_topic,
)

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).parent / "debian_librdkafka" / "conformance.py"
UNAVAILABLE = ROOT / ".cache" / "debian_librdkafka" / "unavailable"
PYTHON = "/usr/bin/python3"
INSTALL = "run tests/conformance/debian_librdkafka/install.sh (`make test` does)"
DEBIAN_MODULES = "/usr/lib/python3/dist-packages/"

IDEMPOTENT_PARTITIONS, IDEMPOTENT_PER_PARTITION = 4, 200
RESUME_PARTITIONS, RESUME_PER_PARTITION = 3, 40


def _token(b: bytes | None) -> str:
    """The program's byte encoding: "-" is null, "=" + base64 is bytes (empty included)."""
    return "-" if b is None else "=" + base64.b64encode(b).decode()


def _bytes(token: str) -> bytes | None:
    return None if token == "-" else base64.b64decode(token[1:])


def _got(row: list) -> Got:
    offset, ts_type, ts, key, value, headers = row
    return Got(offset, Rec(_bytes(key), _bytes(value),
                           tuple((k, _bytes(v)) for k, v in headers), ts), ts_type)


def _require() -> None:
    """Debian's binding importable by Debian's python, or a skip with the reason install.sh
    recorded (also raised as a warning, so that a plain `pytest -q` shows it)."""
    probe = None
    if Path(PYTHON).exists():
        probe = subprocess.run(
            [PYTHON, "-I", "-c", "import confluent_kafka; print(confluent_kafka.__file__)"],
            capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and probe.stdout.startswith(DEBIAN_MODULES):
            return
    if UNAVAILABLE.exists():
        reason = f"Debian's confluent-kafka unavailable: {UNAVAILABLE.read_text().strip()}"
    elif probe is None:
        reason = f"{PYTHON} does not exist: {INSTALL}"
    else:
        found = probe.stdout.strip() or probe.stderr.strip().splitlines()[-1:]
        reason = f"{PYTHON} has no Debian confluent_kafka ({found}): {INSTALL}"
    warnings.warn(reason, stacklevel=2)
    pytest.skip(reason)


def _debian_version(package: str) -> str:
    """The upstream version of an installed Debian package (2.0.2-1 -> 2.0.2)."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return out.rsplit("-", 1)[0]


@pytest.fixture(scope="module")
def debian_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    _require()
    yield from module_broker(tmp_path_factory.mktemp("debian-broker"), GROUP_OVERRIDES)


@pytest.fixture(scope="module")
def run(debian_broker: BrokerProcess, tmp_path_factory) -> ScenarioRun:
    """Every scenario in one Debian python process; each test then reads its part."""
    sent = {codec: sample_records(40, seed=i, both_null=True, null_header=False)
            for i, codec in enumerate(CODECS)}
    plan: dict = {"roundtrip": [
        {"codec": codec, "topic": unique_topic(f"deb-{codec}"), "records": [
            [r.timestamp, _token(r.key), _token(r.value),
             [[k, _token(v)] for k, v in r.headers]] for r in sent[codec]]}
        for codec in CODECS]}
    plan["idempotent"] = {"topic": unique_topic("deb-idem"), "partitions": IDEMPOTENT_PARTITIONS,
                          "per_partition": IDEMPOTENT_PER_PARTITION}
    topic = unique_topic("deb-resume")
    plan["resume"] = {"topic": topic, "group": f"{topic}-g", "partitions": RESUME_PARTITIONS,
                      "per_partition": RESUME_PER_PARTITION}
    plan_path = tmp_path_factory.mktemp("debian-plan") / "plan.json"
    plan_path.write_text(json.dumps(plan))
    try:
        proc = subprocess.run([PYTHON, "-I", str(PROGRAM), debian_broker.bootstrap,
                               str(plan_path)], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"conformance.py timed out; stderr:\n{e.stderr}") from None
    assert proc.returncode == 0, (
        f"conformance.py exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return ScenarioRun(debian_broker, summary, plan, sent, proc.stderr)


def test_debian_client(run: ScenarioRun) -> None:
    """Debian's packages, not the venv's wheel: the versions dpkg reports, loaded by
    /usr/bin/python3 from Debian's module directory."""
    assert run.summary["python"] == PYTHON
    assert run.summary["module"].startswith(DEBIAN_MODULES), run.summary["module"]
    assert run.summary["version"] == _debian_version("python3-confluent-kafka")
    assert run.summary["librdkafka"] == _debian_version("librdkafka1")


@pytest.mark.parametrize("codec", CODECS)
def test_roundtrip_every_codec(run: ScenarioRun, codec: str) -> None:
    """Keys and values (binary, empty, null, both null), headers (binary, duplicate, empty,
    non-ASCII) and CreateTime timestamps come back byte for byte, to Debian's client and to the
    venv's alike; the broker stores the batches with the producer's codec."""
    result, sent = run[f"roundtrip:{codec}"], run.sent[codec]
    topic = run.plan["roundtrip"][CODECS.index(codec)]["topic"]
    assert result["errors"] == []
    assert result["acked"] == [[0, i] for i in range(len(sent))]
    assert_roundtrip([_got(row) for row in result["records"]], sent)
    assert_roundtrip(confluent_consume(run.broker.bootstrap, topic, len(sent)), sent)
    batches = disk_batches(run.broker.data_dir / "logs", topic)
    assert sum(b.record_count for b in batches) == len(sent)
    assert_stored_as_sent(batches, codec)


def test_idempotent_producer(run: ScenarioRun) -> None:
    """enable.idempotence, five requests in flight, small batches over four partitions: every
    record acknowledged once at a dense offset, in send order, and stored once."""
    assert_idempotent_scenario(run, IDEMPOTENT_PARTITIONS, IDEMPOTENT_PER_PARTITION)


def test_group_commit_and_resume(run: ScenarioRun) -> None:
    """A member processes the first half of every partition, committing each record
    synchronously, and leaves; a new member of the group, with auto.offset.reset=error, resumes
    exactly at the committed offsets: every record processed once."""
    result, spec = run["resume"], run.plan["resume"]
    half, per = RESUME_PER_PARTITION // 2, RESUME_PER_PARTITION
    assert result["errors"] == []
    assert result["commitErrors"] == []
    everything = {str(p): per for p in range(RESUME_PARTITIONS)}
    assert result["committedByFirst"] == {str(p): half for p in range(RESUME_PARTITIONS)}
    assert result["committedAtEnd"] == everything
    rows = [tuple(r) for r in result["rows"]]
    expected = {(p, o): f"{p}:{o}" for p in range(RESUME_PARTITIONS) for o in range(per)}
    assert_exactly_once(rows, expected)
    assert sorted((p, o) for m, p, o, _v in rows if m == "second") == sorted(
        (p, o) for p in range(RESUME_PARTITIONS) for o in range(half, per))
    assert committed_offsets(run.broker.bootstrap, spec["group"], spec["topic"],
                      RESUME_PARTITIONS) == everything
