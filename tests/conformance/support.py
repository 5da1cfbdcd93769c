"""Helpers shared by the conformance tests (the generic client helpers are in tests/support)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable


class Ledger:
    """Thread-safe record of who consumed what: (member, partition, offset, value)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[tuple[str, int, int, bytes]] = []

    def add(self, member: str, partition: int, offset: int, value: bytes) -> None:
        with self._lock:
            self.rows.append((member, partition, offset, value))

    def snapshot(self) -> list[tuple[str, int, int, bytes]]:
        with self._lock:
            return list(self.rows)

    def positions(self) -> set[tuple[int, int]]:
        return {(p, o) for _m, p, o, _v in self.snapshot()}

    def wait_for(self, expected: Iterable[tuple[int, int]], timeout: float, what: str) -> None:
        want = set(expected)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if want <= self.positions():
                return
            time.sleep(0.05)
        missing = sorted(want - self.positions())
        raise AssertionError(f"{what}: {len(missing)} records never consumed, e.g. {missing[:10]}")


def assert_exactly_once(rows: list[tuple[str, int, int, bytes]],
                        expected: dict[tuple[int, int], bytes]) -> None:
    """Each expected (partition, offset) consumed once, with the value produced there."""
    seen = Counter((p, o) for _m, p, o, _v in rows)
    dups = sorted(k for k, n in seen.items() if n > 1)
    assert not dups, f"{len(dups)} records consumed more than once, e.g. " + ", ".join(
        f"{k} by {[m for m, p, o, _v in rows if (p, o) == k]}" for k in dups[:5])
    missing = sorted(set(expected) - set(seen))
    assert not missing, f"{len(missing)} records never consumed, e.g. {missing[:10]}"
    extra = sorted(set(seen) - set(expected))
    assert not extra, f"records consumed that were never produced: {extra[:10]}"
    for _m, p, o, v in rows:
        assert v == expected[(p, o)], f"({p}, {o}): value {v!r} != {expected[(p, o)]!r}"
