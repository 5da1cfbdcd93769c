"""Replica placement (Kafka's AdminUtils.assignReplicasToBrokers): Kafka's own examples, its
errors, and the properties it promises, checked by hypothesis."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.cluster.placement import (
    BrokerRack,
    PlacementError,
    RackAwareMode,
    assign_replicas,
    brokers_for_placement,
    new_partitions_assignment,
    rack_alternated,
    validate_manual_assignment,
)
from protocol.errors import ErrorCode


def test_rack_unaware_round_robin_with_a_growing_shift() -> None:
    brokers = [BrokerRack(i) for i in range(5)]
    got = assign_replicas(brokers, 10, 3, start_index=0)
    # Leaders round robin; the followers of the second round shifted one further.
    assert got[0] == [0, 1, 2] and got[4] == [4, 0, 1]
    assert got[5] == [0, 2, 3] and got[9] == [4, 1, 2]
    assert [got[p][0] for p in range(10)] == [0, 1, 2, 3, 4] * 2


def test_rack_alternated_list_and_rack_aware_assignment_as_kafka_documents() -> None:
    racks = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}
    assert rack_alternated(racks) == [0, 3, 1, 5, 4, 2]
    brokers = [BrokerRack(b, r) for b, r in racks.items()]
    got = assign_replicas(brokers, 7, 3, start_index=0, start_partition_id=0)
    assert got == {0: [0, 3, 1], 1: [3, 1, 5], 2: [1, 5, 4], 3: [5, 4, 2], 4: [4, 2, 0],
                   5: [2, 0, 3], 6: [0, 4, 2]}


def test_added_partitions_continue_the_numbering() -> None:
    brokers = [BrokerRack(i) for i in (10, 20, 30)]
    got = assign_replicas(brokers, 2, 2, start_index=1, start_partition_id=4)
    assert sorted(got) == [4, 5]


@pytest.mark.parametrize(
    ("partitions", "rf", "code", "text"),
    [
        (0, 1, ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0."),
        (1, 0, ErrorCode.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0."),
        (1, 4, ErrorCode.INVALID_REPLICATION_FACTOR,
         "Replication factor: 4 larger than available brokers: 3."),
    ],
)
def test_counts_kafka_refuses(partitions: int, rf: int, code: ErrorCode, text: str) -> None:
    with pytest.raises(PlacementError) as info:
        assign_replicas([BrokerRack(i) for i in range(3)], partitions, rf)
    assert info.value.error_code == code and info.value.message == text


def test_partial_rack_information_by_mode() -> None:
    brokers = [BrokerRack(2, "a"), BrokerRack(1), BrokerRack(3, "b")]
    with pytest.raises(PlacementError, match="brokers without broker.rack: 1") as info:
        brokers_for_placement(brokers)
    assert info.value.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    with pytest.raises(PlacementError):
        assign_replicas(brokers, 1, 1)
    assert brokers_for_placement(brokers, RackAwareMode.SAFE) == [
        BrokerRack(1), BrokerRack(2), BrokerRack(3)]
    full = [BrokerRack(2, "a"), BrokerRack(1, "b")]
    assert brokers_for_placement(full, RackAwareMode.SAFE) == [BrokerRack(1, "b"),
                                                               BrokerRack(2, "a")]
    assert brokers_for_placement(full, RackAwareMode.DISABLED) == [BrokerRack(1), BrokerRack(2)]


@pytest.mark.parametrize(
    ("assignment", "text"),
    [
        ([(0, [])], "The manual partition assignment includes an empty replica list."),
        ([(0, [9, 1, 7])],
         "The manual partition assignment includes broker 7, but no such broker is registered."),
        ([(0, [2, 1, 2])], "The manual partition assignment includes the broker 2 more than once."),
        ([(0, [1, 2]), (1, [1])],
         "The manual partition assignment includes a partition with 1 replica(s), but this is "
         "not consistent with previous partitions, which have 2 replica(s)."),
        ([(0, [1]), (2, [2])], "partitions should be a consecutive 0-based integer sequence"),
        ([(0, [1]), (0, [2])], "Found multiple manual partition assignments for partition 0"),
    ],
)
def test_manual_assignments_kafka_refuses(assignment: list[tuple[int, list[int]]],
                                          text: str) -> None:
    with pytest.raises(PlacementError) as info:
        validate_manual_assignment(assignment, registered={1, 2})
    assert info.value.error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert info.value.message == text


def test_a_valid_manual_assignment_is_returned_by_partition() -> None:
    got = validate_manual_assignment([(1, [2, 1]), (0, [1, 2])], registered={1, 2, 3})
    assert got == {0: [1, 2], 1: [2, 1]}


@pytest.mark.parametrize(
    ("count", "assignments", "text"),
    [
        (4, [[3, 1]], "Attempted to add 2 additional partition(s), but only 1 assignment(s) "
                      "were specified."),
        (3, [[3, 9]], "The manual partition assignment includes broker 9, but no such broker "
                      "is registered."),
        (3, [[3, 3]], "The manual partition assignment includes the broker 3 more than once."),
        (3, [[3]], "The manual partition assignment includes a partition with 1 replica(s), "
                   "but this is not consistent with previous partitions, which have 2 "
                   "replica(s)."),
        (3, [[]], "The manual partition assignment includes an empty replica list."),
    ],
)
def test_new_partitions_kafka_refuses(count: int, assignments: list[list[int]],
                                      text: str) -> None:
    existing = {0: [1, 2], 1: [2, 3]}
    with pytest.raises(PlacementError) as info:
        new_partitions_assignment(existing, count, assignments, registered={1, 2, 3})
    assert info.value.error_code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert info.value.message == text


def test_new_partitions_are_numbered_after_the_existing_ones() -> None:
    got = new_partitions_assignment({0: [1], 1: [2]}, 4, [[3], [1]], registered={1, 2, 3})
    assert got == {2: [3], 3: [1]}


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[BrokerRack], int, int, random.Random]:
    n = draw(st.integers(1, 12))
    ids = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n, unique=True))
    racked = draw(st.booleans())
    rack_names = draw(st.lists(st.sampled_from("abcdef"), min_size=n, max_size=n))
    brokers = [BrokerRack(i, rack_names[k] if racked else None) for k, i in enumerate(ids)]
    rf = draw(st.integers(1, n))
    partitions = draw(st.integers(1, 60))
    return brokers, partitions, rf, random.Random(draw(st.integers(0, 2**32)))


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_placement_properties(case: tuple[list[BrokerRack], int, int, random.Random]) -> None:
    brokers, partitions, rf, rng = case
    got = assign_replicas(brokers, partitions, rf, rng=rng)
    ids = {b.id for b in brokers}
    assert sorted(got) == list(range(partitions))
    for replicas in got.values():
        assert len(replicas) == rf and len(set(replicas)) == rf  # RF distinct brokers
        assert set(replicas) <= ids
    # Leaders round robin: counts never differ by more than one.
    leaders = Counter(r[0] for r in got.values())
    counts = [leaders.get(b, 0) for b in ids]
    assert max(counts) - min(counts) <= 1
    racks = {b.id: b.rack for b in brokers}
    n_racks = len({b.rack for b in brokers})
    if brokers[0].rack is not None:
        for replicas in got.values():
            # Each partition spans as many racks as it can: min(rf, racks).
            assert len({racks[r] for r in replicas}) == min(rf, n_racks)
    elif partitions % len(brokers) == 0:
        # Whole rounds: every broker holds the same number of replicas.
        held = Counter(r for replicas in got.values() for r in replicas)
        assert set(held.values()) == {partitions * rf // len(brokers)}


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 20))
def test_equal_racks_with_rf_equal_to_racks_spread_replicas_evenly(
    n_racks: int, per_rack: int, start: int
) -> None:
    """Kafka's "perfect situation": as many replicas as racks, equal racks."""
    brokers = [BrokerRack(r * per_rack + i, f"r{r}") for r in range(n_racks)
               for i in range(per_rack)]
    n = len(brokers)
    got = assign_replicas(brokers, n * 2, n_racks, start_index=start % n)
    held = Counter(r for replicas in got.values() for r in replicas)
    assert set(held.values()) == {2 * n_racks}
