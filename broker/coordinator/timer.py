"""CoordinatorTimer: the coordinators' deadlines by key, on the purgatory's timing wheel.

Kafka 4's CoordinatorTimer: ``schedule(key, delay_ms, callback)`` replaces a deadline of the same
key (a member's session renewed by its heartbeat, a transaction's timeout set again by its next
state), ``cancel(key)`` drops it. A deadline that fires is gone before its callback runs, so the
callback may schedule the key again. Nothing polls: the wheel wakes the loop only when one is
due, and a cancelled deadline leaves the wheel at once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from purgatory import Timer, TimerTask

K = TypeVar("K", bound=Hashable)


class CoordinatorTimer(Generic[K]):
    """One pending deadline per key."""

    def __init__(self, timer: Timer) -> None:
        self._timer = timer
        self._counter = timer.new_counter()
        self._deadlines: dict[K, _Deadline[K]] = {}

    def schedule(self, key: K, delay_ms: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` ``delay_ms`` from now, replacing the key's earlier deadline."""
        self.cancel(key)
        deadline = _Deadline(self, key, max(delay_ms, 0), callback)
        self._deadlines[key] = deadline
        self._timer.add(deadline, self._counter)

    def cancel(self, key: K) -> None:
        deadline = self._deadlines.pop(key, None)
        if deadline is not None:
            deadline.cancel()

    def is_scheduled(self, key: K) -> bool:
        return key in self._deadlines

    def cancel_all(self) -> None:
        """Shutdown: every deadline dropped, none runs."""
        for deadline in self._deadlines.values():
            deadline.cancel()
        self._deadlines.clear()

    def __len__(self) -> int:
        return len(self._deadlines)

    def _fired(self, deadline: _Deadline[K]) -> None:
        if self._deadlines.get(deadline.key) is deadline:
            del self._deadlines[deadline.key]
            deadline.callback()


class _Deadline(TimerTask, Generic[K]):
    __slots__ = ("owner", "key", "callback")

    def __init__(self, owner: CoordinatorTimer[K], key: K, delay_ms: float,
                 callback: Callable[[], None]) -> None:
        super().__init__(delay_ms)
        self.owner = owner
        self.key = key
        self.callback = callback

    def run(self) -> None:
        self.owner._fired(self)
