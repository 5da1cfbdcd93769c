"""kcat (librdkafka's command-line client) against the broker: metadata listing and lines
produced with -P read back exactly with -C -e."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    CODECS,
    assert_stored_as_sent,
    create_topic,
    disk_batches,
    unique_topic,
    watermarks,
)

KCAT = shutil.which("kcat") or shutil.which("kafkacat")

pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat not on PATH (make test installs it)")


def kcat(*args: str, stdin: str | None = None, timeout: float = 30) -> str:
    proc = subprocess.run(
        [KCAT or "kcat", *args], input=stdin, capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, f"kcat {args} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


def test_kcat_lists_broker_and_topics(broker: BrokerProcess) -> None:
    topics = {unique_topic("kcat-one"): 1, unique_topic("kcat-three"): 3}
    for name, partitions in topics.items():
        create_topic(broker.bootstrap, name, partitions)

    text = kcat("-L", "-b", broker.bootstrap)
    assert "1 brokers:" in text, text
    assert f"at 127.0.0.1:{broker.port}" in text, text
    for name, partitions in topics.items():
        assert f'topic "{name}" with {partitions} partitions:' in text, text

    meta = json.loads(kcat("-L", "-J", "-b", broker.bootstrap))
    assert [b["name"] for b in meta["brokers"]] == [f"127.0.0.1:{broker.port}"]
    listed = {t["topic"]: t for t in meta["topics"]}
    for name, partitions in topics.items():
        t = listed[name]
        assert "error" not in t, t
        assert sorted(p["partition"] for p in t["partitions"]) == list(range(partitions))
        for p in t["partitions"]:
            assert p["leader"] == meta["brokers"][0]["id"]
            assert "error" not in p, p


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_produce_consume_lines(broker: BrokerProcess, codec: str) -> None:
    topic = unique_topic(f"kcat-lines-{codec}")  # not created: -P relies on auto-creation
    lines = [f"line {i}: {'∑ünïcødé ' * (i % 4)}tab\there {i * 7919}" for i in range(200)]
    keyed = [f"key{i % 13}#{line}" for i, line in enumerate(lines)]

    kcat("-P", "-b", broker.bootstrap, "-t", topic, "-p", "0", "-K", "#", "-z", codec,
         stdin="\n".join(keyed) + "\n")
    assert watermarks(broker.bootstrap, topic) == (0, len(lines))
    batches = disk_batches(broker.data_dir / "logs", topic)
    assert_stored_as_sent(batches, codec)

    out = kcat("-C", "-b", broker.bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e",
               "-q", "-f", "%o|%k|%s\n")
    expected = [f"{i}|key{i % 13}|{line}" for i, line in enumerate(lines)]
    assert out.splitlines() == expected

    # The plain form, exactly as a user would type it.
    plain = kcat("-C", "-b", broker.bootstrap, "-t", topic, "-e", "-q")
    assert plain.splitlines() == lines
