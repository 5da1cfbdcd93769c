"""What a started broker imports: none of kafka-python's client, no compression library before
a compressed batch, no Prometheus exposition before a scrape (protocol/deferred_imports.py).

Each scenario runs in a fresh interpreter state: this process has long since imported what the
tests themselves use. One child interpreter serves them all: it forks each scenario from the
state the broker's entry point starts in (deferred imports installed, then ``broker.server``,
which every installed scenario imports first), so the broker is imported twice per run, not once
per scenario; the embedding scenario is forked before anything is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

# Code a broker never runs at start, and why it is absent.
NOT_AT_START = (
    "kafka.admin", "kafka.net", "kafka.consumer", "kafka.coordinator", "kafka.producer",
    "kafka.cluster",  # kafka-python's clients, loaded by its package __init__
    "cramjam", "snappy", "zstandard",  # compression libraries: at the first compressed batch
    "prometheus_client.exposition", "http.server", "urllib.request", "wsgiref",  # first scrape
    "importlib.metadata",  # version strings: at --version and the first scrape
    "hashlib", "hmac", "secrets",  # SCRAM, SASL/PLAIN and the cleaner's long keys
    "decimal",  # a config double printed in E notation
    "pyspark",
)

_PRELUDE = """
import json, sys
from protocol.deferred_imports import install, is_deferred

install()  # first, as the broker's entry point (broker/__main__.py) does

def ran() -> list[str]:
    return sorted(name for name in list(sys.modules) if not is_deferred(name))
"""

# The child: scenarios (name, code, installed) as JSON on stdin, each one's stdout (or its
# traceback) into <out dir>/<name>.out. Scenarios run one at a time, each in its own fork.
_FORKER = """
import json, os, sys, traceback

out_dir = sys.argv[1]
scenarios = json.load(sys.stdin)

def run(name: str, code: str, env: dict) -> None:
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    status = 0
    with open(os.path.join(out_dir, name + ".out"), "w") as out:
        sys.stdout = out
        try:
            exec(compile(code, name, "exec"), env)
        except BaseException:
            traceback.print_exc(file=out)
            status = 1
        out.flush()
    os._exit(status)

for name, code, installed in scenarios:
    if not installed:
        run(name, code, {"__name__": "__main__"})
prelude: dict = {"__name__": "__main__"}
exec(compile(PRELUDE, "prelude", "exec"), prelude)
import broker.server
for name, code, installed in scenarios:
    if installed:
        run(name, code, dict(prelude))
"""

SCENARIOS_TIMEOUT_S = 240  # four scenarios of at most 60 s each


def _scenarios(logs: Path) -> list[tuple[str, str, bool]]:
    """(name, code, runs after install()) of every scenario; each prints one JSON line last."""
    return [
        ("started_broker", _STARTED_BROKER.replace("LOGS", repr(str(logs))), True),
        ("compressed_batch", _COMPRESSED_BATCH, True),
        ("embedding_process", _EMBEDDING_PROCESS, False),
        ("deferred_package", _DEFERRED_PACKAGE, True),
    ]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every scenario's stdout by name, from one child interpreter."""
    tmp = tmp_path_factory.mktemp("start-imports")
    scenarios = [(n, textwrap.dedent(c), i) for n, c, i in _scenarios(tmp / "logs")]
    forker = _FORKER.replace("PRELUDE", repr(_PRELUDE))
    subprocess.run([sys.executable, "-c", forker, str(tmp)], input=json.dumps(scenarios),
                   check=True, capture_output=True, text=True, timeout=SCENARIOS_TIMEOUT_S)
    return {n: (tmp / f"{n}.out").read_text() if (tmp / f"{n}.out").exists() else ""
            for n, _, _ in scenarios}


def _result(outputs: dict[str, str], name: str) -> Any:
    """The last line a scenario printed, as JSON; its traceback if it failed."""
    lines = outputs[name].strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        raise AssertionError(f"scenario {name} printed no result:\n{outputs[name]}") from None


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in NOT_AT_START)]


_STARTED_BROKER = """
    import asyncio
    import broker.cli
    import uvloop
    from broker.config import BrokerConfig
    from broker.server import Broker

    async def main() -> list[str]:
        broker = Broker(BrokerConfig.from_dict({
            "log.dirs": LOGS,
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "metrics.listener": "http://127.0.0.1:0/metrics"}))
        await broker.start()
        try:
            await asyncio.sleep(0.2)
            return ran()
        finally:
            await broker.stop()

    print(json.dumps({"ran": uvloop.run(main())}))
"""


def test_a_started_broker_runs_no_client_codec_or_exposition_code(outputs: dict[str, str]) -> None:
    out = _result(outputs, "started_broker")
    assert "broker.server" in out["ran"] and "kafka.protocol.consumer.fetch" in out["ran"]
    assert _heavy(out["ran"]) == []


_COMPRESSED_BATCH = """
    import broker.server
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    from broker.log.cleaner import _decompress
    from broker.log.validator import codec_available, compress

    before = {m: is_deferred(m) for m in ("snappy", "zstandard")}
    available = [codec_available(c) for c in ("gzip", "snappy", "lz4", "zstd")]
    data = b"a record value " * 200
    rounds = {}
    for codec in (1, 2, 3, 4):  # gzip, snappy, lz4, zstd
        builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 2**20)
        for i in range(3):
            builder.append(i, timestamp=1000 + i, key=b"k%d" % i, value=data, headers=[])
        batch = DefaultRecordBatch(bytes(builder.build()))
        values = [r.value for r in batch]
        rounds[codec] = [batch.compression_type, values == [data] * 3,
                         _decompress(codec, compress(codec, data)) == data]
    after = {m: is_deferred(m) for m in ("snappy", "zstandard")}
    print(json.dumps({"before": before, "available": available, "rounds": rounds,
                      "after": after, "heavy": [m for m in ran() if m == "cramjam"]}))
"""


def test_a_compressed_batch_loads_its_codec_on_first_use(outputs: dict[str, str]) -> None:
    out = _result(outputs, "compressed_batch")
    assert out["before"] == {"snappy": True, "zstandard": True}
    assert out["available"] == [True, True, True, True]
    assert out["rounds"] == {str(c): [c, True, True] for c in (1, 2, 3, 4)}
    assert out["after"] == {"snappy": False, "zstandard": False}
    assert out["heavy"] == ["cramjam"]


_EMBEDDING_PROCESS = """
    import json, sys
    import broker.testing.pytest_plugin, broker.testing, broker.server
    from protocol.deferred_imports import DEFERRED, is_deferred
    print(json.dumps([name for name in DEFERRED if is_deferred(name)]))
"""


def test_an_embedding_process_keeps_its_own_modules(outputs: dict[str, str]) -> None:
    """Importing the broker, its test fixture or its pytest plugin registers no stand-in
    modules: only the broker's own process (its entry point) defers its imports."""
    assert _result(outputs, "embedding_process") == []


_DEFERRED_PACKAGE = """
    import broker.server
    import kafka
    import prometheus_client

    deferred = [is_deferred("kafka"), is_deferred("prometheus_client")]
    from kafka import KafkaProducer
    from kafka.producer.kafka import KafkaProducer as Direct
    print(json.dumps({
        "deferred": deferred,
        "same_class": KafkaProducer is Direct,
        "version": kafka.__version__ == __import__("kafka.version").version.__version__,
        "registry": type(prometheus_client.REGISTRY).__name__,
        "after": [is_deferred("kafka"), is_deferred("prometheus_client")],
        "missing": not hasattr(kafka, "NoSuchName"),
    }))
"""


def test_a_deferred_package_runs_its_init_at_the_first_other_name(outputs: dict[str, str]) -> None:
    out = _result(outputs, "deferred_package")
    assert out == {"deferred": [True, True], "same_class": True, "version": True,
                   "registry": "CollectorRegistry", "after": [False, False], "missing": True}
