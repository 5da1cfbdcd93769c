"""A broker's registration: ``/brokers/ids/<node.id>`` on the broker's lease (Kafka's
ephemeral broker znode, KafkaZkClient.registerBroker).

Invariants:
- At most one live registration per node id: the key is created only if absent, so a second
  broker with a live node id fails to start (``NodeIdInUse``) and changes nothing.
- The **broker epoch** is the revision that created the key (Kafka used the znode's czxid):
  it grows with every registration, so a restarted or re-registered broker is told apart from
  its earlier self by everyone who compares epochs.
- A lease loss is reported at once, before anything else happens (``broker_lost`` of every
  listener: the replica manager stops leading, the controller resigns), then the broker
  registers again with a new lease and a new epoch (``broker_registered``), retrying while
  etcd cannot be reached. If meanwhile another live broker took the node id, that is reported
  (``failed``) and the registration stops: serving under a taken id would be two brokers in
  one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from broker.cluster.lease_keeper import LeaseKeeper
from broker.cluster.paths import broker_key
from broker.cluster.store import (
    Compare,
    Get,
    KeyValue,
    Lease,
    MetadataStore,
    Put,
    StoreError,
    StoreUnavailable,
    cancel_and_wait,
    sleep_until,
)
from broker.startup_error import StartupError

logger = structlog.get_logger("broker.cluster")


class NodeIdInUse(StartupError):
    """Another live broker holds this node id's registration."""


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """What a broker registers (Kafka's BrokerIdZNode, version 5): its advertised endpoint of
    each listener, each listener's security protocol, its rack."""

    node_id: int
    endpoints: Mapping[str, tuple[str, int]]  # listener name -> advertised (host, port)
    security_protocols: Mapping[str, str] = field(default_factory=dict)
    rack: str | None = None

    def encode(self, timestamp_ms: int) -> bytes:
        doc: dict[str, object] = {
            "version": 5,
            # host/port: the PLAINTEXT listener's, for readers of version 1 (Kafka's rule).
            "host": None,
            "port": -1,
            "jmx_port": -1,
            "timestamp": str(timestamp_ms),
            "endpoints": [f"{name}://{_host(h)}:{p}" for name, (h, p) in self.endpoints.items()],
            "listener_security_protocol_map": {
                name: self.security_protocols.get(name, name) for name in self.endpoints},
        }
        for name, (host, port) in self.endpoints.items():
            if self.security_protocols.get(name, name) == "PLAINTEXT":
                doc["host"], doc["port"] = host, port
                break
        if self.rack is not None:
            doc["rack"] = self.rack
        return json.dumps(doc).encode()

    @classmethod
    def decode(cls, node_id: int, data: bytes) -> BrokerInfo:
        try:
            doc = json.loads(data)
            endpoints: dict[str, tuple[str, int]] = {}
            for text in doc["endpoints"]:
                name, _, address = text.partition("://")
                host, _, port = address.rpartition(":")
                endpoints[name] = (host.removeprefix("[").removesuffix("]"), int(port))
            protocols = dict(doc.get("listener_security_protocol_map") or {})
            return cls(node_id, endpoints, protocols, doc.get("rack"))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StoreError(f"broker {node_id}'s registration cannot be read ({e!r}): "
                             f"{data[:200]!r}") from None


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True, slots=True)
class RegisteredBroker:
    """A live broker as the cluster sees it: what it registered and its epoch."""

    info: BrokerInfo
    epoch: int

    @classmethod
    def from_kv(cls, node_id: int, kv: KeyValue) -> RegisteredBroker:
        return cls(BrokerInfo.decode(node_id, kv.value), kv.create_revision)


class RegistrationListener(Protocol):
    def broker_registered(self, epoch: int, lease: Lease) -> object:
        """Registered (again) with ``epoch``; keys of this broker go on ``lease``."""

    def broker_lost(self, epoch: int, reason: str) -> object:
        """The registration of ``epoch`` is gone or may be: stop acting on it now."""


class BrokerRegistration:
    """Keeps ``/brokers/ids/<id>`` registered on a kept-alive lease."""

    def __init__(
        self,
        store: MetadataStore,
        info: BrokerInfo,
        *,
        ttl_s: int,
        heartbeat_interval_ms: float | None = None,
        where: str = "etcd",
        retry_min_ms: float = 100.0,
        retry_max_ms: float = 2000.0,
    ) -> None:
        self.store = store
        self.info = info
        self.key = broker_key(info.node_id)
        self.ttl_s = ttl_s
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.where = where
        self._retry_min_ms = retry_min_ms
        self._retry_max_ms = retry_max_ms
        self._listeners: list[RegistrationListener] = []
        #: The current registration's epoch; None while not registered.
        self.epoch: int | None = None
        self.lease: Lease | None = None
        self.keeper: LeaseKeeper | None = None
        self.registrations = 0
        self.registered = asyncio.Event()
        #: Set when another broker took the node id while this one was re-registering: the
        #: broker must shut down (``failed`` says why).
        self.taken = asyncio.Event()
        self.failed: NodeIdInUse | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        #: Leases of ours that may still hold the key (a lost one, an attempt whose answer
        #: never came): revoked before the next attempt, never taken for another broker's.
        self._orphans: set[int] = set()

    def add_listener(self, listener: RegistrationListener) -> None:
        self._listeners.append(listener)
        if self.epoch is not None and self.lease is not None:
            listener.broker_registered(self.epoch, self.lease)

    async def start(self) -> int:
        """Register; the broker epoch. ``NodeIdInUse`` when a live broker has the id."""
        got = await self._register()
        if not isinstance(got, int) and got.lease in self._orphans:
            # The key is on a lease of an earlier attempt of ours (a start that failed
            # without knowing whether its write landed): free it and go again.
            await self._clear_orphans()
            got = await self._register()
        if isinstance(got, int):
            return got
        raise self._conflict(got)

    async def stop(self) -> None:
        """Deregister (revoke the lease: the key goes at once, as a closed ZooKeeper session
        removed its ephemeral nodes)."""
        self._stopped = True
        task, self._task = self._task, None
        await cancel_and_wait(task)
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            await keeper.stop(revoke=True)
        for lease_id in sorted(self._orphans):
            await self._revoke(lease_id)
        self.epoch = None
        self.registered.clear()

    async def _register(self) -> int | KeyValue:
        """One attempt: a new lease and the key created on it. The epoch, or the key that
        exists already (read in the same txn)."""
        lease = await self.store.grant_lease(self.ttl_s)
        # Until the txn's answer is known the key may be on this lease: an orphan to revoke.
        self._orphans.add(lease.id)
        try:
            value = self.info.encode(self.store.clock.wall_ms())
            result = await self.store.txn(
                [Compare.absent(self.key)], [Put(self.key, value, lease.id)], [Get(self.key)])
        except BaseException:
            await self._revoke(lease.id)
            raise
        if not result.succeeded:
            await self._revoke(lease.id)
            existing = result.responses[0]
            assert isinstance(existing, list) and existing, "a failed create reads the key"
            return existing[0]
        self._orphans.discard(lease.id)
        self.lease, self.epoch = lease, result.revision
        self.registrations += 1
        self.keeper = LeaseKeeper(self.store, lease, on_lost=self._lost,
                                  interval_ms=self.heartbeat_interval_ms).start()
        self.registered.set()
        logger.info("broker registered", node_id=self.info.node_id, epoch=self.epoch,
                    lease=f"{lease.id:x}")
        for listener in list(self._listeners):
            listener.broker_registered(result.revision, lease)
        return result.revision

    async def _revoke(self, lease_id: int) -> None:
        """Best effort: a lease that cannot be revoked now stays an orphan for later."""
        with contextlib.suppress(StoreError):
            await self.store.revoke_lease(lease_id)
            self._orphans.discard(lease_id)

    async def _clear_orphans(self) -> None:
        """Revoke every lease of ours that may still hold the key (raises when the store
        cannot be reached)."""
        for lease_id in sorted(self._orphans):
            await self.store.revoke_lease(lease_id)
            self._orphans.discard(lease_id)

    def _conflict(self, kv: KeyValue) -> NodeIdInUse:
        holder = ""
        with contextlib.suppress(StoreError):
            endpoints = BrokerInfo.decode(self.info.node_id, kv.value).endpoints
            holder = " at " + ", ".join(f"{n}://{_host(h)}:{p}" for n, (h, p) in endpoints.items())
        return NodeIdInUse(
            f"node.id {self.info.node_id} is registered by another live broker{holder} in "
            f"{self.where} (key {broker_key(self.info.node_id)}): give this broker another "
            f"node.id, or stop the other one (its registration goes within "
            f"broker.session.timeout.ms)")

    def _lost(self, reason: str) -> None:
        """The keeper's report: tell every listener now, then register again."""
        epoch, self.epoch = self.epoch, None
        self.registered.clear()
        if self.lease is not None:
            # The keeper may give up before etcd expires the lease (it could not reach etcd):
            # revoke it before registering again, rather than wait a TTL for the key to go.
            self._orphans.add(self.lease.id)
        if epoch is not None:
            logger.warning("broker registration lost", node_id=self.info.node_id, epoch=epoch,
                           reason=reason)
            for listener in list(self._listeners):
                try:
                    listener.broker_lost(epoch, reason)
                except Exception:  # one listener's failure must not keep the others unaware
                    logger.exception("registration-lost listener failed")
        if not self._stopped and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._reregister(), name=f"broker-{self.info.node_id}-reregister")

    async def _reregister(self) -> None:
        backoff = self._retry_min_ms
        try:
            while not self._stopped:
                try:
                    await self._clear_orphans()
                    got = await self._register()
                    if isinstance(got, int):
                        return
                    if got.lease not in self._orphans:
                        self.failed = self._conflict(got)
                        self.taken.set()
                        logger.error("broker registration taken", error=str(self.failed))
                        return
                except StoreUnavailable as e:
                    logger.info("re-registration waiting for the store", error=str(e))
                except StoreError as e:
                    logger.warning("re-registration failed, retrying", error=str(e))
                clock = self.store.clock
                await sleep_until(clock, clock.time() + backoff)
                backoff = min(backoff * 2, self._retry_max_ms)
        finally:
            self._task = None
