"""The leader's ISR changes written to the cluster's partition state (the ZooKeeper-era
leader's conditional update of its LeaderAndIsr znode; KRaft's AlterPartition).

A proposal is written by compare-and-swap on the state key's version (the partition epoch):
it succeeds only while the state is the one the proposal was made against, with this broker
its leader in the proposal's leader epoch, and commits the ISR with the partition epoch moved
on by one. Losing the race to a newer leader epoch or partition epoch fences the proposal
(``IsrFenced``): the leader keeps its committed ISR and waits for the newer state, which the
partition-state watcher brings (and which makes it a follower when another broker leads).
Only what the cluster committed is ever applied by the leader.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from broker.cluster.store import Compare, Get, MetadataStore, Put, StoreError
from broker.cluster.topic_state import MalformedMetadata, PartitionState, state_key
from broker.replica.delayed_result import Completion
from broker.replica.replica_state import IsrFenced, LeaderAndIsrState
from protocol.errors import ErrorCode, KafkaError

logger = structlog.get_logger("broker.cluster")

TopicPartition = tuple[str, int]


class StoreIsrWriter:
    """``IsrWriter`` on the metadata store, for the partitions ``broker_id`` leads."""

    def __init__(self, store: MetadataStore, broker_id: int) -> None:
        self.store = store
        self.broker_id = broker_id
        self.committed = 0
        self.fenced = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    def alter_isr(self, tp: TopicPartition, proposed: LeaderAndIsrState
                  ) -> Completion[LeaderAndIsrState]:
        done: Completion[LeaderAndIsrState] = Completion()
        task = asyncio.get_running_loop().create_task(self._write(tp, proposed, done),
                                                      name="alter-isr")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return done

    async def _write(self, tp: TopicPartition, proposed: LeaderAndIsrState,
                     done: Completion[LeaderAndIsrState]) -> None:
        try:
            committed = await self.write(tp, proposed)
        except BaseException as e:
            if not done.done():
                done.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        done.set_result(committed)

    async def write(self, tp: TopicPartition, proposed: LeaderAndIsrState) -> LeaderAndIsrState:
        """One compare-and-swap of the state key: the committed state, or IsrFenced, or
        KafkaError (UNKNOWN_TOPIC_OR_PARTITION: the partition is gone), or StoreError."""
        if self.broker_id not in proposed.isr:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"an ISR without its leader {self.broker_id}: {proposed.isr}")
        key = state_key(*tp)
        kv = await self.store.get(key)
        if kv is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no state for {key}")
        current = self._decode(kv.value, kv.version, key)
        self._check_not_fenced(current, proposed, key)
        new = PartitionState(current.leader, current.leader_epoch, list(proposed.isr),
                             current.controller_epoch)
        result = await self.store.txn([Compare.version(key, "==", kv.version)],
                                      [Put(key, new.encode())], [Get(key)])
        if not result.succeeded:
            won = result.responses[0]
            assert isinstance(won, list)
            if not won:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{key} deleted")
            latest = self._decode(won[0].value, won[0].version, key)
            self._check_not_fenced(latest, proposed, key)
            self.fenced += 1
            raise IsrFenced(ErrorCode.INVALID_UPDATE_VERSION,
                            f"{key} changed under the ISR change (partition epoch "
                            f"{latest.partition_epoch})")
        self.committed += 1
        logger.info("ISR change committed", topic=tp[0], partition=tp[1], isr=list(proposed.isr),
                    leader_epoch=current.leader_epoch,
                    partition_epoch=current.partition_epoch + 1)
        return LeaderAndIsrState(current.leader_epoch, tuple(proposed.isr),
                                 current.partition_epoch + 1)

    def _decode(self, value: bytes, version: int, key: str) -> PartitionState:
        try:
            return PartitionState.decode(value, version, key)
        except MalformedMetadata as e:
            raise StoreError(f"partition state unreadable: {e}") from None

    def _check_not_fenced(self, current: PartitionState, proposed: LeaderAndIsrState,
                          key: str) -> None:
        """Kafka's AlterPartition checks: the writer must lead in the proposal's epoch, and
        the state must be the one the proposal was made against."""
        if current.leader != self.broker_id or current.leader_epoch != proposed.leader_epoch:
            self.fenced += 1
            raise IsrFenced(ErrorCode.FENCED_LEADER_EPOCH,
                            f"{key}: leader {current.leader} in epoch {current.leader_epoch}, "
                            f"the proposal was made as {self.broker_id} in epoch "
                            f"{proposed.leader_epoch}")
        if current.partition_epoch != proposed.partition_epoch:
            self.fenced += 1
            raise IsrFenced(ErrorCode.INVALID_UPDATE_VERSION,
                            f"{key}: partition epoch {current.partition_epoch}, the proposal "
                            f"was made against {proposed.partition_epoch}")

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # a cancellation of the caller is not swallowed here
        for task in tasks:
            if not task.cancelled():
                task.exception()  # retrieved: a write that failed as it stopped is no news
