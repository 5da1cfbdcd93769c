"""What only the etcd store has: a key root per cluster, errors when etcd is away, and the
etcd child process the tests and the embedded cluster use."""

from __future__ import annotations

import os
import socket
import time

import pytest

from broker.cluster.etcd_process import EtcdNotFound, EtcdProcess, find_etcd
from broker.cluster.etcd_store import EtcdStore
from broker.cluster.store import StoreUnavailable

pytestmark = pytest.mark.timeout(60)


async def test_stores_with_different_roots_share_an_etcd_without_seeing_each_other(
    etcd_server: EtcdProcess,
) -> None:
    a = EtcdStore(etcd_server.endpoint, root="/cluster-a")
    b = EtcdStore(etcd_server.endpoint, root="/cluster-b/")
    try:
        start = (await a.get_prefix("/")).revision + 1
        watch = a.watch("/", prefix=True, start_revision=start)
        await b.put("/brokers/ids/1", b"b's broker")
        rev = await a.put("/brokers/ids/1", b"a's broker")
        assert [(kv.key, kv.value) for kv in (await a.get_prefix("/")).kvs] == [
            ("/brokers/ids/1", b"a's broker")
        ]
        kv = await b.get("/brokers/ids/1")
        assert kv is not None and kv.value == b"b's broker"
        event = await anext(watch)  # b's write, one revision earlier, is not a's
        assert (event.revision, event.kv.key) == (rev, "/brokers/ids/1")
        assert event.kv.value == b"a's broker"
        await watch.close()
        lease = await a.grant_lease(5)
        await a.put("/controller", b"1", lease=lease.id)
        ttl, keys = await a.lease_time_to_live(lease.id)
        assert 0 < ttl <= 5 and keys == ["/controller"]
        await a.revoke_lease(lease.id)
        assert (await a.lease_time_to_live(lease.id))[0] == -1
    finally:
        await a.delete_prefix("/")
        await b.delete_prefix("/")
        await a.close()
        await b.close()


async def test_a_listing_larger_than_a_page_is_one_snapshot(etcd_server: EtcdProcess) -> None:
    store = EtcdStore(etcd_server.endpoint, root="/paged", page_size=10)
    writer = EtcdStore(etcd_server.endpoint, root="/paged")
    try:
        for i in range(25):
            await writer.put(f"/brokers/topics/t/partitions/{i:02}/state", b"%d" % i)
        reads = 0
        real_call = store._call

        async def call_and_write_between_pages(stub: str, method: str, request: object) -> object:
            nonlocal reads
            reads += 1
            resp = await real_call(stub, method, request)
            if reads == 1:  # a write after the first page must not show in the listing
                await writer.put("/brokers/topics/t/partitions/99/state", b"late")
            return resp

        store._call = call_and_write_between_pages  # type: ignore[method-assign]
        listing = await store.get_prefix("/brokers/topics/t/partitions/")
        assert reads == 3
        assert [kv.value for kv in listing.kvs] == [b"%d" % i for i in range(25)]
        late = await writer.get("/brokers/topics/t/partitions/99/state")
        assert late is not None and listing.revision == late.mod_revision - 1
    finally:
        await writer.delete_prefix("/")
        await store.close()
        await writer.close()


async def test_requests_wait_for_etcd_up_to_their_timeout_then_fail_unavailable(
    own_etcd: EtcdProcess,
) -> None:
    store = EtcdStore(own_etcd.endpoint, request_timeout=1.0)
    try:
        await store.put("/a", b"1")
        own_etcd.kill()
        # A request sent before gRPC saw the connection drop fails as soon as it does
        # (it was on the wire: wait-for-ready does not apply); from then on the channel
        # knows etcd is gone and every request waits for it.
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.get("/a")
        assert time.monotonic() - started < 2.0
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.get("/a")
        with pytest.raises(StoreUnavailable):
            await store.grant_lease(5)
        assert 1.8 <= time.monotonic() - started < 4.0
        own_etcd.start()  # a crash loses nothing etcd acknowledged
        kv = await store.get("/a")  # the channel reconnects within the request's time
        assert kv is not None and kv.value == b"1"
    finally:
        await store.close()


def test_the_etcd_binary_comes_from_the_environment_or_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    real = find_etcd()
    monkeypatch.setenv("MINI_BROKER_ETCD", real)
    assert find_etcd() == real
    monkeypatch.setenv("MINI_BROKER_ETCD", os.path.join(tmp_path, "no-such-etcd"))
    with pytest.raises(EtcdNotFound, match="MINI_BROKER_ETCD"):
        find_etcd()
    monkeypatch.delenv("MINI_BROKER_ETCD")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EtcdNotFound, match="PATH"):
        find_etcd()


def test_a_restarted_etcd_keeps_its_ports_and_data_dir_and_close_removes_it() -> None:
    etcd = EtcdProcess().start()
    ports, data_dir, pid = (etcd.client_port, etcd.peer_port), etcd.data_dir, etcd.pid
    assert etcd.healthy()
    etcd.restart()
    assert (etcd.client_port, etcd.peer_port) == ports and etcd.pid != pid
    assert etcd.healthy() and data_dir.is_dir()
    etcd.close()
    assert not etcd.running() and not etcd.base_dir.exists()


def test_a_port_taken_before_etcd_binds_it_makes_the_first_start_pick_others() -> None:
    etcd = EtcdProcess()
    taken = etcd.client_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        etcd.start()
        try:
            assert etcd.client_port != taken and etcd.healthy()
        finally:
            etcd.close()
