"""The cluster metadata store: what Kafka's ZooKeeper-era controller needed from ZooKeeper.

Kafka kept its cluster metadata in ZooKeeper and reached it through KafkaZkClient over
ZooKeeperClient; mini-broker keeps it in etcd behind ``MetadataStore``. The mapping:

- ephemeral znode (``/brokers/ids/<id>``, ``/controller``) -> a key put on a **lease**: etcd
  deletes it when the lease is not kept alive for its TTL (the owner died or was cut off).
  ``LeaseKeeper`` refreshes a lease at a third of its TTL and tells its owner when it is lost.
- conditional ``setData(path, data, zkVersion)`` and ``multi([CheckOp, ...])`` -> ``txn``: all
  compares on a key's ``version`` / ``mod_revision`` / ``create_revision`` (or value, lease)
  hold, then the success ops run, else the failure ops; atomic, one new revision.
- one-shot ZooKeeper watches -> ``watch(key, start_revision=...)``: every event after a
  revision, in order, resumed from the last revision seen when the connection comes back;
  when that revision has been compacted the watch ends with ``WatchCompacted``, and the caller
  re-lists (``get_prefix``) and watches again from the listing's revision + 1.

Two implementations: ``broker.cluster.etcd_store.EtcdStore`` (a real etcd, for clusters) and
``broker.cluster.memory.InMemoryStore`` (same semantics in process: single-node mode and unit
tests).
"""

from __future__ import annotations

import asyncio
import enum
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from purgatory.clock import Clock

logger = structlog.get_logger("broker.cluster")

CompareOp = Literal["==", "!=", "<", ">"]


class StoreError(Exception):
    """A metadata store request failed."""


class StoreUnavailable(StoreError):
    """The store could not be reached (connection refused, timed out, closed): retry later."""


class LeaseNotFound(StoreError):
    """The lease does not exist (expired, revoked, or never granted)."""


class WatchCompacted(StoreError):
    """The watch's next revision is older than the store's compaction: re-list, then watch
    again from the listing's revision + 1."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revisions below {compact_revision} have been compacted")
        self.compact_revision = compact_revision


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key as etcd reports it; ``version`` is ZooKeeper's dataVersion + 1 (1 on create,
    reset by delete), ``create_revision`` its czxid, ``mod_revision`` its mzxid."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Listing:
    """Keys under a prefix and the store revision they were read at (watch from it + 1)."""

    kvs: list[KeyValue]
    revision: int


class EventType(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. For a delete, ``kv`` holds the key, an empty value, version 0 and the
    delete's revision as ``mod_revision``."""

    type: EventType
    kv: KeyValue

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


class CompareTarget(enum.Enum):
    VERSION = "version"
    CREATE_REVISION = "create_revision"
    MOD_REVISION = "mod_revision"
    VALUE = "value"
    LEASE = "lease"


@dataclass(frozen=True, slots=True)
class Compare:
    """One condition of a txn. A missing key has version, revisions and lease 0 (so
    ``Compare.absent(k)`` is "create_revision == 0") and never matches a VALUE compare."""

    key: str
    target: CompareTarget
    op: CompareOp
    operand: int | bytes

    @classmethod
    def version(cls, key: str, op: CompareOp, version: int) -> Compare:
        return cls(key, CompareTarget.VERSION, op, version)

    @classmethod
    def mod_revision(cls, key: str, op: CompareOp, revision: int) -> Compare:
        return cls(key, CompareTarget.MOD_REVISION, op, revision)

    @classmethod
    def create_revision(cls, key: str, op: CompareOp, revision: int) -> Compare:
        return cls(key, CompareTarget.CREATE_REVISION, op, revision)

    @classmethod
    def value(cls, key: str, op: CompareOp, value: bytes) -> Compare:
        return cls(key, CompareTarget.VALUE, op, value)

    @classmethod
    def lease(cls, key: str, op: CompareOp, lease_id: int) -> Compare:
        return cls(key, CompareTarget.LEASE, op, lease_id)

    @classmethod
    def absent(cls, key: str) -> Compare:
        """The key does not exist (ZooKeeper's create fails with NODEEXISTS otherwise)."""
        return cls(key, CompareTarget.CREATE_REVISION, "==", 0)


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    key: str
    prefix: bool = False


Op = Put | Delete | Get
OpResult = list[KeyValue] | int | None


@dataclass(frozen=True, slots=True)
class TxnResult:
    """``responses`` follow the ops that ran: a Get gives its keys, a Delete how many it
    deleted, a Put None. ``revision`` is the store's revision after the txn (the revision of
    its writes when it wrote)."""

    succeeded: bool
    revision: int
    responses: list[OpResult] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Lease:
    """A granted lease. ``ttl`` is what the store granted (it may raise a request to its
    minimum); ``granted_at_ms`` is the store clock's time just before the grant was asked, so
    ``granted_at_ms + ttl`` is never later than the store's own expiry."""

    id: int
    ttl: int
    granted_at_ms: float


def compare_holds(kv: KeyValue | None, cmp: Compare) -> bool:
    """etcd's comparison of one key against a Compare (for stores that evaluate it here)."""
    if cmp.target is CompareTarget.VALUE:
        if kv is None:
            return False
        actual: int | bytes = kv.value
    elif kv is None:
        actual = 0
    elif cmp.target is CompareTarget.VERSION:
        actual = kv.version
    elif cmp.target is CompareTarget.CREATE_REVISION:
        actual = kv.create_revision
    elif cmp.target is CompareTarget.MOD_REVISION:
        actual = kv.mod_revision
    else:
        actual = kv.lease
    operand = cmp.operand
    if cmp.op == "==":
        return actual == operand
    if cmp.op == "!=":
        return actual != operand
    if cmp.op == "<":
        return actual < operand  # type: ignore[operator]
    return actual > operand  # type: ignore[operator]


def prefix_end(prefix: bytes) -> bytes:
    """The end of etcd's key range for a prefix: the prefix with its last byte incremented
    (trailing 0xff bytes dropped); b"\\0" (every key) for an empty or all-0xff prefix."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"


async def sleep_until(clock: Clock, when_ms: float) -> None:
    """Sleep on ``clock`` (the loop's or a manual one) until ``when_ms``."""
    if when_ms <= clock.time():
        await asyncio.sleep(0)
        return
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    handle = clock.call_at(when_ms, wake)
    try:
        await fut
    finally:
        handle.cancel()


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task of an owner and wait until it has stopped; a failure of the
    task is raised. A cancellation of the caller while it waits goes on to the caller:
    awaiting the task under a suppressed CancelledError would swallow it, and a caller
    stopped that way would carry on as if never asked to stop."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.result()


class WatchStream(ABC):
    """One connection's worth of a watch, as a backend opens it from a start revision."""

    @abstractmethod
    async def next_batch(self) -> list[WatchEvent]:
        """The next events, whole revisions at a time (a txn's events share a revision and
        arrive together). Raises StoreUnavailable when the connection breaks or the stream is
        closed, WatchCompacted when the start revision has been compacted."""

    @abstractmethod
    async def close(self) -> None: ...


class Watch:
    """Every event on a key (or prefix) after a revision, in revision order, with no gaps.

    When the store's connection breaks the watch reopens from the revision after the last
    batch it received (``reconnects`` counts that), at once and then with a bounded backoff on
    the store's clock; when that revision has been compacted it raises ``WatchCompacted``: the
    caller re-lists and watches again from the listing's revision + 1. Use ``async for`` and
    ``close`` (or ``async with``); one consumer at a time.
    """

    def __init__(
        self,
        opener: Callable[[int], Awaitable[WatchStream]],
        start_revision: int,
        clock: Clock,
        *,
        description: str = "",
        min_backoff_ms: float = 50.0,
        max_backoff_ms: float = 1000.0,
    ) -> None:
        if start_revision < 1:
            raise ValueError("a watch starts at a revision >= 1 (list first, then watch)")
        self._opener = opener
        self.clock = clock
        #: Where the stream (re)opens: the revision after the last batch received.
        self.resume_revision = start_revision
        self.reconnects = 0
        self.description = description
        self._min_backoff = min_backoff_ms
        self._max_backoff = max_backoff_ms
        self._backoff = 0.0
        self._stream: WatchStream | None = None
        self._pending: deque[WatchEvent] = deque()
        self._interrupted = False
        self._closed = False

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._pending:
                return self._pending.popleft()
            if self._closed:
                raise StopAsyncIteration
            try:
                if self._stream is None:
                    self._stream = await self._opener(self.resume_revision)
                    if self._closed:
                        await self._drop_stream()
                        raise StopAsyncIteration
                batch = await self._stream.next_batch()
            except StoreUnavailable as e:
                await self._drop_stream()
                if self._closed:
                    raise StopAsyncIteration from None
                await self._back_off(e)
                continue
            except BaseException:
                await self._drop_stream()
                raise
            self._take(batch)

    def _take(self, batch: list[WatchEvent]) -> None:
        if self._interrupted:
            logger.info("metadata watch resumed", watch=self.description,
                     revision=self.resume_revision, reconnects=self.reconnects)
            self._interrupted = False
        self._backoff = 0.0
        fresh = [e for e in batch if e.revision >= self.resume_revision]
        if fresh:
            self.resume_revision = fresh[-1].revision + 1
            self._pending.extend(fresh)

    async def _back_off(self, error: StoreUnavailable) -> None:
        if not self._interrupted:
            logger.warning("metadata watch interrupted, resuming", watch=self.description,
                        revision=self.resume_revision, error=str(error))
            self._interrupted = True
        self.reconnects += 1
        # The first retry is immediate (a broken stream on a live store reopens at once).
        await sleep_until(self.clock, self.clock.time() + self._backoff)
        self._backoff = min(max(self._backoff * 2, self._min_backoff), self._max_backoff)

    async def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                await stream.close()
            except Exception:  # noqa: BLE001 - a broken stream may fail to close; it is gone
                pass

    async def close(self) -> None:
        self._closed = True
        await self._drop_stream()


class MetadataStore(ABC):
    """Keys (``/brokers/ids/1``...), leases, txns and watches: what the controller and the
    brokers of a cluster share. Keys are str paths, values bytes. Every method may raise
    ``StoreUnavailable``; a write that raised it may or may not have been applied."""

    #: The clock the store's leases are measured on (``LeaseKeeper`` uses it too).
    clock: Clock

    @abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abstractmethod
    async def get_prefix(self, prefix: str) -> Listing:
        """Every key starting with ``prefix``, in key order, and the revision read at."""

    @abstractmethod
    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write a key (on a lease when ``lease`` is given); returns the new revision."""

    @abstractmethod
    async def delete(self, key: str) -> bool:
        """Delete one key; False when it did not exist."""

    @abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with ``prefix``; returns how many."""

    @abstractmethod
    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """If every compare holds run ``success``, else ``failure``; atomically."""

    @abstractmethod
    async def grant_lease(self, ttl: int) -> Lease:
        """A new lease of ``ttl`` seconds (the store may raise it to its minimum)."""

    @abstractmethod
    async def refresh_lease(self, lease_id: int) -> int:
        """Keep a lease alive: its TTL in seconds, counted from now; 0 when it is gone."""

    @abstractmethod
    async def revoke_lease(self, lease_id: int) -> bool:
        """Delete the lease and its keys now; False when it was already gone."""

    @abstractmethod
    async def compact(self, revision: int) -> None:
        """Drop the history before ``revision``: watches from older revisions fail."""

    @abstractmethod
    async def _open_watch(self, key: str, prefix: bool, start_revision: int) -> WatchStream: ...

    def watch(self, key: str, *, start_revision: int, prefix: bool = False) -> Watch:
        """Events on ``key`` (or every key under it when ``prefix``) from ``start_revision``."""
        return Watch(
            lambda rev: self._open_watch(key, prefix, rev),
            start_revision,
            self.clock,
            description=f"{key}{'*' if prefix else ''}",
        )

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
