"""Prometheus metrics end to end: a real Prometheus scrapes a real broker.

The Prometheus server (Debian package `prometheus`, installed by `make test`) is started by the
test on 127.0.0.1 with an ephemeral port, a temporary config and storage dir, and killed at the
end. After a produce (acks=all, fsync per message: parked in the produce purgatory until the
fsync) and long-poll fetches (one expires, one is completed by that produce), the purgatory and
request series are read back through Prometheus's HTTP API, polling with a deadline.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    Rec,
    confluent_produce,
    create_topic,
    numbered,
    unique_topic,
    wait_until,
)
from tests.support.requests import (
    fetch_request,
    fetch_response,
    fetched_values,
    produce_request,
    produce_response,
    record_batch,
)
from tests.support.wire import Wire

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not on PATH (make test installs it)")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not on PATH (make test installs prometheus)")


def scrape(broker: BrokerProcess, accept: str | None = None) -> str:
    assert broker.metrics_port, "metrics are off"
    req = urllib.request.Request(f"http://127.0.0.1:{broker.metrics_port}/metrics")
    if accept:
        req.add_header("Accept", accept)
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def exported_names(exposition: str) -> set[str]:
    """Every series name the exposition can carry, from its TYPE lines."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "counter":
                names.add(name if name.endswith("_total") else name + "_total")
            if kind == "histogram":
                names.update(f"{name}_{s}" for s in ("bucket", "sum", "count"))
    return names


class Prometheus:
    """A Prometheus server of our own on loopback, scraping one target every second."""

    def __init__(self, workdir: Path, target: str) -> None:
        self.workdir = workdir
        self.target = target
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    def start(self, timeout: float = 30.0) -> Prometheus:
        assert PROMETHEUS is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: minibroker\n"
            f"    static_configs:\n      - targets: ['{self.target}']\n")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([
                PROMETHEUS, f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                "--web.listen-address=127.0.0.1:0", "--storage.tsdb.retention.time=1h",
            ], stdout=log, stderr=log, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # The web server logs the address it actually bound (our port 0 made concrete).
            found = re.search(r'msg="Listening on" address=127\.0\.0\.1:(\d+)',
                              self.log_path.read_text(errors="replace"))
            if found:
                self.port = int(found.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{self.log_path.read_text()}")
            time.sleep(0.1)
        else:
            raise TimeoutError(f"prometheus did not listen:\n{self.log_path.read_text()}")
        wait_until(self._ready, deadline - time.monotonic(), what="prometheus ready")
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def value(self, expr: str) -> float | None:
        """The single value of an instant query, None when it has no result yet."""
        result = self.query(expr)
        return result[0][1] if result else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def prometheus_for(tmp_path: Path):
    started: list[Prometheus] = []

    def start(broker: BrokerProcess) -> Prometheus:
        prom = Prometheus(tmp_path / "prometheus", f"127.0.0.1:{broker.metrics_port}").start()
        started.append(prom)
        return prom

    yield start
    for prom in started:
        prom.stop()


@needs_prometheus
def test_prometheus_scrapes_purgatory_and_request_series(broker_factory, prometheus_for) -> None:
    broker: BrokerProcess = broker_factory({"log.flush.interval.messages": "1"})
    prom = prometheus_for(broker)
    wait_until(lambda: prom.value('up{job="minibroker"}') == 1, 30, what="a first scrape")
    topic = unique_topic("metrics")
    create_topic(broker.bootstrap, topic)
    fetch, producer = Wire(broker.port), Wire(broker.port)
    try:
        # A long poll with no data: parked for 2.5 s (several scrapes see it), then expired.
        started = time.monotonic()
        fetch.send(fetch_request([(topic, 0, 0)], max_wait_ms=2500), 1)
        part = fetch_response(fetch.read_frame()).responses[0].partitions[0]
        assert fetched_values(part.records) == [] and time.monotonic() - started >= 2.5
        # A long poll completed by an event: the produce's fsync moves the high watermark,
        # which also completes the produce itself (acks=all, parked until then).
        fetch.send(fetch_request([(topic, 0, 0)], max_wait_ms=10000), 2)
        assert not fetch.readable(0.3)
        producer.send(produce_request(topic, record_batch([b"metered"]), acks=-1), 3)
        assert produce_response(producer.read_frame()) == (0, 0)
        part = fetch_response(fetch.read_frame()).responses[0].partitions[0]
        assert fetched_values(part.records) == [(0, b"metered")]
    finally:
        fetch.close()
        producer.close()

    expected = {
        'sum(minibroker_requests_total{api="Produce"})': 1,
        'sum(minibroker_requests_total{api="Fetch"})': 2,
        'minibroker_purgatory_completed_operations_total{purgatory="fetch",by="expiration"}': 1,
        'minibroker_purgatory_completed_operations_total{purgatory="fetch",by="event"}': 1,
        'minibroker_purgatory_completed_operations_total{purgatory="produce",by="event"}': 1,
        'minibroker_purgatory_parked_operations_total{purgatory="fetch"}': 2,
        # The gauge itself, as scraped while the first fetch was parked.
        'max_over_time(minibroker_purgatory_delayed_operations{purgatory="fetch"}[5m])': 1,
        'max_over_time(minibroker_purgatory_watched{purgatory="fetch"}[5m])': 1,
        'minibroker_request_remote_time_seconds_sum{api="Fetch"}': 2.5,
        'minibroker_request_total_time_seconds_count{api="Produce"}': 1,
        'minibroker_timer_expiration_lateness_seconds_count': 1,
        'minibroker_log_flush_time_seconds_count': 1,
        f'minibroker_topic_messages_in_total{{topic="{topic}"}}': 1,
        f'minibroker_topic_bytes_out_total{{topic="{topic}"}}': 1,
        f'minibroker_log_high_watermark{{topic="{topic}",partition="0"}}': 1,
    }
    seen: dict[str, float | None] = {}

    def all_there() -> bool:
        for expr in expected:
            seen[expr] = prom.value(expr)
        return all(seen[e] is not None and seen[e] >= v for e, v in expected.items())

    try:
        wait_until(all_there, 30, interval=0.5, what="the series in Prometheus")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {json.dumps(seen, indent=1)}") from None
    # A rate over the scraped counters works as a dashboard would use it.
    assert prom.query('sum by (api) (rate(minibroker_requests_total[1m]))')


@needs_promtool
def test_exposition_passes_promtool(broker: BrokerProcess) -> None:
    topic = unique_topic("promtool")
    create_topic(broker.bootstrap, topic)
    confluent_produce(broker.bootstrap, topic, numbered(10))
    text = scrape(broker)  # the text format (0.0.4), which promtool checks
    assert "minibroker_purgatory_delayed_operations" in text
    result = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(),
                            capture_output=True, timeout=60)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert not (result.stdout + result.stderr).strip()  # no lint findings either
    # What Prometheus asks for first is OpenMetrics; that must parse too.
    om = scrape(broker, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    families = {f.name for f in text_string_to_metric_families(om)}
    assert {"minibroker_requests", "minibroker_purgatory_delayed_operations"} <= families


def test_dashboard_queries_name_exported_metrics(broker: BrokerProcess) -> None:
    names = exported_names(scrape(broker))
    dashboards = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
    assert dashboards
    for path in dashboards:
        exprs = [t["expr"] for panel in json.loads(path.read_text())["panels"]
                 for t in panel.get("targets", [])]
        assert exprs, path
        for expr in exprs:
            for name in re.findall(r"\bminibroker_[a-z_]+", expr):
                assert name in names, f"{path.name}: {expr} uses {name}, not exported"


def test_metrics_off(broker_factory) -> None:
    broker = broker_factory({"metrics.listener": ""})
    assert broker.metrics_port is None
    started = next(e for e in broker.new_log_lines() if e.get("event") == "broker started")
    assert started["metrics"] is None
    topic = unique_topic("nometrics")
    create_topic(broker.bootstrap, topic)
    confluent_produce(broker.bootstrap, topic, numbered(1))


@needs_promtool
def test_prometheus_config_in_repo_is_valid() -> None:
    result = subprocess.run(
        [PROMTOOL, "check", "config", str(ROOT / "deploy" / "prometheus" / "prometheus.yml")],
        capture_output=True, timeout=60)
    assert result.returncode == 0, (result.stdout, result.stderr)


def _compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "compose", "version"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _compose_available(),
                    reason="docker client with the compose plugin not available")
def test_docker_compose_config() -> None:
    result = subprocess.run(["docker", "compose", "-f", str(ROOT / "docker-compose.yml"),
                             "config", "--quiet"], capture_output=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr.decode()


# -- operations: health check and CLI -------------------------------------------------------------

def test_healthcheck_module_asks_api_versions(broker: BrokerProcess) -> None:
    ok = subprocess.run([sys.executable, "-m", "broker.healthcheck", broker.bootstrap],
                        capture_output=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    broker.stop()
    down = subprocess.run([sys.executable, "-m", "broker.healthcheck", broker.bootstrap],
                          capture_output=True, timeout=60)
    assert down.returncode == 1 and b"unhealthy" in down.stderr


def test_cli_version_and_help_list_every_key() -> None:
    from broker.cli import default_text
    from broker.config import KEYS

    version = subprocess.run([sys.executable, "-m", "broker", "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and re.fullmatch(r"\d+\.\d+\.\d+\S*\n", version.stdout)
    text = subprocess.run([sys.executable, "-m", "broker", "--help"], capture_output=True,
                          text=True, timeout=60).stdout
    for key in KEYS.values():
        assert f"  {key.name} (default {default_text(key)})\n" in text, key.name


def test_cleaner_series_follow_a_compaction(broker_factory) -> None:
    """Kafka's cleaner metrics: a compacted topic whose keys were overwritten is cleaned, and
    the runs, the records and bytes it removed and the log's dirty ratio are exported."""
    broker = broker_factory({"log.cleaner.backoff.ms": "100"})
    topic = unique_topic("cleaned")
    create_topic(broker.bootstrap, topic, config={
        "cleanup.policy": "compact", "segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01"})
    records = [Rec(key=f"k{i % 10}".encode(), value=b"v" * 50) for i in range(400)]
    confluent_produce(broker.bootstrap, topic, records, one_batch_each=True)

    def value(name: str, text: str) -> float:
        found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        return float(found.group(1)) if found else 0.0

    wait_until(lambda: value("minibroker_log_cleaner_records_removed_total", scrape(broker))
               > 0, 30, "a clean that removed records")
    text = scrape(broker)
    assert value("minibroker_log_cleaner_runs_total", text) >= 1
    assert value("minibroker_log_cleaner_bytes_removed_total", text) > 0
    assert value("minibroker_log_cleaner_records_removed_total", text) < 400
    ratio = re.search(rf'^minibroker_log_cleaner_dirty_ratio{{partition="0",topic="{topic}"}} '
                      r"(\S+)$", text, re.M)
    assert ratio is not None and 0.0 <= float(ratio.group(1)) <= 1.0
    assert value("minibroker_log_cleaner_uncleanable_partitions", text) == 0
