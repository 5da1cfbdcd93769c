"""Purgatory: delayed operations watched by key and timed out by a Timer (Kafka's
DelayedOperationPurgatory on a hierarchical timing wheel; docs/purgatory.md).

An operation is watched on every key it depends on (a (topic, partition) tuple, say); an event
on a key calls ``check_and_complete(key)``, which tries each operation watching it.

Completed operations leave the timer at once (O(1)), but stay in the watcher lists of keys
that saw no event since; removing them there eagerly would cost a scan per key. Instead, as in
Kafka, a purge scans the lists when the *estimated* number of completed-but-watched
operations passes a threshold: the estimate E grows by one per watched operation and is reset,
just before a purge, to the number of this purgatory's operations still in the timer (exact,
since completion unlinks at once). E - delayed is the completed-but-watched estimate, so a purge
never runs merely because many operations are pending. Empty watcher lists go with their key.

Two changes from Kafka, both because the purge runs on the event loop rather than on a reaper
thread (measured in docs/benchmarks.md):
- the threshold is ``max(purge_interval, delayed)`` (``adaptive_purge=True``, the default).
  With Kafka's fixed interval every purge rescans all *pending* entries, so purge work per
  operation grows with the number pending (quadratic in the request rate). Scaling with the
  pending count makes each purge drop at least as many entries as it keeps: O(1) amortised per
  operation, and completed-but-watched operations stay below max(purge_interval, pending), so
  memory still follows the pending count. ``adaptive_purge=False`` is Kafka's rule;
- a purge proceeds in steps (one watcher list, or a few short ones, about ``PURGE_STEP``
  entries), paced by watches so that one cycle is spread over about half the watches that
  precede the next trigger: a burst of watches in one loop iteration then runs at most a step
  or two, not the whole cycle (filtering ~10^5 entries and freeing the completed operations
  takes tens of ms). ``purge_completed()`` still purges everything at once.

No lock is needed: the purgatory lives on one event loop, and each method runs to completion
without awaiting. Callbacks may re-enter it (``on_complete`` watching or checking again): lists
are only ever appended to in place and replaced by filtered copies, so an iteration in progress
is never disturbed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from purgatory.delayed_operation import DelayedOperation
from purgatory.timer import Timer

Op = TypeVar("Op", bound=DelayedOperation)

PURGE_STEP = 1024  # watcher entries filtered per purge step, at least one whole list


class Purgatory(Generic[Op]):
    """Parks DelayedOperations until an event on one of their keys completes them, or timeout."""

    def __init__(
        self, name: str, timer: Timer, purge_interval: int = 1000, *, adaptive_purge: bool = True
    ) -> None:
        self.name = name
        self.timer = timer
        self.purge_interval = purge_interval
        self.adaptive_purge = adaptive_purge
        # Our own count of operations in the timer: a timer may be shared by purgatories.
        self._counter = timer.new_counter()
        self._timer_add = timer.add
        # Watcher lists by key, oldest first; completed entries linger until a check or purge.
        self._watchers: dict[Hashable, list[Op]] = {}
        self.estimated_total = 0
        self.purges = 0
        self.purge_step = PURGE_STEP
        self._purge_keys: list[Hashable] = []  # keys still to filter in the current purge
        self._purge_pos = 0
        self._purge_pace = 1  # watches per purge step in the current cycle
        self._purge_countdown = 0
        self._last_purged = 0
        # Observability counters (plain ints, moved on the loop): operations that completed at
        # their first check and never waited, that waited and completed on an event, and that
        # went into the timer; entries dropped from watcher lists by purges. Expirations are
        # counted by the timer on this purgatory's TaskCounter (``expired``).
        self.completed_immediately = 0
        self.completed_by_event = 0
        self.parked = 0
        self.purged_entries = 0

    # -- gauges (Kafka: PurgatorySize, NumDelayedOperations) --------------------------------

    @property
    def watched(self) -> int:
        """Entries in all watcher lists: an operation counts once per key, and completed ones
        count until purged, so this can exceed the number of live operations. O(keys)."""
        return sum(len(ops) for ops in self._watchers.values())

    @property
    def delayed(self) -> int:
        """Operations of this purgatory waiting in the timer: exactly the pending ones."""
        return self._counter.n

    @property
    def watched_keys(self) -> int:
        """Keys with a watcher list (empty lists are removed)."""
        return len(self._watchers)

    @property
    def expired(self) -> int:
        """Operations of this purgatory the timer expired (their deadline came first)."""
        return self._counter.expired

    # -- operations --------------------------------------------------------------------------

    def try_complete_else_watch(self, op: Op, keys: Iterable[Hashable]) -> bool:
        """Complete ``op`` now if it can; else watch it on every key and time it out.

        Checked twice, as in Kafka: once before watching (the common fast path), and once after
        it is on every watcher list, so an event that fired between the first check and the
        watch cannot be missed. True iff the operation completed here.
        """
        if op.try_complete():
            self.completed_immediately += 1
            return True
        watchers = self._watchers
        watched_any = False
        for key in keys:
            if op._completed:
                break
            ops = watchers.get(key)
            if ops is None:
                watchers[key] = [op]
            else:
                ops.append(op)
            watched_any = True
        if not watched_any and not op._completed:
            raise ValueError("an operation needs at least one watch key")
        self.estimated_total += 1
        if op.try_complete():
            self.completed_by_event += 1
            return True
        counter = self._counter
        if not op._completed:
            # Adding to the timer never runs a task inline, so op cannot complete during add().
            self._timer_add(op, counter)
            self.parked += 1
        if self._purge_keys:
            self._purge_countdown -= 1
            if self._purge_countdown <= 0:
                self._purge_countdown = self._purge_pace
                self._purge_step()
        else:
            delayed = counter.n
            threshold = self.purge_interval
            if self.adaptive_purge and delayed > threshold:
                threshold = delayed
            if self.estimated_total - delayed > threshold:
                self._start_purge(pace_over=threshold)
        return False

    def check_and_complete(self, key: Hashable) -> int:
        """Try every operation watching ``key``; returns how many this call completed."""
        watchers = self._watchers
        ops = watchers.get(key)
        if ops is None:
            return 0
        completed = 0
        stale = 0
        # Callbacks may append to this list (seen here) or replace it with a filtered copy
        # (a nested check or a purge): this loop keeps iterating the list it started with.
        for op in ops:
            if op._completed:
                stale += 1
            elif op.try_complete():
                completed += 1
        if completed or stale:
            self.completed_by_event += completed
            current = watchers.get(key)
            if current is not None:  # else cancel_for_key dropped the key meanwhile
                live = [op for op in current if not op._completed]
                if live:
                    watchers[key] = live
                else:
                    del watchers[key]
        return completed

    def cancel_for_key(self, key: Hashable) -> list[Op]:
        """Stop watching ``key``: its operations leave the timer uncompleted and are returned
        (e.g. when a partition goes away and the caller answers them itself)."""
        ops = self._watchers.pop(key, None)
        if ops is None:
            return []
        cancelled = []
        for op in ops:
            if not op._completed:
                op.cancel()
                cancelled.append(op)
        return cancelled

    def purge_completed(self) -> int:
        """Drop completed operations from every watcher list now; returns entries removed."""
        self._start_purge(full=True)
        return self._last_purged

    def _start_purge(self, full: bool = False, pace_over: int = 0) -> None:
        """Begin a purge cycle; ``pace_over`` is the number of watches the next trigger is at
        least away, over half of which the cycle is spread."""
        self.purges += 1
        # Reset first: operations watched while the purge goes on are added on top (Kafka's
        # estimated-completed purge rule, docs/purgatory.md).
        self.estimated_total = self._counter.n
        self._purge_keys = list(self._watchers)
        self._purge_pos = 0
        self._last_purged = 0
        self._purge_pace = max(1, pace_over // (2 * max(1, len(self._purge_keys))))
        self._purge_countdown = self._purge_pace
        self._purge_step(full)

    def _purge_step(self, full: bool = False) -> None:
        """Filter whole watcher lists until about ``purge_step`` entries were scanned."""
        budget = None if full else self.purge_step
        keys = self._purge_keys
        watchers = self._watchers
        pos = self._purge_pos
        scanned = 0
        purged = 0
        while pos < len(keys) and (budget is None or scanned < budget):
            key = keys[pos]
            pos += 1
            ops = watchers.get(key)
            if ops is None:
                continue
            live = [op for op in ops if not op._completed]
            scanned += len(ops)
            purged += len(ops) - len(live)
            if live:
                watchers[key] = live
            else:
                del watchers[key]
        self._last_purged += purged
        self.purged_entries += purged
        if pos >= len(keys):
            self._purge_keys = []
            pos = 0
        self._purge_pos = pos

    def __repr__(self) -> str:
        return f"Purgatory({self.name!r}, delayed={self.delayed}, keys={self.watched_keys})"
