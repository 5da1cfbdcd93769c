"""Wall-clock time in milliseconds: what Kafka stamps on records, commits and state changes.

Timeouts never use it (the purgatory's timer runs on the loop's monotonic clock); only values
that are stored or compared with a client's timestamps do.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
