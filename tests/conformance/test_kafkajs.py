"""kafkajs (npm, pinned by tests/conformance/kafkajs/package-lock.json): an idempotent producer
and a consumer group of two that commits each message, driven by kafkajs/roundtrip.js; and
transactions (commit, abort, read_committed, sendOffsets, fencing), driven by
kafkajs/transactions.js.

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
from tests.support.clients import unique_topic

HERE = Path(__file__).parent / "kafkajs"
N = 300


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
