"""TransactionMetadata: one transactional id's state, and Kafka's rules for changing it.

A change is made in two steps, as in Kafka: ``prepare_*`` checks that the transition is valid,
sets ``pending_state`` and returns a TxnTransit (the whole next state, written to
``__transaction_state``); once that record is committed ``complete_transition`` applies it. While
a transition is pending no other may be prepared, which is what makes concurrent requests answer
CONCURRENT_TRANSACTIONS instead of racing. This is transaction version 1 (KIP-98): the epoch is
bumped by InitProducerId and by fencing, never by EndTxn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NoReturn

from protocol.errors import ErrorCode

TopicPartition = tuple[str, int]
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767  # Short.MaxValue: kept free so the coordinator can always fence


class TransactionState(IntEnum):
    """Kafka's states, by the id stored in the log; ``kafka_name`` is what the admin APIs show."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        return _NAMES[self]

    @classmethod
    def from_kafka_name(cls, name: str) -> TransactionState | None:
        return _BY_NAME.get(name)

    @property
    def expiration_allowed(self) -> bool:
        """A transactional id may be forgotten only with no transaction in progress."""
        return self in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)


S = TransactionState
_NAMES = {
    S.EMPTY: "Empty", S.ONGOING: "Ongoing", S.PREPARE_COMMIT: "PrepareCommit",
    S.PREPARE_ABORT: "PrepareAbort", S.COMPLETE_COMMIT: "CompleteCommit",
    S.COMPLETE_ABORT: "CompleteAbort", S.DEAD: "Dead", S.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME = {name: state for state, name in _NAMES.items()}

# Kafka's TransactionState.validPreviousStates.
VALID_PREVIOUS: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}


class IllegalTransitionError(RuntimeError):
    """A transition Kafka's state machine forbids: a coordinator bug, never a client error."""


def is_epoch_exhausted(epoch: int) -> bool:
    return epoch >= MAX_EPOCH - 1


@dataclass(frozen=True, slots=True)
class TxnTransit:
    """The next state of a transactional id, as written to the log before it is applied."""

    producer_id: int
    prev_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    topic_partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int


@dataclass(eq=False, slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    txn_last_update_timestamp: int
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    topic_partitions: set[TopicPartition] = field(default_factory=set)
    txn_start_timestamp: int = -1
    pending_state: TransactionState | None = None
    # A fence whose write failed already bumped the epoch in memory; the next fence reuses it.
    has_failed_epoch_fence: bool = False

    @property
    def pending_transition_in_progress(self) -> bool:
        return self.pending_state is not None

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        return is_epoch_exhausted(self.producer_epoch)

    def remove_partition(self, tp: TopicPartition) -> None:
        """A marker for ``tp`` is written (or its topic is gone): one partition less to end."""
        if self.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            raise IllegalTransitionError(
                f"{self.transactional_id}: removing a partition in state {self.state.kafka_name}")
        self.topic_partitions.discard(tp)

    # -- preparing transitions -------------------------------------------------------------------
    def prepare_fence_producer_epoch(self) -> TxnTransit:
        if self.producer_epoch == MAX_EPOCH:
            raise IllegalTransitionError("cannot fence a producer at the largest epoch")
        epoch = self.producer_epoch if self.has_failed_epoch_fence else self.producer_epoch + 1
        return self._prepare(S.PREPARE_EPOCH_FENCE, self.producer_id, epoch, NO_PRODUCER_EPOCH,
                             self.txn_timeout_ms, frozenset(self.topic_partitions),
                             self.txn_start_timestamp, self.txn_last_update_timestamp)

    def prepare_increment_producer_epoch(self, timeout_ms: int, expected_epoch: int | None,
                                         now: int) -> TxnTransit | ErrorCode:
        """InitProducerId: the next epoch, or (KIP-360) the same one for a retried bump."""
        if self.is_producer_epoch_exhausted:
            raise IllegalTransitionError(f"no epoch left for producer id {self.producer_id}")
        bumped = self.producer_epoch + 1
        if expected_epoch is None:
            epoch, last = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last = self.producer_epoch, self.last_producer_epoch  # a retry of a bump
        else:
            return ErrorCode.PRODUCER_FENCED
        return self._prepare(S.EMPTY, self.producer_id, epoch, last, timeout_ms, frozenset(), -1,
                             now)

    def prepare_producer_id_rotation(self, new_producer_id: int, timeout_ms: int, now: int,
                                     record_last_epoch: bool) -> TxnTransit:
        if self.state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT):
            raise IllegalTransitionError("cannot rotate the producer id of a pending transaction")
        last = self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH
        return self._prepare(S.EMPTY, new_producer_id, 0, last, timeout_ms, frozenset(), -1, now)

    def prepare_add_partitions(self, added: set[TopicPartition], now: int) -> TxnTransit:
        starting = self.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT)
        return self._prepare(S.ONGOING, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms,
                             frozenset(self.topic_partitions | added),
                             now if starting else self.txn_start_timestamp, now)

    def prepare_abort_or_commit(self, state: TransactionState, now: int) -> TxnTransit:
        return self._prepare(state, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms,
                             frozenset(self.topic_partitions), self.txn_start_timestamp, now)

    def prepare_complete(self, now: int) -> TxnTransit:
        state = S.COMPLETE_COMMIT if self.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        self.has_failed_epoch_fence = False  # the PrepareAbort of a fence is durable now
        return self._prepare(state, self.producer_id, self.producer_epoch, self.producer_epoch,
                             self.txn_timeout_ms, frozenset(), self.txn_start_timestamp, now)

    def prepare_dead(self) -> TxnTransit:
        return self._prepare(S.DEAD, self.producer_id, self.producer_epoch,
                             self.last_producer_epoch, self.txn_timeout_ms, frozenset(),
                             self.txn_start_timestamp, self.txn_last_update_timestamp)

    def _prepare(self, state: TransactionState, producer_id: int, epoch: int, last_epoch: int,
                 timeout_ms: int, partitions: frozenset[TopicPartition], start: int,
                 now: int) -> TxnTransit:
        if self.pending_state is not None:
            raise IllegalTransitionError(
                f"{self.transactional_id}: preparing {state.kafka_name} while "
                f"{self.pending_state.kafka_name} is pending")
        if producer_id < 0:
            raise IllegalTransitionError(f"illegal producer id {producer_id}")
        if state != S.DEAD and epoch < 0:
            raise IllegalTransitionError(f"illegal producer epoch {epoch}")
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalTransitionError(
                f"{self.transactional_id}: {self.state.kafka_name} -> {state.kafka_name}")
        self.pending_state = state
        return TxnTransit(producer_id, self.producer_id, epoch, last_epoch, timeout_ms, state,
                          partitions, start, now)

    # -- completing them ---------------------------------------------------------------------------
    def complete_transition(self, t: TxnTransit) -> None:
        """Apply a transition whose record is committed (Kafka's completeTransitionTo checks)."""
        to = self.pending_state
        if to is None or to != t.state:
            self._fail(t)
        same_producer = (t.producer_epoch == self.producer_epoch
                         and t.producer_id == self.producer_id)
        if to == S.EMPTY:
            bumped = (t.producer_epoch == self.producer_epoch + 1
                      or (t.producer_epoch == 0 and t.producer_id != self.producer_id))
            if (t.producer_epoch != self.producer_epoch and not bumped) or t.topic_partitions \
                    or t.txn_start_timestamp != -1:
                self._fail(t)
            self.txn_timeout_ms = t.txn_timeout_ms
            self.producer_epoch = t.producer_epoch
            self.last_producer_epoch = t.last_producer_epoch
            self.producer_id = t.producer_id
            self.previous_producer_id = t.prev_producer_id
        elif to == S.ONGOING:
            if not same_producer or not self.topic_partitions <= t.topic_partitions \
                    or self.txn_timeout_ms != t.txn_timeout_ms:
                self._fail(t)
            self.txn_start_timestamp = t.txn_start_timestamp
            self.topic_partitions |= t.topic_partitions
        elif to in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            if not same_producer or self.topic_partitions != t.topic_partitions \
                    or self.txn_timeout_ms != t.txn_timeout_ms \
                    or self.txn_start_timestamp != t.txn_start_timestamp:
                self._fail(t)
        elif to in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            if not same_producer or self.txn_timeout_ms != t.txn_timeout_ms \
                    or t.txn_start_timestamp == -1:
                self._fail(t)
            self.txn_start_timestamp = t.txn_start_timestamp
            self.topic_partitions.clear()
        else:  # PrepareEpochFence is replaced by PrepareAbort before any write; Dead is removed
            self._fail(t)
        self.txn_last_update_timestamp = t.txn_last_update_timestamp
        self.pending_state = None
        self.state = to

    def _fail(self, t: TxnTransit) -> NoReturn:
        raise IllegalTransitionError(
            f"{self.transactional_id}: cannot complete {t} from {self.state.kafka_name} "
            f"(pending {self.pending_state})")
