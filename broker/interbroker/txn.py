"""Transactions across brokers: markers to each partition's leader, and the KIP-890 check of a
transactional produce against a coordinator on another broker.

- ``ClusterMarkerChannel`` is the transaction coordinator's ``MarkerChannel`` in a cluster
  (Kafka's TransactionMarkerChannelManager): partitions this broker serves are written locally
  as before; the others are grouped by their leader in the cluster metadata cache and sent as
  one WriteTxnMarkers per leader through the inter-broker client. A partition without a live
  leader, or whose leader cannot be reached or answers NOT_LEADER_OR_FOLLOWER, comes back as a
  retriable error: the coordinator retries after its backoff, by which time the cache (kept by
  the partition-state watch) names the new leader. A partition the cluster does not have is
  gone (its topic deleted) and owes no marker.
- ``RemoteTransactionVerifier`` is the replica manager's check when the transactional id's
  coordinator is another broker (Kafka's AddPartitionsToTxnManager): AddPartitionsToTxn v4+
  with ``verify_only``. The coordinator of an id is the leader of its ``__transaction_state``
  partition in the cluster metadata. While that topic is not a cluster topic (coordinators
  answering for themselves, per broker), an id this broker's coordinator does not know cannot
  be located: the produce is appended unverified (Kafka's behaviour with
  ``transaction.partition.verification.enable=false``), logged once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import structlog
from kafka.protocol.producer import AddPartitionsToTxnRequest, WriteTxnMarkersRequest

from broker.interbroker.client import InterBrokerClient, InterBrokerError, RequestTimedOut
from broker.replica.delayed_result import Completion, all_of, completed
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.cluster.metadata_cache import ClusterMetadataCache
    from broker.replica.replica_manager import ReplicaManager

logger = structlog.get_logger("broker.interbroker")

E = ErrorCode
TopicPartition = tuple[str, int]
Errors = dict[TopicPartition, ErrorCode]
WRITE_TXN_MARKERS_KEY = 27
WRITE_TXN_MARKERS_NEWEST = 1  # transaction version 1 (v2 means version 2)
ADD_PARTITIONS_TO_TXN_KEY = 24
ADD_PARTITIONS_TO_TXN_NEWEST = 5
VERIFY_MIN_VERSION = 4  # the batched, broker-to-broker form
TRANSACTION_STATE_TOPIC = "__transaction_state"
NO_LEADER = -1

Marker = WriteTxnMarkersRequest.WritableTxnMarker
MarkerTopic = Marker.WritableTxnMarkerTopic
VerifyTxn = AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction
VerifyTopic = VerifyTxn.AddPartitionsToTxnTopic


class _Tasks:
    """Background requests, cancelled together at shutdown."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def answer(self, ask: Coroutine[Any, Any, Any], read: Callable[[Any], Errors],
               failed: Callable[[InterBrokerError], Errors], name: str) -> Completion[Errors]:
        """Each partition's error: ``read(response)``, or ``failed(error)`` when the request
        got no answer."""
        done: Completion[Errors] = Completion()

        async def run() -> None:
            try:
                response = await ask
            except InterBrokerError as e:
                done.set_result(failed(e))
                return
            except BaseException as e:
                done.set_exception(e)
                raise
            done.set_result(read(response))

        task = asyncio.get_running_loop().create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return done

    async def cancel(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _by_topic(partitions: list[TopicPartition]) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for topic, index in partitions:
        topics.setdefault(topic, []).append(index)
    return topics


def _leader(cache: ClusterMetadataCache, tp: TopicPartition) -> int | None:
    """The partition's leader in the cluster, NO_LEADER when offline, None when the cluster
    does not have it."""
    topic = cache.topic(tp[0])
    if topic is None:
        return None
    partition = topic.partitions.get(tp[1])
    return None if partition is None else partition.leader


class ClusterMarkerChannel:
    """Markers to each partition's leader, this broker's own written locally."""

    def __init__(self, node_id: int, replica_manager: ReplicaManager,
                 cache: ClusterMetadataCache, client: InterBrokerClient,
                 joined: Callable[[], bool]) -> None:
        """``joined()``: the cluster's partition states are known (before that every
        partition is taken as existing, so no marker is dropped at start-up)."""
        self.node_id = node_id
        self.replica_manager = replica_manager
        self.cache = cache
        self.client = client
        self.joined = joined
        self.remote_requests = 0  # WriteTxnMarkers sent to other brokers (metrics, tests)
        self._tasks = _Tasks()

    def known(self, tp: TopicPartition) -> bool:
        return (tp in self.replica_manager.partitions or not self.joined()
                or _leader(self.cache, tp) is not None)

    def write(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
              partitions: list[TopicPartition], timeout_ms: int
              ) -> Completion[dict[TopicPartition, ErrorCode]]:
        local = [tp for tp in partitions if tp in self.replica_manager.partitions]
        parts: list[Completion[dict[TopicPartition, ErrorCode]]] = []
        if local:
            parts.append(self.replica_manager.write_txn_markers(
                producer_id, producer_epoch, coordinator_epoch, commit, local, timeout_ms))
        unplaced: dict[TopicPartition, ErrorCode] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in partitions:
            if tp in self.replica_manager.partitions:
                continue
            leader = _leader(self.cache, tp)
            if leader is None or leader == NO_LEADER or leader == self.node_id:
                # Not led (yet) by a live broker, or this broker has not opened it yet.
                unplaced[tp] = E.NOT_LEADER_OR_FOLLOWER
            else:
                by_leader.setdefault(leader, []).append(tp)
        if unplaced:
            parts.append(completed(unplaced))
        for leader, tps in sorted(by_leader.items()):
            parts.append(self._send(leader, tps, producer_id, producer_epoch,
                                    coordinator_epoch, commit))
        return all_of(parts).then(_merged)

    def _send(self, leader: int, tps: list[TopicPartition], producer_id: int,
              producer_epoch: int, coordinator_epoch: int, commit: bool) -> Completion[Errors]:
        def build(version: int) -> Any:
            return WriteTxnMarkersRequest[version](markers=[Marker(
                producer_id=producer_id, producer_epoch=producer_epoch,
                transaction_result=commit, coordinator_epoch=coordinator_epoch,
                topics=[MarkerTopic(name=t, partition_indexes=ps)
                        for t, ps in _by_topic(tps).items()])])

        def read(response: Any) -> Errors:
            errors = {(topic.name, p.partition_index): ErrorCode(p.error_code)
                      for marker in response.markers for topic in marker.topics
                      for p in topic.partitions}
            return {tp: errors.get(tp, E.UNKNOWN_SERVER_ERROR) for tp in tps}

        def failed(e: InterBrokerError) -> Errors:
            # Kafka re-enqueues markers whose request failed: retried on the leader then.
            logger.info("transaction markers not delivered", leader=leader, error=str(e))
            timed_out = isinstance(e, RequestTimedOut)
            return dict.fromkeys(tps, E.REQUEST_TIMED_OUT if timed_out
                                 else E.NOT_LEADER_OR_FOLLOWER)

        self.remote_requests += 1
        ask = self.client.send(leader, WRITE_TXN_MARKERS_KEY, build, WRITE_TXN_MARKERS_NEWEST)
        return self._tasks.answer(ask, read, failed, f"txn-markers-{leader}")

    async def close(self) -> None:
        await self._tasks.cancel()


def _merged(parts: list[dict[TopicPartition, ErrorCode]]) -> dict[TopicPartition, ErrorCode]:
    out: dict[TopicPartition, ErrorCode] = {}
    for part in parts:
        out.update(part)
    return out


class RemoteTransactionVerifier:
    """The replica manager's ``verify_transaction_remote`` in a cluster."""

    def __init__(self, node_id: int, cache: ClusterMetadataCache, client: InterBrokerClient,
                 partition_for: Callable[[str], int], known_here: Callable[[str], bool]) -> None:
        """``partition_for(id)``: the id's ``__transaction_state`` partition;
        ``known_here(id)``: this broker's coordinator has the id (it checks it itself)."""
        self.node_id = node_id
        self.cache = cache
        self.client = client
        self.partition_for = partition_for
        self.known_here = known_here
        self.remote_requests = 0  # AddPartitionsToTxn verifications sent (metrics, tests)
        self.unverified = 0  # produces appended with no coordinator to ask
        self._tasks = _Tasks()

    def coordinator_of(self, transactional_id: str) -> int | None:
        """The broker leading the id's ``__transaction_state`` partition; None when that
        topic is not in the cluster."""
        return _leader(self.cache, (TRANSACTION_STATE_TOPIC,
                                    self.partition_for(transactional_id)))

    def __call__(self, transactional_id: str, producer_id: int, producer_epoch: int,
                 partitions: list[TopicPartition]
                 ) -> Completion[dict[TopicPartition, ErrorCode]] | None:
        if self.known_here(transactional_id):
            return None
        coordinator = self.coordinator_of(transactional_id)
        if coordinator == self.node_id:
            return None
        if coordinator is None:
            if not self.unverified:
                logger.warning("transactional produce appended unverified: the transaction "
                               "coordinator cannot be located while __transaction_state is "
                               "not a cluster topic", transactional_id=transactional_id)
            self.unverified += 1
            return completed(dict.fromkeys(partitions, E.NONE))
        if coordinator == NO_LEADER:
            return completed(dict.fromkeys(partitions, E.COORDINATOR_NOT_AVAILABLE))
        return self.verify_on(coordinator, transactional_id, producer_id, producer_epoch,
                              partitions)

    def verify_on(self, coordinator: int, transactional_id: str, producer_id: int,
                  producer_epoch: int, partitions: list[TopicPartition]
                  ) -> Completion[dict[TopicPartition, ErrorCode]]:
        """AddPartitionsToTxn (verify only) to ``coordinator``: each partition's answer."""
        def build(version: int) -> Any:
            if version < VERIFY_MIN_VERSION:
                raise InterBrokerError(f"broker {coordinator} cannot verify transactions "
                                       f"(AddPartitionsToTxn v{version})")
            return AddPartitionsToTxnRequest[version](transactions=[VerifyTxn(
                transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, verify_only=True,
                topics=[VerifyTopic(name=t, partitions=ps)
                        for t, ps in _by_topic(partitions).items()])])

        def failed(e: InterBrokerError) -> Errors:
            logger.info("transaction verification failed", coordinator=coordinator,
                        error=str(e))
            return dict.fromkeys(partitions, E.NETWORK_EXCEPTION)

        self.remote_requests += 1
        ask = self.client.send(coordinator, ADD_PARTITIONS_TO_TXN_KEY, build,
                               ADD_PARTITIONS_TO_TXN_NEWEST)
        return self._tasks.answer(
            ask, lambda response: _verified(response, transactional_id, partitions), failed,
            f"txn-verify-{coordinator}")

    async def close(self) -> None:
        await self._tasks.cancel()


def _verified(response: Any, transactional_id: str, partitions: list[TopicPartition]
              ) -> dict[TopicPartition, ErrorCode]:
    """Each partition's answer; a request-level error (CLUSTER_AUTHORIZATION_FAILED) for all."""
    if response.error_code != 0:
        return dict.fromkeys(partitions, ErrorCode(response.error_code))
    errors: dict[TopicPartition, ErrorCode] = {}
    for txn in response.results_by_transaction:
        if txn.transactional_id != transactional_id:
            continue
        for topic in txn.topic_results:
            for p in topic.results_by_partition:
                errors[(topic.name, p.partition_index)] = ErrorCode(p.partition_error_code)
    return {tp: errors.get(tp, E.UNKNOWN_SERVER_ERROR) for tp in partitions}
