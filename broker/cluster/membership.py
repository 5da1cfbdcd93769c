"""One broker's membership of the cluster: what the server starts in cluster mode, in the
two steps its start-up has (docs/cluster.md, "Wiring it into the broker").

1. ``check_log_dirs`` before the log dirs are loaded: the cluster id (made once in etcd) and
   every dir's meta.properties agree with it and with ``node.id``; an unreachable etcd is a
   ``StartupError`` line, not a traceback.
2. ``register`` once the listeners are bound: the broker's registration, the controller
   election on its lease, and, while this broker is the controller, the liveness view.

``close`` undoes both (the registration's lease revoked, so its keys go at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from broker.cluster.cluster_id import get_or_create_cluster_id
from broker.cluster.controller import ControllerContext, ControllerElection
from broker.cluster.liveness import BrokerChange, BrokerLivenessView
from broker.cluster.meta_properties import check_meta_properties
from broker.cluster.registration import BrokerInfo, BrokerRegistration, RegistrationListener
from broker.cluster.settings import ClusterSettings
from broker.cluster.store import MetadataStore, StoreError, cancel_and_wait, sleep_until
from broker.startup_error import StartupError


def open_etcd_store(settings: ClusterSettings) -> MetadataStore:
    """The etcd store the settings name (imports grpc: only in cluster mode)."""
    from broker.cluster.etcd_store import EtcdStore

    return EtcdStore(settings.endpoint, root=settings.prefix)


class ClusterMembership:
    """This broker in the cluster: registered, running for controller, and, as controller,
    watching which brokers are alive."""

    def __init__(self, settings: ClusterSettings, store: MetadataStore, *,
                 owns_store: bool = True) -> None:
        self.settings = settings
        self.store = store
        self.owns_store = owns_store  # close it on close (not a store shared in one process)
        self.where = (f"etcd {settings.endpoint}{settings.prefix}" if settings.enabled
                      else "the in-process store")
        self.cluster_id: str | None = None
        self.registration: BrokerRegistration | None = None
        self.election: ControllerElection | None = None
        #: The live brokers while this broker is the controller; None otherwise.
        self.liveness: BrokerLivenessView | None = None
        self._on_elected: Callable[[ControllerContext], object] | None = None
        self._on_resigned: Callable[[ControllerContext, str], object] | None = None
        self._on_brokers: Callable[[BrokerChange], object] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # the view's starts and stops

    async def check_log_dirs(self, log_dirs: Sequence[Path]) -> str:
        """The cluster id, after every log dir was found to belong to it and to this node."""
        try:
            self.cluster_id = await get_or_create_cluster_id(self.store)
        except StoreError as e:
            raise StartupError(
                f"the cluster's metadata in {self.where} cannot be read ({e}): check that "
                f"etcd is running and minibroker.etcd.endpoints names it") from None
        check_meta_properties(log_dirs, self.cluster_id, self.settings.node_id,
                              where=self.where)
        return self.cluster_id

    async def register(
        self,
        info: BrokerInfo,
        *,
        listeners: Sequence[RegistrationListener] = (),
        on_elected: Callable[[ControllerContext], object] | None = None,
        on_resigned: Callable[[ControllerContext, str], object] | None = None,
        on_brokers: Callable[[BrokerChange], object] | None = None,
    ) -> int:
        """Register (``NodeIdInUse``, a StartupError, when the id is live elsewhere) and run
        for controller; the broker epoch. ``listeners`` hear of registrations and their loss
        first (the replica manager: stop leading), the election after them."""
        self._on_elected, self._on_resigned, self._on_brokers = on_elected, on_resigned, on_brokers
        registration = BrokerRegistration(
            self.store, info, ttl_s=self.settings.lease_ttl_s,
            heartbeat_interval_ms=self.settings.heartbeat_interval_ms, where=self.where)
        election = ControllerElection(self.store, info.node_id, on_elected=self._elected,
                                      on_resigned=self._resigned)
        for listener in listeners:
            registration.add_listener(listener)
        registration.add_listener(election)
        self.registration, self.election = registration, election
        try:
            return await registration.start()
        except StoreError as e:
            raise StartupError(f"broker {info.node_id} cannot register in {self.where} "
                               f"({e}): check that etcd is running") from None

    def _elected(self, context: ControllerContext) -> None:
        view = self.liveness = BrokerLivenessView(self.store, on_change=self._on_brokers)
        # The view lists, then follows, on its own task: the election loop does not wait.
        self._spawn(self._start_view(view), "broker-liveness-start")
        if self._on_elected is not None:
            self._on_elected(context)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start_view(self, view: BrokerLivenessView) -> None:
        clock = self.store.clock
        while view is self.liveness:
            try:
                await view.start()
                break
            except StoreError:
                await sleep_until(clock, clock.time() + 200)
        if view is not self.liveness:  # resigned meanwhile
            await view.stop()

    def _resigned(self, context: ControllerContext, reason: str) -> None:
        view, self.liveness = self.liveness, None
        if view is not None:
            self._spawn(view.stop(), "broker-liveness-stop")
        if self._on_resigned is not None:
            self._on_resigned(context, reason)

    async def close(self) -> None:
        """Leave the cluster: resign, deregister, close the store."""
        if self.election is not None:
            await self.election.stop()
        view, self.liveness = self.liveness, None
        if view is not None:
            await view.stop()
        for task in list(self._tasks):
            await cancel_and_wait(task)
        if self.registration is not None:
            await self.registration.stop()
        if self.owns_store:
            await self.store.close()
