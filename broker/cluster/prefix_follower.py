"""List a prefix, then follow it (Kubernetes' list-then-watch over ``MetadataStore``): what
every view of the cluster's keys does, the liveness view and the partition-state watcher.

Invariant: a view's state is the keys at ``revision``: the listing's, then each watch event
in revision order; the watch resumes by itself after a reconnect, and when its history has
been compacted the view lists again (retrying while the store cannot be reached), so a
change is never lost, at most merged into the difference a re-list reports.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Self

import structlog

from broker.cluster.store import (
    Listing,
    MetadataStore,
    StoreError,
    StoreUnavailable,
    WatchCompacted,
    WatchEvent,
    cancel_and_wait,
    sleep_until,
)

logger = structlog.get_logger("broker.cluster")


class PrefixFollower(ABC):
    """Keeps a view of the keys under ``prefix`` current; subclasses say what a listing and
    an event change."""

    prefix: str
    description: str

    def __init__(self, store: MetadataStore, *, retry_ms: float = 200.0) -> None:
        self.store = store
        self._retry_ms = retry_ms
        #: The store revision the view is as of.
        self.revision = 0
        self.relists = 0
        self.ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @abstractmethod
    def _listed(self, listing: Listing) -> None:
        """Replace the view with a listing's keys and report the difference."""

    @abstractmethod
    def _changed(self, event: WatchEvent) -> None:
        """Take one watch event in and report what it changed."""

    async def start(self) -> Self:
        """List (so the view is filled on return), then follow changes. A view started
        before resumes from the revision it had reached: what changed while it was stopped
        comes from the watch, or from a re-list when that history has been compacted."""
        if not self.ready.is_set():
            await self._relist()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.description)
        return self

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _relist(self) -> None:
        listing = await self.store.get_prefix(self.prefix)
        self.relists += 1
        self._listed(listing)
        self.revision = listing.revision
        self.ready.set()

    async def _run(self) -> None:
        while True:
            try:
                await self._follow()
            except WatchCompacted as e:
                logger.info("watch compacted, re-listing", view=self.description,
                            revision=e.compact_revision)
            except StoreUnavailable:
                pass  # the watch resumes by itself; only opening it can end up here
            except StoreError as e:
                logger.warning("watch failed, re-listing", view=self.description, error=str(e))
            while True:
                try:
                    await self._relist()
                    break
                except StoreError:
                    clock = self.store.clock
                    await sleep_until(clock, clock.time() + self._retry_ms)

    async def _follow(self) -> None:
        async with self.store.watch(self.prefix, prefix=True,
                                    start_revision=self.revision + 1) as watch:
            async for event in watch:
                self._changed(event)
                self.revision = event.revision
