"""Fixtures for the metadata store's contract tests: a real etcd, and the in-process store.

``etcd_server`` is one etcd per test session (tmpfs data dir, ephemeral loopback ports); each
test gets its own key root in it, so tests never see each other's keys. ``own_etcd`` is an
etcd for one test, for tests that stop, restart or compact it. ``backend`` / ``own_backend``
give the same test a store of each kind plus the means to let time pass and to take the store
away and bring it back; for the in-process store time is a manual clock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from broker.cluster.etcd_process import EtcdNotFound, EtcdProcess
from broker.cluster.memory import InMemoryStore
from broker.cluster.store import MetadataStore, Watch, WatchEvent
from purgatory.clock import ManualClock

# Manual time moves in steps this long, with loop turns between them so that tasks woken by
# the clock (lease keepers, expiry) run at about the time they were due.
STEP_MS = 10.0
TURNS_PER_STEP = 4


def _start_etcd() -> EtcdProcess:
    try:
        return EtcdProcess().start()
    except EtcdNotFound as e:
        pytest.fail(f"the cluster tests need a real etcd: {e}")


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdProcess]:
    etcd = _start_etcd()
    yield etcd
    etcd.close()


@pytest.fixture
def own_etcd() -> Iterator[EtcdProcess]:
    etcd = _start_etcd()
    yield etcd
    etcd.close()


class Backend:
    """A store under test and the world around it."""

    name: str
    store: MetadataStore

    async def sleep(self, seconds: float) -> None:
        raise NotImplementedError

    async def new_client(self) -> MetadataStore:
        """Another client of the same store (a second broker)."""
        raise NotImplementedError

    async def take_down(self) -> None:
        """The store becomes unreachable (etcd stopped)."""
        raise NotImplementedError

    async def bring_back(self) -> None:
        """The same store is back, with its data (etcd started on the same ports and dir)."""
        raise NotImplementedError

    async def eventually(
        self, check: Callable[[], Awaitable[bool] | bool], within_s: float, step_s: float = 0.05
    ) -> bool:
        """True as soon as ``check`` holds, False when it has not within ``within_s`` of the
        store's time."""
        waited = 0.0
        while True:
            held = check()
            if not isinstance(held, bool):
                held = await held
            if held:
                return True
            if waited >= within_s:
                return False
            await self.sleep(step_s)
            waited += step_s

    async def take(self, watch: Watch, n: int, within_s: float = 5.0) -> list[WatchEvent]:
        """The watch's next ``n`` events, letting the store's time run meanwhile."""

        async def collect() -> list[WatchEvent]:
            return [await anext(watch) for _ in range(n)]

        task = asyncio.create_task(collect())
        try:
            if not await self.eventually(task.done, within_s, step_s=0.01):
                raise AssertionError(f"fewer than {n} watch events within {within_s} s")
            return task.result()
        finally:
            task.cancel()

    async def close(self) -> None:
        await self.store.close()


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self) -> None:
        self.clock = ManualClock(run_due_soon=True)
        self.memory = InMemoryStore(self.clock)
        self.store = self.memory

    async def sleep(self, seconds: float) -> None:
        end = self.clock.time() + seconds * 1000.0
        while self.clock.time() < end:
            self.clock.advance(min(STEP_MS, end - self.clock.time()))
            for _ in range(TURNS_PER_STEP):
                await asyncio.sleep(0)

    async def new_client(self) -> MetadataStore:
        return self.memory

    async def take_down(self) -> None:
        self.memory.set_reachable(False)

    async def bring_back(self) -> None:
        self.memory.set_reachable(True)

    async def close(self) -> None:
        await self.memory.close()


class EtcdBackend(Backend):
    name = "etcd"

    def __init__(self, etcd: EtcdProcess, root: str) -> None:
        from broker.cluster.etcd_store import EtcdStore

        self.etcd = etcd
        self.root = root
        self._make = lambda: EtcdStore(etcd.endpoint, root=root, request_timeout=2.0)
        self.store = self._make()
        self.clients: list[MetadataStore] = [self.store]

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def new_client(self) -> MetadataStore:
        client = self._make()
        self.clients.append(client)
        return client

    async def take_down(self) -> None:
        # In a thread: the loop keeps running (keepalives, watches) while etcd stops.
        await asyncio.to_thread(self.etcd.stop)

    async def bring_back(self) -> None:
        await asyncio.to_thread(self.etcd.start)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


def _root() -> str:
    return f"/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["memory", "etcd"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """A store of each kind; etcd is the session's (do not stop it)."""
    if request.param == "memory":
        b: Backend = MemoryBackend()
    else:
        b = EtcdBackend(request.getfixturevalue("etcd_server"), _root())
    yield b
    await b.close()


@pytest.fixture(params=["memory", "etcd"])
async def own_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    """A store of each kind that the test may take down and bring back."""
    if request.param == "memory":
        b: Backend = MemoryBackend()
    else:
        b = EtcdBackend(request.getfixturevalue("own_etcd"), _root())
    yield b
    await b.close()
