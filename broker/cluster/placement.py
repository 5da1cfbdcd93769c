"""Replica placement as Kafka's ZooKeeper-era controller did it
(AdminUtils.assignReplicasToBrokers).

Pure functions: the live brokers (id, rack) in, ``{partition: [replica ids]}`` out, the first
replica being the preferred leader. What the algorithm promises, and the property tests check:

- every partition gets ``replication_factor`` distinct brokers;
- first replicas (leaders) go round robin over the brokers from a start index, so leader
  counts differ by at most one across brokers for any run of consecutive partitions;
- followers are shifted by an amount that grows every ``len(brokers)`` partitions, so the
  brokers that follow a given leader vary;
- rack aware (every broker has a rack): the brokers are first interleaved by rack (sorted rack
  names, ids ascending within a rack), and a partition's replicas take a rack without one
  before any rack gets a second, so a partition spans ``min(rf, racks)`` racks.

Kafka picks the start index and the first shift at random; tests pass them (``start_index``)
or a seeded ``random.Random``. Errors carry Kafka's codes: INVALID_PARTITIONS and
INVALID_REPLICATION_FACTOR for counts, INVALID_REPLICA_ASSIGNMENT for a manual assignment.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from protocol.errors import ErrorCode


class PlacementError(Exception):
    """A placement Kafka refuses, with the error code its CreateTopics answer carries."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.message = message


@dataclass(frozen=True, slots=True)
class BrokerRack:
    """A live broker as placement sees it (Kafka's admin BrokerMetadata)."""

    id: int
    rack: str | None = None


class RackAwareMode(enum.Enum):
    """How racks are used when only some brokers have one (Kafka's RackAwareMode)."""

    ENFORCED = "enforced"  # refuse: a placement that ignored racks could share one
    SAFE = "safe"  # ignore racks unless every broker has one
    DISABLED = "disabled"  # ignore racks


def brokers_for_placement(
    brokers: Iterable[BrokerRack], mode: RackAwareMode = RackAwareMode.ENFORCED
) -> list[BrokerRack]:
    """The brokers to place on, by id, racks kept or dropped as ``mode`` says
    (Kafka's getBrokerMetadatas)."""
    ordered = sorted(brokers, key=lambda b: b.id)
    with_rack = sum(1 for b in ordered if b.rack is not None)
    partial = 0 < with_rack < len(ordered)
    if mode is RackAwareMode.ENFORCED and partial:
        raise PlacementError(ErrorCode.UNKNOWN_SERVER_ERROR, _partial_racks(ordered))
    if mode is RackAwareMode.DISABLED or (mode is RackAwareMode.SAFE and partial):
        return [BrokerRack(b.id) for b in ordered]
    return ordered


def _partial_racks(brokers: Sequence[BrokerRack]) -> str:
    without = [b.id for b in brokers if b.rack is None]
    return (f"Not every broker has a rack (brokers without broker.rack: "
            f"{', '.join(map(str, without))}): set broker.rack on all of them or on none, "
            f"or place replicas without rack awareness")


def assign_replicas(
    brokers: Sequence[BrokerRack],
    partitions: int,
    replication_factor: int,
    *,
    start_index: int = -1,
    start_partition_id: int = -1,
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """``{partition id: replicas}`` for ``partitions`` new partitions numbered from
    ``start_partition_id`` (0 when negative). ``start_index`` >= 0 fixes both the first
    leader's position and the first follower shift (Kafka's fixedStartIndex), as adding
    partitions to a topic does; else both are random."""
    if partitions <= 0:
        raise PlacementError(ErrorCode.INVALID_PARTITIONS,
                             "Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise PlacementError(ErrorCode.INVALID_REPLICATION_FACTOR,
                             "Replication factor must be larger than 0.")
    if replication_factor > len(brokers):
        raise PlacementError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"Replication factor: {replication_factor} larger than available brokers: "
            f"{len(brokers)}.")
    if len({b.id for b in brokers}) != len(brokers):
        raise ValueError(f"a broker is listed twice: {[b.id for b in brokers]}")
    rng = rng or random.Random()
    start = start_index if start_index >= 0 else rng.randrange(len(brokers))
    shift = start_index if start_index >= 0 else rng.randrange(len(brokers))
    first_id = max(0, start_partition_id)
    if all(b.rack is None for b in brokers):
        ids = [b.id for b in brokers]
        return _rack_unaware(ids, partitions, replication_factor, start, shift, first_id)
    if any(b.rack is None for b in brokers):
        raise PlacementError(ErrorCode.UNKNOWN_SERVER_ERROR, _partial_racks(brokers))
    racks = {b.id: b.rack for b in brokers if b.rack is not None}
    return _rack_aware(racks, partitions, replication_factor, start, shift, first_id)


def replica_index(first: int, shift: int, j: int, n: int) -> int:
    """Where the (j+2)-th replica goes: never on the first replica's position."""
    return (first + 1 + (shift + j) % (n - 1)) % n


def _rack_unaware(ids: list[int], partitions: int, rf: int, start: int, shift: int,
                  first_id: int) -> dict[int, list[int]]:
    n = len(ids)
    out: dict[int, list[int]] = {}
    for partition in range(first_id, first_id + partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        out[partition] = [ids[first]] + [ids[replica_index(first, shift, j, n)]
                                         for j in range(rf - 1)]
    return out


def _rack_aware(racks: dict[int, str], partitions: int, rf: int, start: int, shift: int,
                first_id: int) -> dict[int, list[int]]:
    arranged = rack_alternated(racks)
    n = len(arranged)
    n_racks = len(set(racks.values()))
    out: dict[int, list[int]] = {}
    for partition in range(first_id, first_id + partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start) % n
        leader = arranged[first]
        replicas = [leader]
        racks_used, brokers_used = {racks[leader]}, {leader}
        k = 0
        for _ in range(rf - 1):
            while True:
                broker = arranged[replica_index(first, shift * n_racks, k, n)]
                k += 1
                rack = racks[broker]
                # A rack already used is taken only once every rack has a replica, a broker
                # already used only once every broker has one.
                if ((rack not in racks_used or len(racks_used) == n_racks)
                        and (broker not in brokers_used or len(brokers_used) == n)):
                    replicas.append(broker)
                    racks_used.add(rack)
                    brokers_used.add(broker)
                    break
        out[partition] = replicas
    return out


def rack_alternated(racks: Mapping[int, str]) -> list[int]:
    """Brokers interleaved by rack: racks in name order, ids ascending within each
    (rack a: 0,1; rack b: 2 -> 0, 2, 1)."""
    by_rack: dict[str, list[int]] = {}
    for broker, rack in racks.items():
        by_rack.setdefault(rack, []).append(broker)
    columns = [sorted(by_rack[rack]) for rack in sorted(by_rack)]
    depth = max(len(c) for c in columns)
    return [c[i] for i in range(depth) for c in columns if i < len(c)]


def validate_manual_assignment(
    assignments: Iterable[tuple[int, Sequence[int]]], registered: Collection[int],
    replication_factor: int | None = None,
) -> dict[int, list[int]]:
    """A CreateTopics manual assignment checked as Kafka's controller checks it
    (ReplicationControlManager: each partition once, replicas non-empty, registered and
    distinct, one replication factor, partitions 0..n-1); ``{partition: replicas}``.
    ``replication_factor``: the one every partition must have (the topic's, when partitions
    are added to it)."""
    out: dict[int, list[int]] = {}
    for partition, replicas in assignments:
        if partition in out:
            raise _bad_assignment(
                f"Found multiple manual partition assignments for partition {partition}")
        _check_replicas(list(replicas), registered, replication_factor)
        replication_factor = len(replicas)
        out[partition] = list(replicas)
    if sorted(out) != list(range(len(out))):
        raise _bad_assignment("partitions should be a consecutive 0-based integer sequence")
    return dict(sorted(out.items()))


def new_partitions_assignment(
    existing: Mapping[int, Sequence[int]], count: int, assignments: Sequence[Sequence[int]],
    registered: Collection[int],
) -> dict[int, list[int]]:
    """A CreatePartitions manual assignment for a topic with ``existing`` partitions grown to
    ``count``, checked as Kafka's controller checks it (ReplicationControlManager.
    createPartitions: one assignment per new partition, then each as a manual assignment with
    the replication factor of the topic's first partition); the new partitions' replicas,
    numbered on from the existing ones."""
    added = count - len(existing)
    if len(assignments) != added:
        raise _bad_assignment(f"Attempted to add {added} additional partition(s), but only "
                              f"{len(assignments)} assignment(s) were specified.")
    first = existing[min(existing)]
    placed = validate_manual_assignment(enumerate(assignments), registered, len(first))
    return {len(existing) + p: replicas for p, replicas in placed.items()}


def _check_replicas(replicas: list[int], registered: Collection[int],
                    replication_factor: int | None) -> None:
    if not replicas:
        raise _bad_assignment("The manual partition assignment includes an empty replica list.")
    previous = None
    for broker in sorted(replicas):  # ascending, so the message names the least offender
        if broker not in registered:
            raise _bad_assignment(f"The manual partition assignment includes broker {broker}, "
                                  "but no such broker is registered.")
        if broker == previous:
            raise _bad_assignment(f"The manual partition assignment includes the broker "
                                  f"{broker} more than once.")
        previous = broker
    if replication_factor is not None and len(replicas) != replication_factor:
        raise _bad_assignment(
            f"The manual partition assignment includes a partition with {len(replicas)} "
            f"replica(s), but this is not consistent with previous partitions, which have "
            f"{replication_factor} replica(s).")


def _bad_assignment(message: str) -> PlacementError:
    return PlacementError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, message)
