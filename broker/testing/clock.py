"""The manual clock of an embedded broker: broker time that moves only on ``advance``.

The coordinators' timer (group sessions and rebalances, transaction timeouts) and the server's
periodic jobs (retention, checkpoints, offset expiry) are scheduled on it, and the broker's
wall clock (record and commit timestamps, retention's "now") reads from it, starting at the
real time the clock was made. Unlike the purgatory's ManualClock, a callback already due when
it is scheduled runs on the next loop iteration instead of waiting for an advance: a broker
serves real clients, and "now" must not need a test's nudge.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from purgatory import ManualClock as _ManualClock
from purgatory.timer_task_list import Cancellable


class ManualClock(_ManualClock):
    """Milliseconds of broker time; call ``advance`` on the broker's loop (EmbeddedBroker's
    ``advance`` does)."""

    def __init__(self, wall_start_ms: int | None = None) -> None:
        super().__init__(0)
        self.wall_start_ms = time.time_ns() // 1_000_000 if wall_start_ms is None else wall_start_ms

    def wall_ms(self) -> int:
        """The broker's wall clock: its start plus every advance."""
        return self.wall_start_ms + int(self.time())

    def call_at(self, when_ms: float, callback: Callable[..., object], *args: Any) -> Cancellable:
        if when_ms <= self.time():
            return asyncio.get_running_loop().call_soon(callback, *args)
        return super().call_at(when_ms, callback, *args)
