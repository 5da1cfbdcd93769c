"""Buckets of the timing wheel: circular doubly linked lists of timer tasks.

Invariants (single event loop, so no locks):
- an entry is in at most one bucket; ``entry._list`` is that bucket or None;
- a bucket's ``expiration`` is None exactly when it is empty, otherwise the start of the time
  range it holds; it is set when the bucket is (re)used and cleared when it empties;
- a bucket's ``handle`` (the loop callback that will flush it) is live only while the bucket is
  non-empty: the removal that empties a bucket cancels it, so an empty bucket never wakes the
  process;
- every link and unlink moves the entry's ``TaskCounter`` by one, so a timer's size is exactly
  the number of linked tasks.

Kafka keeps a separate TimerTaskEntry per TimerTask so that a task can move between timers
across threads. On one event loop a task can carry its own links, which saves an allocation per
parked request; ``TimerTaskEntry`` is therefore the base class of ``TimerTask``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Protocol


class Cancellable(Protocol):
    """What a clock returns from ``call_at``: asyncio's TimerHandle satisfies it."""

    def cancel(self) -> None: ...


class TaskCounter:
    """A mutable count shared by the buckets: Python ints cannot be shared by reference.

    ``expired`` counts this owner's tasks the timer ran (deadline reached, never cancelled):
    a purgatory's expirations, kept here because only the timer sees them.
    """

    __slots__ = ("n", "expired")

    def __init__(self) -> None:
        self.n = 0
        self.expired = 0

    def __repr__(self) -> str:
        return f"TaskCounter({self.n})"


class TimerTaskEntry:
    """A link cell: what a bucket holds. The sentinel of each bucket is a bare entry."""

    __slots__ = ("_next", "_prev", "_list", "_counter", "expiration_ms")

    def __init__(self) -> None:
        self._next: TimerTaskEntry | None = None
        self._prev: TimerTaskEntry | None = None
        self._list: TimerTaskList | None = None
        self._counter: TaskCounter | None = None
        self.expiration_ms = 0


class TimerTask(TimerTaskEntry, ABC):
    """Something to run once ``delay_ms`` after it is added to a Timer, unless cancelled."""

    __slots__ = ("delay_ms",)

    def __init__(self, delay_ms: float) -> None:
        # Every slot set here rather than through super(): one frame instead of two, which
        # shows at 10^5 parked requests per second.
        self._next = self._prev = self._list = self._counter = None
        self.expiration_ms = 0
        # Rounded up: a deadline in whole ms must never be earlier than the one asked for.
        self.delay_ms: int = math.ceil(delay_ms)

    def cancel(self) -> None:
        """Leave the timer now: the bucket link is dropped, the task will not run."""
        lst = self._list
        if lst is not None:
            lst.remove(self)

    @abstractmethod
    def run(self) -> None:
        """Called once by the timer when the task's deadline has passed."""


class TimerTaskList:
    """A bucket: tasks whose expirations fall in one tick-sized range of one wheel."""

    __slots__ = ("_root", "expiration", "handle")

    def __init__(self) -> None:
        root = TimerTaskEntry()
        root._next = root
        root._prev = root
        self._root = root
        self.expiration: int | None = None
        self.handle: Cancellable | None = None

    def set_expiration(self, expiration_ms: int) -> bool:
        """Set the bucket's time; True when it changed, i.e. the bucket needs a new wake-up."""
        if self.expiration != expiration_ms:
            self.expiration = expiration_ms
            return True
        return False

    def add(self, entry: TimerTaskEntry) -> None:
        """Append at the tail; an entry already in a bucket is moved."""
        if entry._list is not None:
            entry._list.remove(entry)
        root = self._root
        tail = root._prev
        assert tail is not None
        entry._next = root
        entry._prev = tail
        entry._list = self
        tail._next = entry
        root._prev = entry
        counter = entry._counter
        if counter is not None:
            counter.n += 1

    def remove(self, entry: TimerTaskEntry) -> None:
        """Unlink ``entry`` in O(1); emptying the bucket clears its time and cancels its wake-up."""
        if entry._list is not self:
            return
        nxt = entry._next
        prev = entry._prev
        assert nxt is not None and prev is not None
        nxt._prev = prev
        prev._next = nxt
        entry._next = entry._prev = entry._list = None
        counter = entry._counter
        if counter is not None:
            counter.n -= 1
        if prev is nxt:  # only the sentinel is left
            self.expiration = None
            handle = self.handle
            if handle is not None:
                self.handle = None
                handle.cancel()

    def pop(self) -> TimerTaskEntry | None:
        """Remove and return the head, or None when empty (flushing one entry at a time is what
        lets a running task cancel a later one in the same bucket safely)."""
        head = self._root._next
        if head is self._root or head is None:
            return None
        self.remove(head)
        return head

    def is_empty(self) -> bool:
        return self._root._next is self._root

    def __len__(self) -> int:
        """O(n); for tests and debugging only."""
        n = 0
        entry = self._root._next
        while entry is not self._root:
            n += 1
            assert entry is not None
            entry = entry._next
        return n

    def entries(self) -> list[Any]:
        """A snapshot of the entries, head first; for tests and debugging only."""
        out: list[Any] = []
        entry = self._root._next
        while entry is not self._root:
            assert entry is not None
            out.append(entry)
            entry = entry._next
        return out

    def __repr__(self) -> str:
        return f"TimerTaskList(expiration={self.expiration}, size={len(self)})"
