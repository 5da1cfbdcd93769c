"""ReplicaManager: the partitions this broker leads and everything that appends to or reads them.

Like Kafka's ReplicaManager it owns produce and fetch end to end: validate, append or read,
then answer now or park a DelayedProduce / DelayedFetch in its purgatories and hand back an
awaitable (the one bridge is broker/delayed_result.py). Handlers and the offsets store call it
and never see a purgatory; it never sees the wire format. Whatever moves a partition's high
watermark or log start (append, fsync, retention, deletion) checks the purgatories for that
partition here: parked requests complete on the event, never on a poll.

A disk fault takes a log dir offline (broker/log/dir_failure.py); as Kafka's
handleLogDirFailure, the partitions of that dir then answer KAFKA_STORAGE_ERROR to Produce and
Fetch, what is parked on them is answered at once, and the partitions of the other dirs go on
as before. Offline partitions stay in ``partitions`` (Kafka's HostedPartition.Offline).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import structlog

from broker.delayed_fetch import DelayedFetch
from broker.delayed_produce import DelayedProduce
from broker.log.dir_failure import KafkaStorageError, LogDirFailureChannel
from broker.log.log import AppendInfo, Log, OffsetOutOfRangeError
from broker.metrics import Histogram
from broker.partition import Partition
from broker.wallclock import now_ms
from protocol.errors import ErrorCode, KafkaError
from protocol.record_batch import check_produce_request_version
from purgatory import Purgatory, Timer

log = structlog.get_logger("broker.replica")

TopicPartition = tuple[str, int]
VALID_ACKS = (0, 1, -1)


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
class PartitionFetch:
    """One partition of a fetch: ``tp`` is None when the request named an unknown topic id."""

    tp: TopicPartition | None
    fetch_offset: int
    max_bytes: int


@dataclass(slots=True)
class FetchResult:
    error: ErrorCode
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1


class ReplicaManager:
    def __init__(self, flush_interval_ms: int, timer: Timer) -> None:
        self.partitions: dict[TopicPartition, Partition] = {}
        self.timer = timer
        self.produce_purgatory: Purgatory[DelayedProduce] = Purgatory("produce", timer)
        self.fetch_purgatory: Purgatory[DelayedFetch] = Purgatory("fetch", timer)
        self._failure_channels: list[LogDirFailureChannel] = []
        self._flush_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="flusher")
        self._flush_tasks: set[asyncio.Task[None]] = set()
        self.flush_interval_ms = flush_interval_ms
        # Metrics, read at scrape time: fsync durations (observed on the loop), and each
        # partition's log end offset when it was opened (messages in = its growth since).
        self.flush_time = Histogram()
        self.opened_at: dict[TopicPartition, int] = {}

    # -- produce ----------------------------------------------------------------------------
    def append_records(
        self, entries: Iterable[tuple[TopicPartition, bytes | None]], api_version: int,
        acks: int = 1, timeout_ms: int = 0,
    ) -> ProduceResults | Awaitable[ProduceResults]:
        """Validate, assign offsets and append each partition's batches, in arrival order.

        Answers at once, or (acks=-1, or a partition whose high watermark waits for the fsync)
        with an awaitable that resolves when the high watermark covers every appended batch or
        ``timeout_ms`` passes.
        """
        if acks not in VALID_ACKS:
            return {tp: ProduceResult(ErrorCode.INVALID_REQUIRED_ACKS) for tp, _ in entries}
        results: ProduceResults = {}
        ts = now_ms()
        for tp, records in entries:
            results[tp] = self._append_one(tp, records, ts, api_version)
        if acks == 0:
            return results
        partitions = self.partitions
        waits = acks == -1 or any(
            (p := partitions.get(tp)) is not None and p.hw_gated_by_flush for tp in results)
        if not waits:
            return results
        op = DelayedProduce(timeout_ms, partitions, results)
        self.produce_purgatory.try_complete_else_watch(op, list(results))
        return op.future

    def _append_one(
        self, tp: TopicPartition, records: bytes | None, ts: int, api_version: int
    ) -> ProduceResult:
        partition = self.partitions.get(tp)
        if partition is None:
            return ProduceResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if not records:
            return ProduceResult(ErrorCode.INVALID_RECORD, message="no record batches")
        try:
            check_produce_request_version(records, api_version)
            info, hw_moved = partition.append(bytearray(records), ts)
        except KafkaStorageError as exc:  # logged once, when its dir went offline
            return ProduceResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc))
        except KafkaError as exc:
            code = ErrorCode(exc.error_code)
            log.warning("produce rejected", topic=tp[0], partition=tp[1], error=code.name,
                        reason=str(exc))
            return ProduceResult(code, message=str(exc), record_errors=exc.record_errors)
        self._after_append(partition, info, hw_moved)
        return ProduceResult(ErrorCode.NONE, info.first_offset, info.last_offset,
                             info.log_append_time, partition.log_start_offset)

    # -- fetch ------------------------------------------------------------------------------
    def fetch_messages(
        self, fetches: list[PartitionFetch], max_bytes: int, min_bytes: int, max_wait_ms: int,
        limit: Callable[[], int] | None = None,
    ) -> list[FetchResult] | Awaitable[list[FetchResult]]:
        """Read up to each high watermark; below ``min_bytes`` park a DelayedFetch that reads
        again when enough became readable, a partition changed under it, or the wait ends.

        ``limit`` is the most the caller may take when the read happens (the connection's
        share of the memory budget); at 0 the answer is empty and immediate, as a fetch
        throttled by a quota is.
        """
        if limit is not None and limit() <= 0:
            return self.read_from_log(fetches, 0, min_one=False)
        results = self.read_from_log(fetches, _capped(max_bytes, limit))
        total = sum(len(r.records) for r in results)
        has_error = any(r.error != ErrorCode.NONE for r in results)
        if max_wait_ms <= 0 or total >= min_bytes or has_error or not fetches:
            return results
        partitions = self.partitions
        watched = [(f.tp, f.fetch_offset, partitions[f.tp].hw_bytes)  # type: ignore[index]
                   for f in fetches]
        def read() -> list[FetchResult]:
            capped = _capped(max_bytes, limit)
            return self.read_from_log(fetches, capped, min_one=capped > 0)

        op = DelayedFetch(max_wait_ms, partitions, watched, total, min_bytes,  # type: ignore[arg-type]
                          read)
        self.fetch_purgatory.try_complete_else_watch(op, [w[0] for w in watched])
        return op.future

    def read_from_log(self, fetches: list[PartitionFetch], max_bytes: int, min_one: bool = True
                      ) -> list[FetchResult]:
        """KIP-74: the first batch of the first partition with data is returned whole even when
        larger than the limits, so a consumer always makes progress; after it, each partition's
        max_bytes and the response's max_bytes bound what is read. ``min_one=False`` drops that
        guarantee (a throttled fetch)."""
        remaining = max_bytes
        results: list[FetchResult] = []
        for f in fetches:
            p = self.partitions.get(f.tp) if f.tp is not None else None
            if p is None:
                results.append(FetchResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            if p.offline:  # Kafka answers no offsets either (UnknownOffset)
                results.append(FetchResult(ErrorCode.KAFKA_STORAGE_ERROR))
                continue
            hw = p.high_watermark
            if f.max_bytes < 0:  # Kafka's LocalLog.read refuses it; the partition answers so
                results.append(FetchResult(ErrorCode.UNKNOWN_SERVER_ERROR, b"", hw,
                                           p.log_start_offset))
                continue
            try:
                data = p.log.read(f.fetch_offset, min(f.max_bytes, max(remaining, 0)), hw, min_one)
            except OffsetOutOfRangeError:
                results.append(FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE, b"", hw,
                                           p.log_start_offset))
                continue
            except KafkaStorageError:  # the read failed: the dir is offline now
                results.append(FetchResult(ErrorCode.KAFKA_STORAGE_ERROR))
                continue
            if data:
                min_one = False
                remaining -= len(data)
            results.append(FetchResult(ErrorCode.NONE, data, hw, p.log_start_offset))
        return results

    # -- retention ----------------------------------------------------------------------------
    def apply_retention(self) -> None:
        """Delete segments past retention; a fetch parked below a new log start answers now."""
        ts = now_ms()
        for p in list(self.partitions.values()):
            if p.offline:
                continue
            try:
                deleted = p.log.delete_old_segments(ts, p.high_watermark)
            except KafkaStorageError:
                continue  # its dir is offline now, reported once
            if deleted:
                log.info("retention deleted segments", topic=p.topic, partition=p.index,
                         segments=deleted, log_start_offset=p.log_start_offset)
                self.fetch_purgatory.check_and_complete(p.key)

    def _after_append(self, partition: Partition, info: AppendInfo, hw_moved: bool) -> None:
        if hw_moved:
            self.on_high_watermark(partition)
        if partition.log.unflushed_messages >= partition.log.config.flush_interval_messages:
            self.request_flush(partition)

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
                if partition.hw_gated_by_flush and partition.advance_high_watermark(
                    end_offset, end_bytes
                ):
                    self.on_high_watermark(partition)
                if not partition.flush_again or self.partitions.get(partition.key) is not partition:
                    return
        except KafkaStorageError:
            pass  # the fsync failed: the high watermark stays, the dir is offline (logged once)
        except Exception:
            log.exception("flush failed", topic=partition.topic, partition=partition.index)
        finally:
            partition.flush_pending = False

    async def run_time_flusher(self) -> None:
        """log.flush.interval.ms: flush partitions whose data has waited that long."""
        interval = self.flush_interval_ms
        while True:
            await asyncio.sleep(min(interval, 1000) / 1000)
            ts = now_ms()
            for p in list(self.partitions.values()):
                if p.log.flush_due(ts):
                    self.request_flush(p)

    async def flush_all(self) -> None:
        if self._flush_tasks:
            await asyncio.gather(*self._flush_tasks, return_exceptions=True)
        loop = asyncio.get_running_loop()
        for p in list(self.partitions.values()):
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
        self.opened_at[partition.key] = partition.log_end_offset
        channel = partition.log.failure_channel
        if not any(c is channel for c in self._failure_channels):
            self._watch_log_dir_failures(channel)

    def partition_or_error(self, tp: TopicPartition) -> tuple[Partition | None, ErrorCode]:
        """Kafka's getPartitionOrError, for handlers that read a partition themselves
        (ListOffsets, OffsetForLeaderEpoch): an offline one answers KAFKA_STORAGE_ERROR."""
        p = self.partitions.get(tp)
        if p is None:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
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
        log.warning("stopped serving replicas in an offline log dir", log_dir=log_dir,
                    partitions=[f"{t}-{i}" for t, i in offline])

    def remove_partition(self, tp: TopicPartition) -> Partition | None:
        """Drop a partition; requests parked on it complete now with an error."""
        partition = self.partitions.pop(tp, None)
        self.opened_at.pop(tp, None)
        self.produce_purgatory.check_and_complete(tp)
        self.fetch_purgatory.check_and_complete(tp)
        return partition

    def complete_all_parked(self) -> None:
        """Answer every parked request now (shutdown): fetches with what they have, produces
        with their partitions' state."""
        for purgatory in (self.fetch_purgatory, self.produce_purgatory):
            for tp in list(self.partitions):
                for op in purgatory.cancel_for_key(tp):
                    op.force_complete()

    def shutdown(self) -> None:
        self._flush_executor.shutdown(wait=True)


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
