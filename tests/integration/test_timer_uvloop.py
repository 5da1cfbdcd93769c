"""The real Timer on a real uvloop loop: 100,000 tasks, none early, and no wake-ups when idle."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import uvloop

from purgatory import LoopClock, Timer, TimerTask
from purgatory.timer_task_list import Cancellable

N = 100_000
MAX_DELAY_MS = 2_000


class CountingClock:
    """LoopClock that counts the callbacks the timer schedules and the ones that run, and
    keeps the clock's time as each one ran (``ran_at``; ``running`` is the one running)."""

    def __init__(self, inner: LoopClock) -> None:
        self.inner = inner
        self.scheduled = 0
        self.fired = 0
        self.ran_at: list[float] = []
        self.running: int | None = None  # its index in ran_at

    def time(self) -> float:
        return self.inner.time()

    def call_at(self, when_ms: float, callback: Callable[..., object], *args: Any) -> Cancellable:
        self.scheduled += 1

        def counted(*a: Any) -> None:
            self.fired += 1
            self.running = len(self.ran_at)
            self.ran_at.append(self.inner.time())
            try:
                callback(*a)
            finally:
                self.running = None

        return self.inner.call_at(when_ms, counted, *args)


class Probe(TimerTask):
    __slots__ = ("added_loop_ms", "added_real_ms", "fired_loop_ms", "fired_real_ms", "loop",
                 "done", "clock", "fired_by")

    def __init__(self, delay_ms: int, loop: asyncio.AbstractEventLoop, done: Callable[[], None],
                 clock: CountingClock):
        super().__init__(delay_ms)
        self.loop = loop
        self.done = done
        self.clock = clock
        self.fired_by: int | None = None  # the CountingClock callback that ran it
        self.fired_loop_ms = -1.0
        self.fired_real_ms = -1.0
        self.added_loop_ms = loop.time() * 1000
        self.added_real_ms = time.monotonic() * 1000

    def run(self) -> None:
        assert self.fired_loop_ms < 0, "ran twice"
        self.fired_loop_ms = self.loop.time() * 1000
        self.fired_real_ms = time.monotonic() * 1000
        self.fired_by = self.clock.running
        self.done()


async def scenario() -> None:
    loop = asyncio.get_running_loop()
    clock = CountingClock(LoopClock(loop))
    timer = Timer(clock)
    rng = random.Random(42)
    remaining = N
    all_done = loop.create_future()

    def done() -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0:
            all_done.set_result(None)

    probes = []
    # Added over ~0.5 s in bursts, so the wheel turns while tasks arrive.
    for burst in range(50):
        for _ in range(N // 50):
            p = Probe(rng.randint(1, MAX_DELAY_MS), loop, done, clock)
            timer.add(p)
            probes.append(p)
        if burst % 5 == 4:
            await asyncio.sleep(0.05)
    assert timer.size == remaining
    await asyncio.wait_for(all_done, timeout=MAX_DELAY_MS / 1000 + 10)

    # None early, on the loop clock or on the real monotonic clock; each ran once.
    early_loop = [p for p in probes if p.fired_loop_ms < p.added_loop_ms + p.delay_ms - 1e-6]
    early_real = [p for p in probes if p.fired_real_ms < p.added_real_ms + p.delay_ms]
    assert early_loop == [] and early_real == []
    # Not late on the timer's part: each ran in the first of the timer's loop callbacks that
    # ran at or after its deadline, never left for a later one. How late the loop ran that
    # callback is the machine's part, which bench.purgatory measures (late_p99_ms).
    ran_at = clock.ran_at
    late = [p for p in probes if p.fired_by is None
            or (p.fired_by > 0 and ran_at[p.fired_by - 1] >= p.expiration_ms)]
    assert late == [], f"{len(late)} tasks were left past a timer callback after their deadline"

    # One wake-up per bucket expiration, never one per task. Over the run's span a wheel level
    # of 1 ms ticks times 20**k has at most span / 20**k + 2 distinct bucket expirations; the
    # span is the machine's (a loaded loop adds slower), the bound on it is the timer's. On
    # an idle machine the span is ~2.5 s and the bound ~2,800, a thirtieth of the tasks.
    span_ms = max(ran_at) - probes[0].added_loop_ms
    levels = 4  # 1 ms, 20 ms, 400 ms and 8 s buckets: MAX_DELAY_MS needs three
    buckets = sum(int(span_ms) // 20**k + 2 for k in range(levels))
    assert clock.fired <= clock.scheduled <= buckets < N, (clock.scheduled, buckets, span_ms)
    assert timer.size == 0 and timer.live_callbacks() == 0

    # Idle: nothing pending, so nothing is scheduled and nothing runs.
    scheduled, fired = clock.scheduled, clock.fired
    await asyncio.sleep(0.3)
    assert (clock.scheduled, clock.fired) == (scheduled, fired)

    # Sparse: a few tasks 1.5 s away wake the process once per wheel level on the way down,
    # not once per 1 ms tick (which would be ~1500 wake-ups).
    remaining = 5
    all_done = loop.create_future()
    sparse = [Probe(1500 + i, loop, done, clock) for i in range(5)]
    for p in sparse:
        timer.add(p)
    fired = clock.fired
    await asyncio.wait_for(all_done, timeout=10)
    assert clock.fired - fired <= 3 + 5  # level-3 bucket, level-2 bucket, 5 level-1 buckets
    assert all(p.fired_real_ms >= p.added_real_ms + p.delay_ms for p in sparse)

    # Cancelled tasks leave no wake-up behind.
    far = [Probe(5000, loop, done, clock) for _ in range(1000)]
    for p in far:
        timer.add(p)
    assert timer.live_callbacks() >= 1
    for p in far:
        p.cancel()
    assert timer.live_callbacks() == 0 and timer.size == 0
    scheduled, fired = clock.scheduled, clock.fired
    await asyncio.sleep(0.2)
    assert clock.fired == fired
    timer.close()


def test_timer_on_uvloop_100k_tasks_none_early_and_idle() -> None:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
