"""The follower's side of replication: fetchers that copy the leaders' logs to this broker.

Kafka's ReplicaFetcherManager, AbstractFetcherThread and ReplicaFetcherThread, as asyncio
tasks:

- ``ReplicaFetcherManager`` keeps ``num.replica.fetchers`` fetchers per source broker; a
  partition goes to fetcher ``abs(31 * hash(topic) + partition) % num.replica.fetchers`` of
  its leader (Java's String.hashCode, as Kafka's getFetcherId). A fetcher left with no
  partition stops. Each fetcher has its own connection to its leader, as each of Kafka's
  fetcher threads has its own NetworkClient: a long-polling Fetch never holds up another
  fetcher's or the transaction markers' requests behind it on one connection.
- A partition added (this broker became its follower, or follows in a new leader epoch)
  starts *truncating*: OffsetForLeaderEpoch for its latest epoch tells where its log
  diverges from the leader's (Kafka's path for leaders without LastFetchedEpoch support,
  KIP-101 and KIP-279), its log is cut there, then it is *fetching*. A replica with no epoch
  cache entry truncates to its high watermark.
- Fetching sends Kafka's Fetch as a replica: v15+ ReplicaState{ReplicaId, ReplicaEpoch = this
  broker's registration epoch}, older versions ReplicaId; per partition CurrentLeaderEpoch,
  FetchOffset = the log end, LastFetchedEpoch = the log's latest epoch, LogStartOffset.
  A log end is reported only once the flush policy is met: with flush.messages=N, not while
  N or more messages are unflushed (Kafka's follower flushes in its append then), so with
  flush.messages=1 the leader never counts a follower's offset that is not fsynced.
  Records are appended as they are (Log.append_as_follower); the high watermark is the
  leader's capped by the own log end; the log start follows the leader's.
- A DivergingEpoch in the answer (the leader detected divergence from LastFetchedEpoch)
  truncates instead of appending, as Kafka since 2.7; OFFSET_OUT_OF_RANGE asks the leader's
  end and start (ListOffsets as a replica) and truncates as handleOutOfRangeError;
  FENCED_LEADER_EPOCH stops fetching the partition until the partition-state watcher brings
  newer state (Kafka's onPartitionFenced); UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER and any
  other error back the partition off ``replica.fetch.backoff.ms``, as does a leader that
  cannot be reached (the state may have reached this broker before the leader).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kafka.protocol.consumer import (
    FetchRequest,
    ListOffsetsRequest,
    OffsetForLeaderEpochRequest,
)

from broker.cluster.store import cancel_and_wait
from broker.config import BrokerConfig
from broker.interbroker.client import InterBrokerClient, InterBrokerError, LinkFault
from broker.log.dir_failure import KafkaStorageError
from broker.replica.partition import Partition
from broker.replica.replica_manager import ReplicaManager
from protocol.errors import ErrorCode, KafkaError

__all__ = ["FetcherSettings", "ReplicaFetcher", "ReplicaFetcherManager", "fetcher_id"]

logger = structlog.get_logger("broker.interbroker.replica_fetcher")

TopicPartition = tuple[str, int]
FETCH_KEY = 1
FETCH_NEWEST = 16
LIST_OFFSETS_KEY = 2
LIST_OFFSETS_NEWEST = 7
OFFSET_FOR_LEADER_EPOCH_KEY = 23
OFFSET_FOR_LEADER_EPOCH_NEWEST = 4
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
#: the error after which a partition waits for newer state from the cluster (Kafka's
#: onPartitionFenced: this replica's leader epoch is older than the leader's). The leader not
#: knowing the epoch yet (UNKNOWN_LEADER_EPOCH) or not leading yet (NOT_LEADER_OR_FOLLOWER:
#: the state reached this follower first) backs off and asks again, as Kafka's fetcher does.
_WAIT_FOR_STATE = frozenset({ErrorCode.FENCED_LEADER_EPOCH})


@dataclass(frozen=True, slots=True)
class FetcherSettings:
    """Kafka's replica fetcher keys."""

    num_fetchers: int = 1
    wait_max_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 1 << 20
    response_max_bytes: int = 10 << 20
    backoff_ms: int = 1000

    @classmethod
    def from_config(cls, cfg: BrokerConfig) -> FetcherSettings:
        return cls(cfg["num.replica.fetchers"], cfg["replica.fetch.wait.max.ms"],
                   cfg["replica.fetch.min.bytes"], cfg["replica.fetch.max.bytes"],
                   cfg["replica.fetch.response.max.bytes"], cfg["replica.fetch.backoff.ms"])


def _java_string_hash(text: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def fetcher_id(tp: TopicPartition, num_fetchers: int) -> int:
    """Kafka's getFetcherId: which of a source broker's fetchers serves ``tp``."""
    mixed = (31 * _java_string_hash(tp[0]) + tp[1]) & 0xFFFFFFFF
    if mixed & 0x80000000:
        mixed -= 1 << 32
    return abs(mixed) % num_fetchers


@dataclass(slots=True)
class FetchState:
    """One partition in a fetcher (Kafka's PartitionFetchState)."""

    tp: TopicPartition
    topic_id: uuid.UUID | None
    leader_epoch: int
    truncating: bool = True
    #: loop time before which the partition is not asked for (a back-off)
    delayed_until: float = 0.0
    #: fenced or told it is not the leader's: waits for newer state from the cluster
    waiting_for_state: bool = False

    def ready(self, now: float) -> bool:
        return not self.waiting_for_state and self.delayed_until <= now


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """A leader's answer for an epoch: the largest epoch it knows at or below the asked one
    and where that epoch ends (-1, -1: it does not know)."""

    epoch: int
    end_offset: int


class ReplicaFetcher:
    """One fetcher (Kafka's ReplicaFetcherThread): the partitions this broker follows on one
    leader, fetched together."""

    def __init__(self, manager: ReplicaFetcherManager, leader_id: int, fetcher_index: int,
                 client: InterBrokerClient) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.fetcher_index = fetcher_index
        self.client = client
        self.partitions: dict[TopicPartition, FetchState] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.fetches = 0  # Fetch requests answered (tests, metrics)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{self.leader_id}-{self.fetcher_index}")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        await self.client.close()

    # -- the loop (Kafka's doWork: maybeTruncate, then maybeFetch) -------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._truncate_pending()
                ready = [s for s in self.partitions.values()
                         if not s.truncating and s.ready(loop.time())]
                if ready:
                    await self._fetch(ready)
                    continue
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("replica fetcher failed a round", leader=self.leader_id)
                self._back_off(list(self.partitions.values()))
            await self._idle()

    async def _idle(self) -> None:
        """Until a partition is ready again, or something changed."""
        loop = asyncio.get_running_loop()
        delays = [s.delayed_until - loop.time() for s in self.partitions.values()
                  if not s.waiting_for_state]
        timeout = max(min(delays), 0.0) if delays else None
        self._wake.clear()
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when the
        # wake-up and a cancellation come together, and the cancelled loop would go on.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._wake.wait()

    def _back_off(self, states: list[FetchState]) -> None:
        until = asyncio.get_running_loop().time() + self.manager.settings.backoff_ms / 1000
        for s in states:
            s.delayed_until = until

    def _current(self, state: FetchState) -> Partition | None:
        """The partition, if this fetch state is still the one it is followed with."""
        if self.partitions.get(state.tp) is not state:
            return None
        partition = self.manager.replica_manager.follower_partitions.get(state.tp)
        if partition is None or partition.leader_epoch != state.leader_epoch:
            return None
        return partition

    def _wait_for_state(self, state: FetchState, error: ErrorCode) -> None:
        state.waiting_for_state = True
        logger.info("replica fetch stopped until newer partition state", topic=state.tp[0],
                    partition=state.tp[1], leader=self.leader_id, error=error.name,
                    leader_epoch=state.leader_epoch)

    # -- truncation by OffsetForLeaderEpoch --------------------------------------------------
    async def _truncate_pending(self) -> None:
        loop = asyncio.get_running_loop()
        asking: dict[TopicPartition, tuple[FetchState, int]] = {}
        for state in list(self.partitions.values()):
            if not state.truncating or not state.ready(loop.time()):
                continue
            partition = self._current(state)
            if partition is None:
                continue
            latest = partition.log.latest_epoch
            if latest is None or latest < 0:
                # no epoch known: Kafka truncates such a replica to its high watermark
                self._truncate(partition, state, partition.high_watermark)
                state.truncating = False
                continue
            asking[state.tp] = (state, latest)
        if not asking:
            return
        try:
            answers = await self._offsets_for_leader_epoch(asking)
        except InterBrokerError as e:
            logger.info("leader epochs not asked: leader unreachable", leader=self.leader_id,
                        error=str(e))
            self._back_off([s for s, _ in asking.values()])
            return
        for tp, (state, _latest) in asking.items():
            partition = self._current(state)
            if partition is None:
                continue
            error, answer = answers.get(tp, (ErrorCode.UNKNOWN_SERVER_ERROR, None))
            if error in _WAIT_FOR_STATE:
                self._wait_for_state(state, error)
            elif error != ErrorCode.NONE or answer is None:
                self._back_off([state])
            else:
                offset, completed = truncation_offset(partition, answer)
                self._truncate(partition, state, offset)
                state.truncating = not completed

    async def _offsets_for_leader_epoch(
        self, asking: dict[TopicPartition, tuple[FetchState, int]]
    ) -> dict[TopicPartition, tuple[ErrorCode, EpochEndOffset | None]]:
        by_topic: dict[str, list[Any]] = {}
        for (topic, index), (state, latest) in asking.items():
            by_topic.setdefault(topic, []).append(
                OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                    partition=index, current_leader_epoch=state.leader_epoch,
                    leader_epoch=latest))
        node_id = self.manager.node_id

        def build(version: int) -> Any:
            topics = [OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=t, partitions=ps)
                      for t, ps in by_topic.items()]
            if version >= 3:
                return OffsetForLeaderEpochRequest[version](replica_id=node_id, topics=topics)
            return OffsetForLeaderEpochRequest[version](topics=topics)

        response = await self.client.send(self.leader_id, OFFSET_FOR_LEADER_EPOCH_KEY, build,
                                          OFFSET_FOR_LEADER_EPOCH_NEWEST)
        out: dict[TopicPartition, tuple[ErrorCode, EpochEndOffset | None]] = {}
        for t in response.topics:
            for p in t.partitions:
                out[(t.topic, p.partition)] = (
                    ErrorCode(p.error_code), EpochEndOffset(p.leader_epoch, p.end_offset))
        return out

    def _truncate(self, partition: Partition, state: FetchState, offset: int) -> None:
        try:
            if offset < partition.high_watermark:
                logger.warning("truncating below the high watermark", topic=state.tp[0],
                               partition=state.tp[1], offset=offset,
                               high_watermark=partition.high_watermark)
            if partition.truncate_to(offset):
                logger.info("follower log truncated", topic=state.tp[0], partition=state.tp[1],
                            offset=offset, leader=self.leader_id,
                            leader_epoch=state.leader_epoch)
        except KafkaStorageError:
            self._wait_for_state(state, ErrorCode.KAFKA_STORAGE_ERROR)

    # -- fetch -------------------------------------------------------------------------------
    async def _fetch(self, ready: list[FetchState]) -> None:
        asked = await self._fetch_offsets(ready)
        if not asked:
            return
        try:
            response = await self.client.send(self.leader_id, FETCH_KEY,
                                              self._fetch_builder(asked), FETCH_NEWEST)
        except InterBrokerError as e:
            logger.info("replica fetch failed: leader unreachable", leader=self.leader_id,
                        error=str(e))
            self._back_off([s for s, _ in asked.values()])
            return
        self.fetches += 1
        top_error = ErrorCode(getattr(response, "error_code", 0) or 0)
        if top_error != ErrorCode.NONE:
            logger.info("replica fetch refused", leader=self.leader_id, error=top_error.name)
            self._back_off([s for s, _ in asked.values()])
            return
        by_id: dict[Any, str] = {s.topic_id: tp[0] for tp, (s, _o) in asked.items()
                                 if s.topic_id is not None}
        answered: set[TopicPartition] = set()
        for t in response.responses:
            topic = getattr(t, "topic", None) or by_id.get(getattr(t, "topic_id", None))
            if topic is None:
                continue
            for p in t.partitions:
                tp = (topic, p.partition_index)
                entry = asked.get(tp)
                if entry is None:
                    continue
                answered.add(tp)
                await self._handle_partition(entry[0], entry[1], p)
        missing = [s for tp, (s, _o) in asked.items() if tp not in answered]
        if missing:
            self._back_off(missing)

    async def _fetch_offsets(self, ready: list[FetchState]
                             ) -> dict[TopicPartition, tuple[FetchState, int]]:
        """Each partition's fetch offset, its log end: the leader takes it as what this
        replica holds (its high watermark and acks=all count it). So an offset is reported
        only once as durable as the flush policy asks (flush.messages: Kafka's follower
        flushes in the append before its next fetch). A log end whose flush failed (its dir
        went offline) is not reported: the partition waits for newer state, as after a
        failed append."""
        rm = self.manager.replica_manager
        current = [(s, p) for s in ready if (p := self._current(s)) is not None]
        if any(rm.follower_flush_owed(p) for _s, p in current):
            await rm.follower_flushes([p for _s, p in current])
            current = [(s, p) for s, _p in current if (p := self._current(s)) is not None]
            for state, partition in current:
                if rm.follower_flush_owed(partition):  # only offline it was not flushed
                    self._wait_for_state(state, ErrorCode.KAFKA_STORAGE_ERROR)
            current = [(s, p) for s, p in current if not s.waiting_for_state]
        return {s.tp: (s, p.log_end_offset) for s, p in current}

    def _fetch_builder(self, asked: dict[TopicPartition, tuple[FetchState, int]]
                       ) -> Callable[[int], Any]:
        settings = self.manager.settings
        node_id = self.manager.node_id
        broker_epoch = self.manager.broker_epoch()
        rm = self.manager.replica_manager

        def build(version: int) -> Any:
            topics: dict[Any, list[Any]] = {}
            for tp, (state, offset) in asked.items():
                log = rm.follower_partitions[tp].log if tp in rm.follower_partitions else None
                last_epoch = log.latest_epoch if log is not None else None
                start = log.log_start_offset if log is not None else -1
                key = state.topic_id if version >= 13 else tp[0]
                topics.setdefault(key, []).append(FetchRequest.FetchTopic.FetchPartition(
                    partition=tp[1], current_leader_epoch=state.leader_epoch,
                    fetch_offset=offset,
                    last_fetched_epoch=-1 if last_epoch is None else last_epoch,
                    log_start_offset=start, partition_max_bytes=settings.max_bytes))
            fetch_topics = [
                FetchRequest.FetchTopic(topic_id=key, partitions=ps) if version >= 13
                else FetchRequest.FetchTopic(topic=key, partitions=ps)
                for key, ps in topics.items()]
            common: dict[str, Any] = dict(
                max_wait_ms=settings.wait_max_ms, min_bytes=settings.min_bytes,
                max_bytes=settings.response_max_bytes, isolation_level=0, session_id=0,
                session_epoch=-1, topics=fetch_topics, forgotten_topics_data=[], rack_id="")
            if version >= 15:
                return FetchRequest[version](replica_state=FetchRequest.ReplicaState(
                    replica_id=node_id, replica_epoch=broker_epoch), **common)
            return FetchRequest[version](replica_id=node_id, **common)

        return build

    async def _handle_partition(self, state: FetchState, fetch_offset: int, p: Any) -> None:
        """Kafka's processFetchRequest for one partition of the answer."""
        partition = self._current(state)
        if partition is None or partition.log_end_offset != fetch_offset:
            return  # followed anew, or truncated, while the fetch was out: asked again
        error = ErrorCode(p.error_code)
        if error == ErrorCode.NONE:
            diverging = getattr(p, "diverging_epoch", None)
            if diverging is not None and diverging.epoch >= 0 and diverging.end_offset >= 0:
                offset, completed = truncation_offset(
                    partition, EpochEndOffset(diverging.epoch, diverging.end_offset))
                self._truncate(partition, state, offset)
                state.truncating = not completed
                return
            self._append(partition, state, p)
        elif error == ErrorCode.OFFSET_OUT_OF_RANGE:
            await self._handle_out_of_range(partition, state)
        elif error in _WAIT_FOR_STATE:
            self._wait_for_state(state, error)
        else:
            logger.info("replica fetch error: backing off", topic=state.tp[0],
                        partition=state.tp[1], leader=self.leader_id, error=error.name)
            self._back_off([state])

    def _append(self, partition: Partition, state: FetchState, p: Any) -> None:
        """Kafka's processPartitionData: the records as they are, then the leader's high
        watermark and log start."""
        records = p.records
        rm = self.manager.replica_manager
        try:
            if records:
                info = partition.append_as_follower(records, rm.clock.wall_ms())
                rm.follower_appended(partition, info)
            partition.update_follower_high_watermark(p.high_watermark)
            if p.log_start_offset >= 0:
                partition.follow_log_start_offset(p.log_start_offset)
        except KafkaStorageError:
            self._wait_for_state(state, ErrorCode.KAFKA_STORAGE_ERROR)
        except KafkaError as e:
            logger.warning("replicated records refused: backing off", topic=state.tp[0],
                           partition=state.tp[1], leader=self.leader_id, error=str(e))
            self._back_off([state])

    async def _handle_out_of_range(self, partition: Partition, state: FetchState) -> None:
        """Kafka's fetchOffsetAndTruncate: behind the leader's start, start again at it;
        past the leader's end (an unclean election), truncate to that end."""
        try:
            leader_end = await self._leader_offset(state, LATEST_TIMESTAMP)
            if self._current(state) is not partition:
                return
            end = partition.log_end_offset
            if leader_end is not None and leader_end < end:
                logger.warning("log end past the leader's: truncating", topic=state.tp[0],
                               partition=state.tp[1], log_end_offset=end, leader_end=leader_end)
                self._truncate(partition, state, leader_end)
                return
            leader_start = await self._leader_offset(state, EARLIEST_TIMESTAMP)
        except InterBrokerError:
            self._back_off([state])
            return
        if leader_start is None or leader_end is None:
            self._back_off([state])
            return
        if self._current(state) is not partition:
            return
        if leader_start > partition.log_end_offset:
            logger.warning("log end below the leader's start: starting again there",
                           topic=state.tp[0], partition=state.tp[1],
                           log_end_offset=partition.log_end_offset, leader_start=leader_start)
            try:
                partition.truncate_fully_and_start_at(leader_start)
            except KafkaStorageError:
                self._wait_for_state(state, ErrorCode.KAFKA_STORAGE_ERROR)

    async def _leader_offset(self, state: FetchState, timestamp: int) -> int | None:
        """ListOffsets as a replica (the leader's log end for LATEST); None on an error,
        after which the partition waits or backs off."""
        node_id = self.manager.node_id
        topic, index = state.tp

        def build(version: int) -> Any:
            return ListOffsetsRequest[version](
                replica_id=node_id, isolation_level=0, topics=[
                    ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                        ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                            partition_index=index, current_leader_epoch=state.leader_epoch,
                            timestamp=timestamp)])])

        response = await self.client.send(self.leader_id, LIST_OFFSETS_KEY, build,
                                          LIST_OFFSETS_NEWEST)
        for t in response.topics:
            for p in t.partitions:
                error = ErrorCode(p.error_code)
                if error in _WAIT_FOR_STATE:
                    self._wait_for_state(state, error)
                    return None
                if error == ErrorCode.NONE:
                    return int(p.offset)
        self._back_off([state])
        return None


def truncation_offset(partition: Partition, leader: EpochEndOffset) -> tuple[int, bool]:
    """Kafka's getOffsetTruncationState: where this replica's log stops agreeing with the
    leader's answer for an epoch, and whether that is final (False: the leader named an epoch
    this replica does not have; ask again with the then latest epoch)."""
    log = partition.log
    end = log.log_end_offset
    if leader.end_offset < 0:
        return min(partition.high_watermark, end), True  # the leader knows no such epoch
    if leader.epoch < 0:
        return min(leader.end_offset, end), True
    mine = log.end_offset_for_epoch(leader.epoch)
    if mine is None:
        return min(leader.end_offset, end), True
    follower_epoch, follower_end = mine
    if follower_epoch != leader.epoch:
        return min(follower_end, end), False
    return min(follower_end, leader.end_offset, end), True


class ReplicaFetcherManager:
    """Kafka's ReplicaFetcherManager: this broker's fetchers, by (source broker, index)."""

    def __init__(self, replica_manager: ReplicaManager, client: InterBrokerClient,
                 settings: FetcherSettings, node_id: int,
                 broker_epoch: Callable[[], int]) -> None:
        """``client``: the broker's inter-broker client, whose settings and resolver each
        fetcher's own connections use; ``broker_epoch()``: this broker's registration epoch
        now (a Fetch's ReplicaEpoch)."""
        self.replica_manager = replica_manager
        self.client = client
        self.settings = settings
        self.node_id = node_id
        self.broker_epoch = broker_epoch
        self.fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        #: where each followed partition is fetched: (leader, fetcher index)
        self.placement: dict[TopicPartition, tuple[int, int]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._stopped = False

    def _new_client(self) -> InterBrokerClient:
        """A fetcher's own connections: the broker client's settings, resolver and test
        fault (a link a test cuts or slows stops or slows replication too)."""
        client = InterBrokerClient(self.client.settings, self.client.resolve)
        client.set_fault(self.client.fault)
        return client

    def set_fault(self, fault: LinkFault | None) -> None:
        """A test's fault on every link of this broker, the fetchers' own included."""
        self.client.set_fault(fault)
        for fetcher in self.fetchers.values():
            fetcher.client.set_fault(fault)

    def add_partition(self, tp: TopicPartition, topic_id: uuid.UUID | None, leader_id: int,
                      leader_epoch: int) -> None:
        """Fetch ``tp`` from ``leader_id`` in ``leader_epoch``, truncating first (Kafka's
        addFetcherForPartitions). The same leader and epoch again changes nothing, except
        that a partition waiting for newer state is asked again."""
        if self._stopped:
            return
        key = (leader_id, fetcher_id(tp, self.settings.num_fetchers))
        old_key = self.placement.get(tp)
        if old_key == key:
            state = self.fetchers[key].partitions.get(tp)
            if state is not None and state.leader_epoch == leader_epoch:
                if state.waiting_for_state:
                    state.waiting_for_state = False
                    self.fetchers[key].wake()
                return
        if old_key is not None and old_key != key:
            self._drop(tp, old_key)
        fetcher = self.fetchers.get(key)
        if fetcher is None:
            fetcher = ReplicaFetcher(self, leader_id, key[1], self._new_client())
            self.fetchers[key] = fetcher
            fetcher.start()
        fetcher.partitions[tp] = FetchState(tp, topic_id, leader_epoch)
        self.placement[tp] = key
        fetcher.wake()
        logger.info("fetching partition as follower", topic=tp[0], partition=tp[1],
                    leader=leader_id, leader_epoch=leader_epoch, fetcher=key[1])

    def remove_partition(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp`` (it is led here now, or deleted)."""
        key = self.placement.pop(tp, None)
        if key is not None:
            self._drop(tp, key)

    def _drop(self, tp: TopicPartition, key: tuple[int, int]) -> None:
        fetcher = self.fetchers.get(key)
        if fetcher is None:
            return
        fetcher.partitions.pop(tp, None)
        if not fetcher.partitions:  # Kafka's shutdownIdleFetcherThreads
            del self.fetchers[key]
            task = asyncio.get_running_loop().create_task(fetcher.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def stop(self) -> None:
        """Stop every fetcher (broker shutdown); adds after this are ignored."""
        self._stopped = True
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        self.placement.clear()
        for fetcher in fetchers:
            await fetcher.stop()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
