"""Clocks for the Timer: the event loop's, and a manual one for exact tests.

The Timer only needs "what time is it" and "call me back at t". Both are in milliseconds so
the wheel works on whole ticks. ``LoopClock`` maps them onto ``loop.time()`` and
``loop.call_at``; ``ManualClock`` plays the role of Kafka's MockTimer: time moves only when a
test says so, and due callbacks run in time order, so tests are exact and never sleep.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol

from purgatory.timer_task_list import Cancellable


class Clock(Protocol):
    """Milliseconds on a monotonic clock plus one-shot callbacks at an absolute time."""

    def time(self) -> float: ...

    def call_at(self, when_ms: float, callback: Callable[..., object], *args: Any) -> Cancellable:
        ...


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
    """

    def __init__(self, start_ms: float = 0) -> None:
        self._now = start_ms
        self._heap: list[ManualHandle] = []
        self._seq = itertools.count()
        self.live = 0
        self.scheduled = 0
        self.fired = 0
        self.cancelled = 0

    def time(self) -> float:
        return self._now

    def call_at(self, when_ms: float, callback: Callable[..., object], *args: Any) -> ManualHandle:
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
