"""Timer: the hierarchical timing wheel driven by the event loop instead of a reaper thread.

Kafka's SystemTimer has a reaper thread blocked on a DelayQueue of buckets; the thread wakes
when the earliest non-empty bucket is due, advances the wheel to that bucket's expiration and
flushes it (due tasks run, the rest cascade to finer wheels). Here the event loop does the
waiting: every bucket that gets a new expiration schedules one ``call_at`` for that time and
nothing else is ever scheduled. No per-tick wake-ups, no heap entry per task.

When a bucket's callback fires, every bucket due by now is flushed in expiration order. The
order comes from a small heap of (expiration, bucket) pairs, one pair per bucket expiration
(never per task): the role of Kafka's DelayQueue minus the waiting. It matters because a loop
can run callbacks out of time order (uvloop turns a callback already due into ``call_soon``),
and the wheel's clock must never pass a bucket that still holds tasks, or a later deadline
would land in that bucket's slot.

Invariants:
- ``size`` is exactly the number of tasks that will run unless cancelled (a counter moved on
  every bucket link and unlink);
- a bucket has a live loop callback if and only if it is non-empty: emptying a bucket (by
  cancels, or by flushing it) cancels its callback, so an idle timer never wakes the process;
- with ``tick_ms == 1`` a task never runs before its deadline on the clock; with a coarser tick
  it may run up to one tick early (the bucket fires at the start of its range, as in Kafka).

Due tasks run inline in the timer callback, one at a time; a task's ``run`` may add or cancel
other tasks (cancelling one later in the same bucket keeps it from running).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from bisect import bisect_left
from math import ceil

from purgatory.clock import Clock, LoopClock
from purgatory.timer_task_list import TaskCounter, TimerTask, TimerTaskList
from purgatory.timing_wheel import TimingWheel

logger = logging.getLogger(__name__)

# Upper bounds (ms) of the expiration-lateness histogram; the last count is for "above".
LATENESS_BOUNDS_MS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)


class Timer:
    """Runs each added TimerTask once its ``delay_ms`` has passed, unless it is cancelled first.

    ``clock`` is a Clock (``time()`` and ``call_at()`` in ms), an asyncio loop, or None for the
    running loop. Defaults are Kafka's: tick 1 ms, 20 buckets per wheel.
    """

    def __init__(
        self,
        clock: Clock | asyncio.AbstractEventLoop | None = None,
        *,
        tick_ms: int = 1,
        wheel_size: int = 20,
        start_ms: int | None = None,
    ) -> None:
        if clock is None:
            clock = LoopClock(asyncio.get_running_loop())
        elif isinstance(clock, asyncio.AbstractEventLoop):
            clock = LoopClock(clock)
        self._clock: Clock = clock
        self._time = clock.time
        self._call_at = clock.call_at
        if start_ms is None:
            start_ms = math.floor(clock.time())
        self.counter = TaskCounter()
        self._counters: list[TaskCounter] = [self.counter]
        self._queue: list[tuple[int, int, TimerTaskList]] = []
        self._compact_at = 256
        self._seq = itertools.count()
        self.wheel = TimingWheel(tick_ms, wheel_size, start_ms, self._schedule_bucket)
        self._wheel_add = self.wheel.add
        # Tasks already due when added (delay <= 0): run on the next callback, never inline in
        # add(), so a caller's stack is never re-entered; a bucket like any other, so cancel and
        # size behave the same.
        self._due = TimerTaskList()
        self._closed = False
        self.callbacks_scheduled = 0
        self.callbacks_fired = 0
        # Counters for observability, plain ints moved on the event loop only: tasks put back
        # into a finer wheel when their coarse bucket came due (Kafka's cascades), and how late
        # each expired task ran (now - deadline, ms; negatives count as 0) as histogram counts
        # over LATENESS_BOUNDS_MS plus their sum.
        self.reinsertions = 0
        self.lateness_counts = [0] * (len(LATENESS_BOUNDS_MS) + 1)
        self.lateness_sum_ms = 0.0

    # -- public API -------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Tasks waiting to run (all counters sharing this timer)."""
        counters = self._counters
        if len(counters) == 1:
            return counters[0].n
        return sum(c.n for c in counters)

    def new_counter(self) -> TaskCounter:
        """A separate count for one owner's tasks (a purgatory sharing this timer with others)."""
        counter = TaskCounter()
        self._counters.append(counter)
        return counter

    def add(self, task: TimerTask, counter: TaskCounter | None = None) -> None:
        """Schedule ``task`` to run ``task.delay_ms`` from now; re-adding a task moves it."""
        if self._closed:
            raise RuntimeError("timer is closed")
        task._counter = self.counter if counter is None else counter
        # Rounded up so a deadline is never before now + delay; the epsilon keeps a clock that
        # reads whole ms from being pushed a full ms late by float error.
        task.expiration_ms = ceil(self._time() - 1e-6) + task.delay_ms
        if not self._wheel_add(task):
            due = self._due
            due.add(task)
            if due.handle is None:
                now = self._time()
                due.expiration = math.floor(now)
                due.handle = self._call_at(now, self._run_due)
                self.callbacks_scheduled += 1

    def close(self) -> None:
        """Cancel every loop callback; pending tasks will not run. Further adds raise."""
        self._closed = True
        for wheel in self.wheel.levels():
            for bucket in wheel.buckets:
                if bucket.handle is not None:
                    bucket.handle.cancel()
                    bucket.handle = None
        if self._due.handle is not None:
            self._due.handle.cancel()
            self._due.handle = None
        self._queue.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def live_callbacks(self) -> int:
        """Loop callbacks currently scheduled by this timer (0 when idle)."""
        n = 1 if self._due.handle is not None else 0
        for wheel in self.wheel.levels():
            n += sum(1 for b in wheel.buckets if b.handle is not None)
        return n

    # -- driving the wheel ------------------------------------------------------------------

    def _schedule_bucket(self, bucket: TimerTaskList) -> None:
        """A bucket got a new expiration: one wake-up for it, one entry in the order heap."""
        expiration = bucket.expiration
        assert expiration is not None
        queue = self._queue
        heapq.heappush(queue, (expiration, next(self._seq), bucket))
        if len(queue) > self._compact_at:
            self._compact()
        # A live handle here would mean the wheel passed a bucket that still held tasks.
        assert bucket.handle is None, "bucket re-timed while still scheduled"
        bucket.handle = self._call_at(expiration, self._bucket_due, bucket)
        self.callbacks_scheduled += 1

    def _compact(self) -> None:
        """Drop heap pairs of buckets emptied by cancels: they would otherwise pile up while
        the timer sleeps (no bucket fires, so nothing pops them). Amortised O(1) per push."""
        seen: set[int] = set()
        kept = []
        for item in self._queue:
            bucket = item[2]
            if bucket.expiration == item[0] and id(bucket) not in seen:
                seen.add(id(bucket))
                kept.append(item)
        heapq.heapify(kept)
        self._queue[:] = kept  # in place: _advance holds a reference to the list
        self._compact_at = max(256, 2 * len(kept))

    def _bucket_due(self, bucket: TimerTaskList) -> None:
        """Loop callback: ``bucket`` is due; flush it and anything else due by now, in order."""
        self.callbacks_fired += 1
        bucket.handle = None
        expiration = bucket.expiration
        target = math.floor(self._time() + 1e-6)
        if expiration is not None and expiration > target:
            target = expiration  # a loop may fire a hair early in float seconds
        self._advance(target)

    def _advance(self, target: int) -> None:
        queue = self._queue
        wheel = self.wheel
        heappop = heapq.heappop
        while queue and queue[0][0] <= target:
            expiration, _, bucket = heappop(queue)
            if bucket.expiration != expiration:
                continue  # emptied by cancels, or flushed already
            handle = bucket.handle
            if handle is not None:
                bucket.handle = None
                handle.cancel()
            wheel.advance_clock(expiration)
            self._flush(bucket)

    def _flush(self, bucket: TimerTaskList) -> None:
        """Empty ``bucket``: due tasks run, the others go back into finer wheels.

        One entry at a time, so a running task that cancels a later entry of this bucket
        unlinks it before it is reached. Unlinking is TimerTaskList.remove inlined (the bucket's
        wake-up is already cancelled by the caller); nothing can be added to this bucket
        meanwhile, since the wheel's clock now stands at its expiration.
        """
        wheel_add = self.wheel.add
        root = bucket._root
        now = self._time()
        lateness = self.lateness_counts
        late_sum = 0.0
        reinserted = 0
        while True:
            entry = root._next
            if entry is root or entry is None:
                break
            nxt = entry._next
            root._next = nxt
            nxt._prev = root  # type: ignore[union-attr]
            entry._next = entry._prev = entry._list = None
            counter = entry._counter
            counter.n -= 1  # type: ignore[union-attr]
            if wheel_add(entry):
                reinserted += 1
                continue
            counter.expired += 1  # type: ignore[union-attr]
            late = now - entry.expiration_ms
            if late < 0.0:
                late = 0.0
            lateness[bisect_left(LATENESS_BOUNDS_MS, late)] += 1
            late_sum += late
            try:
                entry.run()  # type: ignore[attr-defined]
            except Exception:
                logger.exception("timer task %r failed", entry)
        bucket.expiration = None
        self.reinsertions += reinserted
        self.lateness_sum_ms += late_sum

    def _run_due(self) -> None:
        """Loop callback for tasks that were already due when added."""
        self.callbacks_fired += 1
        due = self._due
        due.handle = None
        # Only what is there now: tasks added while these run get their own callback.
        now = self._time()
        for _ in range(len(due)):
            entry = due.pop()
            if entry is None:
                break
            if entry._counter is not None:
                entry._counter.expired += 1
            late = max(now - entry.expiration_ms, 0.0)
            self.lateness_counts[bisect_left(LATENESS_BOUNDS_MS, late)] += 1
            self.lateness_sum_ms += late
            try:
                entry.run()  # type: ignore[attr-defined]
            except Exception:
                logger.exception("timer task %r failed", entry)
        if not due.is_empty() and due.handle is None and not self._closed:
            now = self._time()
            due.expiration = math.floor(now)
            due.handle = self._call_at(now, self._run_due)
            self.callbacks_scheduled += 1

    def __repr__(self) -> str:
        return f"Timer(size={self.size}, levels={len(self.wheel.levels())})"
