"""ReplicaManager: the partitions this broker leads and everything that appends to or reads them.

Like Kafka's ReplicaManager it owns produce and fetch end to end: validate, append or read,
then answer now or park a DelayedProduce / DelayedFetch in its purgatories; either way it hands
back a Completion (broker/replica/delayed_result.py), completed already when nothing waits.
Handlers and the offsets store call it and never see a purgatory; it never sees the wire
format. Whatever moves a partition's high watermark or log start (append, fsync, retention,
deletion) checks the purgatories for that partition here: parked requests complete on the
event, never on a poll.

A disk fault takes a log dir offline (broker/log/dir_failure.py); as Kafka's
handleLogDirFailure, the partitions of that dir then answer KAFKA_STORAGE_ERROR to Produce and
Fetch, what is parked on them is answered at once, and the partitions of the other dirs go on
as before. Offline partitions stay in ``partitions`` (Kafka's HostedPartition.Offline).

The leader's side of replication (docs/replication.md): a Fetch from a replica (replica id
>= 0) reads up to the log end, moves that follower's state, and so the high watermark and the
ISR; the ISR is changed only through the cluster's ``IsrWriter``, checked for lagging
followers every half replica.lag.time.max.ms on the timer. With no followers (a single
broker) none of it runs and a replica fetch is refused as from an unknown replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from broker.log.dir_failure import KafkaStorageError, LogDirFailureChannel
from broker.log.log import AppendInfo, AppendOrigin, Log, OffsetOutOfRangeError
from broker.log.txn_index import AbortedTxn
from broker.metrics.instruments import Histogram
from broker.replica.delayed_delete_records import DelayedDeleteRecords
from broker.replica.delayed_fetch import DelayedFetch
from broker.replica.delayed_produce import DelayedProduce
from broker.replica.delayed_result import Completion, chain, completed
from broker.replica.hw_checkpoint import HighWatermarkCheckpoints, HighWatermarks
from broker.replica.partition import Partition
from broker.replica.replica_state import IsrFenced, IsrWriter, LeaderAndIsrState, ReplicaState
from protocol.errors import ErrorCode, KafkaError
from protocol.record_batch import (
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    check_produce_request_version,
    iter_batches,
)
from purgatory import Purgatory, Timer, TimerTask, WallClock, system_wall_ms

logger = structlog.get_logger("broker.replica")

TopicPartition = tuple[str, int]
VALID_ACKS = (0, 1, -1)
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
#: How often a fetcher waiting for a followed log's flush checks again without being woken
#: (a flush asked for again, should a wake-up never come)
_FLUSH_RECHECK_S = 0.5

#: Asks the transaction coordinator whether a partition is in a producer's ongoing transaction
#: (transactional id, producer id, producer epoch, partition) -> error; set by the server.
TransactionVerifier = Callable[[str, int, int, TopicPartition], ErrorCode]
# Cluster mode: the check asked of a transaction coordinator on another broker (transactional
# id, producer id, epoch, partitions); None when the coordinator is this broker's own.
RemoteTransactionVerifier = Callable[
    [str, int, int, list[TopicPartition]], "Completion[dict[TopicPartition, ErrorCode]] | None"]

# Verification errors a producer may retry, answered as Kafka does to clients that may not
# know them: NOT_ENOUGH_REPLICAS is retriable and does not trigger a metadata refresh.
_RETRIABLE_VERIFICATION_ERRORS = frozenset({
    ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
})


@dataclass(slots=True)
class ProduceResult:
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    last_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    message: str | None = None
    record_errors: list[tuple[int, str | None]] = field(default_factory=list)


ProduceResults = dict[TopicPartition, ProduceResult]


@dataclass(slots=True)
class DeleteRecordsResult:
    """One partition of a DeleteRecords: its error, or the low watermark it now has."""

    error: ErrorCode
    low_watermark: int = -1


@dataclass(slots=True)
class PartitionFetch:
    """One partition of a fetch: ``tp`` is None when the request named an unknown topic id."""

    tp: TopicPartition | None
    fetch_offset: int
    max_bytes: int
    #: the client's current leader epoch (Fetch v9+), -1: not checked.
    current_leader_epoch: int = -1
    #: a follower's log start offset (Fetch v5+), -1 from a consumer.
    log_start_offset: int = -1
    #: the epoch of the fetcher's last batch (Fetch v12+), -1: none, nothing checked.
    last_fetched_epoch: int = -1


@dataclass(slots=True)
class FetchResult:
    error: ErrorCode
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    last_stable_offset: int = -1
    #: read_committed only: the aborted transactions overlapping what was read.
    aborted: list[AbortedTxn] | None = None
    #: (epoch, end offset) when the fetcher's log diverged from this one (Fetch v12+): no
    #: records, the fetcher truncates to it (Kafka's DivergingEpoch).
    diverging_epoch: tuple[int, int] | None = None


class ReplicaManager:
    def __init__(self, flush_interval_ms: int, timer: Timer, clock: WallClock) -> None:
        """``timer`` holds the parked produce and fetch requests; ``clock`` is the broker's
        wall clock, the "now" of appends, markers and retention."""
        self.clock = clock
        self.partitions: dict[TopicPartition, Partition] = {}
        self.timer = timer
        self.produce_purgatory: Purgatory[DelayedProduce] = Purgatory("produce", timer)
        self.fetch_purgatory: Purgatory[DelayedFetch] = Purgatory("fetch", timer)
        self.delete_records_purgatory: Purgatory[DelayedDeleteRecords] = Purgatory(
            "delete_records", timer)
        self._failure_channels: list[LogDirFailureChannel] = []
        self._flush_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="flusher")
        self._flush_tasks: set[asyncio.Task[None]] = set()
        #: fetchers waiting for a followed log's flush: woken by each flush, failed dir or
        #: partition no longer followed
        self._flush_waiters: list[asyncio.Future[None]] = []
        self.flush_interval_ms = flush_interval_ms
        # Metrics, read at scrape time: fsync durations (observed on the loop), and each
        # partition's log end offset when it was opened (messages in = its growth since).
        self.flush_time = Histogram()
        self.opened_at: dict[TopicPartition, int] = {}
        self.verify_transaction: TransactionVerifier | None = None
        self.verify_transaction_remote: RemoteTransactionVerifier | None = None
        self.markers_written = 0
        # Replication, set by the cluster layer: this broker's id, the seam that commits ISR
        # changes, each live broker's epoch (None: not alive), replica.lag.time.max.ms.
        self.broker_id = -1
        self.isr_writer: IsrWriter | None = None
        self.broker_epoch_of: Callable[[int], int | None] | None = None
        self.replica_lag_time_max_ms = 30_000
        self.isr_changes_failed = 0
        #: ISR changes committed that removed or added replicas (Kafka's IsrShrinksPerSec,
        #: IsrExpandsPerSec, counted here since start).
        self.isr_shrinks = 0
        self.isr_expands = 0
        #: partitions of the cluster hosted here but led elsewhere (Kafka's
        #: NOT_LEADER_OR_FOLLOWER rather than UNKNOWN_TOPIC_OR_PARTITION).
        self.not_led: set[TopicPartition] = set()
        #: partitions hosted here as followers of another broker's leader: not served to
        #: clients (they are in ``not_led``), appended to by the replica fetcher.
        self.follower_partitions: dict[TopicPartition, Partition] = {}
        self._isr_check: _IsrExpiration | None = None
        #: the log dirs' replication-offset-checkpoint files; None: not kept (tests).
        self.hw_checkpoints: HighWatermarkCheckpoints | None = None

    # -- produce ----------------------------------------------------------------------------
    def append_records(
        self, entries: Iterable[tuple[TopicPartition, bytes | None]], api_version: int,
        acks: int = 1, timeout_ms: int = 0, *, origin: AppendOrigin = AppendOrigin.CLIENT,
        transactional_id: str | None = None,
    ) -> Completion[ProduceResults]:
        """Validate, assign offsets and append each partition's batches, in arrival order.

        Completed at once, or (acks=-1, or a partition whose high watermark waits for the
        fsync) when the high watermark covers every appended batch or
        ``timeout_ms`` passes. A transactional produce first has each partition checked with
        the transaction coordinator (a partition not added to the transaction is refused).
        """
        if acks not in VALID_ACKS:
            return completed({tp: ProduceResult(ErrorCode.INVALID_REQUIRED_ACKS)
                              for tp, _ in entries})
        entries = list(entries)
        asked = self._partitions_to_verify(entries, transactional_id)
        if isinstance(asked, dict):
            refused = asked
        else:
            producer, to_verify = asked
            remote = self.verify_transaction_remote
            pending = (remote(transactional_id, *producer, to_verify)
                       if remote is not None and to_verify and transactional_id else None)
            if pending is not None:
                # Appended once the remote coordinator answers: its answers on one connection
                # come in order, so a partition's produces stay in arrival order.
                return chain(pending, lambda errors: self._append_verified(
                    entries, self._refusals(errors, transactional_id, api_version),
                    api_version, acks, timeout_ms, origin))
            refused = self._verify_transaction(producer, to_verify, transactional_id,
                                               api_version)
        return self._append_verified(entries, refused, api_version, acks, timeout_ms, origin)

    def _append_verified(
        self, entries: list[tuple[TopicPartition, bytes | None]],
        refused: dict[TopicPartition, ProduceResult], api_version: int, acks: int,
        timeout_ms: int, origin: AppendOrigin,
    ) -> Completion[ProduceResults]:
        results: ProduceResults = {}
        ts = self.clock.wall_ms()
        for tp, records in entries:
            refusal = refused.get(tp)
            results[tp] = refusal if refusal is not None else self._append_one(
                tp, records, ts, api_version, origin, acks)
        if acks == 0:
            return completed(results)
        return self._await_high_watermark(results, acks, timeout_ms)

    def _await_high_watermark(self, results: ProduceResults, acks: int, timeout_ms: int
                              ) -> Completion[ProduceResults]:
        partitions = self.partitions
        waits = acks == -1 or any(
            (p := partitions.get(tp)) is not None and p.hw_gated_by_flush for tp in results)
        if not waits:
            return completed(results)  # acks=1: each batch was written where it was appended
        op = DelayedProduce(timeout_ms, partitions, results, acks)
        self.produce_purgatory.try_complete_else_watch(op, list(results))
        return op.future

    def _partitions_to_verify(
        self, entries: list[tuple[TopicPartition, bytes | None]], transactional_id: str | None,
    ) -> dict[TopicPartition, ProduceResult] | tuple[tuple[int, int], list[TopicPartition]]:
        """Kafka's handleProduceAppend: the partitions of a transactional produce whose producer
        has no transaction open there yet, with the (producer id, epoch); or refusals."""
        if transactional_id is None or self.verify_transaction is None:
            return (-1, -1), []
        producers: set[tuple[int, int]] = set()
        to_verify: list[TopicPartition] = []
        for tp, records in entries:
            if not records or len(records) < RECORD_BATCH_OVERHEAD:
                continue
            header = BatchHeader(records)
            if not (header.is_transactional and header.has_producer_id):
                continue
            producers.add((header.producer_id, header.producer_epoch))
            partition = self.partitions.get(tp)
            if partition is None or partition.offline:
                continue  # the append answers it
            entry = partition.log.producer_state.last_entry(header.producer_id)
            if entry is None or entry.current_txn_first_offset < 0:
                to_verify.append(tp)
        if len(producers) > 1:
            message = "transactional records contained more than one producer id"
            return {tp: ProduceResult(ErrorCode.INVALID_PRODUCER_ID_MAPPING, message=message)
                    for tp, _ in entries}
        if not to_verify:
            return (-1, -1), []
        ((producer_id, epoch),) = producers
        return (producer_id, epoch), to_verify

    def _verify_transaction(self, producer: tuple[int, int], to_verify: list[TopicPartition],
                            transactional_id: str | None, api_version: int
                            ) -> dict[TopicPartition, ProduceResult]:
        """The coordinator of this broker checks each partition; refusals by partition."""
        verify = self.verify_transaction
        if not to_verify or verify is None or transactional_id is None:
            return {}
        errors = {tp: verify(transactional_id, *producer, tp) for tp in to_verify}
        return self._refusals(errors, transactional_id, api_version)

    def _refusals(self, errors: dict[TopicPartition, ErrorCode], transactional_id: str | None,
                  api_version: int) -> dict[TopicPartition, ProduceResult]:
        """The coordinator's answers as the produce's errors (Kafka's AddPartitionsToTxnManager)."""
        refused: dict[TopicPartition, ProduceResult] = {}
        for tp, answer in errors.items():
            error = _verification_error(answer, api_version)
            if error == ErrorCode.NONE:
                continue
            message = None
            if error == ErrorCode.INVALID_TXN_STATE:
                message = "Partition was not added to the transaction"
            elif error in _RETRIABLE_VERIFICATION_ERRORS:
                message = ("Unable to verify the partition has been added to the transaction. "
                           f"Underlying error: {error.name}")
                error = ErrorCode.NOT_ENOUGH_REPLICAS
            logger.info("transactional produce refused", topic=tp[0], partition=tp[1],
                        transactional_id=transactional_id, error=error.name)
            refused[tp] = ProduceResult(error, message=message)
        return refused

    # -- transaction markers ------------------------------------------------------------------
    def write_txn_markers(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
        partitions: list[TopicPartition], timeout_ms: int,
    ) -> Completion[dict[TopicPartition, ErrorCode]]:
        """Append an end-transaction marker to each partition (as the coordinator: Kafka's
        WriteTxnMarkers with acks=all); resolves with each partition's error once every marker
        is under the high watermark, or ``timeout_ms`` passes."""
        ts = self.clock.wall_ms()
        results: ProduceResults = {}
        for tp in partitions:
            results[tp] = self._append_marker(tp, producer_id, producer_epoch, coordinator_epoch,
                                              commit, ts)
        appended = self._await_high_watermark(results, -1, timeout_ms)
        return appended.then(_errors).exceptionally(
            {tp: ErrorCode.UNKNOWN_SERVER_ERROR for tp in partitions})

    def _append_marker(self, tp: TopicPartition, producer_id: int, producer_epoch: int,
                       coordinator_epoch: int, commit: bool, ts: int) -> ProduceResult:
        partition = self.partitions.get(tp)
        if partition is None:
            return ProduceResult(self._absent_error(tp))
        if partition.under_min_isr:
            return _not_enough_replicas(partition)
        try:
            info, hw_moved = partition.append_end_txn_marker(
                producer_id, producer_epoch, coordinator_epoch, commit, ts)
        except KafkaStorageError as exc:
            return ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc))
        except KafkaError as exc:
            code = ErrorCode(exc.error_code)
            logger.warning("transaction marker refused", topic=tp[0], partition=tp[1],
                           producer_id=producer_id, error=code.name, reason=str(exc))
            return ProduceResult(code, message=str(exc))
        self.markers_written += 1
        self._after_append(partition, info, hw_moved)
        return ProduceResult(ErrorCode.NONE, info.first_offset, info.last_offset,
                             info.log_append_time, partition.log_start_offset)

    def _append_one(
        self, tp: TopicPartition, records: bytes | None, ts: int, api_version: int,
        origin: AppendOrigin = AppendOrigin.CLIENT, acks: int = 1,
    ) -> ProduceResult:
        partition = self.partitions.get(tp)
        if partition is None:
            return ProduceResult(self._absent_error(tp))
        if not records:
            return ProduceResult(ErrorCode.INVALID_RECORD, message="no record batches")
        if acks == -1 and partition.under_min_isr:  # Kafka's appendRecordsToLeader
            return _not_enough_replicas(partition)
        try:
            check_produce_request_version(records, api_version)
            # Offsets are assigned in place: a writable view (an owned frame) is used as it
            # is, anything else copied once by Log.append.
            info, hw_moved = partition.append(records, ts, origin)
        except KafkaStorageError as exc:  # logged once, when its dir went offline
            return ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc))
        except KafkaError as exc:
            code = ErrorCode(exc.error_code)
            logger.warning("produce rejected", topic=tp[0], partition=tp[1], error=code.name,
                           reason=str(exc))
            return ProduceResult(code, message=str(exc), record_errors=exc.record_errors)
        self._after_append(partition, info, hw_moved)
        return ProduceResult(ErrorCode.NONE, info.first_offset, info.last_offset,
                             info.log_append_time, partition.log_start_offset)

    # -- fetch ------------------------------------------------------------------------------
    def fetch_messages(
        self, fetches: list[PartitionFetch], max_bytes: int, min_bytes: int, max_wait_ms: int,
        limit: Callable[[], int] | None = None, isolation_level: int = READ_UNCOMMITTED,
        replica_id: int = -1, replica_epoch: int = -1,
    ) -> Completion[list[FetchResult]]:
        """Read up to each high watermark (read_committed: last stable offset); below
        ``min_bytes`` park a DelayedFetch that reads again when enough became readable, a
        partition changed under it, or the wait ends.

        ``limit`` is the most the caller may take when the read happens (the connection's
        share of the memory budget); at 0 the answer is empty and immediate, as a fetch
        throttled by a quota is.

        ``replica_id`` >= 0 is a follower's fetch (``replica_epoch``: its broker epoch, -1
        unchecked): it reads up to the log end whatever the isolation, its fetch offsets move
        its state on the leader, and it parks until enough is appended.
        """
        committed = isolation_level == READ_COMMITTED and replica_id < 0
        if limit is not None and limit() <= 0:
            return completed(self.read_from_log(fetches, 0, min_one=False,
                                                read_committed=committed,
                                                replica_id=replica_id,
                                                replica_epoch=replica_epoch))
        results = self.read_from_log(fetches, _capped(max_bytes, limit), read_committed=committed,
                                     replica_id=replica_id, replica_epoch=replica_epoch,
                                     update_fetch_state=True)
        total = sum(len(r.records) for r in results)
        has_error = any(r.error != ErrorCode.NONE or r.diverging_epoch is not None
                        for r in results)  # a diverged fetcher is told at once, as Kafka
        if max_wait_ms <= 0 or total >= min_bytes or has_error or not fetches:
            return completed(results)
        partitions = self.partitions
        if replica_id >= 0:  # a follower waits for appends, not for the high watermark
            hw_bytes = tuple(partitions[f.tp].appended_bytes  # type: ignore[index]
                             for f in fetches)
        else:
            hw_bytes = tuple(partitions[f.tp].hw_bytes for f in fetches)  # type: ignore[index]
        op = DelayedFetch(self, max_wait_ms, fetches, hw_bytes, total, min_bytes, max_bytes,
                          limit, read_committed=committed, replica_id=replica_id,
                          replica_epoch=replica_epoch)
        self.fetch_purgatory.try_complete_else_watch(op, [f.tp for f in fetches])
        return op.future

    def read_from_log(self, fetches: list[PartitionFetch], max_bytes: int, min_one: bool = True,
                      read_committed: bool = False, *, replica_id: int = -1,
                      replica_epoch: int = -1, update_fetch_state: bool = False
                      ) -> list[FetchResult]:
        """KIP-74: the first batch of the first partition with data is returned whole even when
        larger than the limits, so a consumer always makes progress; after it, each partition's
        max_bytes and the response's max_bytes bound what is read. ``min_one=False`` drops that
        guarantee (a throttled fetch). read_committed stops at the last stable offset and lists
        the aborted transactions the data overlaps, so the consumer can drop their records.
        A follower (``replica_id`` >= 0) reads up to the log end; with ``update_fetch_state``
        its fetch offsets are recorded (not on the read that completes a parked fetch, as
        Kafka)."""
        remaining = max_bytes
        results: list[FetchResult] = []
        follower_fetches: list[tuple[Partition, ReplicaState, PartitionFetch, int]] = []
        for f in fetches:
            p = self.partitions.get(f.tp) if f.tp is not None else None
            if p is None:
                results.append(FetchResult(self._absent_error(f.tp)))
                continue
            if p.offline:  # Kafka answers no offsets either (UnknownOffset)
                results.append(FetchResult(ErrorCode.KAFKA_STORAGE_ERROR))
                continue
            if f.current_leader_epoch >= 0:  # Kafka's localLogWithEpochOrThrow
                epoch_error = p.check_leader_epoch(f.current_leader_epoch)
                if epoch_error != ErrorCode.NONE:
                    results.append(FetchResult(epoch_error))
                    continue
            follower: ReplicaState | None = None
            if replica_id >= 0:
                follower, replica_error = self._follower_or_error(p, f, replica_id,
                                                                  replica_epoch)
                if follower is None:
                    results.append(FetchResult(replica_error))
                    continue
            hw = p.high_watermark
            lso = p.last_stable_offset
            if f.last_fetched_epoch >= 0:  # Kafka's readRecords, before any read
                try:
                    diverged = p.diverging_epoch(f.current_leader_epoch, f.last_fetched_epoch,
                                                 f.fetch_offset)
                except KafkaError as exc:
                    results.append(FetchResult(ErrorCode(exc.error_code), b"", hw,
                                               p.log_start_offset, lso))
                    continue
                if diverged is not None:  # no records, and the follower's state stays
                    results.append(FetchResult(ErrorCode.NONE, b"", hw, p.log_start_offset,
                                               lso, diverging_epoch=diverged))
                    continue
            if f.max_bytes < 0:  # Kafka's LocalLog.read refuses it; the partition answers so
                results.append(FetchResult(ErrorCode.UNKNOWN_SERVER_ERROR, b"", hw,
                                           p.log_start_offset, lso))
                continue
            leader_end = p.log_end_offset
            upper = leader_end if follower is not None else lso if read_committed else hw
            try:
                data = p.log.read(f.fetch_offset, min(f.max_bytes, max(remaining, 0)), upper,
                                  min_one)
                aborted = (_aborted_in(p, f.fetch_offset, data) if read_committed else None)
            except OffsetOutOfRangeError:
                results.append(FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, b"", hw,
                                           p.log_start_offset, lso))
                continue
            except KafkaStorageError:  # the read failed: the dir is offline now
                results.append(FetchResult(ErrorCode.KAFKA_STORAGE_ERROR))
                continue
            if data:
                min_one = False
                remaining -= len(data)
            results.append(FetchResult(ErrorCode.NONE, data, hw, p.log_start_offset, lso,
                                       aborted))
            if follower is not None and update_fetch_state:
                follower_fetches.append((p, follower, f, leader_end))
        for p, follower, f, leader_end in follower_fetches:
            self._follower_fetched(p, follower, f, leader_end, replica_epoch)
        return results

    def _absent_error(self, tp: TopicPartition | None) -> ErrorCode:
        """A partition not served here: led by another broker, or unknown."""
        if tp is not None and tp in self.not_led:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    def _follower_or_error(self, p: Partition, f: PartitionFetch, replica_id: int,
                           replica_epoch: int) -> tuple[ReplicaState | None, ErrorCode]:
        """Kafka's followerReplicaOrThrow and the broker-epoch fence of
        updateFetchStateOrThrow: a replica id not among the assigned followers answers
        UNKNOWN_LEADER_EPOCH when the fetch names the current epoch (the assignment may be
        newer than this leader knows), else NOT_LEADER_OR_FOLLOWER; a broker epoch older than
        the one the cluster has for that broker answers NOT_LEADER_OR_FOLLOWER."""
        follower = p.follower(replica_id)
        if follower is None:
            return None, (ErrorCode.UNKNOWN_LEADER_EPOCH if f.current_leader_epoch >= 0
                          else ErrorCode.NOT_LEADER_OR_FOLLOWER)
        epoch_of = self.broker_epoch_of
        if replica_epoch != -1 and epoch_of is not None:
            current = epoch_of(replica_id)
            if current is not None and current > replica_epoch:
                logger.info("replica fetch with a stale broker epoch refused", topic=p.topic,
                            partition=p.index, replica_id=replica_id,
                            broker_epoch=replica_epoch, expected=current)
                return None, ErrorCode.NOT_LEADER_OR_FOLLOWER
        return follower, ErrorCode.NONE

    def _follower_fetched(self, p: Partition, follower: ReplicaState, f: PartitionFetch,
                          leader_end: int, replica_epoch: int) -> None:
        """A follower fetched at ``f.fetch_offset``: its state, maybe the ISR, maybe the high
        watermark (and what waits on it)."""
        start_before = follower.log_start_offset
        hw_moved = p.update_follower_fetch_state(follower, f.fetch_offset, f.log_start_offset,
                                                 leader_end, replica_epoch)
        if follower.log_start_offset != start_before:
            self.delete_records_purgatory.check_and_complete(p.key)
        proposal = p.isr_to_expand(follower)
        if proposal is not None:
            logger.info("expanding the ISR", topic=p.topic, partition=p.index,
                        isr=list(p.isr), proposed=list(proposal.isr),
                        replica_id=follower.broker_id, log_end_offset=follower.log_end_offset,
                        high_watermark=p.high_watermark)
            self._alter_isr(p, proposal)
        if hw_moved:
            self.on_high_watermark(p)

    def make_leader(self, tp: TopicPartition, leader_epoch: int,
                    replicas: list[int] | None = None, isr: list[int] | None = None,
                    partition_epoch: int = -1) -> bool:
        """The partition leads in ``leader_epoch`` (Kafka's makeLeader, for the cluster):
        parked fetches of it answer again, so a client on an older epoch is fenced at once.
        With ``replicas`` and ``isr``: its followers and committed ISR (the same epoch may
        bring a new ISR). Whether the epoch is new."""
        partition = self.partitions[tp]
        self.not_led.discard(tp)
        new_epoch = partition.make_leader(leader_epoch)
        if replicas is not None:
            committed = LeaderAndIsrState(leader_epoch, tuple(isr or ()), partition_epoch)
            hw_moved = partition.update_assignment_and_isr(
                self.broker_id, replicas, committed, new_epoch, self.clock.wall_ms,
                self.replica_lag_time_max_ms)
            if partition.replication is not None:
                partition.replication.broker_epoch_of = self.broker_epoch_of
                self._start_isr_check()
            if hw_moved or not new_epoch:  # an ISR change may settle a parked produce too
                self.on_high_watermark(partition)
        if not new_epoch:
            return False
        self.fetch_purgatory.check_and_complete(tp)
        return True

    def make_follower(self, tp: TopicPartition, leader_id: int, leader_epoch: int,
                      replicas: list[int], isr: list[int], partition_epoch: int,
                      partition: Partition | None = None) -> bool:
        """The partition follows ``leader_id`` in ``leader_epoch`` (Kafka's makeFollowers):
        served no more (parked produce and fetch answered NOT_LEADER_OR_FOLLOWER now, as
        completeDelayedOperationsWhenNotPartitionLeader), kept among the follower partitions
        for the replica fetcher. ``partition``: the one to follow with when this broker holds
        none of it yet. Whether the leader or epoch changed; False, with nothing changed, for
        an epoch older than the partition's."""
        current = self.partitions.get(tp) or self.follower_partitions.get(tp) or partition
        if current is None:
            raise KeyError(tp)
        if leader_epoch < current.leader_epoch:
            logger.warning("stale leader epoch ignored", topic=tp[0], partition=tp[1],
                           leader_epoch=leader_epoch, current=current.leader_epoch)
            return False
        if tp in self.partitions:
            self.remove_partition(tp, not_leader=True)
        self.not_led.add(tp)
        if tp not in self.follower_partitions:
            self._add_follower_partition(current)
        changed = current.make_follower(self.broker_id, leader_id, leader_epoch, isr,
                                        partition_epoch)
        logger.info("following partition", topic=tp[0], partition=tp[1], leader=leader_id,
                    leader_epoch=leader_epoch, replicas=replicas, isr=isr,
                    log_end_offset=current.log_end_offset,
                    high_watermark=current.high_watermark)
        return changed

    def _add_follower_partition(self, partition: Partition) -> None:
        """A follower's log is made durable by the flush policy alone: its high watermark
        comes from the leader, never from its own fsyncs (which only let its fetcher go on)."""
        self.follower_partitions[partition.key] = partition
        partition.log.on_durable = self._follower_durable
        partition.log.on_segments_deleted = functools.partial(self._delete_later,
                                                              partition.log)
        channel = partition.log.failure_channel
        if not any(c is channel for c in self._failure_channels):
            self._watch_log_dir_failures(channel)

    def hosted_partitions(self) -> list[Partition]:
        """Every partition with a log here, led or followed (a copy: callers may change
        either map while they go through it)."""
        return [*self.partitions.values(), *self.follower_partitions.values()]

    def remove_follower_partition(self, tp: TopicPartition) -> Partition | None:
        """Stop following (the partition is led here now, or deleted)."""
        partition = self.follower_partitions.pop(tp, None)
        if partition is not None:
            self._wake_flush_waiters()
        return partition

    def follower_appended(self, partition: Partition, info: AppendInfo | None) -> None:
        """After the replica fetcher appended: flush by the flush policy (a log without the
        dir's writer), as appends of a leader are."""
        plog = partition.log
        if info is None or plog.writes_on_writer:
            return
        if plog.unflushed_messages >= plog.config.flush_interval_messages:
            self.request_flush(partition)

    def follower_flush_owed(self, partition: Partition) -> bool:
        """Whether the flush policy owes the followed ``partition`` a flush before its log
        end may be reported to the leader as a fetch offset. Kafka's follower appends through
        the leader's append path, which flushes in the append once the unflushed messages
        reach flush.messages: the offset its next fetch reports is then durable. Never with
        flush.messages unset, the default."""
        log = partition.log
        return log.unflushed_messages >= log.config.flush_interval_messages

    async def follower_flushes(self, partitions: Iterable[Partition]) -> None:
        """Until no partition of ``partitions`` both owes a flush (``follower_flush_owed``)
        and can still get it (followed here, its dir online): the fetcher's wait, off the
        loop's thread, for the fsync that Kafka's fetcher thread makes in its append. Their
        flushes run together (the dir's writer, or the flusher threads), so one round of
        fsyncs covers every partition of a fetch."""
        owed = [p for p in partitions if self.follower_flush_owed(p) and not p.offline]
        loop = asyncio.get_running_loop()
        while owed:
            for p in owed:
                if not p.log.writer_covers_end:
                    self.request_flush(p)  # one is running or asked for already, or now
            waiter: asyncio.Future[None] = loop.create_future()
            self._flush_waiters.append(waiter)
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_FLUSH_RECHECK_S):
                        await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._flush_waiters.remove(waiter)
            owed = [p for p in owed if self.follower_flush_owed(p) and not p.offline
                    and self.follower_partitions.get(p.key) is p]

    def _follower_durable(self, end_offset: int, seconds: float) -> None:
        """A followed log's dir writer made it durable below ``end_offset``, on the loop."""
        self.flush_time.observe(seconds)
        self._wake_flush_waiters()

    def _wake_flush_waiters(self) -> None:
        waiters, self._flush_waiters = self._flush_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- the ISR: shrink on lag, expand on catch-up, committed by the cluster --------------------
    def _start_isr_check(self) -> None:
        if self._isr_check is None:
            self._isr_check = _IsrExpiration(self)
            self.timer.add(self._isr_check)

    def maybe_shrink_isr(self) -> None:
        """Kafka's isr-expiration task: propose to drop each led partition's followers that
        have not caught up within replica.lag.time.max.ms."""
        for p in list(self.partitions.values()):
            if p.replication is None or p.offline:
                continue
            out = p.out_of_sync_replicas()
            proposal = p.isr_to_shrink() if out else None
            if proposal is not None:
                logger.info("shrinking the ISR", topic=p.topic, partition=p.index,
                            isr=list(p.isr), proposed=list(proposal.isr), out_of_sync=out,
                            high_watermark=p.high_watermark, log_end_offset=p.log_end_offset)
                self._alter_isr(p, proposal)

    def _alter_isr(self, partition: Partition, proposal: LeaderAndIsrState) -> None:
        """Send ``proposal`` (in flight on the partition) to the cluster; its answer is
        applied to the same partition object only, on the loop."""
        writer = self.isr_writer
        if writer is None:  # nothing can commit it: the ISR stays as it is
            partition.isr_refused()
            return
        try:
            done = writer.alter_isr(partition.key, proposal)
        except Exception:
            logger.exception("ISR change not sent", topic=partition.topic,
                             partition=partition.index)
            partition.isr_refused()
            return
        done.on_done(functools.partial(self._isr_answered, partition))

    def _isr_answered(self, partition: Partition, done: Completion[LeaderAndIsrState]) -> None:
        if self.partitions.get(partition.key) is not partition:
            return  # not led here any more
        try:
            committed = done.result()
        except IsrFenced as e:  # the cluster moved on: its newer state will come
            self.isr_changes_failed += 1
            logger.info("ISR change fenced", topic=partition.topic, partition=partition.index,
                        error=e.error.name, reason=str(e))
            return
        except Exception as e:
            self.isr_changes_failed += 1
            logger.warning("ISR change failed", topic=partition.topic,
                           partition=partition.index, error=repr(e))
            partition.isr_refused()
            return
        logger.info("ISR committed", topic=partition.topic, partition=partition.index,
                    isr=list(committed.isr), partition_epoch=committed.partition_epoch)
        before = len(partition.isr)
        partition.isr_committed(committed)
        after = len(partition.isr)
        if after < before:
            self.isr_shrinks += 1
        elif after > before:
            self.isr_expands += 1
        self.on_high_watermark(partition)

    # -- record deletion ----------------------------------------------------------------------
    def delete_records(self, offsets: dict[TopicPartition, int], timeout_ms: int
                       ) -> Completion[dict[TopicPartition, DeleteRecordsResult]]:
        """Kafka's deleteRecords: move each partition's log start offset (-1: to its high
        watermark); fetches parked below a new start answer now, OFFSET_OUT_OF_RANGE. The
        segments wholly below it go with the next retention pass.

        Each partition answers its low watermark once it reached the offset: at once without
        followers, else when the live followers' log starts followed (DelayedDeleteRecords,
        at most ``timeout_ms``). The caller refuses the internal topics.
        """
        results: dict[TopicPartition, DeleteRecordsResult] = {}
        required: dict[TopicPartition, int] = {}
        for tp, offset in offsets.items():
            results[tp], target = self._delete_records_one(tp, offset)
            if target is not None:
                required[tp] = target
        if not required:
            return completed(results)
        op = DelayedDeleteRecords(timeout_ms, self.partition_or_error, required, results)
        self.delete_records_purgatory.try_complete_else_watch(op, list(required))
        return op.future

    def _delete_records_one(self, tp: TopicPartition, offset: int
                            ) -> tuple[DeleteRecordsResult, int | None]:
        """One partition's local deletion: its result, and the offset its low watermark must
        reach (None when refused)."""
        partition, error = self.partition_or_error(tp)
        if partition is None:
            return DeleteRecordsResult(error), None
        before = partition.log_start_offset
        try:
            low_watermark, target = partition.delete_records(offset)
        except KafkaError as exc:  # KafkaStorageError too: the dir failed under the move
            code = ErrorCode(exc.error_code)
            logger.info("delete records refused", topic=tp[0], partition=tp[1], offset=offset,
                        error=code.name, reason=str(exc))
            return DeleteRecordsResult(code), None
        except Exception:
            logger.exception("delete records failed", topic=tp[0], partition=tp[1], offset=offset)
            return DeleteRecordsResult(ErrorCode.UNKNOWN_SERVER_ERROR), None
        if partition.log_start_offset > before:
            self.fetch_purgatory.check_and_complete(tp)
        return DeleteRecordsResult(ErrorCode.NONE, low_watermark), target

    # -- retention ----------------------------------------------------------------------------
    def apply_retention(self) -> None:
        """Delete segments past retention; a fetch parked below a new log start answers now."""
        ts = self.clock.wall_ms()
        for p in self.hosted_partitions():
            if p.offline:
                continue
            try:
                deleted = p.log.delete_old_segments(ts, p.high_watermark)
            except KafkaStorageError:
                continue  # its dir is offline now, reported once
            if deleted:
                logger.info("retention deleted segments", topic=p.topic, partition=p.index,
                            segments=deleted, log_start_offset=p.log_start_offset)
                self.fetch_purgatory.check_and_complete(p.key)


    def _after_append(self, partition: Partition, info: AppendInfo, hw_moved: bool) -> None:
        if hw_moved:
            self.on_high_watermark(partition)
        elif partition.replication is not None:  # followers' fetches wait for appends
            self.fetch_purgatory.check_and_complete(partition.key)
        plog = partition.log
        if plog.writes_on_writer:
            return  # its dir's writer fsyncs it; _on_durable moves the high watermark
        if plog.unflushed_messages >= plog.config.flush_interval_messages:
            self.request_flush(partition)

    def _on_durable(self, partition: Partition, end_offset: int, seconds: float) -> None:
        """The log dir's writer made ``partition`` durable below ``end_offset``, on the loop."""
        self.flush_time.observe(seconds)
        if self.partitions.get(partition.key) is not partition:
            return
        if partition.on_durable(end_offset) or partition.replication is not None:
            # with followers the high watermark may stay while acks=1 waits for this fsync
            self.on_high_watermark(partition)

    # -- flush: a group commit, off the event loop --------------------------------------------
    def request_flush(self, partition: Partition) -> None:
        """Flush now, or right after the running flush: one fsync covers every batch since."""
        if partition.flush_pending:
            partition.flush_again = True
            return
        partition.flush_pending = True
        task = asyncio.get_running_loop().create_task(self._flush(partition))
        self._flush_tasks.add(task)
        task.add_done_callback(self._flush_tasks.discard)

    async def _flush(self, partition: Partition) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                partition.flush_again = False
                end_offset, end_bytes = partition.log_end_offset, partition.appended_bytes
                elapsed = await loop.run_in_executor(self._flush_executor, _timed_flush,
                                                     partition.log)
                if elapsed is not None:
                    self.flush_time.observe(elapsed)
                led = self.partitions.get(partition.key) is partition  # not a follower's
                if led and partition.hw_gated_by_flush and (partition.advance_high_watermark(
                    end_offset, end_bytes
                ) or partition.replication is not None):
                    self.on_high_watermark(partition)
                if self._flush_waiters:
                    self._wake_flush_waiters()
                if not partition.flush_again or not self._hosts(partition):
                    return
        except KafkaStorageError:
            pass  # the fsync failed: the high watermark stays, the dir is offline (logged once)
        except Exception:
            logger.exception("flush failed", topic=partition.topic, partition=partition.index)
        finally:
            partition.flush_pending = False
            if self._flush_waiters:
                self._wake_flush_waiters()

    def _hosts(self, partition: Partition) -> bool:
        """Whether ``partition`` is still the one led or followed here under its key."""
        key = partition.key
        return self.partitions.get(key) is partition or \
            self.follower_partitions.get(key) is partition

    async def run_time_flusher(self) -> None:
        """log.flush.interval.ms: flush partitions whose data has waited that long, in real
        time (the system's wall clock, as the logs' last flush), whatever the broker's clock."""
        interval = self.flush_interval_ms
        while True:
            await asyncio.sleep(min(interval, 1000) / 1000)
            ts = system_wall_ms()
            for p in self.hosted_partitions():
                if p.log.flush_due(ts):
                    self.request_flush(p)

    async def flush_all(self) -> None:
        if self._flush_tasks:
            await asyncio.gather(*self._flush_tasks, return_exceptions=True)
        loop = asyncio.get_running_loop()
        for p in self.hosted_partitions():
            if p.offline:
                continue
            try:
                elapsed = await loop.run_in_executor(self._flush_executor, _timed_flush, p.log)
            except KafkaStorageError:
                continue  # its dir is offline now, reported once
            if elapsed is not None:
                self.flush_time.observe(elapsed)

    def on_high_watermark(self, partition: Partition) -> None:
        key = partition.key
        self.produce_purgatory.check_and_complete(key)
        self.fetch_purgatory.check_and_complete(key)

    # -- partitions -----------------------------------------------------------------------------
    def add_partition(self, partition: Partition) -> None:
        self.partitions[partition.key] = partition
        partition.log.on_durable = functools.partial(self._on_durable, partition)
        partition.log.on_segments_deleted = functools.partial(self._delete_later,
                                                              partition.log)
        self.opened_at[partition.key] = partition.log_end_offset
        channel = partition.log.failure_channel
        if not any(c is channel for c in self._failure_channels):
            self._watch_log_dir_failures(channel)

    def _delete_later(self, log: Log, deleted_at_ms: int) -> None:
        """Segments of ``log`` renamed ``.deleted`` (retention, the cleaner's swap): their
        files go when file.delete.delay.ms has passed."""
        self.timer.add(_DeleteDueSegments(log, deleted_at_ms, self.clock))

    def partition_or_error(self, tp: TopicPartition) -> tuple[Partition | None, ErrorCode]:
        """Kafka's getPartitionOrError, for handlers that read a partition themselves
        (ListOffsets, OffsetForLeaderEpoch): an offline one answers KAFKA_STORAGE_ERROR, one
        led by another broker NOT_LEADER_OR_FOLLOWER."""
        p = self.partitions.get(tp)
        if p is None:
            return None, self._absent_error(tp)
        if p.offline:
            return None, ErrorCode.KAFKA_STORAGE_ERROR
        return p, ErrorCode.NONE

    # -- log dir failure --------------------------------------------------------------------------
    def _watch_log_dir_failures(self, channel: LogDirFailureChannel) -> None:
        """Handle each dir the channel takes offline, on the event loop: failures are also
        seen on flusher and checkpoint threads."""
        self._failure_channels.append(channel)
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None

        def on_failure(log_dir: str) -> None:
            if loop is None:
                self.handle_log_dir_failure(log_dir)
            elif not loop.is_closed():
                loop.call_soon_threadsafe(self.handle_log_dir_failure, log_dir)

        channel.add_listener(on_failure)

    def handle_log_dir_failure(self, log_dir: str) -> None:
        """Kafka's handleLogDirFailure: stop serving the partitions of a failed log dir.

        Their logs refuse every write already (the channel's offline set); what waits on them
        is checked now, and the delayed operations themselves judge an offline partition: a
        parked produce answers it KAFKA_STORAGE_ERROR (its batch was never acknowledged, the
        high watermark never reached it) and keeps waiting, with its own deadline, for any
        partitions of other dirs; a parked fetch completes, reading it as KAFKA_STORAGE_ERROR.
        """
        offline = [p.key for p in self.partitions.values() if p.log.log_dir == log_dir]
        for tp in offline:
            self.fetch_purgatory.check_and_complete(tp)
            self.produce_purgatory.check_and_complete(tp)
            self.delete_records_purgatory.check_and_complete(tp)
        self._wake_flush_waiters()  # a followed log of the dir will never flush now
        logger.warning("stopped serving replicas in an offline log dir", log_dir=log_dir,
                       partitions=[f"{t}-{i}" for t, i in offline])

    # -- the high-watermark checkpoint -----------------------------------------------------------
    def restore_high_watermark(self, partition: Partition) -> None:
        """A partition just made from its log in cluster mode: the high watermark it had
        (checkpointed, or when it last stopped being served here; 0 without one, as Kafka),
        capped to its log, taken when it first leads with followers."""
        checkpoints = self.hw_checkpoints
        log = partition.log
        if checkpoints is None or log.offline:
            return
        hw = checkpoints.fetch(Path(log.log_dir), partition.key) or 0
        partition.restored_high_watermark = max(min(hw, log.log_end_offset),
                                                log.log_start_offset)

    def high_watermarks_to_checkpoint(self) -> HighWatermarks:
        """Every online partition's high watermark by log dir (Kafka's
        checkpointHighWatermarks), taken on the loop; written with ``write``."""
        checkpoints = self.hw_checkpoints
        if checkpoints is None:
            return {}
        return checkpoints.snapshot((Path(p.log.log_dir), p.key, p.high_watermark)
                                    for p in self.hosted_partitions() if not p.offline)

    async def checkpoint_high_watermarks(self) -> None:
        """Write the replication-offset-checkpoint files, off the loop (fsyncs)."""
        checkpoints = self.hw_checkpoints
        if checkpoints is None:
            return
        taken = self.high_watermarks_to_checkpoint()
        await asyncio.get_running_loop().run_in_executor(self._flush_executor,
                                                         checkpoints.write, taken)

    def remove_partition(self, tp: TopicPartition, *, not_leader: bool = False
                         ) -> Partition | None:
        """Drop a partition; requests parked on it complete now with an error
        (``not_leader``: it stays in the cluster, led by another broker, and is answered
        NOT_LEADER_OR_FOLLOWER from now on, as Kafka's
        completeDelayedOperationsWhenNotPartitionLeader)."""
        partition = self.partitions.pop(tp, None)
        checkpoints = self.hw_checkpoints
        if partition is not None and checkpoints is not None and not partition.offline:
            checkpoints.unserved(Path(partition.log.log_dir), tp,
                                 partition.high_watermark if not_leader else None)
        if not_leader:
            self.not_led.add(tp)
        else:
            self.not_led.discard(tp)
        self.opened_at.pop(tp, None)
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)
        self.delete_records_purgatory.check_and_complete(tp)
        return partition

    def complete_all_parked(self) -> None:
        """Answer every parked request now (shutdown): fetches with what they have, produces
        with their partitions' state."""
        purgatories = (self.fetch_purgatory, self.produce_purgatory,
                       self.delete_records_purgatory)
        for purgatory in purgatories:
            for tp in list(self.partitions):
                for op in purgatory.cancel_for_key(tp):
                    op.force_complete()

    def shutdown(self) -> None:
        if self._isr_check is not None:
            self._isr_check.cancel()
            self._isr_check = None
        self._flush_executor.shutdown(wait=True)


class _IsrExpiration(TimerTask):
    """Kafka's isr-expiration task: every half replica.lag.time.max.ms on the broker's timer
    (a manual clock moves it in tests), for as long as the replica manager runs."""

    __slots__ = ("_rm",)

    def __init__(self, rm: ReplicaManager) -> None:
        super().__init__(max(rm.replica_lag_time_max_ms // 2, 1))
        self._rm = rm

    def run(self) -> None:
        rm = self._rm
        try:
            rm.maybe_shrink_isr()
        except Exception:
            logger.exception("ISR check failed")
        rm._isr_check = _IsrExpiration(rm)
        rm.timer.add(rm._isr_check)


def _not_enough_replicas(partition: Partition) -> ProduceResult:
    """Kafka's NotEnoughReplicasException before an acks=all append."""
    return ProduceResult(
        ErrorCode.NOT_ENOUGH_REPLICAS,
        message=(f"The size of the current ISR {list(partition.isr)} is insufficient to "
                 f"satisfy the min.isr requirement of {partition.effective_min_isr} for "
                 f"partition {partition.topic}-{partition.index}"))


class _DeleteDueSegments(TimerTask):
    """Removes a log's ``.deleted`` segment files once file.delete.delay.ms has passed
    (Kafka's scheduled deleteSegmentFiles); a closed or offline log is left alone."""

    __slots__ = ("_log", "_due_ms", "_clock")

    def __init__(self, log: Log, deleted_at_ms: int, clock: WallClock) -> None:
        delay = log.config.file_delete_delay_ms
        super().__init__(delay)
        self._log = log
        self._due_ms = deleted_at_ms + delay  # what the retention pass at deleted_at_ms renamed
        self._clock = clock

    def run(self) -> None:
        log = self._log
        if log.closed or log.offline:
            return
        try:  # the timer's delay has passed: what it was set for goes, whatever the drift
            log.delete_due_segments(max(self._clock.wall_ms(), self._due_ms))
        except KafkaStorageError:
            pass  # its dir is offline now, reported once


def _errors(results: ProduceResults) -> dict[TopicPartition, ErrorCode]:
    return {tp: r.error for tp, r in results.items()}


def _verification_error(error: ErrorCode, produce_version: int) -> ErrorCode:
    """The coordinator's answer as Kafka's AddPartitionsToTxnManager hands it to a produce:
    producers expect INVALID_PRODUCER_EPOCH when fenced, and TRANSACTION_ABORTABLE is known
    to clients from Produce v11 only (older ones are told INVALID_TXN_STATE)."""
    if error == ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if error == ErrorCode.TRANSACTION_ABORTABLE and produce_version <= 10:
        return ErrorCode.INVALID_TXN_STATE
    return error


def _aborted_in(partition: Partition, fetch_offset: int, data: bytes | memoryview
                ) -> list[AbortedTxn]:
    """Aborted transactions overlapping [fetch_offset, the end of the last batch read)."""
    if not data:
        return []
    return partition.log.collect_aborted_transactions(fetch_offset, _next_offset_of(data))


def _next_offset_of(data: bytes | memoryview) -> int:
    """The offset after the last whole batch in ``data`` (headers only)."""
    next_offset = -1
    for _pos, header in iter_batches(data):
        next_offset = header.next_offset
    return next_offset


def _capped(max_bytes: int, limit: Callable[[], int] | None) -> int:
    return max_bytes if limit is None else min(max_bytes, limit())


def _timed_flush(log: Log) -> float | None:
    """Log.flush on a flusher thread; its duration when it made something durable (an fsync
    happened), else None."""
    before = log.recovery_point
    started = time.monotonic()
    log.flush()
    elapsed = time.monotonic() - started
    return elapsed if log.recovery_point > before else None
