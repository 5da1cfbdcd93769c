"""The in-process store on a manual clock: lease expiry to the millisecond, faults, history."""

from __future__ import annotations

import pytest

from broker.cluster.memory import InMemoryStore
from broker.cluster.store import StoreError, StoreUnavailable
from purgatory.clock import ManualClock


@pytest.fixture
async def store_and_clock() -> tuple[InMemoryStore, ManualClock]:
    clock = ManualClock(run_due_soon=True)
    return InMemoryStore(clock, min_lease_ttl=2), clock


async def test_a_lease_expires_exactly_at_its_ttl_and_a_refresh_restarts_it(
    store_and_clock: tuple[InMemoryStore, ManualClock],
) -> None:
    store, clock = store_and_clock
    lease = await store.grant_lease(1)
    assert lease.ttl == 2  # raised to the store's minimum, as etcd does
    await store.put("/brokers/ids/1", b"x", lease=lease.id)
    clock.advance(1500)
    assert await store.refresh_lease(lease.id) == 2  # now due at 3500
    clock.advance(1999)
    assert await store.get("/brokers/ids/1") is not None
    assert store.lease_keys(lease.id) == {"/brokers/ids/1"}
    clock.advance(1)
    assert await store.get("/brokers/ids/1") is None
    assert store.lease_keys(lease.id) is None


async def test_moving_a_key_to_another_lease_detaches_it_from_the_first(
    store_and_clock: tuple[InMemoryStore, ManualClock],
) -> None:
    store, clock = store_and_clock
    first = await store.grant_lease(2)
    clock.advance(1000)
    second = await store.grant_lease(2)
    await store.put("/controller", b"1", lease=first.id)
    await store.put("/controller", b"1", lease=second.id)
    clock.advance(1000)  # the first lease expires; the key is the second's now
    assert store.lease_keys(first.id) is None
    kv = await store.get("/controller")
    assert kv is not None and kv.lease == second.id
    clock.advance(1000)
    assert await store.get("/controller") is None


async def test_leases_run_out_while_the_store_is_unreachable(
    store_and_clock: tuple[InMemoryStore, ManualClock],
) -> None:
    store, clock = store_and_clock
    lease = await store.grant_lease(2)
    await store.put("/brokers/ids/1", b"x", lease=lease.id)
    store.set_reachable(False)
    with pytest.raises(StoreUnavailable):
        await store.refresh_lease(lease.id)
    with pytest.raises(StoreUnavailable):
        await store.get("/brokers/ids/1")
    clock.advance(2000)
    store.set_reachable(True)
    assert await store.get("/brokers/ids/1") is None
    assert await store.refresh_lease(lease.id) == 0


async def test_a_txn_writing_a_key_twice_is_refused(
    store_and_clock: tuple[InMemoryStore, ManualClock],
) -> None:
    from broker.cluster.store import Delete, Put

    store, _ = store_and_clock
    with pytest.raises(StoreError, match="duplicate key"):
        await store.txn([], [Put("/a", b"1"), Put("/a", b"2")])
    with pytest.raises(StoreError, match="duplicate key"):
        await store.txn([], [Put("/a/b", b"1"), Delete("/a/", prefix=True)])
    assert (await store.get_prefix("/")).revision == 1


async def test_history_beyond_its_limit_is_compacted_and_old_watches_relist() -> None:
    from broker.cluster.store import Put, WatchCompacted

    store = InMemoryStore(ManualClock(run_due_soon=True), max_history=4)
    first = await store.put("/a", b"1")
    await store.put("/a", b"2")
    both = await store.txn([], [Put("/a", b"3"), Put("/b", b"3")])
    await store.put("/a", b"4")  # five events: the oldest revisions go, whole revisions kept
    with pytest.raises(WatchCompacted) as info:
        await anext(store.watch("/", prefix=True, start_revision=first))
    assert info.value.compact_revision == first + 1
    watch = store.watch("/", prefix=True, start_revision=both.revision)
    assert [(e.revision, e.kv.key) for e in [await anext(watch) for _ in range(3)]] == [
        (both.revision, "/a"),
        (both.revision, "/b"),
        (both.revision + 1, "/a"),
    ]
