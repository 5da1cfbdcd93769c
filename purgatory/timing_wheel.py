"""Hierarchical timing wheel (Kafka's TimingWheel; docs/purgatory.md).

A wheel of ``wheel_size`` buckets, each ``tick_ms`` wide, covers ``[current_time,
current_time + interval)`` with ``interval = tick_ms * wheel_size``. A deadline beyond that goes to
an overflow wheel whose tick is this wheel's interval, created the first time it is needed. When
a coarse bucket comes due its tasks are added again and fall into finer wheels ("cascade"), so a
task is re-inserted at most once per level: insert costs O(levels), cancel O(1).

Invariants:
- ``current_time`` is a multiple of ``tick_ms`` and never moves backwards;
- a bucket holds expirations in ``[e, e + tick_ms)`` where ``e`` is its ``expiration``; within
  one wheel every non-empty bucket has a distinct ``e`` in ``[current_time, current_time +
  interval)``, because the clock only advances to the expiration of the earliest due bucket
  (the Timer guarantees that ordering);
- ``add`` refuses (returns False) a task already due, i.e. ``expiration < current_time + tick``;
  the caller runs it.
"""

from __future__ import annotations

from collections.abc import Callable

from purgatory.timer_task_list import TimerTaskEntry, TimerTaskList


class TimingWheel:
    """One level of the hierarchy; the Timer holds the finest level only."""

    __slots__ = (
        "tick_ms",
        "wheel_size",
        "interval",
        "current_time",
        "buckets",
        "overflow_wheel",
        "_on_new_expiration",
    )

    def __init__(
        self,
        tick_ms: int,
        wheel_size: int,
        start_ms: int,
        on_new_expiration: Callable[[TimerTaskList], None],
    ) -> None:
        if tick_ms < 1 or wheel_size < 2:
            raise ValueError("tick_ms must be >= 1 and wheel_size >= 2")
        self.tick_ms = tick_ms
        self.wheel_size = wheel_size
        self.interval = tick_ms * wheel_size
        self.current_time = start_ms - (start_ms % tick_ms)
        self.buckets = [TimerTaskList() for _ in range(wheel_size)]
        self.overflow_wheel: TimingWheel | None = None
        # Kafka offers the bucket to its DelayQueue here; the Timer schedules a loop callback.
        self._on_new_expiration = on_new_expiration

    def _add_overflow_wheel(self) -> TimingWheel:
        wheel = self.overflow_wheel
        if wheel is None:
            wheel = TimingWheel(
                self.interval, self.wheel_size, self.current_time, self._on_new_expiration
            )
            self.overflow_wheel = wheel
        return wheel

    def add(self, entry: TimerTaskEntry) -> bool:
        """Place ``entry`` in its bucket at this level or above; False when it is already due.

        Walks up the levels in one frame (rather than recursing) and links the entry inline:
        this is the hot path of parking a request and of every cascade.
        """
        expiration = entry.expiration_ms
        wheel = self
        while True:
            current = wheel.current_time
            tick = wheel.tick_ms
            if expiration < current + tick:
                return False
            if expiration < current + wheel.interval:
                break
            upper = wheel.overflow_wheel
            if upper is None:
                upper = wheel._add_overflow_wheel()
            wheel = upper
        virtual_id = expiration // tick
        bucket = wheel.buckets[virtual_id % wheel.wheel_size]
        # TimerTaskList.add, inlined.
        if entry._list is not None:
            entry._list.remove(entry)
        root = bucket._root
        tail = root._prev
        entry._next = root
        entry._prev = tail
        entry._list = bucket
        tail._next = entry  # type: ignore[union-attr]
        root._prev = entry
        counter = entry._counter
        if counter is not None:
            counter.n += 1
        bucket_expiration = virtual_id * tick
        if bucket.expiration != bucket_expiration:
            # The bucket was empty (fresh, flushed, or emptied by cancels): it needs exactly
            # one wake-up at its new time. Adds to a bucket already timed cost nothing more.
            bucket.expiration = bucket_expiration
            self._on_new_expiration(bucket)
        return True

    def advance_clock(self, time_ms: int) -> None:
        """Move every level's clock to ``time_ms`` truncated to that level's tick."""
        wheel: TimingWheel | None = self
        while wheel is not None and time_ms >= wheel.current_time + wheel.tick_ms:
            wheel.current_time = time_ms - (time_ms % wheel.tick_ms)
            wheel = wheel.overflow_wheel

    def levels(self) -> list[TimingWheel]:
        """This wheel and its overflow wheels, finest first; for tests and introspection."""
        out: list[TimingWheel] = []
        wheel: TimingWheel | None = self
        while wheel is not None:
            out.append(wheel)
            wheel = wheel.overflow_wheel
        return out

    def __repr__(self) -> str:
        return (
            f"TimingWheel(tick_ms={self.tick_ms}, wheel_size={self.wheel_size}, "
            f"current_time={self.current_time})"
        )
