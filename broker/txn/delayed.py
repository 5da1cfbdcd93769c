"""The transaction coordinator's one delayed operation kind, parked in its purgatory.

Each transactional id has at most one live TxnDeadline, watched on the id: for an Ongoing
transaction it ends at start + transaction.timeout.ms (the transaction is then fenced and
aborted, Kafka's abortTimedOutTransactions), for an idle id (Empty, CompleteCommit,
CompleteAbort) at its last update + transactional.id.expiration.ms (the id is then forgotten),
and a marker write that failed with a retriable error is retried after a backoff. A new deadline
replaces the old one: the coordinator sets it on the metadata, and the old one, no longer
current, completes at its next check without doing anything. No scan, no polling: the timing
wheel wakes the loop only when a deadline is due.
"""

from __future__ import annotations

from collections.abc import Callable

from purgatory import DelayedOperation


class TxnDeadline(DelayedOperation):
    """Runs ``on_due`` at its deadline unless ``is_current`` turned False before."""

    __slots__ = ("is_current", "on_due")

    def __init__(self, delay_ms: int, is_current: Callable[[TxnDeadline], bool],
                 on_due: Callable[[], None]) -> None:
        super().__init__(max(delay_ms, 0))
        self.is_current = is_current
        self.on_due = on_due

    def try_complete(self) -> bool:
        if not self.is_current(self):
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        if self.is_current(self):
            self.on_due()
