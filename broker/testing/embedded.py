"""EmbeddedBroker: a real mini-broker inside the test process, on an ephemeral port.

Two ways to run it:

- ``with EmbeddedBroker() as b:`` runs the broker's event loop (uvloop) on a background
  thread, for synchronous clients (confluent-kafka, kafka-python); every method is called from
  the test's thread and waits for the loop;
- ``async with EmbeddedBroker() as b:`` runs it in the caller's running loop, for asyncio
  clients (aiokafka); use the ``*_async`` methods there.

It is the broker the CLI runs (broker.server.Broker), with test-friendly defaults (an
ephemeral port on 127.0.0.1, metrics off, no initial rebalance delay, one partition for the
internal topics) that any keyword argument overrides. ``stop`` shuts down cleanly, ``kill``
crashes (no flush, no clean-shutdown marker) so the next ``start`` runs recovery, and
``restart`` keeps the port so clients keep their bootstrap address. ``clock="manual"`` puts
broker time in the test's hands (``advance``); fault injection comes from broker.testing.faults.

The embedded broker never touches the process's GC settings, nor a logging set up by the
process: structlog prints as the process configured it; left unconfigured, structlog is sent
to the standard logging module (broker.logging.to_standard_logging), so the broker's lines
are filtered by level there (pytest shows WARNING and above, of a failed test, by default).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from broker.config import BrokerConfig
from broker.log.manager import CLEAN_SHUTDOWN_FILE
from broker.logging import to_standard_logging
from broker.server import Broker
from broker.testing.faults import Fault, Faults
from purgatory import ManualClock

T = TypeVar("T")

#: What an embedded broker changes from the broker's defaults (Kafka's own test harness makes
#: the same choices): a group's first rebalance does not wait 3 s for more members, and the
#: internal topics have one partition each instead of 50.
TEST_DEFAULTS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    "metrics.listener": "",
}

START_TIMEOUT_S = 30.0


def property_name(key: str) -> str:
    """A keyword argument as a server.properties key: ``num_partitions`` -> ``num.partitions``;
    a key with a dot is taken as it is (``**{"log.retention.ms": "1000"}``)."""
    return key if "." in key else key.replace("_", ".")


class EmbeddedBroker:
    """A broker for tests: ``EmbeddedBroker(**server_properties)`` (see module docstring)."""

    def __init__(self, data_dir: str | Path | None = None, *, clock: str = "real",
                 **server_properties: Any) -> None:
        if clock not in ("real", "manual"):
            raise ValueError(f"clock must be 'real' or 'manual', not {clock!r}")
        self._own_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="mini-broker-")) if data_dir is None \
            else Path(data_dir)
        self.properties: dict[str, str] = {
            **TEST_DEFAULTS,
            "listeners": "PLAINTEXT://127.0.0.1:0",
            "log.dirs": str(self.data_dir / "logs"),
            **{property_name(k): _property_value(v) for k, v in server_properties.items()},
        }
        BrokerConfig.from_dict(self.properties)  # a bad key fails here, not on the loop
        # The broker's own clock (each embedded broker has its own): on "manual" it moves only
        # on advance, its wall clock starting at the real time it was made.
        self.clock: ManualClock | None = (ManualClock(run_due_soon=True) if clock == "manual"
                                          else None)
        self.faults = Faults()
        self.broker: Broker | None = None
        self.port = 0
        self.start_seconds = 0.0  # how long the last start took
        self.recovered = False  # the last start found data without a clean-shutdown marker
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._async = False

    # -- addresses ---------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        if not self.port:
            raise RuntimeError("the broker has not been started")
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.broker is not None

    @property
    def metrics_url(self) -> str | None:
        server = self.broker.metrics_server if self.broker is not None else None
        return server.url if server is not None else None

    # -- thread mode -------------------------------------------------------------------------
    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> EmbeddedBroker:
        """Start on a background thread's loop; returns once the broker listens."""
        if self.running:
            return self
        self._async = False
        import uvloop

        loop = self._loop = uvloop.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, args=(loop, ready),
                                        name="mini-broker", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self._call(self._start_broker)
        except BaseException:
            self._stop_loop()
            raise
        return self

    def stop(self) -> None:
        """Clean shutdown (Kafka's order: finish in-flight requests, flush, mark clean)."""
        self._end(lambda b: b.stop())

    def kill(self) -> None:
        """A crash: connections reset, nothing flushed, no clean-shutdown marker; the next
        start runs recovery."""
        self._end(lambda b: b.crash())

    def restart(self, clean: bool = True) -> EmbeddedBroker:
        """Stop (or kill when ``clean`` is false) and start again on the same port."""
        self.stop() if clean else self.kill()
        return self.start()

    def close(self) -> None:
        """Stop if running and remove the data dir when this broker made it."""
        if self._async:
            raise RuntimeError("an async broker closes with `await close_async()`")
        if self.running:
            self.stop()
        self._remove_dir()

    def advance(self, ms: float) -> int:
        """Move a manual clock ``ms`` forward, running what comes due on the broker's loop
        (timeouts, expiries, periodic jobs); returns how many callbacks ran."""
        clock = self.clock
        if clock is None:
            raise RuntimeError("advance needs EmbeddedBroker(clock='manual')")
        if self._async or self._loop is None:
            return clock.advance(ms)

        async def advance() -> int:
            ran = clock.advance(ms)
            for _ in range(3):  # let what the expiries completed write its answers
                await asyncio.sleep(0)
            return ran

        return self._call(advance)

    def _end(self, how: Callable[[Broker], Awaitable[None]]) -> None:
        if self._async:
            raise RuntimeError("an async broker stops with the *_async methods")
        if not self.running:
            return
        try:
            self._call(lambda: self._end_broker(how))
        finally:
            self._stop_loop()

    def _run_loop(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        self._loop = self._thread = None

    def _call(self, coro: Callable[[], Awaitable[T]], timeout: float = START_TIMEOUT_S) -> T:
        """Run ``coro()`` on the broker's loop; wait for its result."""
        loop = self._loop
        assert loop is not None
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def begin() -> None:
            task = loop.create_task(_awaited(coro()))

            def finished(t: asyncio.Task[T]) -> None:
                if t.cancelled():
                    done.cancel()
                elif t.exception() is not None:
                    done.set_exception(t.exception())  # type: ignore[arg-type]
                else:
                    done.set_result(t.result())

            task.add_done_callback(finished)

        loop.call_soon_threadsafe(begin)
        return done.result(timeout)

    # -- async mode --------------------------------------------------------------------------
    async def __aenter__(self) -> EmbeddedBroker:
        return await self.start_async()

    async def __aexit__(self, *exc: object) -> None:
        await self.close_async()

    async def start_async(self) -> EmbeddedBroker:
        """Start in the running loop (the caller's)."""
        if not self.running:
            self._async = True
            self._loop = asyncio.get_running_loop()
            await self._start_broker()
        return self

    async def stop_async(self) -> None:
        if self.running:
            await self._end_broker(lambda b: b.stop())

    async def kill_async(self) -> None:
        if self.running:
            await self._end_broker(lambda b: b.crash())

    async def restart_async(self, clean: bool = True) -> EmbeddedBroker:
        await (self.stop_async() if clean else self.kill_async())
        return await self.start_async()

    async def close_async(self) -> None:
        await self.stop_async()
        self._loop = None
        self._async = False
        self._remove_dir()

    async def advance_async(self, ms: float) -> int:
        """``advance`` for a broker in the caller's loop, then a few loop iterations so the
        answers of what expired are written."""
        ran = self.advance(ms)
        for _ in range(3):
            await asyncio.sleep(0)
        return ran

    # -- both --------------------------------------------------------------------------------
    async def _start_broker(self) -> None:
        started = time.perf_counter()
        to_standard_logging()
        properties = dict(self.properties)
        if self.port:  # a restart keeps the port: clients keep their bootstrap address
            properties["listeners"] = _with_port(properties["listeners"], self.port)
        log_dirs = [Path(d) for d in BrokerConfig.from_dict(properties)["log.dirs"]]
        self.recovered = any(d.is_dir() and any(d.iterdir())
                             and not (d / CLEAN_SHUTDOWN_FILE).exists() for d in log_dirs)
        broker = Broker(BrokerConfig.from_dict(properties), clock=self.clock)
        broker.dispatch_filter = self.faults
        try:
            await broker.start()
        except BaseException:
            await broker.crash()
            raise
        if broker.metrics is not None:
            broker.metrics.registry.register(self.faults)
        self.broker = broker
        self.port = broker.port
        self.start_seconds = time.perf_counter() - started

    async def _end_broker(self, how: Callable[[Broker], Awaitable[None]]) -> None:
        broker = self.broker
        if broker is None:
            return
        self.broker = None
        self.faults.release_delays()
        await how(broker)

    def _remove_dir(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- fault injection (any thread, any mode) ------------------------------------------------
    def inject_errors(self, api: str | int, error: str | int, count: int | None = 1,
                      topic: str | None = None, partition: int | None = None) -> Fault:
        """Answer the next ``count`` requests of ``api`` with ``error`` (a Kafka name or code),
        in the API's own response layout, without acting on them; with ``topic`` (and
        ``partition``) only their entries get the error, the rest is served."""
        return self.faults.inject_errors(api, error, count, topic, partition)

    def delay(self, api: str | int, ms: float, count: int | None = 1) -> Fault:
        """Serve the next ``count`` requests of ``api`` at once but send their answers ``ms``
        late (real time, whatever the clock)."""
        return self.faults.delay(api, ms, count)

    def drop_connections(self, after: int = 0) -> Fault:
        """Answer ``after`` more requests, then reset every open connection."""
        return self.faults.drop_connections(after)

    def clear_faults(self) -> None:
        """Disarm every fault; answers still held back by a delay leave now."""
        self.faults.clear()
        loop = self._loop
        if loop is None or not self.running:
            return
        if self._async:
            self.faults.release_delays()
        else:
            loop.call_soon_threadsafe(self.faults.release_delays)

    @property
    def fault_counts(self) -> dict[tuple[str, str], int]:
        """Faults fired so far, by (kind, API name)."""
        return dict(self.faults.counts)

    def __repr__(self) -> str:
        state = f"on {self.bootstrap_servers}" if self.running else "stopped"
        return f"EmbeddedBroker({state}, data_dir={str(self.data_dir)!r})"


async def _awaited(aw: Awaitable[T]) -> T:
    return await aw


def _property_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _with_port(listeners: str, port: int) -> str:
    """The first listener on ``port`` when it asked for an ephemeral one."""
    first, *rest = [e.strip() for e in listeners.split(",")]
    name, sep, address = first.partition("://")
    host, _, bound = address.rpartition(":")
    if sep and bound == "0":
        first = f"{name}://{host}:{port}"
    return ",".join([first, *rest])
