"""The cluster's configuration keys and meta.properties: no store needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cluster.meta_properties import (
    FILE_NAME,
    MetaProperties,
    check_meta_properties,
    new_cluster_id,
    read_meta_properties,
)
from broker.cluster.settings import ClusterSettings
from broker.config import BrokerConfig
from broker.config_error import ConfigError
from broker.startup_error import StartupError


def settings(**keys: str) -> ClusterSettings:
    return ClusterSettings.from_config(BrokerConfig.from_dict(keys))


def test_defaults_are_single_node_mode_with_kafkas_timeouts() -> None:
    s = settings()
    assert not s.enabled and s.endpoints == ()
    assert (s.prefix, s.rack, s.session_timeout_ms, s.heartbeat_interval_ms) == (
        "/mini-broker", None, 9000, 2000)
    assert s.lease_ttl_s == 9 and s.node_id == 1
    assert BrokerConfig.from_dict({}).unused_keys == []


def test_a_cluster_configuration_is_read() -> None:
    s = settings(**{"minibroker.etcd.endpoints": "http://127.0.0.1:2379/",
                    "minibroker.etcd.prefix": "/kafka/prod/", "broker.rack": " r1 ",
                    "broker.session.timeout.ms": "1500", "broker.heartbeat.interval.ms": "500",
                    "broker.id": "7"})
    assert s.enabled and s.endpoints == (("127.0.0.1", 2379),) and s.endpoint == "127.0.0.1:2379"
    assert (s.prefix, s.rack, s.node_id, s.lease_ttl_s) == ("/kafka/prod", "r1", 7, 2)
    assert settings(**{"minibroker.etcd.endpoints": "[::1]:2379"}).endpoint == "[::1]:2379"
    cfg = BrokerConfig.from_dict({"broker.rack": "r1", "broker.session.timeout.ms": "1500"})
    assert cfg.unused_keys == []  # served now, no longer Kafka's unused keys


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"broker.heartbeat.interval.ms": "9000"},
         "broker.heartbeat.interval.ms=9000 must be less than broker.session.timeout.ms=9000"),
        ({"minibroker.etcd.endpoints": "127.0.0.1"},
         "invalid value '127.0.0.1' in minibroker.etcd.endpoints: expected host:port"),
        ({"minibroker.etcd.endpoints": "h:99999"}, "expected host:port"),
        ({"minibroker.etcd.endpoints": "https://h:2379"}, "TLS to etcd is not served yet"),
        ({"minibroker.etcd.endpoints": "a:1,b:2"}, "2 endpoints given"),
        ({"minibroker.etcd.prefix": "kafka"}, "expected an absolute path"),
    ],
)
def test_bad_cluster_keys_are_one_line_config_errors(keys: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        settings(**keys)
    assert "\n" not in str(info.value)


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="broker.session.timeout.ms: must be >= 1"):
        BrokerConfig.from_dict({"broker.session.timeout.ms": "0"})


def test_meta_properties_are_written_in_kafkas_format_and_read_back(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    cluster = new_cluster_id()
    assert len(cluster) == 22
    check_meta_properties(dirs, cluster, 3)
    text = (dirs[1] / FILE_NAME).read_text()
    lines = text.splitlines()
    assert lines[0] == "#" and lines[1].startswith("#")
    assert lines[2:] == ["node.id=3", "version=1", f"cluster.id={cluster}"]
    assert read_meta_properties(dirs) == {d: MetaProperties(cluster, 3) for d in dirs}
    check_meta_properties(dirs, cluster, 3)  # the same cluster and node: starts again
    (dirs[0] / FILE_NAME).write_text(f"version=0\nbroker.id=3\ncluster.id={cluster}\n")
    check_meta_properties(dirs, cluster, 3)  # the ZooKeeper era's version 0 reads too


def test_a_dir_of_another_node_or_cluster_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "data"
    check_meta_properties([d], "clusterAAAAAAAAAAAAAAA", 1)
    before = (d / FILE_NAME).read_text()
    with pytest.raises(StartupError, match="belongs to node 1, but node.id is 2: set node.id=1"):
        check_meta_properties([d], "clusterAAAAAAAAAAAAAAA", 2)
    with pytest.raises(StartupError) as info:
        check_meta_properties([d], "clusterBBBBBBBBBBBBBBB", 1, where="etcd 127.0.0.1:2379/x")
    assert str(info.value).startswith(
        f"{d} belongs to cluster clusterAAAAAAAAAAAAAAA, but the cluster in etcd "
        f"127.0.0.1:2379/x is clusterBBBBBBBBBBBBBBB: this broker is joining another cluster")
    assert (d / FILE_NAME).read_text() == before  # nothing rewritten


def test_dirs_that_disagree_or_cannot_be_read_are_refused(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    check_meta_properties([a], "clusterAAAAAAAAAAAAAAA", 1)
    check_meta_properties([b], "clusterAAAAAAAAAAAAAAA", 2)
    with pytest.raises(StartupError, match="log.dirs disagree"):
        check_meta_properties([a, b, c], "clusterAAAAAAAAAAAAAAA", 1)
    assert not (c / FILE_NAME).exists()
    (b / FILE_NAME).write_text("version=1\ncluster.id=x\n")
    with pytest.raises(StartupError, match=r"meta.properties cannot be read \(no node.id\)"):
        check_meta_properties([b], "x", 1)
    (b / FILE_NAME).write_text("version=7\nnode.id=1\ncluster.id=x\n")
    with pytest.raises(StartupError, match="version 7 is not known"):
        check_meta_properties([b], "x", 1)
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(StartupError, match="sub/meta.properties cannot be read: Not a dir"):
        check_meta_properties([blocker / "sub"], "x", 1)
