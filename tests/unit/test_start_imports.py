"""What a started broker imports: none of kafka-python's client, no compression library before
a compressed batch, no Prometheus exposition before a scrape (protocol/deferred_imports.py).

Each test runs in a fresh interpreter: this process has long since imported what the tests
themselves use.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

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


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)],
                         check=True, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in NOT_AT_START)]


def test_a_started_broker_runs_no_client_codec_or_exposition_code(tmp_path) -> None:
    out = _run(f"""
        import asyncio
        import broker.cli
        import uvloop
        from broker.config import BrokerConfig
        from broker.server import Broker

        async def main() -> list[str]:
            broker = Broker(BrokerConfig.from_dict({{
                "log.dirs": {str(tmp_path / "logs")!r},
                "listeners": "PLAINTEXT://127.0.0.1:0",
                "metrics.listener": "http://127.0.0.1:0/metrics"}}))
            await broker.start()
            try:
                await asyncio.sleep(0.2)
                return ran()
            finally:
                await broker.stop()

        print(json.dumps({{"ran": uvloop.run(main())}}))
    """)
    assert "broker.server" in out["ran"] and "kafka.protocol.consumer.fetch" in out["ran"]
    assert _heavy(out["ran"]) == []


def test_a_compressed_batch_loads_its_codec_on_first_use() -> None:
    out = _run("""
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
    """)
    assert out["before"] == {"snappy": True, "zstandard": True}
    assert out["available"] == [True, True, True, True]
    assert out["rounds"] == {str(c): [c, True, True] for c in (1, 2, 3, 4)}
    assert out["after"] == {"snappy": False, "zstandard": False}
    assert out["heavy"] == ["cramjam"]


def test_an_embedding_process_keeps_its_own_modules() -> None:
    """Importing the broker, its test fixture or its pytest plugin registers no stand-in
    modules: only the broker's own process (its entry point) defers its imports."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys
        import broker.testing.pytest_plugin, broker.testing, broker.server
        from protocol.deferred_imports import DEFERRED, is_deferred
        print(json.dumps([name for name in DEFERRED if is_deferred(name)]))
    """)], check=True, capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_deferred_package_runs_its_init_at_the_first_other_name() -> None:
    out = _run("""
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
    """)
    assert out == {"deferred": [True, True], "same_class": True, "version": True,
                   "registry": "CollectorRegistry", "after": [False, False], "missing": True}
