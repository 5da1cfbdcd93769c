"""DelayedOperation: a request parked until its condition holds or ``delay_ms`` passes.

Completion happens exactly once, by whichever comes first: ``try_complete`` finding the
condition met (it calls ``force_complete``), or the timer expiring it (``run``). ``force_complete``
is the single gate: the first call marks the operation completed, takes it out of the timer
at once (O(1) unlink, so the timer's size counts only pending operations and the memory is
freed now, not at the deadline) and calls ``on_complete``. On expiry ``on_expiration`` runs
after ``on_complete``, as in Kafka.

No lock: everything runs on one event loop, and the completed flag is set before any callback
runs, so a re-entrant call (``on_complete`` triggering another check of the same operation)
finds it completed.
"""

from __future__ import annotations

import math
from abc import abstractmethod

from purgatory.timer_task_list import TimerTask


class DelayedOperation(TimerTask):
    """Subclass and implement ``try_complete``, ``on_complete`` and ``on_expiration``."""

    __slots__ = ("_completed",)

    def __init__(self, delay_ms: float) -> None:
        # TimerTask's slots set inline (no super() chain): this runs once per parked request.
        self._next = self._prev = self._list = self._counter = None
        self.expiration_ms = 0
        self.delay_ms = math.ceil(delay_ms)
        self._completed = False

    @property
    def is_completed(self) -> bool:
        return self._completed

    def force_complete(self) -> bool:
        """Complete now unless already completed; True only for the call that completed it."""
        if self._completed:
            return False
        self._completed = True
        lst = self._list  # cancel(), inlined: this is the completion hot path
        if lst is not None:
            lst.remove(self)
        self.on_complete()
        return True

    @abstractmethod
    def try_complete(self) -> bool:
        """Check the condition; if met, return ``self.force_complete()``, else False."""

    @abstractmethod
    def on_complete(self) -> None:
        """Build and send the response; called exactly once."""

    @abstractmethod
    def on_expiration(self) -> None:
        """Extra work when completion was forced by the timeout (metrics, logging)."""

    def run(self) -> None:
        """Timer expiry."""
        if self.force_complete():
            self.on_expiration()
