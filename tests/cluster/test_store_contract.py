"""The MetadataStore contract, run against a real etcd and against the in-process store.

What Kafka's ZooKeeper-era controller relied on ZooKeeper for, stated as etcd gives it:
revisions and per-key versions, conditional writes that change nothing when a compare fails,
keys on leases that vanish with their owner, watches that deliver every event after a revision
in order (and keep doing so across an etcd restart), compaction that tells a watcher to re-list.
"""

from __future__ import annotations

import asyncio

import pytest

from broker.cluster.lease_keeper import LeaseKeeper
from broker.cluster.store import (
    Compare,
    Delete,
    EventType,
    Get,
    LeaseNotFound,
    Put,
    StoreError,
    WatchCompacted,
    WatchEvent,
)
from tests.cluster.conftest import Backend

pytestmark = pytest.mark.timeout(60)

# Shortest TTL etcd grants with the fixture's election timeout (1.5 x 250 ms, rounded up).
TTL = 1


def brief(events: list[WatchEvent]) -> list[tuple[int, str, str, bytes]]:
    return [(e.revision, e.type.value, e.kv.key, e.kv.value) for e in events]


async def test_put_get_and_prefix_reads_carry_revisions_and_versions(backend: Backend) -> None:
    s = backend.store
    start = (await s.get_prefix("/")).revision
    r1 = await s.put("/brokers/ids/1", b"a")
    r2 = await s.put("/brokers/ids/2", b"b")
    r3 = await s.put("/brokers/ids/1", b"a2")
    assert (r1, r2, r3) == (start + 1, start + 2, start + 3)

    kv = await s.get("/brokers/ids/1")
    assert kv is not None
    assert (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (b"a2", 2, r1, r3)
    assert await s.get("/brokers/ids/3") is None

    await s.put("/brokers/idsx", b"not under the prefix")
    listing = await s.get_prefix("/brokers/ids/")
    assert [(k.key, k.value) for k in listing.kvs] == [
        ("/brokers/ids/1", b"a2"),
        ("/brokers/ids/2", b"b"),
    ]
    assert listing.revision == start + 4

    assert await s.delete("/brokers/ids/2") is True
    assert await s.delete("/brokers/ids/2") is False
    # Deleting nothing is no write: the revision stays.
    assert (await s.get_prefix("/")).revision == start + 5
    await s.put("/brokers/ids/2", b"again")
    recreated = await s.get("/brokers/ids/2")
    assert recreated is not None and recreated.version == 1  # version restarts after delete
    assert await s.delete_prefix("/brokers/") == 3
    assert (await s.get_prefix("/brokers/")).kvs == []


async def test_version_compare_failure_leaves_state_unchanged(backend: Backend) -> None:
    """Kafka's zkVersion compare-and-swap of a partition state (updateLeaderAndIsr)."""
    s = backend.store
    key = "/brokers/topics/t/partitions/0/state"
    await s.put(key, b'{"leader":1,"leader_epoch":0}')
    ok = await s.txn(
        [Compare.version(key, "==", 1)], [Put(key, b'{"leader":2,"leader_epoch":1}')]
    )
    assert ok.succeeded
    before = await s.get(key)
    before_rev = (await s.get_prefix("/")).revision
    assert before is not None and before.version == 2 and before.mod_revision == ok.revision

    stale = await s.txn(
        [Compare.version(key, "==", 1)],
        [Put(key, b'{"leader":3,"leader_epoch":1}'), Delete("/controller")],
        [Get(key)],
    )
    assert not stale.succeeded
    assert stale.revision == before_rev  # nothing written
    assert stale.responses == [[before]]  # the failure branch reads the current state
    assert await s.get(key) == before
    assert (await s.get_prefix("/")).revision == before_rev


async def test_multi_compare_is_atomic_and_fences_a_stale_controller(backend: Backend) -> None:
    """One failing compare (a deposed controller's epoch) and none of the writes happen."""
    s = backend.store
    epoch_rev = await s.put("/controller_epoch", b"1")
    won = await s.txn(
        [Compare.absent("/controller"), Compare.mod_revision("/controller_epoch", "==", epoch_rev)],
        [Put("/controller", b'{"brokerid":1}'), Put("/controller_epoch", b"2")],
    )
    assert won.succeeded
    epoch = await s.get("/controller_epoch")
    assert epoch is not None and epoch.value == b"2" and epoch.mod_revision == won.revision
    controller = await s.get("/controller")
    assert controller is not None
    assert controller.create_revision == won.revision == controller.mod_revision

    # A second candidate: /controller exists, so it loses and changes nothing.
    lost = await s.txn(
        [Compare.absent("/controller")],
        [Put("/controller", b'{"brokerid":2}'), Put("/controller_epoch", b"3")],
    )
    assert not lost.succeeded
    # A zombie controller writing with the epoch it saw before: refused as a whole.
    zombie = await s.txn(
        [
            Compare.create_revision("/controller", "==", controller.create_revision),
            Compare.mod_revision("/controller_epoch", "==", epoch_rev),
        ],
        [Put("/brokers/topics/t", b"zombie"), Put("/admin/delete_topics/t", b"")],
    )
    assert not zombie.succeeded
    assert await s.get("/brokers/topics/t") is None
    assert await s.get("/admin/delete_topics/t") is None
    assert await s.get("/controller") == controller
    assert await s.get("/controller_epoch") == epoch
    # The right epoch passes; "<" / ">" / "!=" and value compares work as etcd's.
    current = await s.txn(
        [
            Compare.mod_revision("/controller_epoch", "==", epoch.mod_revision),
            Compare.value("/controller", "==", b'{"brokerid":1}'),
            Compare.version("/controller_epoch", ">", 1),
            Compare.create_revision("/controller", "<", epoch.mod_revision + 1),
            Compare.value("/missing", "!=", b"x"),
        ],
        [Put("/brokers/topics/t", b"ok")],
    )
    # A value compare on a missing key is false whatever the operator (etcd's rule).
    assert not current.succeeded
    current = await s.txn(
        [
            Compare.mod_revision("/controller_epoch", "==", epoch.mod_revision),
            Compare.value("/controller", "==", b'{"brokerid":1}'),
            Compare.version("/controller_epoch", ">", 1),
            Compare.create_revision("/controller", "<", epoch.mod_revision + 1),
            Compare.version("/missing", "==", 0),
        ],
        [Put("/brokers/topics/t", b"ok")],
    )
    assert current.succeeded


async def test_put_on_an_unknown_lease_fails_and_writes_nothing(backend: Backend) -> None:
    s = backend.store
    before = (await s.get_prefix("/")).revision
    with pytest.raises(LeaseNotFound):
        await s.put("/brokers/ids/1", b"x", lease=0x7FFF_0000_0001)
    with pytest.raises(LeaseNotFound):
        await s.txn([], [Put("/a", b"1"), Put("/brokers/ids/1", b"x", lease=0x7FFF_0000_0001)])
    assert await s.get("/a") is None
    assert (await s.get_prefix("/")).revision == before


async def test_lease_expiry_deletes_its_keys_and_only_them(backend: Backend) -> None:
    """Ephemeral nodes: the broker's registration vanishes when its lease is not kept alive."""
    s = backend.store
    lease = await s.grant_lease(TTL)
    assert lease.ttl == TTL
    await s.put("/brokers/ids/1", b"broker 1", lease=lease.id)
    await s.put("/controller", b'{"brokerid":1}', lease=lease.id)
    await s.put("/brokers/topics/t", b"persistent")
    start = (await s.get_prefix("/")).revision + 1
    watch = s.watch("/", prefix=True, start_revision=start)

    async def expired() -> bool:
        return await s.get("/brokers/ids/1") is None

    # etcd checks for expired leases every 500 ms: allow for that beyond the TTL.
    assert await backend.eventually(expired, within_s=TTL + 3)
    assert await s.get("/controller") is None
    assert await s.get("/brokers/topics/t") is not None
    assert await s.refresh_lease(lease.id) == 0
    events = await backend.take(watch, 2)
    await watch.close()
    # Both keys go in one revision, as one revoke.
    assert {(e.type, e.kv.key) for e in events} == {
        (EventType.DELETE, "/brokers/ids/1"),
        (EventType.DELETE, "/controller"),
    }
    assert events[0].revision == events[1].revision == start


async def test_revoke_deletes_the_keys_at_once(backend: Backend) -> None:
    s = backend.store
    lease = await s.grant_lease(30)
    await s.put("/brokers/ids/7", b"x", lease=lease.id)
    # "Is this key still held by my lease?" (a controller checking it still is one).
    mine = await s.txn([Compare.lease("/brokers/ids/7", "==", lease.id)], [Get("/brokers/ids/7")])
    assert mine.succeeded and mine.responses[0][0].lease == lease.id  # type: ignore[index]
    other = await s.txn([Compare.lease("/brokers/ids/7", "==", lease.id + 1)], [])
    assert not other.succeeded
    assert await s.revoke_lease(lease.id) is True
    assert await s.get("/brokers/ids/7") is None
    assert await s.revoke_lease(lease.id) is False
    assert await s.refresh_lease(lease.id) == 0


async def test_watch_from_a_revision_delivers_every_later_event_in_order(
    backend: Backend,
) -> None:
    s = backend.store
    base = (await s.get_prefix("/")).revision
    await s.put("/brokers/topics/a", b"1")  # base+1, before the watch's start
    r_from = await s.put("/brokers/topics/b", b"1")  # base+2
    await s.put("/elsewhere", b"not watched")  # base+3
    await s.put("/brokers/topics/a", b"2")  # base+4
    await s.delete("/brokers/topics/b")  # base+5
    three: list[Put | Delete] = [Put("/brokers/topics/c", b"1"), Put("/brokers/topics/d", b"1")]
    three.append(Delete("/brokers/topics/a"))
    txn = await s.txn([], three)  # base+6: three events, one revision
    assert txn.revision == base + 6

    watch = s.watch("/brokers/topics/", prefix=True, start_revision=r_from)
    history = await backend.take(watch, 6)
    assert brief(history) == [
        (base + 2, "put", "/brokers/topics/b", b"1"),
        (base + 4, "put", "/brokers/topics/a", b"2"),
        (base + 5, "delete", "/brokers/topics/b", b""),
        (base + 6, "put", "/brokers/topics/c", b"1"),
        (base + 6, "put", "/brokers/topics/d", b"1"),
        (base + 6, "delete", "/brokers/topics/a", b""),
    ]
    assert history[1].kv.version == 2 and history[1].kv.create_revision == base + 1

    # Live events follow without a gap; a single-key watch sees only its key.
    one = s.watch("/brokers/topics/c", start_revision=base + 7)
    await s.put("/brokers/topics/c", b"2")
    await s.put("/brokers/topics/cc", b"prefix of c, not c")
    await s.put("/brokers/topics/c", b"3")
    live = await backend.take(watch, 3)
    assert brief(live) == [
        (base + 7, "put", "/brokers/topics/c", b"2"),
        (base + 8, "put", "/brokers/topics/cc", b"prefix of c, not c"),
        (base + 9, "put", "/brokers/topics/c", b"3"),
    ]
    assert brief(await backend.take(one, 2)) == [
        (base + 7, "put", "/brokers/topics/c", b"2"),
        (base + 9, "put", "/brokers/topics/c", b"3"),
    ]
    await watch.close()
    await one.close()
    with pytest.raises(StopAsyncIteration):
        await anext(watch)


async def test_watch_resumes_after_a_restart_without_missing_events(
    own_backend: Backend,
) -> None:
    """etcd stopped and started on the same ports and data dir: the watch picks up where it
    was, including what was written after the restart before it reconnected."""
    b = own_backend
    s = b.store
    start = (await s.get_prefix("/")).revision + 1
    watch = s.watch("/brokers/", prefix=True, start_revision=start)
    received: list[WatchEvent] = []

    async def consume() -> None:
        async for event in watch:
            received.append(event)

    consumer = asyncio.create_task(consume())
    expected = []
    for i in range(3):
        rev = await s.put(f"/brokers/ids/{i}", b"before")
        expected.append((rev, "put", f"/brokers/ids/{i}", b"before"))

    async def got(n: int) -> bool:
        return len(received) >= n

    assert await b.eventually(lambda: got(3), within_s=5)
    await b.take_down()
    await b.bring_back()
    writer = await b.new_client()
    survived = await writer.get("/brokers/ids/0")
    assert survived is not None and survived.value == b"before"  # same data dir
    for i in range(3):
        rev = await writer.put(f"/brokers/ids/{i}", b"after")
        expected.append((rev, "put", f"/brokers/ids/{i}", b"after"))
    rev = (await writer.txn([], [Delete("/brokers/ids/", prefix=True)])).revision
    expected += [(rev, "delete", f"/brokers/ids/{i}", b"") for i in range(3)]

    assert await b.eventually(lambda: got(9), within_s=10)
    await asyncio.sleep(0.1)  # nothing more may come
    consumer.cancel()
    await watch.close()
    assert brief(received) == expected
    assert watch.reconnects >= 1


async def test_compaction_past_the_watch_revision_tells_the_caller_to_relist(
    own_backend: Backend,
) -> None:
    b = own_backend
    s = b.store
    await s.put("/brokers/topics/a", b"1")
    r2 = await s.put("/brokers/topics/b", b"1")
    r3 = await s.put("/brokers/topics/a", b"2")

    # A watch from before the compaction point fails when it starts...
    await s.compact(r3)
    stale = s.watch("/brokers/topics/", prefix=True, start_revision=r2)
    with pytest.raises(WatchCompacted) as info:
        await anext(stale)
    assert info.value.compact_revision == r3

    # ...and so does one that was behind while the store was away and got compacted.
    watch = s.watch("/brokers/topics/", prefix=True, start_revision=r3 + 1)
    await s.put("/brokers/topics/c", b"1")
    [first] = await b.take(watch, 1)
    assert first.kv.key == "/brokers/topics/c"
    await b.take_down()  # the watch is not read meanwhile: it resumes on its next read
    await b.bring_back()
    other = await b.new_client()
    await other.put("/brokers/topics/d", b"1")
    r_last = await other.put("/brokers/topics/e", b"1")
    await other.compact(r_last)
    with pytest.raises(WatchCompacted) as info:
        await b.take(watch, 1, within_s=10)
    assert info.value.compact_revision == r_last
    assert watch.reconnects >= 1

    # Re-list, then watch from the listing's revision + 1: nothing lost, nothing twice.
    listing = await s.get_prefix("/brokers/topics/")
    assert [kv.key for kv in listing.kvs] == [f"/brokers/topics/{k}" for k in "abcde"]
    again = s.watch("/brokers/topics/", prefix=True, start_revision=listing.revision + 1)
    rev = await s.put("/brokers/topics/f", b"1")
    assert brief(await b.take(again, 1)) == [(rev, "put", "/brokers/topics/f", b"1")]
    await again.close()
    await watch.close()


async def test_compaction_refuses_future_and_already_compacted_revisions(
    backend: Backend,
) -> None:
    s = backend.store
    rev = await s.put("/a", b"1")
    with pytest.raises(StoreError, match="future"):
        await s.compact(rev + 1)
    await s.compact(rev)
    with pytest.raises(StoreError, match="compacted"):
        await s.compact(rev)
    kv = await s.get("/a")
    assert kv is not None and kv.value == b"1"  # compaction keeps the current state


async def test_keepalive_keeps_a_lease_alive_past_its_ttl(backend: Backend) -> None:
    s = backend.store
    lease = await s.grant_lease(TTL)
    await s.put("/brokers/ids/1", b"alive", lease=lease.id)
    lost: list[str] = []
    keeper = LeaseKeeper(s, lease, on_lost=lost.append).start()
    await backend.sleep(TTL * 2.5)
    assert await s.get("/brokers/ids/1") is not None
    assert keeper.alive() and not lost
    # A refresh every TTL/3: seven in 2.5 TTLs; a busy machine may fit fewer.
    assert keeper.refreshes >= 4
    await keeper.stop(revoke=True)
    assert await s.get("/brokers/ids/1") is None
    assert not lost


async def test_keepalive_reports_loss_when_the_store_is_unreachable_past_the_ttl(
    own_backend: Backend,
) -> None:
    b = own_backend
    s = b.store
    ttl = 2
    lease = await s.grant_lease(ttl)
    lost: list[str] = []
    keeper = LeaseKeeper(s, lease, on_lost=lost.append).start()
    await b.sleep(ttl / 3 + 0.3)
    assert keeper.refreshes >= 1
    await b.take_down()
    down_at = keeper.clock.time()
    last_ok = keeper.last_refreshed_ms

    async def reported() -> bool:
        return keeper.lost.is_set()

    assert await b.eventually(reported, within_s=ttl + 2)
    lost_at = keeper.clock.time()
    # Lost no later than the TTL after the last refresh that got through (plus scheduling on
    # a busy machine),
    # and not before: the keeper never gives up a lease that may still be alive.
    assert last_ok + ttl * 1000 <= lost_at <= last_ok + ttl * 1000 + 1000
    assert lost_at > down_at
    assert len(lost) == 1 and "no refresh" in lost[0]
    assert keeper.failed_refreshes >= 1
    assert not keeper.alive()
    await b.bring_back()
    # The owner starts over with a new lease once the store is back.
    fresh = await s.grant_lease(ttl)
    await s.put("/brokers/ids/1", b"re-registered", lease=fresh.id)
    assert await s.get("/brokers/ids/1") is not None
    await keeper.stop()


async def test_keepalive_reports_loss_when_the_store_dropped_the_lease(backend: Backend) -> None:
    s = backend.store
    lease = await s.grant_lease(TTL)
    lost: list[str] = []
    keeper = LeaseKeeper(s, lease, on_lost=lost.append).start()
    other = await backend.new_client()
    assert await other.revoke_lease(lease.id)

    async def reported() -> bool:
        return keeper.lost.is_set()

    assert await backend.eventually(reported, within_s=TTL + 1)
    assert len(lost) == 1 and "no longer has the lease" in lost[0]
    await keeper.stop()
