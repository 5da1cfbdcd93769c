"""docker-compose.yml's cluster profile, read as YAML: docker compose is not on every machine
(tests/integration/test_metrics.py runs `docker compose config` where it is), so what must
agree is checked here: the profile's services, each broker's node.id, listener, advertised
port and published port, the etcd endpoint, Prometheus' scrape targets, and no host port
published twice across both stacks.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CLUSTER = {"etcd", "broker-1", "broker-2", "broker-3", "prometheus-cluster"}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    return doc["services"]


def overrides(service: dict[str, Any]) -> dict[str, str]:
    """The broker's --override key=value pairs."""
    command = service["command"]
    pairs = [command[i + 1] for i, arg in enumerate(command) if arg == "--override"]
    return dict(p.split("=", 1) for p in pairs)


def published(service: dict[str, Any]) -> dict[int, int]:
    """host port -> container port."""
    out = {}
    for entry in service.get("ports", []):
        host, container = str(entry).split(":")
        out[int(host)] = int(container)
    return out


def test_the_cluster_profile_has_etcd_three_brokers_and_prometheus(
        services: dict[str, Any]) -> None:
    in_profile = {name for name, s in services.items() if "cluster" in s.get("profiles", [])}
    assert in_profile == CLUSTER
    # The single-broker stack keeps starting with a plain `docker compose up`.
    assert {"broker", "prometheus", "grafana"} <= {n for n, s in services.items()
                                                   if not s.get("profiles")}


def test_each_broker_has_its_node_id_listener_and_etcd(services: dict[str, Any]) -> None:
    etcd_args = services["etcd"]["command"]
    client_url = next(a for a in etcd_args if a.startswith("--listen-client-urls="))
    etcd_port = int(client_url.rsplit(":", 1)[1])
    seen_ids = set()
    for n in (1, 2, 3):
        service = services[f"broker-{n}"]
        keys = overrides(service)
        assert keys["node.id"] == str(n)
        seen_ids.add(keys["node.id"])
        assert keys["minibroker.etcd.endpoints"] == f"etcd:{etcd_port}"
        assert service["depends_on"]["etcd"]["condition"] == "service_healthy"
        assert service["build"]["args"]["EXTRAS"] == "[cluster]"  # aetcd in the image
        listener = re.fullmatch(r"PLAINTEXT://0\.0\.0\.0:(\d+)", keys["listeners"])
        assert listener is not None, keys["listeners"]
        port = int(listener[1])
        advertised = re.fullmatch(r"PLAINTEXT://localhost:(\d+)", keys["advertised.listeners"])
        assert advertised is not None and int(advertised[1]) == port
        assert published(service) == {port: port}  # clients on the host reach what is told
        healthcheck = service["healthcheck"]["test"]
        assert healthcheck[-1] == f"127.0.0.1:{port}"
        assert keys["metrics.listener"] == "http://0.0.0.0:9404/metrics"
        volume = service["volumes"][0].split(":")
        assert volume[1] == keys["log.dirs"] and volume[0] == f"broker-{n}-data"
    assert len(seen_ids) == 3


def test_no_host_port_is_published_twice(services: dict[str, Any]) -> None:
    ports = [p for s in services.values() for p in published(s)]
    assert len(ports) == len(set(ports)), sorted(ports)


def test_every_named_volume_is_declared(services: dict[str, Any]) -> None:
    declared = set(yaml.safe_load(COMPOSE.read_text())["volumes"])
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("."):
                assert source in declared, f"{name}: volume {source} not declared"
            else:
                assert (ROOT / source).exists(), f"{name}: {source} missing"


def test_prometheus_scrapes_each_cluster_broker(services: dict[str, Any]) -> None:
    mount = next(v for v in services["prometheus-cluster"]["volumes"]
                 if v.endswith(":/etc/prometheus/prometheus.yml:ro"))
    config = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"]
               for t in sc["targets"]}
    assert targets == {f"broker-{n}:9404" for n in (1, 2, 3)}
    promtool = shutil.which("promtool")
    if promtool is not None:  # make test's system-deps installs it
        result = subprocess.run([promtool, "check", "config", str(ROOT / mount.split(":")[0])],
                                capture_output=True, timeout=60)
        assert result.returncode == 0, (result.stdout, result.stderr)


def test_the_image_takes_the_cluster_extra() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ARG EXTRAS=""' in dockerfile and 'pip install ".${EXTRAS}"' in dockerfile
