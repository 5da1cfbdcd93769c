"""TransactionCoordinator: Kafka's transaction coordinator (KIP-98, transaction version 1) on one
event loop.

A transactional producer's InitProducerId gets it a producer id and a fresh epoch (fencing an
older instance, and aborting its open transaction first), AddPartitionsToTxn and AddOffsetsToTxn
put partitions in its transaction, EndTxn makes PrepareCommit or PrepareAbort durable, answers,
then writes the markers to every partition of the transaction and records CompleteCommit or
CompleteAbort. Every transition is written to `__transaction_state` (state_log.py) and applied
only once committed there; while it is in flight the id has a pending state and other requests
are answered CONCURRENT_TRANSACTIONS. Deadlines (a transaction's timeout, an idle id's
expiration, a marker retry) are one deadline per id on the timing wheel
(broker/coordinator/timer.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import structlog

from broker.coordinator.ownership import PartitionOwnership
from broker.coordinator.timer import CoordinatorTimer
from broker.replica.delayed_result import Completion, completed
from broker.txn.state_log import TransactionStateLog, value_bytes
from broker.txn.transaction_metadata import (
    NO_PRODUCER_EPOCH,
    IllegalTransitionError,
    TransactionMetadata,
    TransactionState,
    TxnTransit,
    is_epoch_exhausted,
)
from protocol.errors import ErrorCode, KafkaError
from purgatory import Timer, WallClock

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.metadata.producer_ids import ProducerIdManager
    from broker.metadata.topic_admin import TopicAdmin
    from broker.replica.replica_manager import ReplicaManager

logger = structlog.get_logger("broker.txn")

S = TransactionState
E = ErrorCode
TopicPartition = tuple[str, int]
OFFSETS_TOPIC = "__consumer_offsets"
REQUEST_TIMEOUT_MS = 30_000  # Kafka's request.timeout.ms, which bounds a marker write
RETRY_BACKOFF_MS = 100  # Kafka's retry.backoff.ms, before a failed marker or log write is retried

# What a failed append to the transaction log means to the client (appendTransactionToLog).
_APPEND_ERRORS = {
    E.UNKNOWN_TOPIC_OR_PARTITION: E.COORDINATOR_NOT_AVAILABLE,
    E.NOT_ENOUGH_REPLICAS: E.COORDINATOR_NOT_AVAILABLE,
    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND: E.COORDINATOR_NOT_AVAILABLE,
    E.REQUEST_TIMED_OUT: E.COORDINATOR_NOT_AVAILABLE,
    E.NOT_LEADER_OR_FOLLOWER: E.NOT_COORDINATOR,
    E.KAFKA_STORAGE_ERROR: E.NOT_COORDINATOR,
    E.MESSAGE_TOO_LARGE: E.UNKNOWN_SERVER_ERROR,
    E.RECORD_LIST_TOO_LARGE: E.UNKNOWN_SERVER_ERROR,
}
# Marker errors, as Kafka's TransactionMarkerRequestCompletionHandler sorts them.
_MARKER_RETRIABLE = frozenset({
    E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_LEADER_OR_FOLLOWER, E.NOT_ENOUGH_REPLICAS,
    E.NOT_ENOUGH_REPLICAS_AFTER_APPEND, E.REQUEST_TIMED_OUT, E.KAFKA_STORAGE_ERROR})
_MARKER_FENCED = frozenset({E.INVALID_PRODUCER_EPOCH, E.TRANSACTION_COORDINATOR_FENCED})
_MARKER_SKIPPED = frozenset({E.UNSUPPORTED_FOR_MESSAGE_FORMAT, E.UNSUPPORTED_VERSION})


@dataclass(frozen=True, slots=True)
class TxnConfig:
    transactional_id_expiration_ms: int
    transaction_max_timeout_ms: int
    num_partitions: int
    segment_bytes: int

    @classmethod
    def of(cls, cfg: BrokerConfig) -> TxnConfig:
        return cls(cfg["transactional.id.expiration.ms"], cfg["transaction.max.timeout.ms"],
                   cfg["transaction.state.log.num.partitions"],
                   cfg["transaction.state.log.segment.bytes"])


@dataclass(frozen=True, slots=True)
class InitProducerIdResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """One id of a DescribeTransactions answer (zeros beside an error, as Kafka leaves them)."""

    transactional_id: str
    error: ErrorCode
    state: str = ""
    timeout_ms: int = 0
    start_time_ms: int = 0
    producer_id: int = 0
    producer_epoch: int = 0
    partitions: list[TopicPartition] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TransactionListing:
    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class ListTransactionsResult:
    error: ErrorCode
    transactions: list[TransactionListing] = field(default_factory=list)
    unknown_state_filters: list[str] = field(default_factory=list)


class MarkerChannel(Protocol):
    """Where markers go (Kafka's TransactionMarkerChannelManager): the local replica manager
    on one broker; in a cluster each partition's leader, remote ones by WriteTxnMarkers."""

    def known(self, tp: TopicPartition) -> bool:
        """False: the partition is gone (its topic deleted), no marker is owed to it."""

    def write(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
              partitions: list[TopicPartition], timeout_ms: int
              ) -> Completion[dict[TopicPartition, ErrorCode]]:
        """Each partition's error once its marker is written (acks=all) or has failed."""


class LocalMarkerChannel:
    """Every partition is this broker's (single-node mode)."""

    def __init__(self, replica_manager: ReplicaManager) -> None:
        self.replica_manager = replica_manager

    def known(self, tp: TopicPartition) -> bool:
        return tp in self.replica_manager.partitions

    def write(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
              partitions: list[TopicPartition], timeout_ms: int
              ) -> Completion[dict[TopicPartition, ErrorCode]]:
        return self.replica_manager.write_txn_markers(
            producer_id, producer_epoch, coordinator_epoch, commit, partitions, timeout_ms)


@dataclass(eq=False, slots=True)
class _PendingCompletion:
    """A transaction whose markers are being written; ``transit`` is its Complete* state."""

    md: TransactionMetadata
    transit: TxnTransit
    commit: bool
    coordinator_epoch: int


class TransactionCoordinator:
    def __init__(
        self, config: BrokerConfig, timer: Timer, replica_manager: ReplicaManager,
        topics: TopicAdmin, producer_ids: ProducerIdManager,
        on_offsets_markers: Callable[[int, list[int], bool], None],
        partition_for_group: Callable[[str], int], clock: WallClock,
    ) -> None:
        """``timer`` runs the deadlines (timeouts, id expiry, marker retries); ``clock`` is
        the broker's wall clock they are set by and the state is stamped with."""
        wall_ms = clock.wall_ms
        self.config = TxnConfig.of(config)
        self.replica_manager = replica_manager
        #: where markers are written; the server sets a cluster's before ``start``.
        self.markers: MarkerChannel = LocalMarkerChannel(replica_manager)
        self.producer_ids = producer_ids
        # One deadline per transactional id: the transaction's timeout while Ongoing, the
        # id's expiration while idle, or a marker or log write's retry after its backoff.
        self._deadlines: CoordinatorTimer[str] = CoordinatorTimer(timer)
        self.state_log = TransactionStateLog(replica_manager, topics, self.config.num_partitions,
                                             self.config.segment_bytes, wall_ms)
        self._on_offsets_markers = on_offsets_markers
        self._partition_for_group = partition_for_group
        self._wall_ms = wall_ms
        self._active = False
        self._pending_markers: dict[str, _PendingCompletion] = {}
        # Read by metrics.
        self.transactions: dict[str, TransactionMetadata] = {}
        self.timed_out = 0  # transactions aborted at their timeout
        self.expired_ids = 0  # transactional ids forgotten after transactional.id.expiration.ms
        #: Cluster mode: the __transaction_state partitions this broker coordinates and those
        #: it is loading. None: a single broker, every partition loaded at start.
        self.ownership: PartitionOwnership | None = None

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Load `__transaction_state` if it exists; finish what a previous run left prepared
        (markers, then Complete*), and set every loaded id's deadline. Following partition
        leadership, each partition is loaded when this broker becomes its leader instead."""
        if self.ownership is None and self.state_log.use_existing():
            self.transactions = self.state_log.load()
        self._active = True
        self._resume(list(self.transactions.values()))

    def _resume(self, loaded: Iterable[TransactionMetadata]) -> None:
        """Loaded ids: a prepared transaction's markers written and Complete* recorded, every
        other id's deadline set."""
        now = self._wall_ms()
        for md in loaded:
            if md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                commit = md.state == S.PREPARE_COMMIT
                logger.info("resuming transaction completion", transactional_id=md.transactional_id,
                            producer_id=md.producer_id, commit=commit,
                            partitions=len(md.topic_partitions))
                self._send_markers(md, md.prepare_complete(now), commit)
            else:
                self._schedule(md)

    # -- partition leadership (cluster mode) ---------------------------------------------------
    def follow_partition_leadership(self) -> None:
        """Coordinate only the ids of the partitions this broker leads (cluster mode):
        nothing until ``load_partition``; the topic is created through the controller."""
        self.ownership = PartitionOwnership()

    def coordinator_error(self, transactional_id: str) -> ErrorCode | None:
        """Kafka's getTransactionState: COORDINATOR_LOAD_IN_PROGRESS while the id's partition
        is loading, NOT_COORDINATOR when this broker does not lead it."""
        if self.ownership is None:
            return None
        return self.ownership.error(self.partition_for(transactional_id))

    def begin_loading(self, partition: int) -> None:
        """Kafka's onElection: the partition is this broker's, its ids not yet read."""
        if self.ownership is not None:
            self.ownership.begin_loading(partition)

    def load_partition(self, partition: int) -> None:
        """Kafka's loadTransactionsForTxnTopicPartition: the partition's ids read back from its
        log (the loader start uses), then served; prepared transactions are completed."""
        self.begin_loading(partition)
        self._remove_partition(partition)
        loaded = self.state_log.load_partition(partition)
        self.transactions.update(loaded)
        if self.ownership is not None:
            self.ownership.loaded(partition)
        if loaded:
            logger.info("transactions loaded", partition=partition, transactions=len(loaded))
        if self._active:
            self._resume(list(loaded.values()))

    def unload_partition(self, partition: int) -> None:
        """Kafka's removeTransactionsForTxnTopicPartition: the partition's ids leave this
        broker with their deadlines and pending markers; a write of theirs still in flight
        answers NOT_COORDINATOR."""
        if self.ownership is not None:
            self.ownership.lost(partition)
        removed = self._remove_partition(partition)
        if removed:
            logger.info("transactions unloaded", partition=partition, transactions=removed)

    def _remove_partition(self, partition: int) -> int:
        tids = [t for t in self.transactions if self.partition_for(t) == partition]
        for tid in tids:
            del self.transactions[tid]
            self._deadlines.cancel(tid)
            self._pending_markers.pop(tid, None)
        return len(tids)

    def shutdown(self) -> None:
        self._active = False
        self._pending_markers.clear()
        self._deadlines.cancel_all()

    def ensure_topic(self) -> None:
        """`__transaction_state` exists from the first transactional FindCoordinator on (in
        cluster mode the cluster's topic, created through the controller instead)."""
        if self.ownership is None and not self.state_log.exists:
            self.state_log.ensure_topic()

    def partition_for(self, transactional_id: str) -> int:
        return self.state_log.partition_for(transactional_id)

    @property
    def pending_markers(self) -> int:
        """Transactions whose markers are being written (Kafka's numTxnsWithPendingMarkers)."""
        return len(self._pending_markers)

    # -- InitProducerId ----------------------------------------------------------------------
    def init_producer_id(
        self, transactional_id: str, txn_timeout_ms: int,
        expected: tuple[int, int] | None = None,
    ) -> Completion[InitProducerIdResult]:
        """A transactional producer's id and epoch. ``expected`` is the (producer id, epoch) a
        producer presents to bump its epoch after an error (KIP-360)."""
        if not transactional_id:
            return completed(InitProducerIdResult(E.INVALID_REQUEST))
        if not 0 < txn_timeout_ms <= self.config.transaction_max_timeout_ms:
            return completed(InitProducerIdResult(E.INVALID_TRANSACTION_TIMEOUT))
        if not self._active:
            return completed(InitProducerIdResult(E.COORDINATOR_LOAD_IN_PROGRESS))
        if (moved := self.coordinator_error(transactional_id)) is not None:
            return completed(InitProducerIdResult(moved))
        self.ensure_topic()
        md = self.transactions.get(transactional_id)
        if md is None:
            try:
                producer_id = self.producer_ids.generate()
            except KafkaError as e:  # no producer id block at hand yet: the client retries
                return completed(InitProducerIdResult(e.error_code))
            md = TransactionMetadata(transactional_id, producer_id,
                                     NO_PRODUCER_EPOCH, txn_timeout_ms, S.EMPTY, self._wall_ms())
            self.transactions[transactional_id] = md
        prepared = self._prepare_init(md, txn_timeout_ms, expected)
        if isinstance(prepared, ErrorCode):
            return completed(InitProducerIdResult(prepared))
        transit = prepared
        if transit.state == S.PREPARE_EPOCH_FENCE:
            # Abort the open transaction first; the client retries and gets the next epoch.
            def fenced(error: ErrorCode) -> InitProducerIdResult:
                return InitProducerIdResult(E.CONCURRENT_TRANSACTIONS if error == E.NONE
                                            else error)
            return self._end_transaction(transactional_id, transit.producer_id,
                                         transit.producer_epoch, False,
                                         from_client=False).then(fenced)

        def initialized(error: ErrorCode) -> InitProducerIdResult:
            if error != E.NONE:
                return InitProducerIdResult(error)
            logger.info("producer initialized", transactional_id=transactional_id,
                        producer_id=transit.producer_id, epoch=transit.producer_epoch)
            return InitProducerIdResult(E.NONE, transit.producer_id, transit.producer_epoch)
        return self._append(md, transit).then(initialized)

    def _prepare_init(self, md: TransactionMetadata, timeout_ms: int,
                      expected: tuple[int, int] | None) -> TxnTransit | ErrorCode:
        def valid_producer(producer_id: int, epoch: int) -> bool:
            return (md.producer_epoch == NO_PRODUCER_EPOCH or producer_id == md.producer_id
                    or (producer_id == md.previous_producer_id and is_epoch_exhausted(epoch)))

        if md.pending_transition_in_progress:
            return E.CONCURRENT_TRANSACTIONS
        if expected is not None and not valid_producer(*expected):
            return E.PRODUCER_FENCED
        if md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return E.CONCURRENT_TRANSACTIONS
        now = self._wall_ms()
        if md.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            if md.is_producer_epoch_exhausted and (expected is None
                                                   or expected[1] == md.producer_epoch):
                try:
                    producer_id = self.producer_ids.generate()
                except KafkaError as e:
                    return e.error_code
                return md.prepare_producer_id_rotation(producer_id, timeout_ms,
                                                       now, expected is not None)
            return md.prepare_increment_producer_epoch(
                timeout_ms, expected[1] if expected is not None else None, now)
        if md.state == S.ONGOING:
            return md.prepare_fence_producer_epoch()
        raise IllegalTransitionError(f"{md.transactional_id} found in {md.state.kafka_name}")

    # -- AddPartitionsToTxn, AddOffsetsToTxn and the KIP-890 check ---------------------------------
    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[TopicPartition]) -> Completion[ErrorCode]:
        added = set(partitions)
        if not transactional_id:
            return completed(E.INVALID_REQUEST)
        md, error = self._lookup(transactional_id)
        if md is None:
            return completed(error)
        if md.producer_id != producer_id:
            return completed(E.INVALID_PRODUCER_ID_MAPPING)
        if md.producer_epoch != producer_epoch:
            return completed(E.PRODUCER_FENCED)
        if md.pending_transition_in_progress or md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return completed(E.CONCURRENT_TRANSACTIONS)
        if md.state == S.ONGOING and added <= md.topic_partitions:
            return completed(E.NONE)
        transit = md.prepare_add_partitions(added, self._wall_ms())
        return self._append(md, transit)

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int,
                    group_id: str) -> Completion[ErrorCode]:
        """The group's `__consumer_offsets` partition joins the transaction."""
        tp = (OFFSETS_TOPIC, self._partition_for_group(group_id))
        return self.add_partitions(transactional_id, producer_id, producer_epoch, [tp])

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        """Kafka's handleVerifyPartitionsInTransaction: NONE for a partition in the transaction,
        TRANSACTION_ABORTABLE for one that is not."""
        tps = list(partitions)
        if not transactional_id:
            return {tp: E.INVALID_REQUEST for tp in tps}
        md, error = self._lookup(transactional_id)
        if md is None:
            return {tp: error for tp in tps}
        if md.producer_id != producer_id:
            error = E.INVALID_PRODUCER_ID_MAPPING
        elif md.producer_epoch != producer_epoch:
            error = E.PRODUCER_FENCED
        elif md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            error = E.CONCURRENT_TRANSACTIONS
        else:
            return {tp: E.NONE if tp in md.topic_partitions else E.TRANSACTION_ABORTABLE
                    for tp in tps}
        return {tp: error for tp in tps}

    def verify_partition(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         tp: TopicPartition) -> ErrorCode:
        """The KIP-890 part 1 check of a transactional produce or TxnOffsetCommit."""
        return self.verify_partitions(transactional_id, producer_id, producer_epoch, [tp])[tp]

    # -- EndTxn ---------------------------------------------------------------------------------
    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool) -> Completion[ErrorCode]:
        """Answered once PrepareCommit/PrepareAbort is durable; the markers follow."""
        return self._end_transaction(transactional_id, producer_id, producer_epoch, commit,
                                     from_client=True)

    def _end_transaction(self, tid: str, producer_id: int, producer_epoch: int, commit: bool,
                         *, from_client: bool) -> Completion[ErrorCode]:
        """Kafka's endTransaction: the client's answer once Prepare* is written (or at once,
        refused); the markers are sent after it."""
        if not tid:
            return completed(E.INVALID_REQUEST)
        md, error = self._lookup(tid)
        if md is None:
            return completed(error)
        valid_epoch = ((not from_client or producer_epoch == md.producer_epoch)
                       and producer_epoch >= md.producer_epoch)
        fencing = False
        if md.producer_id != producer_id:
            return completed(E.INVALID_PRODUCER_ID_MAPPING)
        if not valid_epoch:
            return completed(E.PRODUCER_FENCED)
        if md.pending_state not in (None, S.PREPARE_EPOCH_FENCE):
            return completed(E.CONCURRENT_TRANSACTIONS)
        if md.state == S.ONGOING:
            target = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
            if target == S.PREPARE_ABORT and md.pending_state == S.PREPARE_EPOCH_FENCE:
                # The fence's epoch is taken now; if its write fails the next fence reuses it.
                fencing = True
                md.pending_state = None
                md.producer_epoch = producer_epoch
                md.last_producer_epoch = NO_PRODUCER_EPOCH
            transit = md.prepare_abort_or_commit(target, self._wall_ms())
        elif md.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            # A retry of an end that completed: the same result is answered as done.
            done = (md.state == S.COMPLETE_COMMIT) == commit
            return completed(E.NONE if done else E.INVALID_TXN_STATE)
        elif md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            same = (md.state == S.PREPARE_COMMIT) == commit
            return completed(E.CONCURRENT_TRANSACTIONS if same else E.INVALID_TXN_STATE)
        elif md.state == S.EMPTY:
            return completed(E.INVALID_TXN_STATE)
        else:
            raise IllegalTransitionError(f"{tid} found in {md.state.kafka_name}")

        def prepared(error: ErrorCode) -> ErrorCode:
            if error != E.NONE:
                if fencing and self.transactions.get(tid) is md:
                    md.has_failed_epoch_fence = True
                    logger.warning("epoch fence not written", transactional_id=tid,
                                   epoch=producer_epoch, error=error.name)
                return error
            if md.producer_id != producer_id:
                return E.INVALID_PRODUCER_ID_MAPPING
            if md.producer_epoch != producer_epoch:
                return E.PRODUCER_FENCED
            if md.pending_transition_in_progress:
                return E.CONCURRENT_TRANSACTIONS
            if md.state != transit.state:
                return E.INVALID_TXN_STATE
            self._send_markers(md, md.prepare_complete(self._wall_ms()), commit)
            return E.NONE

        return self._append(md, transit).then(prepared)

    # -- markers ----------------------------------------------------------------------------------
    def _send_markers(self, md: TransactionMetadata, completion: TxnTransit, commit: bool) -> None:
        pending = _PendingCompletion(md, completion, commit,
                                     self.state_log.coordinator_epoch(md.transactional_id))
        self._pending_markers[md.transactional_id] = pending
        self._write_markers(pending, set(md.topic_partitions))

    def _write_markers(self, pending: _PendingCompletion, partitions: set[TopicPartition]) -> None:
        md = pending.md
        tid = md.transactional_id
        if self._pending_markers.get(tid) is not pending:
            return
        for tp in sorted(tp for tp in partitions if not self.markers.known(tp)):
            # Kafka skips a partition without a leader: its topic is deleted.
            logger.info("transaction partition gone, no marker", transactional_id=tid,
                        topic=tp[0], partition=tp[1])
            md.remove_partition(tp)
            partitions.discard(tp)
        if not partitions:
            return self._maybe_write_completion(tid)
        to_write = sorted(partitions)
        written = self.markers.write(
            md.producer_id, md.producer_epoch, pending.coordinator_epoch, pending.commit,
            to_write, REQUEST_TIMEOUT_MS)
        written.add_done_callback(lambda f: self._markers_written(pending, to_write, f))

    def _markers_written(self, pending: _PendingCompletion, partitions: list[TopicPartition],
                         f: Completion[dict[TopicPartition, ErrorCode]]) -> None:
        md = pending.md
        tid = md.transactional_id
        if self._pending_markers.get(tid) is not pending:
            return
        if f.cancelled() or f.exception() is not None:
            logger.warning("transaction markers failed", transactional_id=tid,
                           error=repr(None if f.cancelled() else f.exception()))
            return self._retry_markers(pending, set(partitions))
        results = f.result()
        retry: set[TopicPartition] = set()
        offsets: list[int] = []
        stop = False
        for tp in partitions:
            error = results.get(tp, E.UNKNOWN_TOPIC_OR_PARTITION)
            if error == E.NONE:
                md.remove_partition(tp)
                if tp[0] == OFFSETS_TOPIC and tp in self.replica_manager.partitions:
                    offsets.append(tp[1])  # a remote leader completes its own offsets
            elif error in _MARKER_RETRIABLE:
                retry.add(tp)
            elif error in _MARKER_SKIPPED:
                md.remove_partition(tp)
            else:
                # Fenced (a newer producer or coordinator epoch owns the partition): this
                # transaction can be ignored there; anything else is unexpected, as in Kafka.
                log_at = logger.info if error in _MARKER_FENCED else logger.error
                log_at("transaction markers abandoned", transactional_id=tid, topic=tp[0],
                       partition=tp[1], error=error.name)
                stop = True
        if offsets:
            try:
                self._on_offsets_markers(md.producer_id, offsets, pending.commit)
            except Exception:
                logger.exception("offsets not materialized after markers", transactional_id=tid)
        if stop:
            self._pending_markers.pop(tid, None)
        elif retry:
            logger.info("retrying transaction markers", transactional_id=tid,
                        partitions=[f"{t}-{p}" for t, p in sorted(retry)])
            self._retry_markers(pending, retry)
        else:
            self._maybe_write_completion(tid)

    def _retry_markers(self, pending: _PendingCompletion, partitions: set[TopicPartition]) -> None:
        tid = pending.md.transactional_id
        self._set_deadline(tid, self._wall_ms() + RETRY_BACKOFF_MS, lambda: self._write_markers(
            pending, partitions & pending.md.topic_partitions))

    def _maybe_write_completion(self, tid: str) -> None:
        pending = self._pending_markers.get(tid)
        if pending is None or pending.md.topic_partitions:
            return
        del self._pending_markers[tid]
        self._write_completion(pending)

    def _write_completion(self, pending: _PendingCompletion) -> None:
        md = pending.md
        tid = md.transactional_id
        if self.transactions.get(tid) is not md:
            return

        def written(error: ErrorCode) -> None:
            if error == E.NONE:
                logger.info("transaction completed", transactional_id=tid,
                            producer_id=md.producer_id, state=md.state.kafka_name)
            elif error == E.COORDINATOR_NOT_AVAILABLE:
                self._set_deadline(tid, self._wall_ms() + RETRY_BACKOFF_MS,
                                   lambda: self._write_completion(pending))
            else:
                logger.warning("transaction completion not written", transactional_id=tid,
                               error=error.name)

        self._append(md, pending.transit,
                     retry_on_error=lambda e: e == E.COORDINATOR_NOT_AVAILABLE).then(written)

    # -- DescribeTransactions, ListTransactions ---------------------------------------------------
    def describe(self, transactional_id: str) -> TransactionDescription:
        if not self._active:
            return TransactionDescription(transactional_id, E.COORDINATOR_NOT_AVAILABLE)
        if not transactional_id:
            return TransactionDescription(transactional_id, E.INVALID_REQUEST)
        if (moved := self.coordinator_error(transactional_id)) is not None:
            return TransactionDescription(transactional_id, moved)
        md = self.transactions.get(transactional_id)
        if md is None or md.state == S.DEAD:
            return TransactionDescription(transactional_id, E.TRANSACTIONAL_ID_NOT_FOUND)
        return TransactionDescription(
            transactional_id, E.NONE, md.state.kafka_name, md.txn_timeout_ms,
            md.txn_start_timestamp, md.producer_id, md.producer_epoch,
            sorted(md.topic_partitions))

    def list_transactions(self, producer_ids: Iterable[int] = (), states: Iterable[str] = (),
                          duration_ms: int = -1) -> ListTransactionsResult:
        """Kafka's listTransactionStates: every filter given must match; Dead ids are never
        listed; ``duration_ms`` >= 0 keeps transactions running longer than it. While a
        partition this broker leads is loading (cluster mode), COORDINATOR_LOAD_IN_PROGRESS
        and nothing listed, as Kafka's TransactionStateManager answers."""
        if not self._active:
            return ListTransactionsResult(E.COORDINATOR_NOT_AVAILABLE)
        if self.ownership is not None and self.ownership.loading:
            return ListTransactionsResult(E.COORDINATOR_LOAD_IN_PROGRESS)
        pids = set(producer_ids)
        names = list(states)
        wanted = {s for n in names if (s := S.from_kafka_name(n)) is not None}
        unknown = [n for n in names if S.from_kafka_name(n) is None]
        now = self._wall_ms()
        listed = [
            TransactionListing(md.transactional_id, md.producer_id, md.state.kafka_name)
            for md in self.transactions.values()
            if md.state != S.DEAD
            and (not pids or md.producer_id in pids)
            and (not names or md.state in wanted)
            and not (duration_ms >= 0 and now - md.txn_start_timestamp <= duration_ms)
        ]
        return ListTransactionsResult(E.NONE, listed, unknown)

    # -- deadlines ---------------------------------------------------------------------------
    def _schedule(self, md: TransactionMetadata) -> None:
        """The id's deadline for its current state: the transaction timeout while Ongoing, the
        id's expiration while idle, none while a transaction is being ended."""
        tid = md.transactional_id
        if self.transactions.get(tid) is not md:
            return
        if md.state == S.ONGOING:
            self._set_deadline(tid, md.txn_start_timestamp + md.txn_timeout_ms,
                               lambda: self._abort_timed_out(tid))
        elif md.state.expiration_allowed:
            self._set_deadline(
                tid, md.txn_last_update_timestamp + self.config.transactional_id_expiration_ms,
                lambda: self._expire_transactional_id(tid))
        else:
            self._set_deadline(tid, None, None)

    def _set_deadline(self, tid: str, at_ms: int | None, on_due: Callable[[], None] | None
                      ) -> None:
        """The id's one deadline, at ``at_ms`` on the wall clock, replacing the earlier one."""
        if at_ms is None or on_due is None or not self._active:
            self._deadlines.cancel(tid)
            return
        self._deadlines.schedule(tid, at_ms - self._wall_ms(), on_due)

    def _abort_timed_out(self, tid: str) -> None:
        """Kafka's abortTimedOutTransactions for one id: fence the producer's epoch and abort.
        With a write in flight nothing is done now; its completion sets the deadline again."""
        md = self.transactions.get(tid)
        if md is None or md.state != S.ONGOING or md.pending_transition_in_progress:
            return
        if self._wall_ms() < md.txn_start_timestamp + md.txn_timeout_ms:
            return self._schedule(md)  # the wall clock is behind the timer: not yet
        transit = md.prepare_fence_producer_epoch()
        self.timed_out += 1
        logger.info("transaction timed out, aborting", transactional_id=tid,
                    producer_id=md.producer_id, epoch=transit.producer_epoch,
                    timeout_ms=md.txn_timeout_ms)

        def ended(error: ErrorCode) -> None:
            if error != E.NONE:
                logger.info("timed-out transaction not aborted", transactional_id=tid,
                            error=error.name)

        self._end_transaction(tid, transit.producer_id, transit.producer_epoch, False,
                              from_client=False).then(ended)

    def _expire_transactional_id(self, tid: str) -> None:
        """transactional.id.expiration.ms passed with no transaction: tombstone and forget."""
        md = self.transactions.get(tid)
        if md is None or md.pending_transition_in_progress or not md.state.expiration_allowed:
            return
        expires = md.txn_last_update_timestamp + self.config.transactional_id_expiration_ms
        if self._wall_ms() < expires:
            return self._schedule(md)
        transit = md.prepare_dead()
        written = self.state_log.append(tid, None, REQUEST_TIMEOUT_MS)

        def done(f: Completion[tuple[ErrorCode, int]]) -> None:
            error = f.result()[0]
            if (self.transactions.get(tid) is md and md.pending_state == S.DEAD
                    and md.producer_epoch == transit.producer_epoch and error == E.NONE):
                del self.transactions[tid]
                self.expired_ids += 1
                logger.info("transactional id expired", transactional_id=tid,
                            producer_id=md.producer_id)
                return
            logger.warning("transactional id not expired", transactional_id=tid, error=error.name)
            md.pending_state = None
            self._schedule(md)

        written.add_done_callback(done)

    # -- the log --------------------------------------------------------------------------------
    def _lookup(self, tid: str) -> tuple[TransactionMetadata | None, ErrorCode]:
        if not self._active:
            return None, E.COORDINATOR_LOAD_IN_PROGRESS
        if (moved := self.coordinator_error(tid)) is not None:
            return None, moved
        md = self.transactions.get(tid)
        return md, (E.NONE if md is not None else E.INVALID_PRODUCER_ID_MAPPING)

    def _append(self, md: TransactionMetadata, transit: TxnTransit,
                retry_on_error: Callable[[ErrorCode], bool] | None = None
                ) -> Completion[ErrorCode]:
        """Kafka's appendTransactionToLog: write the transition, apply it once committed (or
        drop the pending state on failure), then complete with the client's error. The
        transition is applied on the loop after the write, not inside the append that
        completed it."""
        tid = md.transactional_id
        written = self.state_log.append(tid, value_bytes(transit), transit.txn_timeout_ms)

        answer: Completion[ErrorCode] = Completion()

        def done(f: Completion[tuple[ErrorCode, int]]) -> None:
            error = f.result()[0]
            error = _APPEND_ERRORS.get(error, error)
            current = self.transactions.get(tid) is md
            if error == E.NONE:
                if current:
                    md.complete_transition(transit)
                else:
                    error = E.NOT_COORDINATOR
            elif current and not (retry_on_error is not None and retry_on_error(error)):
                logger.info("transaction log append failed", transactional_id=tid,
                            state=transit.state.kafka_name, error=error.name)
                md.pending_state = None
            if current and md.pending_state is None:
                self._schedule(md)
            answer.set_result(error)

        written.add_done_callback(done)
        return answer
