"""ClusterMembership end to end: brokers configured by their keys join one cluster in a real
etcd (and in the in-process store), one becomes controller and sees the others, and a log
dir of another cluster, a taken node id or an unreachable etcd stops a broker with one line."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest

from broker.cluster.controller import ControllerContext
from broker.cluster.etcd_process import EtcdProcess
from broker.cluster.liveness import BrokerChange
from broker.cluster.membership import ClusterMembership, open_etcd_store
from broker.cluster.memory import InMemoryStore
from broker.cluster.registration import BrokerInfo, NodeIdInUse
from broker.cluster.settings import ClusterSettings
from broker.config import BrokerConfig
from broker.startup_error import StartupError
from tests.cluster.conftest import Backend

pytestmark = pytest.mark.timeout(60)


def settings_for(node_id: int, endpoint: str, prefix: str) -> ClusterSettings:
    return ClusterSettings.from_config(BrokerConfig.from_dict({
        "node.id": str(node_id), "minibroker.etcd.endpoints": endpoint,
        "minibroker.etcd.prefix": prefix, "broker.session.timeout.ms": "1000",
        "broker.heartbeat.interval.ms": "300"}))


def broker_info(node_id: int) -> BrokerInfo:
    return BrokerInfo(node_id, {"PLAINTEXT": ("127.0.0.1", 9000 + node_id)},
                      {"PLAINTEXT": "PLAINTEXT"})


class Member:
    def __init__(self, membership: ClusterMembership) -> None:
        self.m = membership
        self.elected: list[ControllerContext] = []
        self.resigned: list[str] = []
        self.changes: list[BrokerChange] = []

    async def register(self, node_id: int) -> int:
        return await self.m.register(
            broker_info(node_id), on_elected=self.elected.append,
            on_resigned=lambda c, why: self.resigned.append(why), on_brokers=self.changes.append)


def membership(backend: Backend, node_id: int, prefix: str) -> ClusterMembership:
    """A broker's membership: on etcd through its keys, or on the shared in-process store."""
    if isinstance(backend.store, InMemoryStore):
        return ClusterMembership(settings_for(node_id, "", ""), backend.store, owns_store=False)
    settings = settings_for(node_id, backend.etcd.endpoint, prefix)  # type: ignore[attr-defined]
    return ClusterMembership(settings, open_etcd_store(settings))


async def test_brokers_join_one_cluster_and_the_controller_sees_them(
    backend: Backend, tmp_path: Path
) -> None:
    prefix = f"/mb-{uuid.uuid4().hex[:8]}"
    members = [Member(membership(backend, n, prefix)) for n in (1, 2)]
    ids = [await m.m.check_log_dirs([tmp_path / f"b{i}"]) for i, m in enumerate(members, 1)]
    assert ids[0] == ids[1]
    assert f"cluster.id={ids[0]}" in (tmp_path / "b1" / "meta.properties").read_text()
    epochs = [await m.register(n) for n, m in zip((1, 2), members, strict=True)]
    assert epochs[1] > epochs[0]

    def controller() -> Member | None:
        active = [m for m in members if m.m.election and m.m.election.is_active]
        return active[0] if len(active) == 1 else None

    def sees_both() -> bool:
        c = controller()
        return c is not None and c.m.liveness is not None and set(c.m.liveness.live) == {1, 2}

    assert await backend.eventually(sees_both, within_s=5)
    first = controller()
    assert first is not None and first.elected and first.elected[0].epoch == 1
    assert first.changes and {b.info.node_id for c in first.changes for b in c.added} == {1, 2}
    other = members[1] if first is members[0] else members[0]
    assert other.m.liveness is None

    # A second process with broker 1's id (and a dir of its own) is refused.
    twin = membership(backend, 1, prefix)
    assert await twin.check_log_dirs([tmp_path / "twin"]) == ids[0]
    with pytest.raises(NodeIdInUse):
        await twin.register(broker_info(1))
    await twin.close()

    # The controller leaves: the other broker takes over and sees only itself.
    await first.m.close()

    def took_over() -> bool:
        return (other.m.liveness is not None and set(other.m.liveness.live) == {other_id}
                and bool(other.elected))

    other_id = 2 if other is members[1] else 1
    assert await backend.eventually(took_over, within_s=5)
    assert other.elected[0].epoch == 2
    await other.m.close()


async def test_a_log_dir_of_another_cluster_stops_the_broker(
    etcd_server: EtcdProcess, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    first = _etcd(1, etcd_server, f"/a-{uuid.uuid4().hex[:8]}")
    await first.check_log_dirs([data])
    await first.close()
    other = _etcd(1, etcd_server, f"/b-{uuid.uuid4().hex[:8]}")
    with pytest.raises(StartupError, match=f"the cluster in etcd {etcd_server.endpoint}/b-"):
        await other.check_log_dirs([data])
    await other.close()


def _etcd(node_id: int, etcd: EtcdProcess, prefix: str) -> ClusterMembership:
    settings = settings_for(node_id, etcd.endpoint, prefix)
    return ClusterMembership(settings, open_etcd_store(settings))


async def test_an_unreachable_etcd_is_one_startup_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = settings_for(1, f"127.0.0.1:{port}", "/x")
    from broker.cluster.etcd_store import EtcdStore

    member = ClusterMembership(settings, EtcdStore(settings.endpoint, root="/x",
                                                   request_timeout=1.0))
    with pytest.raises(StartupError) as info:
        await member.check_log_dirs([tmp_path])
    message = str(info.value)
    assert message.startswith(f"the cluster's metadata in etcd 127.0.0.1:{port}/x cannot be read")
    assert "\n" not in message
    assert not (tmp_path / "meta.properties").exists()
    await member.close()
