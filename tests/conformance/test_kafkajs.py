"""kafkajs (npm, pinned by tests/conformance/kafkajs/package-lock.json): an idempotent producer
and a consumer group of two that commits each message, driven by kafkajs/roundtrip.js.

`make test` installs kafkajs (`npm ci`, the Makefile's node-deps target); without it this test
fails rather than skips, so a broken install cannot pass unnoticed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

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
