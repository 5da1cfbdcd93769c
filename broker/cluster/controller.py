"""Controller election and the controller-epoch fence (Kafka's ``/controller`` and
``/controller_epoch``: KafkaController.elect, registerControllerAndIncrementControllerEpoch,
wrapRequestWithControllerEpochCheck).

Invariants:
- One controller at a time: ``/controller`` is created only if absent, on the winner's broker
  lease, in the same txn that moves ``/controller_epoch`` from the version the candidate read
  to epoch + 1. Two candidates cannot both win; a controller whose lease goes loses the key.
- Every controller write is a ``ControllerContext.txn``: it compares ``/controller_epoch``'s
  mod_revision with the revision of this controller's election (Kafka compared the zkVersion;
  a revision is never reused, even if the key were deleted and made again). A deposed
  controller (a new one has bumped the epoch, or it resigned) has every write refused as a
  whole: ``ControllerMoved``.
- A broker resigns at once when its registration's lease is lost (before another broker can
  win), when ``/controller`` is deleted or is no longer its own; it runs for election again
  whenever ``/controller`` vanishes, watching the key from the revision it last read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from broker.cluster.paths import CONTROLLER, CONTROLLER_EPOCH
from broker.cluster.store import (
    Compare,
    Delete,
    EventType,
    Get,
    KeyValue,
    Lease,
    LeaseNotFound,
    MetadataStore,
    Op,
    Put,
    StoreError,
    StoreUnavailable,
    TxnResult,
    WatchCompacted,
    cancel_and_wait,
    sleep_until,
)

logger = structlog.get_logger("broker.cluster")


class ControllerMoved(StoreError):
    """This broker is no longer the controller (Kafka's ControllerMovedException): its write
    was refused and nothing of it was applied."""


def encode_controller(broker_id: int, timestamp_ms: int) -> bytes:
    return json.dumps({"version": 2, "brokerid": broker_id,
                       "timestamp": str(timestamp_ms)}).encode()


def decode_controller(kv: KeyValue) -> int | None:
    """The controller's broker id, None when the value cannot be read."""
    try:
        broker_id = json.loads(kv.value)["brokerid"]
    except (ValueError, KeyError, TypeError):
        return None
    return broker_id if isinstance(broker_id, int) else None


def _epoch_of(kvs: list[KeyValue]) -> tuple[int, int]:
    """(epoch, version) of ``/controller_epoch``; (0, 0) when it does not exist yet."""
    if not kvs:
        return 0, 0
    try:
        return int(kvs[0].value), kvs[0].version
    except ValueError:
        raise StoreError(f"{CONTROLLER_EPOCH} holds no epoch: {kvs[0].value[:50]!r}") from None


@dataclass(eq=False)
class ControllerContext:
    """What an elected controller writes through: every write fenced by its epoch."""

    store: MetadataStore
    broker_id: int
    epoch: int
    #: ``/controller_epoch``'s version after this controller's election (Kafka's zkVersion).
    epoch_version: int
    #: The revision of the election txn: ``/controller``'s create revision and
    #: ``/controller_epoch``'s mod revision while this controller's epoch stands.
    revision: int
    active: bool = True

    def fence(self) -> Compare:
        return Compare.mod_revision(CONTROLLER_EPOCH, "==", self.revision)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """``store.txn`` with the epoch fence added: ``ControllerMoved`` when the fence fails,
        else the result (a failed caller's compare gives ``succeeded=False`` and the failure
        ops' responses, as a plain txn)."""
        if not self.active:
            raise ControllerMoved(f"broker {self.broker_id} resigned as controller "
                                  f"(epoch {self.epoch})")
        result = await self.store.txn(
            [self.fence(), *compares], success, [Get(CONTROLLER_EPOCH), *failure])
        if result.succeeded:
            return result
        current = result.responses[0]
        assert isinstance(current, list)
        if not current or current[0].mod_revision != self.revision:
            self.active = False
            raise ControllerMoved(
                f"controller epoch {self.epoch} of broker {self.broker_id} is stale "
                f"({CONTROLLER_EPOCH} is now {_epoch_of(current)[0]})")
        return TxnResult(False, result.revision, result.responses[1:])

    async def put(self, key: str, value: bytes) -> int:
        return (await self.txn([], [Put(key, value)])).revision

    async def delete(self, key: str) -> int:
        return (await self.txn([], [Delete(key)])).revision


class ControllerElection:
    """Runs this broker for controller whenever there is none; a ``RegistrationListener``
    of its broker registration, whose lease ``/controller`` is put on."""

    def __init__(
        self,
        store: MetadataStore,
        broker_id: int,
        *,
        on_elected: Callable[[ControllerContext], object] | None = None,
        on_resigned: Callable[[ControllerContext, str], object] | None = None,
        retry_min_ms: float = 100.0,
        retry_max_ms: float = 2000.0,
    ) -> None:
        self.store = store
        self.broker_id = broker_id
        self.on_elected = on_elected
        self.on_resigned = on_resigned
        self._retry_min_ms = retry_min_ms
        self._retry_max_ms = retry_max_ms
        #: The controller this broker knows of (itself included); None: none known.
        self.active_controller_id: int | None = None
        #: This broker's context while it is the controller.
        self.context: ControllerContext | None = None
        self.elections_won = 0
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def is_active(self) -> bool:
        return self.context is not None and self.context.active

    # -- RegistrationListener -------------------------------------------------------------

    def broker_registered(self, epoch: int, lease: Lease) -> None:
        if self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(
                self._run(lease), name=f"controller-election-{self.broker_id}")

    def broker_lost(self, epoch: int, reason: str) -> None:
        """Resign before anything else: the lease ``/controller`` is on may be gone. Forget
        the controller known too: it may have lost its registration as well (etcd away), and
        a client told of it would send it admin requests until its metadata is refreshed;
        Metadata names none (-1) until this broker, registered again, reads the key."""
        self._resign(f"broker registration lost: {reason}")
        self.active_controller_id = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        """Stop running; as controller, resign and give the key up at once."""
        self._stopped = True
        task, self._task = self._task, None
        await cancel_and_wait(task)
        context = self.context
        self._resign("shutting down")
        if context is not None:
            with contextlib.suppress(StoreError):
                await self.store.txn([Compare.create_revision(CONTROLLER, "==",
                                                              context.revision)],
                                     [Delete(CONTROLLER)])

    # -- the election loop ----------------------------------------------------------------

    async def _run(self, lease: Lease) -> None:
        backoff = self._retry_min_ms
        while True:
            try:
                revision = await self._elect(lease)
                backoff = self._retry_min_ms
                await self._watch(revision)
            except asyncio.CancelledError:
                raise
            except WatchCompacted:
                continue  # re-read the key, then watch from the new revision
            except StoreError as e:
                # Unreachable, or the lease is gone (the registration reports that and this
                # loop is restarted on the new lease): wait; anything else is worth a line.
                if not isinstance(e, StoreUnavailable | LeaseNotFound):
                    logger.warning("controller election failed, retrying", error=str(e))
                clock = self.store.clock
                await sleep_until(clock, clock.time() + backoff)
                backoff = min(backoff * 2, self._retry_max_ms)
            except Exception:  # the loop must outlive a bug in a callback, and say so
                logger.exception("controller election loop error")
                clock = self.store.clock
                await sleep_until(clock, clock.time() + self._retry_max_ms)

    async def _elect(self, lease: Lease) -> int:
        """Read ``/controller``; if there is none, run once. The revision read at."""
        while True:
            read = await self.store.txn([], [Get(CONTROLLER), Get(CONTROLLER_EPOCH)])
            controller_kvs, epoch_kvs = read.responses
            assert isinstance(controller_kvs, list) and isinstance(epoch_kvs, list)
            if controller_kvs:
                kv = controller_kvs[0]
                if self.context is None and kv.lease == lease.id:
                    # Ours, from an election whose answer never came back: nobody acts on
                    # it, and nobody else could win while it stands. Give it up, run again.
                    await self.store.txn(
                        [Compare.create_revision(CONTROLLER, "==", kv.create_revision)],
                        [Delete(CONTROLLER)])
                    continue
                self._saw(kv)
                return read.revision
            epoch, version = _epoch_of(epoch_kvs)
            won = await self.store.txn(
                [Compare.absent(CONTROLLER), Compare.version(CONTROLLER_EPOCH, "==", version)],
                [Put(CONTROLLER, encode_controller(self.broker_id, self.store.clock.wall_ms()),
                     lease.id),
                 Put(CONTROLLER_EPOCH, str(epoch + 1).encode())],
                [Get(CONTROLLER)],
            )
            if won.succeeded:
                self._became_controller(ControllerContext(
                    self.store, self.broker_id, epoch + 1, version + 1, won.revision))
                return won.revision
            # Lost: another broker won (watch it), or the epoch moved under us (read again).
            taken = won.responses[0]
            assert isinstance(taken, list)
            if taken:
                self._saw(taken[0])
                return won.revision

    async def _watch(self, revision: int) -> None:
        """Follow ``/controller`` until it is deleted (then return: run again)."""
        async with self.store.watch(CONTROLLER, start_revision=revision + 1) as watch:
            async for event in watch:
                if event.type is EventType.DELETE:
                    self.active_controller_id = None
                    self._resign(f"{CONTROLLER} was deleted")
                    return
                self._saw(event.kv)

    def _saw(self, kv: KeyValue) -> None:
        """``/controller`` as it is now: resign if it is not this controller's key."""
        self.active_controller_id = decode_controller(kv)
        context = self.context
        if context is not None and kv.create_revision != context.revision:
            self._resign(f"{CONTROLLER} now names broker {self.active_controller_id}")

    def _became_controller(self, context: ControllerContext) -> None:
        self.context = context
        self.active_controller_id = self.broker_id
        self.elections_won += 1
        logger.info("elected controller", broker_id=self.broker_id, epoch=context.epoch)
        if self.on_elected is not None:
            self.on_elected(context)

    def _resign(self, reason: str) -> None:
        context, self.context = self.context, None
        if context is None:
            return
        context.active = False
        if self.active_controller_id == self.broker_id:
            self.active_controller_id = None
        logger.warning("resigned as controller", broker_id=self.broker_id,
                       epoch=context.epoch, reason=reason)
        if self.on_resigned is not None:
            try:
                self.on_resigned(context, reason)
            except Exception:
                logger.exception("controller resignation handler failed")
