"""One broker's part of the cluster, as the server runs it (docs/cluster.md, "Wiring it into
the broker"): membership, controller duties, this broker's own liveness view, the metadata
cache the Metadata and DescribeCluster handlers read, and the partition-state watcher telling
the replica manager which partitions to lead.

``ClusterNode`` is made only when ``ClusterSettings.enabled``; a single broker never builds
it, so nothing here runs, nor is etcd's client imported, in single-node mode.

``ClusterReplicas`` is the watcher's ``ReplicaListener``: each transition is queued and done
in order on one task (reading a topic's configs from the store may wait), so a partition's
become-leader, become-follower and deletion are applied in the order the watcher saw them.
A partition led here gets its replicas, ISR and partition epoch with every become-leader,
and its ISR changes go to the store through ``StoreIsrWriter`` (docs/replication.md); the
follower side of replication is not built: a follower's partition is not served (its log
stays) and answers NOT_LEADER_OR_FOLLOWER.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Awaitable, Callable, Container, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog

from broker.cluster.controller import ControllerMoved
from broker.cluster.isr_writer import StoreIsrWriter
from broker.cluster.lease_keeper import lost_unreachable
from broker.cluster.liveness import BrokerLivenessView
from broker.cluster.membership import ClusterMembership, open_etcd_store
from broker.cluster.metadata_cache import ClusterMetadataCache, TopicMetadata
from broker.cluster.partition_watcher import (
    LeaderAndIsr,
    LocalReplicaTransitions,
    PartitionStateWatcher,
)
from broker.cluster.placement import PlacementError
from broker.cluster.producer_id_block import ClusterProducerIdManager
from broker.cluster.registration import BrokerInfo
from broker.cluster.settings import ClusterSettings
from broker.cluster.shared_state import EtcdSharedState
from broker.cluster.store import Get, KeyValue, Lease, MetadataStore, StoreError, cancel_and_wait
from broker.cluster.topic_controller import (
    ControllerDuties,
    LeaderRebalance,
    TopicController,
    plan_topic,
    propose_topic,
)
from broker.cluster.topic_state import (
    MalformedMetadata,
    PartitionState,
    TopicAssignment,
    config_key,
    decode_topic_config,
    state_key,
    topic_key,
)
from broker.log.config import LogConfig
from broker.log.manager import LogManager
from broker.replica.delayed_result import Completion
from broker.replica.partition import Partition
from broker.replica.replica_manager import ReplicaManager
from broker.startup_error import StartupError
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.interbroker.client import InterBrokerClient

logger = structlog.get_logger("broker.cluster")

T = TypeVar("T")
TopicPartition = tuple[str, int]
#: Re-reading the partitions to lead again after a new registration: the first retry after
#: this long when the store cannot be read, doubling up to the most.
LEAD_AGAIN_RETRY_MIN_S = 0.2
LEAD_AGAIN_RETRY_MAX_S = 2.0
#: Partitions read in one transaction (two reads each): etcd refuses a transaction of more
#: than --max-txn-ops (128 by default) operations.
LEAD_AGAIN_READ_BATCH = 32


class LeadershipListener(Protocol):
    """Told when this broker starts or stops leading a partition (Kafka's
    onLeadershipChange callback of becomeLeaderOrFollower, which the group and transaction
    coordinators' onElection / onResignation hang on)."""

    def became_leader(self, tp: TopicPartition, leader_epoch: int) -> object: ...

    def stopped_leading(self, tp: TopicPartition) -> object: ...


class ReplicaFetching(Protocol):
    """The replica fetchers (broker/interbroker/replica_fetcher.py), as the transitions use
    them: fetch a followed partition from its leader, or stop."""

    def add_partition(self, tp: TopicPartition, topic_id: uuid.UUID | None, leader_id: int,
                      leader_epoch: int) -> object: ...

    def remove_partition(self, tp: TopicPartition) -> object: ...


def topic_uuid(topic_id: str) -> uuid.UUID:
    """A cluster topic id (Kafka's URL-safe base64 form) as the protocol's UUID."""
    return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))


def topic_id_text(value: uuid.UUID) -> str:
    """The protocol's UUID in the cluster's form (the inverse of ``topic_uuid``)."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


class ClusterNode:
    """This broker in the cluster, built by the server in cluster mode only."""

    def __init__(self, settings: ClusterSettings, store: MetadataStore | None = None, *,
                 unclean_leader_election: bool = False,
                 rebalance: LeaderRebalance | None = None) -> None:
        """``rebalance``: the controller's periodic preferred-leader check, None: off."""
        self.settings = settings
        self.store = store if store is not None else open_etcd_store(settings)
        self.membership = ClusterMembership(settings, self.store, owns_store=store is None)
        self.duties = ControllerDuties(lambda: self.membership.liveness,
                                       unclean_leader_election=unclean_leader_election,
                                       rebalance=rebalance)
        self.cluster_id = ""
        self.broker_epoch = -1
        self.view = BrokerLivenessView(self.store)
        self.cache = ClusterMetadataCache(self.view)
        self.watcher: PartitionStateWatcher | None = None
        self.replicas: ClusterReplicas | None = None
        #: The ACLs and SCRAM credentials every broker shares, and producer ids by block.
        self.shared_state = EtcdSharedState(self.store)
        self.shared_state.on_topic_configs_changed(self._topic_configs_changed)
        self.producer_ids = ClusterProducerIdManager(self.store, settings.node_id)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._creating: set[str] = set()  # topics being created (internal or auto-created)
        #: Internal topics not created for want of brokers: the live count last logged.
        self._short_of_brokers: dict[str, int] = {}
        self._stopped = False
        #: Requests to the other brokers (set by the server): one connection per peer, for
        #: transaction markers and verification (the replica fetchers have their own).
        self.client: InterBrokerClient | None = None
        #: Users of the client, stopped before it closes (their requests in flight dropped).
        self.closers: list[Callable[[], Awaitable[None]]] = []

    @property
    def node_id(self) -> int:
        return self.settings.node_id

    @property
    def controller_id(self) -> int:
        """The controller this broker knows of, -1 when none (Metadata's controller_id)."""
        election = self.membership.election
        active = election.active_controller_id if election is not None else None
        return -1 if active is None else active

    @property
    def controller(self) -> TopicController | None:
        """The topic controller while this broker is the controller, else None."""
        return self.duties.controller

    def endpoint(self, node_id: int, listener: str) -> tuple[str, int] | None:
        """A live broker's advertised (host, port) on ``listener``; None when not live."""
        info = self.cache.broker(node_id)
        return None if info is None else info.endpoints.get(listener)

    def not_led(self, tps: Iterable[TopicPartition], served: Container[TopicPartition]
                ) -> set[TopicPartition]:
        """Of ``tps``, the partitions the cluster has that this broker does not serve as
        leader (Kafka's NOT_LEADER_OR_FOLLOWER; a partition the cluster does not have stays
        UNKNOWN_TOPIC_OR_PARTITION)."""
        out: set[TopicPartition] = set()
        topics: dict[str, TopicMetadata | None] = {}
        for tp in tps:
            if tp in served:
                continue
            if tp[0] not in topics:
                topics[tp[0]] = self.cache.topic(tp[0])
            topic = topics[tp[0]]
            if topic is not None and tp[1] in topic.partitions:
                out.add(tp)
        return out

    async def check_log_dirs(self, log_dirs: Sequence[Path]) -> str:
        """Before the logs are loaded: the cluster id, every dir checked against it."""
        self.cluster_id = await self.membership.check_log_dirs(log_dirs)
        return self.cluster_id

    def _topic_configs_changed(self, topic: str, configs: dict[str, str] | None) -> None:
        if self.replicas is not None:
            self.replicas.forget_topic_configs()

    async def load_shared_state(self) -> None:
        """Before the owners load: the shared ACLs and SCRAM credentials listed (then
        followed), the first producer id block claimed."""
        try:
            await self.shared_state.start()
            await self.producer_ids.start()
        except StoreError as e:
            raise StartupError(f"the cluster's shared state in {self.membership.where} cannot "
                               f"be read ({e}): check that etcd is running") from None

    async def join(self, info: BrokerInfo, replicas: ClusterReplicas) -> None:
        """Once the listeners are bound: follow the live brokers, register (NodeIdInUse is a
        StartupError line), then follow the partition states."""
        self.replicas = replicas
        rm = replicas.replica_manager
        rm.broker_id = info.node_id
        rm.isr_writer = StoreIsrWriter(self.store, info.node_id)
        rm.broker_epoch_of = self.view.epoch_of
        replicas.start()
        try:
            await self.view.start()
        except StoreError as e:
            raise StartupError(f"the cluster's brokers in {self.membership.where} cannot be "
                               f"read ({e}): check that etcd is running") from None
        duties = self.duties
        self.broker_epoch = await self.membership.register(
            info, listeners=[replicas], on_elected=duties.elected,
            on_brokers=duties.brokers_changed, on_resigned=duties.resigned)
        watcher = self.watcher = PartitionStateWatcher(
            self.store, listeners=[LocalReplicaTransitions(info.node_id, replicas), self.cache])
        try:
            await watcher.start()
        except StoreError as e:
            raise StartupError(f"the cluster's topics in {self.membership.where} cannot be "
                               f"read ({e}): check that etcd is running") from None
        logger.info("joined the cluster", node_id=info.node_id, cluster_id=self.cluster_id,
                    broker_epoch=self.broker_epoch)

    @property
    def taken(self) -> asyncio.Event | None:
        """Set when another broker took this node id while it re-registered: stop."""
        registration = self.membership.registration
        return registration.taken if registration is not None else None

    async def stop(self) -> None:
        """Kafka's controlled shutdown order: stop leading (controller duties), stop
        following the cluster, then resign and deregister. Once."""
        if self._stopped:
            return
        self._stopped = True
        await self.duties.stop()
        if self.watcher is not None:
            await self.watcher.stop()
        await self.view.stop()
        for close in self.closers:
            await close()
        if self.client is not None:
            await self.client.close()
        if self.replicas is not None:
            await self.replicas.stop()
        for task in list(self._tasks):
            await cancel_and_wait(task)
        await self.producer_ids.stop()
        await self.shared_state.stop()
        await self.membership.close()

    # -- the controller's operations, for the admin handlers -----------------------------------

    def on_controller(self, work: Callable[[TopicController], Awaitable[T]],
                      moved: Callable[[], T]) -> Completion[T] | None:
        """``work`` on this broker's topic controller, answered later; None when this broker
        is not the controller (the handler answers NOT_CONTROLLER), ``moved()`` when it
        stopped being the controller meanwhile."""
        controller = self.controller
        if controller is None:
            return None
        done: Completion[T] = Completion()

        async def run() -> None:
            try:
                result = await work(controller)
            except ControllerMoved:
                result = moved()
            except BaseException as e:
                done.set_exception(e)
                raise
            done.set_result(result)

        self._spawn(run())
        return done

    # -- the coordinators' internal topics -----------------------------------------------------

    def ensure_internal_topic(self, name: str, partitions: int, replication_factor: int,
                              configs: dict[str, str]) -> None:
        """Kafka's creation of ``__consumer_offsets`` / ``__transaction_state`` on the first
        FindCoordinator, made as an auto-created topic is (``auto_create_topic``: the
        controller's ``create_topic`` here, else a proposal the controller completes), with
        the topic's replication factor (``offsets.topic.replication.factor`` /
        ``transaction.state.log.replication.factor``). Fewer live brokers than that: not
        created (logged when the count changes), and the caller answers
        COORDINATOR_NOT_AVAILABLE, as Kafka's brokers did until enough brokers were up."""
        if self._stopped or name in self._creating or self.cache.topic(name) is not None:
            return
        try:
            placed = plan_topic(self.view, name, partitions, replication_factor)
        except PlacementError as e:
            live = len(self.view.live)
            if self._short_of_brokers.get(name) != live:
                self._short_of_brokers[name] = live
                logger.error("internal topic not created: too few live brokers", topic=name,
                             live_brokers=live, replication_factor=replication_factor,
                             error=e.error_code.name)
            return
        self._short_of_brokers.pop(name, None)
        self._creating.add(name)
        self._spawn(self._auto_create(name, partitions, replication_factor, placed, configs))

    # -- topic auto-creation -------------------------------------------------------------------

    def auto_create_topic(self, name: str, partitions: int, replication_factor: int
                          ) -> ErrorCode:
        """Kafka's topic auto-creation from Metadata: the controller creates the topic (this
        broker's own topic controller when it is the controller, else through the store:
        ``propose_topic``, which the controller completes). The answer for the topic now:
        a placement Kafka refuses at once, else LEADER_NOT_AVAILABLE (the client asks again
        until the partitions have leaders)."""
        try:
            placed = plan_topic(self.view, name, partitions, replication_factor)
        except PlacementError as e:
            return e.error_code
        if name not in self._creating:
            self._creating.add(name)
            self._spawn(self._auto_create(name, partitions, replication_factor, placed))
        return ErrorCode.LEADER_NOT_AVAILABLE

    async def _auto_create(self, name: str, partitions: int, replication_factor: int,
                           placed: dict[int, list[int]],
                           configs: dict[str, str] | None = None) -> None:
        try:
            controller = self.controller
            if controller is not None:
                try:
                    result = await controller.create_topic(name, partitions, replication_factor,
                                                           configs=configs)
                    if not result.ok and result.error_code != ErrorCode.TOPIC_ALREADY_EXISTS:
                        logger.warning("topic auto-creation refused", topic=name,
                                       error=result.error_code.name, message=result.message)
                    return
                except ControllerMoved:
                    pass  # no longer the controller: propose it to the next one
            await propose_topic(self.store, name, placed, configs)
        except StoreError as e:  # the client asks again; so does this, then
            logger.warning("topic auto-creation failed", topic=name, error=str(e))
        except Exception:
            logger.exception("topic auto-creation failed", topic=name)
        finally:
            self._creating.discard(name)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work, name="cluster-admin")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class ClusterReplicas:
    """The replica manager's side of LeaderAndIsr and StopReplica (a ``ReplicaListener``),
    and of the registration (a ``RegistrationListener``: on its loss stop leading at once;
    registered again, lead again what the store still names this broker leader of)."""

    def __init__(self, store: MetadataStore, replica_manager: ReplicaManager,
                 log_manager: LogManager, log_config: Callable[[dict[str, str]], LogConfig],
                 min_insync_replicas: int = 1,
                 leadership: Sequence[LeadershipListener] = (),
                 fetchers: ReplicaFetching | None = None) -> None:
        """``leadership``: told after each partition this broker starts leading (or leads in
        a new leader epoch) and as soon as it stops leading one; ``fetchers``: where the
        partitions this broker follows are fetched from their leaders."""
        self.store = store
        self.fetchers = fetchers
        #: the broker's min.insync.replicas, for topics that do not set theirs.
        self.min_insync_replicas = min_insync_replicas
        self.leadership = list(leadership)
        self.replica_manager = replica_manager
        self.log_manager = log_manager
        self.log_config = log_config
        #: the partitions this broker leads: leader epoch by partition.
        self.led: dict[TopicPartition, int] = {}
        #: the become-leader each of them was led by.
        self._leading: dict[TopicPartition, LeaderAndIsr] = {}
        #: those it stopped leading when its registration was lost, to lead again once it is
        #: registered anew if the cluster's state still names it their leader.
        self.unserved_on_loss: dict[TopicPartition, LeaderAndIsr] = {}
        #: the broker epoch of the current registration; None while not registered.
        self._broker_epoch: int | None = None
        self._retry: asyncio.TimerHandle | None = None
        #: those of them of which this broker is the only replica.
        self.sole_replica: set[TopicPartition] = set()
        self._configs: dict[str, dict[str, str]] = {}  # by topic id
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(),
                                                            name="replica-transitions")

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        while True:
            step = await self._queue.get()
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("replica transition failed")

    async def idle(self) -> None:
        """Wait until every queued transition is done (tests)."""
        while not self._queue.empty():
            await asyncio.sleep(0.01)

    # -- ReplicaListener ---------------------------------------------------------------------

    def become_leader(self, partition: LeaderAndIsr) -> None:
        self._queue.put_nowait(lambda: self._lead(partition))

    def become_follower(self, partition: LeaderAndIsr) -> None:
        self._queue.put_nowait(lambda: self._follow(partition))

    def partition_deleted(self, topic: str, topic_id: str, partition: int) -> None:
        self._queue.put_nowait(lambda: self._delete(topic, topic_id, partition))

    # -- RegistrationListener ------------------------------------------------------------------

    def broker_registered(self, epoch: int, lease: Lease) -> None:
        """Registered (again): the partitions it stopped leading on a loss are led again if
        the cluster still names it their leader (``_lead_again``)."""
        self._broker_epoch = epoch
        if self.unserved_on_loss:
            self._queue.put_nowait(lambda: self._lead_again(epoch, LEAD_AGAIN_RETRY_MIN_S))

    def broker_lost(self, epoch: int, reason: str) -> None:
        """Another broker may lead these partitions soon: stop serving them now. Except, when
        the store could not be reached (etcd down, or this broker cut off from it), the
        partitions of which this broker is the only replica: no other broker can be made
        their leader, so they are served on (Kafka's brokers kept serving while ZooKeeper was
        away) until the controller, once the store is back, says otherwise."""
        self._broker_epoch = None
        keep = self.sole_replica if lost_unreachable(reason) else set()
        for tp in list(self.led):
            if tp not in keep:
                request = self._leading.get(tp)
                if request is not None:
                    self.unserved_on_loss[tp] = request
                self._unserve(tp, not_leader=True)
        kept = sum(1 for tp in self.led if tp in keep)
        logger.warning("stopped leading: registration lost", broker_epoch=epoch, reason=reason,
                       still_leading=kept)

    # -- the transitions -----------------------------------------------------------------------

    async def _lead(self, p: LeaderAndIsr) -> None:
        tp = (p.topic, p.partition)
        configs = await self._topic_configs(p.topic, p.topic_id)
        rm = self.replica_manager
        partition = rm.partitions.get(tp) or rm.follower_partitions.get(tp)
        if partition is None:
            partition = await self._open_partition(p, "lead")
            if partition is None:
                return
            rm.add_partition(partition)
        if p.leader_epoch < partition.leader_epoch:
            logger.warning("stale leader epoch ignored", topic=p.topic, partition=p.partition,
                           leader_epoch=p.leader_epoch, current=partition.leader_epoch)
            return
        if rm.remove_follower_partition(tp) is not None:  # led with its follower state
            if self.fetchers is not None:
                self.fetchers.remove_partition(tp)
            rm.add_partition(partition)
        partition.min_insync_replicas = _min_insync_replicas(configs, self.min_insync_replicas)
        rm.make_leader(tp, p.leader_epoch, replicas=p.replicas, isr=p.isr,
                       partition_epoch=p.partition_epoch)
        previous = self.led.get(tp)
        self.led[tp] = p.leader_epoch
        self._leading[tp] = p
        self.unserved_on_loss.pop(tp, None)
        if previous != p.leader_epoch:
            self._tell(lambda listener: listener.became_leader(tp, p.leader_epoch))
        if list(p.replicas) == [p.leader]:
            self.sole_replica.add(tp)
        else:
            self.sole_replica.discard(tp)
        logger.info("leading partition", topic=p.topic, partition=p.partition,
                    leader_epoch=p.leader_epoch)

    async def _follow(self, p: LeaderAndIsr) -> None:
        tp = (p.topic, p.partition)
        rm = self.replica_manager
        partition = rm.partitions.get(tp) or rm.follower_partitions.get(tp)
        if partition is not None and p.leader_epoch < partition.leader_epoch:
            logger.warning("stale leader epoch ignored", topic=p.topic, partition=p.partition,
                           leader_epoch=p.leader_epoch, current=partition.leader_epoch)
            return
        self.unserved_on_loss.pop(tp, None)
        if self._unserve(tp, not_leader=True):
            logger.info("stopped leading partition", topic=p.topic, partition=p.partition,
                        leader=p.leader, leader_epoch=p.leader_epoch)
        if partition is None:
            partition = await self._open_partition(p, "follow")
            if partition is None:
                return
        rm.make_follower(tp, p.leader, p.leader_epoch, list(p.replicas), list(p.isr),
                         p.partition_epoch, partition=partition)
        if self.fetchers is None:
            return
        if p.leader >= 0:
            self.fetchers.add_partition(tp, topic_uuid(p.topic_id), p.leader, p.leader_epoch)
        else:  # no leader: nothing to fetch until one is elected
            self.fetchers.remove_partition(tp)

    async def _lead_again(self, epoch: int, retry_s: float) -> None:
        """Registered anew after a loss: each partition it stopped leading then is led again
        as the cluster's state says now (read after the registration), when that state still
        names this broker its leader; as Kafka's broker applies the LeaderAndIsr of its
        replicas that a controller sends it when it registers again or when a controller
        takes over. A controller that saw the registration go moves those partitions to a new
        leader epoch, and the watcher brings it; one that did not see it (there was none at
        the time, or it was this broker) writes nothing, and without this the partitions
        would stay led by a broker that does not serve them. The store unreachable: read
        again later, for as long as this registration lasts."""
        self._retry = None
        if self._broker_epoch != epoch:
            return  # lost again: the next registration does it
        waiting = {tp: p for tp, p in self.unserved_on_loss.items() if tp not in self.led}
        self.unserved_on_loss = dict(waiting)
        if not waiting:
            return
        try:
            now = await self._read_leader_states(waiting)
        except StoreError as e:
            logger.info("partitions to lead again not read: retrying", error=str(e),
                        partitions=len(waiting))
            delay, later = retry_s, min(retry_s * 2, LEAD_AGAIN_RETRY_MAX_S)
            self._retry = asyncio.get_running_loop().call_later(
                delay, lambda: self._queue.put_nowait(lambda: self._lead_again(epoch, later)))
            return
        for tp, current in now.items():
            if self._broker_epoch != epoch:
                return
            if self.unserved_on_loss.pop(tp, None) is None or tp in self.led:
                continue  # another transition came first
            if current is None:
                continue  # led elsewhere, or gone: the watcher brings the state
            logger.info("leading partition again after a new registration", topic=tp[0],
                        partition=tp[1], leader_epoch=current.leader_epoch, broker_epoch=epoch)
            await self._lead(current)

    async def _read_leader_states(self, waiting: dict[TopicPartition, LeaderAndIsr]
                                  ) -> dict[TopicPartition, LeaderAndIsr | None]:
        """Each partition's become-leader as the store has it now, None when the store no
        longer names this broker its leader (or the topic is gone or another one)."""
        tps = list(waiting)
        out: dict[TopicPartition, LeaderAndIsr | None] = {}
        for start in range(0, len(tps), LEAD_AGAIN_READ_BATCH):
            batch = tps[start:start + LEAD_AGAIN_READ_BATCH]
            read = await self.store.txn([], [Get(k) for t, i in batch
                                             for k in (topic_key(t), state_key(t, i))])
            for n, tp in enumerate(batch):
                topic_kvs, state_kvs = read.responses[2 * n], read.responses[2 * n + 1]
                assert isinstance(topic_kvs, list) and isinstance(state_kvs, list)
                out[tp] = _still_leader(waiting[tp], topic_kvs, state_kvs)
        return out

    async def _open_partition(self, p: LeaderAndIsr, purpose: str) -> Partition | None:
        """A partition of this broker's log (opened, or created empty) to lead or follow
        with; None (logged) when the log cannot be created."""
        configs = await self._topic_configs(p.topic, p.topic_id)
        cfg = self.log_config(configs)
        tp = (p.topic, p.partition)
        log = self.log_manager.get_log(tp)
        if log is None:
            try:
                log = self.log_manager.create_log(p.topic, p.partition, cfg)
            except KafkaError as e:
                logger.error(f"cannot create the log of a partition to {purpose}",
                             topic=p.topic, partition=p.partition, error=str(e))
                return None
        else:
            log.update_config(cfg)
        partition = Partition(p.topic, p.partition, log, cfg.flush_interval_messages == 1)
        partition.min_insync_replicas = _min_insync_replicas(configs, self.min_insync_replicas)
        self.replica_manager.restore_high_watermark(partition)
        return partition

    async def _delete(self, topic: str, topic_id: str, partition: int) -> None:
        tp = (topic, partition)
        self.unserved_on_loss.pop(tp, None)
        self._unserve(tp)
        if self.fetchers is not None:
            self.fetchers.remove_partition(tp)
        self.replica_manager.remove_follower_partition(tp)
        self.log_manager.delete_log(tp)
        self._configs.pop(topic_id, None)
        logger.info("partition deleted", topic=topic, partition=partition)

    def _unserve(self, tp: TopicPartition, not_leader: bool = False) -> bool:
        """Not served any more (parked requests on it answered now, NOT_LEADER_OR_FOLLOWER
        when another broker leads it); its log stays."""
        removed = self.replica_manager.remove_partition(tp, not_leader=not_leader) is not None
        self.sole_replica.discard(tp)
        self._leading.pop(tp, None)
        if self.led.pop(tp, None) is not None:
            self._tell(lambda listener: listener.stopped_leading(tp))
        return removed

    def _tell(self, call: Callable[[LeadershipListener], object]) -> None:
        for listener in self.leadership:
            try:
                call(listener)
            except Exception:
                logger.exception("leadership listener failed")

    def forget_topic_configs(self) -> None:
        """A topic's configs changed: read them again at the next transition."""
        self._configs.clear()

    async def _topic_configs(self, topic: str, topic_id: str, attempts: int = 5
                             ) -> dict[str, str]:
        """The topic's configs from the cluster (read once per topic id); the broker's
        defaults when they cannot be read after a few tries (logged)."""
        known = self._configs.get(topic_id)
        if known is not None:
            return known
        for attempt in range(attempts):
            try:
                kv = await self.store.get(config_key(topic))
                configs = {} if kv is None else decode_topic_config(topic, kv.value)
                self._configs[topic_id] = configs
                return configs
            except MalformedMetadata as e:
                logger.error("topic configs unreadable: broker defaults used", topic=topic,
                             error=str(e))
                return {}
            except StoreError:
                await asyncio.sleep(0.2 * (attempt + 1))
        logger.warning("topic configs not reachable: broker defaults used", topic=topic)
        return {}


def _still_leader(led: LeaderAndIsr, topic_kvs: list[KeyValue], state_kvs: list[KeyValue]
                  ) -> LeaderAndIsr | None:
    """The become-leader of ``led``'s partition from its topic's assignment and its state
    as read now; None unless the same topic still names ``led.leader`` leader."""
    if not topic_kvs or not state_kvs:
        return None
    try:
        topic = TopicAssignment.decode(led.topic, topic_kvs[0].value)
        state = PartitionState.from_kv(state_kvs[0])
    except MalformedMetadata:
        return None  # logged by the watcher, which skips it too
    replicas = topic.partitions.get(led.partition)
    if (topic.topic_id != led.topic_id or replicas is None or state.leader != led.leader
            or state.leader_epoch < led.leader_epoch):
        return None
    return LeaderAndIsr(led.topic, led.topic_id, led.partition, state.leader,
                        state.leader_epoch, state.isr, replicas, state.partition_epoch,
                        state.controller_epoch)


def _min_insync_replicas(configs: dict[str, str], default: int) -> int:
    """The topic's min.insync.replicas (validated when it was set), else the broker's."""
    try:
        return max(int(configs.get("min.insync.replicas", default)), 1)
    except ValueError:
        return default


def not_controller(what: str = "This broker is not the controller.") -> tuple[ErrorCode, str]:
    """Kafka's answer from a broker that is not (or no longer) the controller: the client
    refreshes its metadata and retries on the controller."""
    return ErrorCode.NOT_CONTROLLER, what
