"""What a consistency run observed, as plain data: the input of the analysis.

A history is what the clients saw, nothing the broker says about itself: every record sent
(its unique value, the partition asked for, the offset the acknowledgement gave or the error),
every poll (the records each consumer read, with their offsets) and every assignment that
lets a consumer's position move back on purpose. Times are seconds since the run began.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    """How a transaction ended, as its producer knows it."""

    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"  # the commit's answer never came: it may or may not have committed


@dataclass(frozen=True)
class Send:
    """One record produced. ``acked_s`` is when the broker's answer came (None: never
    answered), ``error`` what it said when it refused; ``offset`` is the acknowledged offset
    (None when refused, unanswered or answered without one); ``txn`` names its transaction
    (``producer`` and ``txn`` together) when the producer is transactional."""

    producer: str
    value: str
    partition: int
    offset: int | None = None
    error: str | None = None
    sent_s: float = 0.0
    acked_s: float | None = None
    txn: int | None = None


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    value: str


@dataclass(frozen=True)
class Poll:
    """The records one call to a consumer's poll returned, in the order it returned them."""

    consumer: str
    records: tuple[Record, ...]
    at_s: float = 0.0
    read_committed: bool = False


@dataclass(frozen=True)
class Assign:
    """A consumer was (re)assigned ``partitions`` or sought on them: its position there may
    move anywhere, so the next poll is not compared with the ones before."""

    consumer: str
    partitions: tuple[int, ...]
    at_s: float = 0.0


@dataclass
class History:
    """Everything a run recorded. ``sends`` holds each producer's records in the order it
    produced them; ``reads`` each consumer's polls and assignments in the order they
    happened; ``drained`` says the final read reached every partition's end, so an
    acknowledged record still unread then is an anomaly rather than a run cut short."""

    sends: list[Send] = field(default_factory=list)
    reads: list[Poll | Assign] = field(default_factory=list)
    txns: dict[tuple[str, int], Outcome] = field(default_factory=dict)
    drained: bool = False

    def outcome(self, send: Send) -> Outcome | None:
        """The outcome of the transaction ``send`` belongs to (None outside transactions)."""
        if send.txn is None:
            return None
        return self.txns.get((send.producer, send.txn), Outcome.UNKNOWN)

    def acknowledged(self, send: Send) -> bool:
        """Acknowledged in Kafka's sense: the broker answered without an error and, in a
        transaction, the transaction committed."""
        if send.error is not None or send.acked_s is None:
            return False
        outcome = self.outcome(send)
        return outcome is None or outcome is Outcome.COMMITTED

    def polls(self) -> list[Poll]:
        return [r for r in self.reads if isinstance(r, Poll)]
