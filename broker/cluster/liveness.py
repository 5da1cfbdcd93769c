"""Which brokers are alive, as the controller sees them (Kafka's BrokerChangeHandler on
``/brokers/ids`` and processBrokerChange).

List ``/brokers/ids/``, then watch it from the listing's revision + 1; every registration that
appears or goes is reported as a ``BrokerChange``: brokers that came, brokers that went, and
brokers that **bounced** (the same id back with a newer epoch before the old registration was
seen to go, which a re-list after compaction can show). When the watch's revision has been
compacted, the view re-lists and reports the difference between what it had and what is
there, so no change is lost, only merged.

Invariant: ``live`` always equals the registrations at ``revision``, and ``on_change`` has been
told every difference between consecutive states it was given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from broker.cluster.paths import BROKER_IDS, broker_id_of
from broker.cluster.placement import BrokerRack
from broker.cluster.prefix_follower import PrefixFollower
from broker.cluster.registration import RegisteredBroker
from broker.cluster.store import EventType, Listing, MetadataStore, StoreError, WatchEvent

logger = structlog.get_logger("broker.cluster")


@dataclass(frozen=True, slots=True)
class BrokerChange:
    """One step of the live set, at a store revision."""

    revision: int
    added: list[RegisteredBroker] = field(default_factory=list)
    removed: list[RegisteredBroker] = field(default_factory=list)
    #: (the registration that went, the one that replaced it)
    bounced: list[tuple[RegisteredBroker, RegisteredBroker]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.bounced)


def diff(old: dict[int, RegisteredBroker], new: dict[int, RegisteredBroker],
         revision: int) -> BrokerChange:
    added = [new[i] for i in sorted(new.keys() - old.keys())]
    removed = [old[i] for i in sorted(old.keys() - new.keys())]
    bounced = [(old[i], new[i]) for i in sorted(old.keys() & new.keys())
               if old[i].epoch != new[i].epoch]
    return BrokerChange(revision, added, removed, bounced)


class BrokerLivenessView(PrefixFollower):
    """The live brokers by node id, kept current from a watch."""

    prefix = BROKER_IDS
    description = "broker-liveness"

    def __init__(
        self,
        store: MetadataStore,
        *,
        on_change: Callable[[BrokerChange], object] | None = None,
        retry_ms: float = 200.0,
    ) -> None:
        super().__init__(store, retry_ms=retry_ms)
        self.on_change = on_change
        self.live: dict[int, RegisteredBroker] = {}

    def epoch_of(self, node_id: int) -> int | None:
        broker = self.live.get(node_id)
        return broker.epoch if broker is not None else None

    def placement_brokers(self) -> list[BrokerRack]:
        """The live brokers as replica placement takes them (id and rack, by id)."""
        return [BrokerRack(b.info.node_id, b.info.rack) for _, b in sorted(self.live.items())]

    def _listed(self, listing: Listing) -> None:
        now: dict[int, RegisteredBroker] = {}
        for kv in listing.kvs:
            node_id = broker_id_of(kv.key)
            if node_id is None:
                continue
            try:
                now[node_id] = RegisteredBroker.from_kv(node_id, kv)
            except StoreError as e:  # a registration nobody can use is no live broker
                logger.warning("unreadable broker registration", key=kv.key, error=str(e))
        self._apply(now, listing.revision)

    def _apply(self, now: dict[int, RegisteredBroker], revision: int) -> None:
        change = diff(self.live, now, revision)
        self.live, self.revision = now, revision
        self.ready.set()
        if change:
            logger.info("live brokers changed", added=[b.info.node_id for b in change.added],
                        removed=[b.info.node_id for b in change.removed],
                        bounced=[n.info.node_id for _, n in change.bounced],
                        revision=revision)
            if self.on_change is not None:
                try:
                    self.on_change(change)
                except Exception:
                    logger.exception("broker change handler failed")

    def _changed(self, event: WatchEvent) -> None:
        node_id = broker_id_of(event.kv.key)
        if node_id is None:
            return
        now = dict(self.live)
        if event.type is EventType.DELETE:
            now.pop(node_id, None)
        else:
            try:
                now[node_id] = RegisteredBroker.from_kv(node_id, event.kv)
            except StoreError as e:
                logger.warning("unreadable broker registration", key=event.kv.key,
                               error=str(e))
                now.pop(node_id, None)
        self._apply(now, event.revision)
