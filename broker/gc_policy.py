"""The broker process's garbage-collection policy, and a record of what the collector cost.

CPython's cyclic collector runs when the tracked objects allocated since its last run (net of
those freed) pass gen0's threshold. A broker's per-request objects are acyclic and die by
reference count, so most of what a collection scans is the long-lived state built at start
(modules, codecs, loaded logs) and the operations parked in the purgatory. The policies:

- ``default``: CPython as it is.
- ``freeze``: after start-up, one full collection, then ``gc.freeze()`` moves every survivor
  to the permanent generation, so no later collection walks it.
- ``tuned`` (the default): ``freeze``, and gen0's threshold raised (50,000 by default) above
  the growth of a burst, so young objects that die by reference count are gone before any
  collection looks at them. Measured with bench.gc: 5,000 fetches parking at once cost ~380
  gen0, ~34 gen1 and 3 full collections under CPython's thresholds (230-510 ms of pauses,
  the longest 85-160 ms), 5 gen0 collections at 50,000 (22-33 ms, the longest 7-14 ms).
  Under steady produce load the live set does not grow, so no policy collects much there;
  without freeze a full collection walks start-up's objects (20-35 ms) when one does run.

After the freeze, glibc's ``malloc_trim(0)`` hands back to the OS the heap pages that start-up
freed (imports, config parsing, the collection itself): glibc keeps them mapped otherwise, and
they would count in the broker's resident memory for its whole life. Once, off the request
path; skipped where the C library is not glibc.

Applied by the command line only (``broker.cli``): an embedded broker runs inside someone
else's process, whose collector is theirs to set.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from typing import Any

POLICIES = ("default", "freeze", "tuned")


def apply(policy: str, gen0_threshold: int) -> tuple[int, int, int]:
    """Set the policy once the broker has started; the thresholds in force are returned."""
    if policy not in POLICIES:
        raise ValueError(f"unknown GC policy {policy!r}")
    if policy in ("freeze", "tuned"):
        gc.collect()
        gc.freeze()
        trim_heap()
    if policy == "tuned":
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0_threshold, gen1, gen2)
    return gc.get_threshold()


def trim_heap() -> bool:
    """glibc's malloc_trim(0): True when it returned memory to the OS; False when it had none
    to give back or the C library is not glibc (musl, macOS: nothing to call)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
    except (ValueError, OSError):  # the name is unknown here: not glibc
        return False
    import ctypes  # only here: its import costs a broker that never trims ~0.4 MB

    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))


@dataclass(eq=False)
class GcPauses:
    """Collections and the time spent in them, per generation, from ``gc.callbacks``.

    Two clock reads per collection: the price is noise next to the collection itself, and it
    is the only way to see what the collector takes from the loop (each pause delays every
    connection's next read, and every timer due meanwhile).
    """

    collections: list[int] = field(default_factory=lambda: [0, 0, 0])
    pause_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    max_pause_s: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    collected: int = 0
    _started: float = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        gen = info["generation"]
        self.collections[gen] += 1
        self.pause_s[gen] += took
        if took > self.max_pause_s[gen]:
            self.max_pause_s[gen] = took
        self.collected += info["collected"]

    def install(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures for the shutdown log line (and the benchmarks that read it)."""
        return {
            "collections": list(self.collections),
            "pause_ms": [round(s * 1e3, 3) for s in self.pause_s],
            "max_pause_ms": [round(s * 1e3, 3) for s in self.max_pause_s],
            "total_pause_ms": round(sum(self.pause_s) * 1e3, 3),
            "collected": self.collected,
        }
