"""The metadata store on etcd (v3 API, etcd 3.4+), through aetcd.

aetcd gives the gRPC channel, the generated etcd stubs and messages, and authentication; the
requests are made on its stubs directly so every answer keeps etcd's response header (the
revision a read was served at, the revision a txn wrote). Watches are one gRPC stream each,
read a response (whole revisions) at a time, which is what resuming without gaps needs; a
compacted start revision ends the stream with ``WatchCompacted``.

``root`` is a key prefix under which the whole cluster lives (Kafka's ZooKeeper chroot,
``zookeeper.connect=host:port/kafka``): several clusters, or several tests, can share one etcd.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aetcd
import grpc
from aetcd import rpc

from broker.cluster.store import (
    Compare,
    CompareTarget,
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
    prefix_end,
)
from purgatory.clock import LoopClock

_TARGETS = {
    CompareTarget.VERSION: rpc.Compare.VERSION,
    CompareTarget.CREATE_REVISION: rpc.Compare.CREATE,
    CompareTarget.MOD_REVISION: rpc.Compare.MOD,
    CompareTarget.VALUE: rpc.Compare.VALUE,
    CompareTarget.LEASE: rpc.Compare.LEASE,
}
_RESULTS = {
    "==": rpc.Compare.EQUAL,
    "!=": rpc.Compare.NOT_EQUAL,
    "<": rpc.Compare.LESS,
    ">": rpc.Compare.GREATER,
}
_OPERAND_FIELD = {
    CompareTarget.VERSION: "version",
    CompareTarget.CREATE_REVISION: "create_revision",
    CompareTarget.MOD_REVISION: "mod_revision",
    CompareTarget.VALUE: "value",
    CompareTarget.LEASE: "lease",
}
# Codes that mean "etcd could not be reached or could not answer in time": retry later.
_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}

# gRPC's reconnect backoff would otherwise grow to two minutes while etcd is down; a broker
# wants to be back within a second of etcd. Keepalive pings find a dead connection (a host
# that vanished without closing its sockets); etcd refuses pings more often than every 5 s.
CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}


def _error(e: grpc.aio.AioRpcError) -> StoreError | asyncio.CancelledError:
    """The store's error for a failed call; a call gRPC cancelled because its task is being
    cancelled stays a cancellation (as StoreUnavailable a retry loop would swallow it, and
    its owner's stop would wait forever)."""
    task = asyncio.current_task()
    if e.code() == grpc.StatusCode.CANCELLED and task is not None and task.cancelling():
        return asyncio.CancelledError()
    details = e.details() or e.code().name
    if e.code() in _UNAVAILABLE:
        return StoreUnavailable(details)
    if "lease not found" in details:
        return LeaseNotFound(details)
    return StoreError(details)


class EtcdStore(MetadataStore):
    """A MetadataStore on one etcd endpoint (``host:port``).

    A request waits up to ``request_timeout`` for etcd to be reachable (gRPC's wait-for-ready:
    a reconnect after a short outage is not an error), then raises StoreUnavailable. Make it
    on the loop that uses it (gRPC's channel and the store's clock belong to that loop).
    """

    def __init__(
        self,
        endpoint: str = "127.0.0.1:2379",
        *,
        root: str = "",
        request_timeout: float = 5.0,
        page_size: int = 1000,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        host, _, port = endpoint.rpartition(":")
        self.endpoint = endpoint
        self.root = root.rstrip("/")
        self.request_timeout = request_timeout
        self.page_size = page_size
        self._client = aetcd.Client(
            host=host or "127.0.0.1",
            port=int(port),
            username=username,
            password=password,
            timeout=request_timeout,
            options=dict(CHANNEL_OPTIONS),
        )
        self._connected = False
        self._watch_stub: Any = None
        self.clock = LoopClock(asyncio.get_running_loop())
        #: A test's fault hook (broker.testing.cluster): called before every request and on
        #: every watch response; it raises StoreUnavailable while etcd is "unreachable".
        self.fault: Callable[[], None] | None = None

    async def connect(self) -> EtcdStore:
        """Open the channel (no round trip: gRPC connects on the first request)."""
        if self.fault is not None:
            self.fault()
        if not self._connected:
            try:
                await self._client.connect()
            except aetcd.ClientError as e:
                raise StoreUnavailable(str(e)) from e
            self._watch_stub = rpc.WatchStub(self._client.channel)
            self._connected = True
        return self

    async def close(self) -> None:
        if self._connected:
            self._connected = False
            await self._client.close()

    # -- keys -----------------------------------------------------------------------------

    def _key(self, key: str) -> bytes:
        if self.root and not key.startswith("/"):
            # "/a" + "b" would reach into a sibling root "/ab".
            raise ValueError(f"keys under a root are absolute paths: {key!r}")
        return (self.root + key).encode()

    def _unkey(self, raw: bytes) -> str:
        return raw.decode()[len(self.root) :]

    def _kv(self, kv: Any) -> KeyValue:
        return KeyValue(
            self._unkey(kv.key),
            bytes(kv.value),
            kv.create_revision,
            kv.mod_revision,
            kv.version,
            kv.lease,
        )

    def _range_request(self, key: str, prefix: bool) -> Any:
        raw = self._key(key)
        if prefix:
            return rpc.RangeRequest(key=raw, range_end=prefix_end(raw))
        return rpc.RangeRequest(key=raw)

    def _delete_request(self, key: str, prefix: bool) -> Any:
        raw = self._key(key)
        if prefix:
            return rpc.DeleteRangeRequest(key=raw, range_end=prefix_end(raw))
        return rpc.DeleteRangeRequest(key=raw)

    async def _call(self, stub: str, method: str, request: Any) -> Any:
        await self.connect()
        fn = getattr(getattr(self._client, stub), method)
        try:
            return await fn(
                request,
                timeout=self.request_timeout,
                metadata=self._client.metadata,
                wait_for_ready=True,
            )
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None

    # -- reads and writes -----------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        resp = await self._call("kvstub", "Range", self._range_request(key, False))
        return self._kv(resp.kvs[0]) if resp.kvs else None

    async def get_prefix(self, prefix: str) -> Listing:
        """Read in pages of ``page_size`` keys, every page at the first page's revision: one
        consistent snapshot however many keys (a single response is capped by gRPC's message
        size), that the watch from ``revision + 1`` continues."""
        raw = self._key(prefix)
        end = prefix_end(raw)
        kvs: list[KeyValue] = []
        start, revision = raw, 0
        while True:
            request = rpc.RangeRequest(
                key=start, range_end=end, limit=self.page_size, revision=revision
            )
            resp = await self._call("kvstub", "Range", request)
            if not revision:
                revision = resp.header.revision
            kvs.extend(self._kv(kv) for kv in resp.kvs)
            if not resp.more or not resp.kvs:
                return Listing(kvs, revision)
            start = bytes(resp.kvs[-1].key) + b"\0"

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        request = rpc.PutRequest(key=self._key(key), value=value, lease=lease)
        return (await self._call("kvstub", "Put", request)).header.revision

    async def delete(self, key: str) -> bool:
        resp = await self._call("kvstub", "DeleteRange", self._delete_request(key, False))
        return resp.deleted > 0

    async def delete_prefix(self, prefix: str) -> int:
        resp = await self._call("kvstub", "DeleteRange", self._delete_request(prefix, True))
        return int(resp.deleted)

    def _compare(self, cmp: Compare) -> Any:
        message = rpc.Compare(
            key=self._key(cmp.key), target=_TARGETS[cmp.target], result=_RESULTS[cmp.op]
        )
        setattr(message, _OPERAND_FIELD[cmp.target], cmp.operand)
        return message

    def _op(self, op: Op) -> Any:
        if isinstance(op, Put):
            put = rpc.PutRequest(key=self._key(op.key), value=op.value, lease=op.lease)
            return rpc.RequestOp(request_put=put)
        if isinstance(op, Delete):
            return rpc.RequestOp(request_delete_range=self._delete_request(op.key, op.prefix))
        assert isinstance(op, Get)
        return rpc.RequestOp(request_range=self._range_request(op.key, op.prefix))

    def _op_result(self, response: Any) -> OpResult:
        kind = response.WhichOneof("response")
        if kind == "response_range":
            return [self._kv(kv) for kv in response.response_range.kvs]
        if kind == "response_delete_range":
            return int(response.response_delete_range.deleted)
        return None

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        request = rpc.TxnRequest(
            compare=[self._compare(c) for c in compares],
            success=[self._op(op) for op in success],
            failure=[self._op(op) for op in failure],
        )
        resp = await self._call("kvstub", "Txn", request)
        return TxnResult(
            resp.succeeded,
            resp.header.revision,
            [self._op_result(r) for r in resp.responses],
        )

    async def compact(self, revision: int) -> None:
        # physical: answer once the history is gone, so a watch made after this fails.
        request = rpc.CompactionRequest(revision=revision, physical=True)
        await self._call("kvstub", "Compact", request)

    # -- leases ---------------------------------------------------------------------------

    async def grant_lease(self, ttl: int) -> Lease:
        granted_at = self.clock.time()
        resp = await self._call("leasestub", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl, ID=0))
        if resp.error:
            raise StoreError(resp.error)
        return Lease(resp.ID, resp.TTL, granted_at)

    async def refresh_lease(self, lease_id: int) -> int:
        """One KeepAlive round trip on its own stream (the keeper paces them)."""
        await self.connect()
        call = self._client.leasestub.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
            timeout=self.request_timeout,
            metadata=self._client.metadata,
            wait_for_ready=True,
        )
        try:
            resp = await call.read()
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None
        finally:
            call.cancel()
        if resp is grpc.aio.EOF:
            raise StoreUnavailable("lease keepalive stream closed without an answer")
        return max(int(resp.TTL), 0)

    async def revoke_lease(self, lease_id: int) -> bool:
        try:
            await self._call("leasestub", "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id))
        except LeaseNotFound:
            return False
        return True

    async def lease_time_to_live(self, lease_id: int) -> tuple[int, list[str]]:
        """The lease's remaining TTL (-1 when gone) and its keys, as etcd reports them."""
        resp = await self._call(
            "leasestub", "LeaseTimeToLive", rpc.LeaseTimeToLiveRequest(ID=lease_id, keys=True)
        )
        return int(resp.TTL), [self._unkey(k) for k in resp.keys]

    # -- watches --------------------------------------------------------------------------

    async def _open_watch(self, key: str, prefix: bool, start_revision: int) -> WatchStream:
        await self.connect()
        raw = self._key(key)
        create = rpc.WatchCreateRequest(key=raw, start_revision=start_revision)
        if prefix:
            create.range_end = prefix_end(raw)
        stream = _EtcdWatchStream(self, rpc.WatchRequest(create_request=create))
        await stream.open()
        return stream


class _EtcdWatchStream(WatchStream):
    """One etcd watch on its own gRPC stream."""

    def __init__(self, store: EtcdStore, create: Any) -> None:
        self.store = store
        self._create = create
        self._done = asyncio.Event()
        self._call: Any = None
        self._closed = False

    async def _requests(self) -> AsyncIterator[Any]:
        yield self._create
        await self._done.wait()  # half-closing the stream would end the watch

    async def open(self) -> None:
        self._call = self.store._watch_stub.Watch(
            self._requests(), metadata=self.store._client.metadata, wait_for_ready=True
        )
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation
            # that arrives as the read completes, and the watch would then outlive its owner.
            async with asyncio.timeout(self.store.request_timeout):
                created = await self._read()
        except TimeoutError:
            await self.close()
            raise StoreUnavailable("etcd did not answer the watch request in time") from None
        except BaseException:
            await self.close()
            raise
        if not created.created:
            await self.close()
            raise StoreError(f"unexpected first watch response: {created}")
        if created.canceled:
            await self.close()
            raise StoreError(f"watch refused: {created.cancel_reason}")

    async def _read(self) -> Any:
        try:
            resp = await self._call.read()
        except grpc.aio.AioRpcError as e:
            raise _error(e) from None
        except asyncio.CancelledError:
            if self._closed:
                raise StoreUnavailable("watch closed") from None
            raise
        if resp is grpc.aio.EOF:
            raise StoreUnavailable("watch stream ended")
        if self.store.fault is not None:
            self.store.fault()
        if resp.compact_revision:
            raise WatchCompacted(resp.compact_revision)
        return resp

    async def next_batch(self) -> list[WatchEvent]:
        if self._closed:
            raise StoreUnavailable("watch closed")
        while True:
            resp = await self._read()
            if resp.canceled:
                raise StoreUnavailable(f"watch canceled by etcd: {resp.cancel_reason}")
            if resp.events:
                return [self._event(e) for e in resp.events]
            # A response without events is a progress notification: read on.

    def _event(self, event: Any) -> WatchEvent:
        kv = event.kv
        if event.type == rpc.Event.DELETE:
            key = self.store._unkey(kv.key)
            return WatchEvent(EventType.DELETE, KeyValue(key, b"", 0, kv.mod_revision, 0, 0))
        return WatchEvent(EventType.PUT, self.store._kv(kv))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._done.set()
        if self._call is not None:
            self._call.cancel()
