"""The broker's clock: monotonic time with one-shot callbacks, and wall-clock time.

The Timer only needs "what time is it" and "call me back at t". Both are in milliseconds so
the wheel works on whole ticks. The broker also stamps records, commits and state changes with
the wall clock (ms since the epoch), which Kafka calls ``time.milliseconds()``; one object
answers both, so whoever holds a broker's clock sees one consistent time, and two brokers in
one process each keep their own.

``LoopClock`` maps them onto ``loop.time()``, ``loop.call_at`` and the system's wall clock;
``ManualClock`` plays the role of Kafka's MockTime/MockTimer: time (both readings) moves only
when a test says so, and due callbacks run in time order, so tests are exact and never sleep.
``SYSTEM_WALL_CLOCK`` is the real wall clock alone, for what has no broker clock (tools,
threads that keep real time on purpose).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol

from purgatory.timer_task_list import Cancellable


def system_wall_ms() -> int:
    """The system's wall clock, ms since the epoch."""
    return time.time_ns() // 1_000_000


class WallClock(Protocol):
    """Wall-clock time in ms since the epoch: what records, commits and states are stamped
    with. Never used for timeouts, which run on the monotonic ``Clock.time``."""

    def wall_ms(self) -> int: ...


class Clock(WallClock, Protocol):
    """Milliseconds on a monotonic clock plus one-shot callbacks at an absolute time, and the
    wall clock that goes with them."""

    def time(self) -> float: ...

    def call_at(self, when_ms: float, callback: Callable[..., object], *args: Any) -> Cancellable:
        ...


class SystemWallClock:
    """The real wall clock alone."""

    __slots__ = ()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


SYSTEM_WALL_CLOCK = SystemWallClock()


class LoopClock:
    """The asyncio (or uvloop) loop's clock, in ms.

    uvloop's ``loop.time()`` is libuv's CLOCK_MONOTONIC reading truncated to whole ms, so a
    deadline computed from it can be up to 1 ms early in real time. When the loop's clock agrees
    with ``time.monotonic()`` to within that truncation, the unrounded ``time.monotonic()`` is
    read instead: same clock, same epoch, so ``call_at`` still fires on time, and a deadline is
    never early on either clock. (asyncio's own loop.time() *is* time.monotonic().)
    """

    __slots__ = ("loop", "_time", "_call_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._time = loop.time
        self._call_at = loop.call_at
        if loop.time is not time.monotonic and _truncated_monotonic(loop):
            self._time = time.monotonic

    def time(self) -> float:
        return self._time() * 1000.0

    def call_at(self, when_ms: float, callback: Callable[..., object], *args: Any) -> Cancellable:
        return self._call_at(when_ms / 1000.0, callback, *args)

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


def _truncated_monotonic(loop: asyncio.AbstractEventLoop) -> bool:
    """True when loop.time() reads time.monotonic() rounded down to ms (uvloop on Linux)."""
    for _ in range(3):
        before = time.monotonic()
        lt = loop.time()
        after = time.monotonic()
        whole_ms = abs(lt * 1000 - round(lt * 1000)) < 1e-6
        if not whole_ms or not before - 0.0011 <= lt <= after + 1e-9:
            return False
    return True


class ManualHandle:
    """A ManualClock callback; ``cancel`` before it runs and it never will."""

    __slots__ = ("when", "_seq", "_callback", "_args", "_clock", "cancelled", "done")

    def __init__(
        self,
        when: float,
        seq: int,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        clock: ManualClock,
    ) -> None:
        self.when = when
        self._seq = seq
        self._callback = callback
        self._args = args
        self._clock = clock
        self.cancelled = False
        self.done = False

    def __lt__(self, other: ManualHandle) -> bool:
        return (self.when, self._seq) < (other.when, other._seq)

    def cancel(self) -> None:
        if not self.cancelled and not self.done:
            self.cancelled = True
            self._clock.live -= 1
            self._clock.cancelled += 1


class ManualClock:
    """Time that moves only on ``advance``; callbacks run in (time, scheduling) order.

    While a callback runs, ``time()`` is exactly its scheduled time, as on a loop that is never
    late. ``live`` counts callbacks scheduled and neither run nor cancelled: the number of
    wake-ups the process still has ahead of it.

    The wall clock starts at ``wall_start_ms`` (the real time the clock was made by default)
    and moves with every advance. With ``run_due_soon`` a callback already due when it is
    scheduled runs on the running loop's next iteration instead of waiting for an advance: a
    broker that serves real clients on this clock (the embedded broker's manual clock) must
    not need a test's nudge for "now". Without it (the default) nothing runs but in
    ``advance``, which keeps timer tests exact.
    """

    def __init__(self, start_ms: float = 0, *, wall_start_ms: int | None = None,
                 run_due_soon: bool = False) -> None:
        self._now = start_ms
        self._start = start_ms
        self.wall_start_ms = system_wall_ms() if wall_start_ms is None else wall_start_ms
        self.run_due_soon = run_due_soon
        self._heap: list[ManualHandle] = []
        self._seq = itertools.count()
        self.live = 0
        self.scheduled = 0
        self.fired = 0
        self.cancelled = 0

    def time(self) -> float:
        return self._now

    def wall_ms(self) -> int:
        """The wall clock: its start plus every advance."""
        return self.wall_start_ms + int(self._now - self._start)

    def call_at(self, when_ms: float, callback: Callable[..., object], *args: Any
                ) -> ManualHandle | asyncio.Handle:
        if self.run_due_soon and when_ms <= self._now:
            return asyncio.get_running_loop().call_soon(callback, *args)
        handle = ManualHandle(when_ms, next(self._seq), callback, args, self)
        heapq.heappush(self._heap, handle)
        self.live += 1
        self.scheduled += 1
        return handle

    def pending(self) -> list[ManualHandle]:
        """Live callbacks, earliest first."""
        return sorted(h for h in self._heap if not h.cancelled and not h.done)

    def next_due(self) -> float | None:
        live = self.pending()
        return live[0].when if live else None

    def advance(self, ms: float) -> int:
        """Move time forward by ``ms``, running what comes due; returns callbacks run."""
        return self.advance_to(self._now + ms)

    def advance_to(self, t_ms: float) -> int:
        """Move time to ``t_ms`` (never backwards), running due callbacks in order."""
        ran = 0
        heap = self._heap
        while heap and heap[0].when <= t_ms:
            handle = heapq.heappop(heap)
            if handle.cancelled:
                continue
            if handle.when > self._now:
                self._now = handle.when
            handle.done = True
            self.live -= 1
            self.fired += 1
            ran += 1
            handle._callback(*handle._args)
        if t_ms > self._now:
            self._now = t_ms
        return ran
