"""Keeping a lease alive: the broker's side of a ZooKeeper session.

An ephemeral znode lived as long as its ZooKeeper session; a key on an etcd lease lives as long
as someone refreshes the lease within its TTL. ``LeaseKeeper`` refreshes at a third of the TTL
(two refreshes may fail before the lease is in danger) and decides on its own clock when the
lease must be taken as lost: ``ttl`` after the last refresh that was *sent* and answered. That
moment is never later than the store's expiry (the store counts from when it received the
refresh), so an owner that stops acting as controller or broker when told the lease is lost has
stopped before another process can take its keys over.

Loss is reported once, through ``on_lost`` and the ``lost`` event: when the store answers that
the lease is gone (TTL 0: it expired or was revoked), or when no refresh got through for a TTL.
The keeper then stops; the owner grants a new lease and re-registers (what Kafka's brokers did
after a ZooKeeper session expired).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from broker.cluster.store import (
    Lease,
    MetadataStore,
    StoreError,
    cancel_and_wait,
    sleep_until,
)
from purgatory.clock import Clock

logger = structlog.get_logger("broker.cluster")

#: How a loss for want of a refresh (the store could not be reached for a TTL) is worded:
#: the store may be down for everyone and the lease still alive in it (etcd renews every
#: lease when it comes back), unlike a loss the store itself reported.
UNREACHABLE_LOSS = "no refresh answered for the lease's TTL"


def lost_unreachable(reason: str) -> bool:
    """Whether a loss was reported because the store could not be reached (not because the
    store said the lease is gone)."""
    return reason.startswith(UNREACHABLE_LOSS)


#: Retry a failed refresh this often (as a fraction of the TTL), at least every RETRY_MIN_MS.
RETRY_FRACTION = 0.1
RETRY_MIN_MS = 50.0


class LeaseKeeper:
    """Refreshes one lease every ttl/3 (or ``interval_ms`` when sooner) until stopped or lost."""

    def __init__(
        self,
        store: MetadataStore,
        lease: Lease,
        *,
        on_lost: Callable[[str], object] | None = None,
        clock: Clock | None = None,
        interval_ms: float | None = None,
    ) -> None:
        self.store = store
        #: Refresh at least this often (``broker.heartbeat.interval.ms``); ttl/3 when sooner.
        self.interval_ms = interval_ms
        self.lease = lease
        self.clock = clock or store.clock
        self.on_lost = on_lost
        self.ttl_ms = lease.ttl * 1000.0
        #: Clock time of the sending of the last refresh that was answered (or of the grant).
        self.last_refreshed_ms = lease.granted_at_ms
        self.refreshes = 0
        self.failed_refreshes = 0
        self.lost = asyncio.Event()
        self.lost_reason: str | None = None
        self._failing = False
        self._task: asyncio.Task[None] | None = None

    @property
    def expires_at_ms(self) -> float:
        """The latest moment the lease is known to be alive, on ``clock``."""
        return self.last_refreshed_ms + self.ttl_ms

    def alive(self) -> bool:
        """Still safe to act as the lease's owner (not lost, not past ``expires_at_ms``)."""
        return not self.lost.is_set() and self.clock.time() < self.expires_at_ms

    def start(self) -> LeaseKeeper:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"lease-keeper-{self.lease.id:x}"
            )
        return self

    async def stop(self, *, revoke: bool = False) -> None:
        """Stop refreshing; with ``revoke`` the lease and its keys go at once (a clean shutdown,
        as closing a ZooKeeper session removed its ephemeral nodes)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if revoke and not self.lost.is_set():
            with contextlib.suppress(StoreError):
                await self.store.revoke_lease(self.lease.id)

    async def __aenter__(self) -> LeaseKeeper:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(revoke=True)

    async def _run(self) -> None:
        try:
            await self._keep()
        except Exception as e:  # the owner must hear of it, or it would act on a dead lease
            logger.exception("lease keeper failed", lease=f"{self.lease.id:x}")
            self._lose(f"the lease keeper failed: {e!r}")

    def _period(self) -> float:
        third = self.ttl_ms / 3
        return min(third, self.interval_ms) if self.interval_ms else third

    async def _keep(self) -> None:
        next_at = self.last_refreshed_ms + self._period()
        while True:
            await sleep_until(self.clock, next_at)
            now = self.clock.time()
            if now >= self.expires_at_ms:
                self._lose(f"{UNREACHABLE_LOSS} of {self.lease.ttl} s")
                return
            ttl = await self._refresh(now)
            if ttl is None:
                retry = max(self.ttl_ms * RETRY_FRACTION, RETRY_MIN_MS)
                next_at = min(self.clock.time() + retry, self.expires_at_ms)
                continue
            if ttl <= 0:
                self._lose("the store no longer has the lease (expired or revoked)")
                return
            self.ttl_ms = ttl * 1000.0
            self.last_refreshed_ms = now
            next_at = now + self._period()

    async def _refresh(self, sent_ms: float) -> int | None:
        """The store's answer (the TTL, 0 when gone), or None when it could not be reached in
        the time the lease has left."""
        budget_s = max((self.expires_at_ms - sent_ms) / 1000.0, 0.001)
        try:
            async with asyncio.timeout(budget_s):
                ttl = await self.store.refresh_lease(self.lease.id)
        except (StoreError, TimeoutError) as e:  # unreachable, or refused: retry till expiry
            self.failed_refreshes += 1
            if not self._failing:
                logger.warning("lease refresh failed, retrying", lease=f"{self.lease.id:x}",
                            error=str(e) or type(e).__name__)
                self._failing = True
            return None
        if self._failing:
            logger.info("lease refresh recovered", lease=f"{self.lease.id:x}")
            self._failing = False
        self.refreshes += 1
        return ttl

    def _lose(self, reason: str) -> None:
        self.lost_reason = reason
        self.lost.set()
        logger.warning("lease lost", lease=f"{self.lease.id:x}", reason=reason)
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:  # the owner's handler must not kill the keeper's report
                logger.exception("lease-lost handler failed", lease=f"{self.lease.id:x}")
