"""Wall-clock time in milliseconds: what Kafka stamps on records, commits and state changes.

Timeouts never use it (the purgatory's timer runs on the loop's monotonic clock); only values
that are stored or compared with a client's timestamps do.

An embedded broker on a manual clock (broker.testing) reads its wall clock from the manual
clock instead: ``use_source`` sets the source for the current context, which the broker's
tasks and loop callbacks inherit, so two brokers in one process keep their own clocks. A
context-local source rather than a global one because a test may run a broker on real time
beside one on manual time. Threads that do not inherit the context (flushers, the cleaner)
read real time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar

_source: ContextVar[Callable[[], int] | None] = ContextVar("wallclock_source", default=None)


def now_ms() -> int:
    source = _source.get()
    if source is None:
        return time.time_ns() // 1_000_000
    return source()


def use_source(source: Callable[[], int] | None) -> None:
    """Read ``source()`` as the wall clock in this context (None: real time again)."""
    _source.set(source)
