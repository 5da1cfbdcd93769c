"""The metadata store in process: etcd's semantics without etcd.

For single-node mode and for tests that need exact timing: one global revision that every
write (a put, a delete that deleted something, a txn that wrote) moves by one; per-key version,
create and mod revisions; leases that expire on a ``Clock`` (a manual clock makes expiry exact);
watches from any revision still in the history; ``compact`` drops history so old watches fail
as on etcd. ``set_reachable(False)`` makes it behave as an etcd that cannot be reached: every
call raises ``StoreUnavailable`` and open watch streams break, so the resume paths of the
callers run, while leases keep counting down as they would on the server.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.cluster.store import (
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    Lease,
    LeaseNotFound,
    Listing,
    MetadataStore,
    Op,
    OpResult,
    Put,
    StoreError,
    StoreUnavailable,
    TxnResult,
    WatchCompacted,
    WatchEvent,
    WatchStream,
    compare_holds,
)
from purgatory.clock import Clock, LoopClock
from purgatory.timer_task_list import Cancellable


@dataclass
class _LeaseState:
    ttl: int
    deadline_ms: float
    keys: set[str] = field(default_factory=set)
    handle: Cancellable | None = None


def _matches(key: str, watched: str, prefix: bool) -> bool:
    return key.startswith(watched) if prefix else key == watched


class InMemoryStore(MetadataStore):
    """A MetadataStore in one process. Make it on the loop that uses it (it reads the loop's
    clock unless given one)."""

    def __init__(
        self, clock: Clock | None = None, *, min_lease_ttl: int = 1, max_history: int = 100_000
    ) -> None:
        self.clock = clock if clock is not None else LoopClock(asyncio.get_running_loop())
        self.min_lease_ttl = min_lease_ttl
        # etcd's --auto-compaction: a long-lived single node must not keep every event.
        self.max_history = max_history
        self._kvs: dict[str, KeyValue] = {}
        # etcd starts at revision 1 with no keys; the first write is revision 2.
        self._revision = 1
        self._compact_revision = 0
        self._history: list[WatchEvent] = []
        self._leases: dict[int, _LeaseState] = {}
        self._lease_ids = itertools.count(0x6D62_0000_0001)
        self._changed = asyncio.Event()
        self._streams: weakref.WeakSet[_MemoryWatchStream] = weakref.WeakSet()
        self._reachable = True
        self._closed = False

    # -- faults ---------------------------------------------------------------------------

    def set_reachable(self, reachable: bool) -> None:
        """False: calls fail and watch streams break, as when etcd is down or cut off."""
        self._reachable = reachable
        if not reachable:
            for stream in self._streams:
                stream.broken = True
            self._wake()

    def _check(self) -> None:
        if self._closed:
            raise StoreUnavailable("store closed")
        if not self._reachable:
            raise StoreUnavailable("store unreachable")

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- reads ----------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        return self._revision

    async def get(self, key: str) -> KeyValue | None:
        self._check()
        return self._kvs.get(key)

    async def get_prefix(self, prefix: str) -> Listing:
        self._check()
        return Listing(self._range(prefix, True), self._revision)

    def _range(self, key: str, prefix: bool) -> list[KeyValue]:
        if not prefix:
            kv = self._kvs.get(key)
            return [kv] if kv is not None else []
        return [self._kvs[k] for k in sorted(self._kvs) if k.startswith(key)]

    # -- writes ---------------------------------------------------------------------------

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        return (await self.txn((), (Put(key, value, lease),))).revision

    async def delete(self, key: str) -> bool:
        result = await self.txn((), (Delete(key),))
        return bool(result.responses[0])

    async def delete_prefix(self, prefix: str) -> int:
        result = await self.txn((), (Delete(prefix, prefix=True),))
        deleted = result.responses[0]
        assert isinstance(deleted, int)
        return deleted

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._check()
        succeeded = all(compare_holds(self._kvs.get(c.key), c) for c in compares)
        ops = success if succeeded else failure
        self._validate(ops)
        return TxnResult(succeeded, *self._apply(ops))

    def _validate(self, ops: Sequence[Op]) -> None:
        """etcd's checks before a txn runs: known leases, no key written twice."""
        written: list[tuple[str, bool]] = []
        for op in ops:
            if isinstance(op, Put):
                if op.lease and op.lease not in self._leases:
                    raise LeaseNotFound("requested lease not found")
                if any(_matches(op.key, k, p) for k, p in written):
                    raise StoreError("duplicate key given in txn request")
                written.append((op.key, False))
            elif isinstance(op, Delete):
                if any(_matches(k, op.key, op.prefix) for k, _ in written):
                    raise StoreError("duplicate key given in txn request")
                written.append((op.key, op.prefix))

    def _apply(self, ops: Sequence[Op]) -> tuple[int, list[OpResult]]:
        """Run ops in order; every change gets the same new revision."""
        rev = self._revision + 1
        events: list[WatchEvent] = []
        responses: list[OpResult] = []
        for op in ops:
            if isinstance(op, Get):
                responses.append(self._range(op.key, op.prefix))
            elif isinstance(op, Put):
                events.append(self._put(op, rev))
                responses.append(None)
            else:
                deleted = [self._delete(kv.key, rev) for kv in self._range(op.key, op.prefix)]
                events.extend(deleted)
                responses.append(len(deleted))
        if events:
            self._commit(rev, events)
        return self._revision, responses

    def _put(self, op: Put, rev: int) -> WatchEvent:
        old = self._kvs.get(op.key)
        if old is not None and old.lease and old.lease != op.lease:
            self._detach(old.key, old.lease)
        kv = KeyValue(
            op.key,
            op.value,
            create_revision=old.create_revision if old is not None else rev,
            mod_revision=rev,
            version=old.version + 1 if old is not None else 1,
            lease=op.lease,
        )
        self._kvs[op.key] = kv
        if op.lease:
            self._leases[op.lease].keys.add(op.key)
        return WatchEvent(EventType.PUT, kv)

    def _delete(self, key: str, rev: int) -> WatchEvent:
        old = self._kvs.pop(key)
        if old.lease:
            self._detach(key, old.lease)
        return WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, rev, 0, 0))

    def _detach(self, key: str, lease_id: int) -> None:
        state = self._leases.get(lease_id)
        if state is not None:
            state.keys.discard(key)

    def _commit(self, rev: int, events: list[WatchEvent]) -> None:
        self._revision = rev
        self._history.extend(events)
        if len(self._history) > self.max_history:
            # Compact at the oldest revision to keep: its events stay whole.
            self._compact(self._history[-self.max_history].revision)
        self._wake()

    # -- leases ---------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> Lease:
        self._check()
        granted_at = self.clock.time()
        ttl = max(int(ttl), self.min_lease_ttl)
        lease_id = next(self._lease_ids)
        state = _LeaseState(ttl, granted_at + ttl * 1000.0)
        self._leases[lease_id] = state
        self._schedule_expiry(lease_id, state)
        return Lease(lease_id, ttl, granted_at)

    def _schedule_expiry(self, lease_id: int, state: _LeaseState) -> None:
        if state.handle is not None:
            state.handle.cancel()
        state.handle = self.clock.call_at(state.deadline_ms, self._expire, lease_id)

    def _expire(self, lease_id: int) -> None:
        state = self._leases.get(lease_id)
        if state is not None and self.clock.time() >= state.deadline_ms:
            self._drop_lease(lease_id)

    def _drop_lease(self, lease_id: int) -> None:
        """Remove a lease and delete its keys in one revision, as etcd's revoke does."""
        state = self._leases.pop(lease_id)
        if state.handle is not None:
            state.handle.cancel()
        rev = self._revision + 1
        events = [self._delete(k, rev) for k in sorted(state.keys) if k in self._kvs]
        if events:
            self._commit(rev, events)

    async def refresh_lease(self, lease_id: int) -> int:
        self._check()
        state = self._leases.get(lease_id)
        if state is None:
            return 0
        state.deadline_ms = self.clock.time() + state.ttl * 1000.0
        self._schedule_expiry(lease_id, state)
        return state.ttl

    async def revoke_lease(self, lease_id: int) -> bool:
        self._check()
        if lease_id not in self._leases:
            return False
        self._drop_lease(lease_id)
        return True

    def lease_keys(self, lease_id: int) -> set[str] | None:
        """The keys on a lease, None when it does not exist (for tests)."""
        state = self._leases.get(lease_id)
        return set(state.keys) if state is not None else None

    # -- history --------------------------------------------------------------------------

    async def compact(self, revision: int) -> None:
        self._check()
        if revision > self._revision:
            raise StoreError("required revision is a future revision")
        if revision <= self._compact_revision:
            raise StoreError("required revision has been compacted")
        self._compact(revision)
        self._wake()

    def _compact(self, revision: int) -> None:
        self._compact_revision = revision
        cut = bisect.bisect_left(self._history, revision, key=lambda e: e.revision)
        del self._history[:cut]

    async def _open_watch(self, key: str, prefix: bool, start_revision: int) -> WatchStream:
        self._check()
        stream = _MemoryWatchStream(self, key, prefix, start_revision)
        self._streams.add(stream)
        return stream

    async def close(self) -> None:
        self._closed = True
        for state in self._leases.values():
            if state.handle is not None:
                state.handle.cancel()
        self._wake()


class _MemoryWatchStream(WatchStream):
    def __init__(self, store: InMemoryStore, key: str, prefix: bool, start: int) -> None:
        self.store = store
        self.key = key
        self.prefix = prefix
        self.next_revision = start
        self.broken = False
        self._closed = False

    async def next_batch(self) -> list[WatchEvent]:
        store = self.store
        while True:
            if self._closed:
                raise StoreUnavailable("watch closed")
            if self.broken:
                raise StoreUnavailable("connection to the store lost")
            store._check()
            if self.next_revision < store._compact_revision:
                raise WatchCompacted(store._compact_revision)
            batch = self._available()
            if batch:
                return batch
            changed = store._changed
            await changed.wait()

    def _available(self) -> list[WatchEvent]:
        history = self.store._history
        start = bisect.bisect_left(history, self.next_revision, key=lambda e: e.revision)
        if start == len(history):
            return []
        self.next_revision = history[-1].revision + 1
        return [e for e in history[start:] if _matches(e.kv.key, self.key, self.prefix)]

    async def close(self) -> None:
        self._closed = True
        self.store._wake()

