"""kafkajs (npm, pinned by tests/conformance/kafkajs/package-lock.json): an idempotent producer
and a consumer group of two that commits each message, driven by kafkajs/roundtrip.js; and
transactions (commit, abort, read_committed, sendOffsets, fencing), driven by
kafkajs/transactions.js; and awkward records through kafkajs' built-in codecs (none, gzip),
driven by kafkajs/codecs.js, read back by kafkajs and by confluent-kafka.

`make test` installs kafkajs (`npm ci`, the Makefile's node-deps target); without it this test
fails rather than skips, so a broken install cannot pass unnoticed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conformance.conftest import GROUP_OVERRIDES
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    CODEC_ID,
    CREATE_TIME,
    Got,
    Rec,
    assert_roundtrip,
    confluent_consume,
    create_topic,
    disk_batches,
    sample_records,
    unique_topic,
)

HERE = Path(__file__).parent / "kafkajs"
N = 300
# The codecs kafkajs ships; snappy, lz4 and zstd need third-party codec packages.
KAFKAJS_CODECS = ["none", "gzip"]
CODEC_RECORDS = 30


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: install Node.js (>= 14) and run `make test`")
    if not (HERE / "node_modules" / "kafkajs" / "package.json").exists():
        pytest.fail(f"kafkajs is not installed in {HERE}/node_modules: run `make test` "
                    "(its node-deps target runs `npm ci --prefix tests/conformance/kafkajs`)")
    return node


def test_kafkajs_roundtrip(group_broker: BrokerProcess) -> None:
    node = _node()
    topic = unique_topic("kjs")
    try:
        proc = subprocess.run([node, "roundtrip.js", group_broker.bootstrap, topic, str(N)],
                              cwd=HERE, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"roundtrip.js timed out; stderr:\n{e.stderr}") from None
    assert proc.returncode == 0, f"roundtrip.js exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])

    pinned = json.loads((HERE / "package.json").read_text())["dependencies"]["kafkajs"]
    assert summary["kafkajs"] == pinned
    assert summary["produced"] == N
    assert summary["missing"] == 0, summary
    assert summary["duplicates"] == 0 and summary["consumed"] == N, summary
    assert summary["unique"] == N
    assert summary["membersWhenStable"] == 2, summary
    assert len(summary["perMember"]) == 2, f"both members must consume: {summary['perMember']}"
    assert summary["commitErrors"] == [], summary["commitErrors"]
    assert summary["committed"] == summary["highWatermarks"], summary
    assert sum(summary["highWatermarks"].values()) == N
    assert summary["groupStateAfterDisconnect"] == "Empty", summary


def test_kafkajs_transactions(broker_factory) -> None:
    """kafkajs/transactions.js: producer.transaction() committed, aborted and committed; a
    read_committed group (kafkajs' default) never reads the aborted records and a
    readUncommitted one does; sendOffsets commits the group's offset with the transaction, only
    at commit, and an aborted transaction leaves it where it was; a zombie sharing the
    transactional id of a newer producer is fenced."""
    node = _node()
    broker = broker_factory({**GROUP_OVERRIDES, "transaction.state.log.num.partitions": "3"})
    prefix = unique_topic("kjs-txn")
    try:
        proc = subprocess.run([node, "transactions.js", broker.bootstrap, prefix], cwd=HERE,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"transactions.js timed out; stderr:\n{e.stderr}") from None
    assert proc.returncode == 0, (
        f"transactions.js exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])

    def five(name: str) -> list[str]:
        return [f"{name}-{i}" for i in range(5)]

    committed = [v for _o, v in summary["readCommitted"]]
    assert committed == five("first") + five("last"), summary["readCommitted"]
    uncommitted = [v for _o, v in summary["readUncommitted"]]
    assert uncommitted == five("first") + five("aborted") + five("last"), uncommitted
    # 15 records and 3 markers; the aborted ones sit between the first two markers
    assert [o for o, _v in summary["readUncommitted"]] == [
        *range(0, 5), *range(6, 11), *range(12, 17)]
    assert summary["highWatermark"] == 18

    offsets = summary["offsets"]
    assert (offsets["commitConsumed"], offsets["abortConsumed"]) == (5, 8), offsets
    assert offsets["commitBefore"] == {"0": -1}, offsets
    assert offsets["commitAfter"] == {"0": 5}, offsets
    assert offsets["abortBefore"] == {"0": 5} and offsets["abortAfter"] == {"0": 5}, offsets
    output = [v for _o, v in summary["output"]]
    assert output == [f"IN-{i}" for i in range(5)] + ["END"], output

    # The zombie's commit is refused (EndTxn below v2 answers a fenced producer
    # INVALID_PRODUCER_EPOCH, as Kafka does); its records are never read_committed.
    zombie = summary["zombieCommit"]
    assert zombie["committed"] is False, zombie
    assert zombie["type"] in ("INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED"), zombie
    fenced = [v for _o, v in summary["fencedRead"]]
    assert fenced == [f"successor-{i}" for i in range(3)], fenced


def _header_for_js(value: bytes) -> dict[str, str]:
    """kafkajs takes a header value as a string or a Buffer: text goes as a string."""
    try:
        return {"str": value.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": value.hex()}


def _records_for_js(records: list[Rec]) -> str:
    return json.dumps([
        {"key": None if r.key is None else r.key.hex(),
         "value": None if r.value is None else r.value.hex(),
         "headers": [[k, _header_for_js(v)] for k, v in r.headers if v is not None],
         "timestamp": r.timestamp}
        for r in records
    ])


def _got_from_js(row: dict) -> Got:
    def unhex(h: str | None) -> bytes | None:
        return None if h is None else bytes.fromhex(h)

    headers = tuple((k, unhex(v)) for k, v in row["headers"])
    return Got(row["offset"], Rec(unhex(row["key"]), unhex(row["value"]), headers,
                                  row["timestamp"]), CREATE_TIME)


@pytest.mark.parametrize("codec", KAFKAJS_CODECS)
def test_kafkajs_codecs_roundtrip(group_broker: BrokerProcess, codec: str) -> None:
    """Null, empty and binary keys and values, string and Buffer headers (repeated names and
    non-ASCII too) and explicit CreateTimes, produced by kafkajs with one of its built-in codecs
    in two sends: kafkajs and confluent-kafka read back every byte, and the two batches on disk
    carry kafkajs' codec (never recompressed)."""
    node = _node()
    topic = unique_topic(f"kjs-{codec}")
    create_topic(group_broker.bootstrap, topic)
    sent = sample_records(CODEC_RECORDS, seed=len(topic), both_null=True, null_header=False)
    kinds = {next(iter(_header_for_js(v))) for r in sent for _k, v in r.headers if v is not None}
    assert kinds == {"str", "hex"}, "both kinds of kafkajs header value must be sent"
    try:
        proc = subprocess.run([node, "codecs.js", group_broker.bootstrap, topic, codec],
                              cwd=HERE, input=_records_for_js(sent), capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"codecs.js timed out; stderr:\n{e.stderr}") from None
    assert proc.returncode == 0, f"codecs.js exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    summary = json.loads(proc.stdout.strip().splitlines()[-1])

    half = (CODEC_RECORDS + 1) // 2
    assert summary["baseOffsets"] == [0, half], summary["baseOffsets"]
    assert {row["partition"] for row in summary["consumed"]} == {0}
    by_kafkajs = sorted((_got_from_js(row) for row in summary["consumed"]),
                        key=lambda g: g.offset)
    assert_roundtrip(by_kafkajs, sent)
    assert_roundtrip(confluent_consume(group_broker.bootstrap, topic, len(sent)), sent)

    batches = disk_batches(group_broker.data_dir / "logs", topic)
    assert [(b.magic, b.codec) for b in batches] == [(2, CODEC_ID[codec])] * 2, batches
    assert [(b.base_offset, b.record_count) for b in batches] == [
        (0, half), (half, CODEC_RECORDS - half)], batches
    assert batches[0].first_timestamp == sent[0].timestamp
    assert batches[1].max_timestamp == max(r.timestamp for r in sent[half:])
