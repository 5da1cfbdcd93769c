"""The server-side assignors on concrete groups, modelled on Kafka's assignor tests: first
assignments, uneven counts, mixed subscriptions, and how few partitions move when members come
and go."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from bench.assignors import assign_twice, count_calls, groups
from broker.group.assignors import (
    ASSIGNORS,
    Assignment,
    MemberSubscription,
    RangeAssignor,
    UniformAssignor,
    assignor_names,
)

UNIFORM = UniformAssignor()
RANGE = RangeAssignor()


def member(member_id: str, topics: list[str], owned: Mapping[str, list[int]] | None = None,
           instance_id: str | None = None) -> MemberSubscription:
    return MemberSubscription(
        member_id=member_id, instance_id=instance_id, rack_id=None, topics=frozenset(topics),
        owned={t: frozenset(ps) for t, ps in (owned or {}).items()})


def group(*members: MemberSubscription) -> dict[str, MemberSubscription]:
    return {m.member_id: m for m in members}


def a(**topics: list[int]) -> Assignment:
    return {t: frozenset(ps) for t, ps in topics.items()}


def size(assignment: Assignment) -> int:
    return sum(len(ps) for ps in assignment.values())


def moved(before: Mapping[str, MemberSubscription], after: dict[str, Assignment]) -> int:
    """Partitions that had an owner (still in the group) and now have another one."""
    owner = {(t, p): m for m, sub in before.items() for t, ps in sub.owned.items() for p in ps}
    return sum(1 for m, assignment in after.items() for t, ps in assignment.items()
               for p in ps if owner.get((t, p), m) != m)


def check_valid(members: Mapping[str, MemberSubscription], counts: Mapping[str, int],
                result: dict[str, Assignment]) -> None:
    assert set(result) == set(members)
    seen: set[tuple[str, int]] = set()
    for member_id, assignment in result.items():
        for topic, parts in assignment.items():
            assert topic in members[member_id].topics
            assert parts, "empty topic entries are left out"
            for p in parts:
                assert 0 <= p < counts[topic]
                assert (topic, p) not in seen
                seen.add((topic, p))
    subscribed = {t for m in members.values() for t in m.topics}
    assert seen == {(t, p) for t in subscribed for p in range(counts.get(t, 0))}


# ---- uniform, everyone subscribed to the same topics ----

def test_uniform_one_member_gets_everything() -> None:
    members = group(member("A", ["t1", "t2"]))
    assert UNIFORM.assign(members, {"t1": 3, "t2": 2, "other": 4}) == {
        "A": a(t1=[0, 1, 2], t2=[0, 1])}


def test_uniform_member_without_subscription_is_present_and_empty() -> None:
    assert UNIFORM.assign(group(member("A", [])), {"t1": 3}) == {"A": {}}
    assert UNIFORM.assign({}, {"t1": 3}) == {}


def test_uniform_first_assignment_uneven_counts() -> None:
    members = group(member("A", ["t1", "t3"]), member("B", ["t1", "t3"]))
    result = UNIFORM.assign(members, {"t1": 3, "t3": 2})
    # Fresh partitions go out in runs, in topic then partition order.
    assert result == {"A": a(t1=[0, 1, 2]), "B": a(t3=[0, 1])}


def test_uniform_more_members_than_partitions() -> None:
    members = group(member("A", ["t3"]), member("B", ["t3"]), member("C", ["t3"]))
    assert UNIFORM.assign(members, {"t3": 2}) == {
        "A": a(t3=[0]), "B": a(t3=[1]), "C": {}}


def test_uniform_rebalances_an_unbalanced_previous_assignment() -> None:
    members = group(
        member("A", ["t1", "t2"], {"t1": [0, 1], "t2": [0, 1]}),
        member("B", ["t1", "t2"], {"t1": [2], "t2": [2]}))
    result = UNIFORM.assign(members, {"t1": 3, "t2": 3})
    assert result == {"A": a(t1=[0, 1], t2=[0]), "B": a(t1=[2], t2=[1, 2])}
    assert moved(members, result) == 1


def test_uniform_added_partitions_go_to_members_keeping_theirs() -> None:
    members = group(
        member("A", ["t1", "t2"], {"t1": [0, 2], "t2": [0]}),
        member("B", ["t1", "t2"], {"t1": [1], "t2": [1, 2]}))
    result = UNIFORM.assign(members, {"t1": 6, "t2": 5})
    check_valid(members, {"t1": 6, "t2": 5}, result)
    assert moved(members, result) == 0
    assert sorted(size(x) for x in result.values()) == [5, 6]


def test_uniform_member_joining_takes_the_fewest_moves() -> None:
    members = group(
        member("A", ["t1", "t2"], {"t1": [0, 2], "t2": [0]}),
        member("B", ["t1", "t2"], {"t1": [1], "t2": [1, 2]}),
        member("C", ["t1", "t2"]))
    result = UNIFORM.assign(members, {"t1": 3, "t2": 3})
    assert result == {"A": a(t1=[0, 2]), "B": a(t1=[1], t2=[1]), "C": a(t2=[0, 2])}
    assert moved(members, result) == 2  # C's share, one from each of A and B


def test_uniform_member_leaving_keeps_the_others_partitions() -> None:
    # C (t1-2, t2-2) left.
    members = group(
        member("A", ["t1", "t2"], {"t1": [0], "t2": [0]}),
        member("B", ["t1", "t2"], {"t1": [1], "t2": [1]}))
    result = UNIFORM.assign(members, {"t1": 3, "t2": 3})
    check_valid(members, {"t1": 3, "t2": 3}, result)
    assert moved(members, result) == 0
    for member_id in "AB":
        for topic, parts in members[member_id].owned.items():
            assert parts <= result[member_id][topic]
    assert [size(result[m]) for m in "AB"] == [3, 3]


def test_uniform_unsubscribed_topic_is_revoked() -> None:
    members = group(
        member("A", ["t2"], {"t1": [0], "t2": [0]}),
        member("B", ["t2"], {"t1": [1], "t2": [1]}))
    assert UNIFORM.assign(members, {"t1": 2, "t2": 2}) == {"A": a(t2=[0]), "B": a(t2=[1])}


def test_uniform_extra_partition_stays_with_the_member_owning_it() -> None:
    # 7 partitions over 3 members: one gets 3. That is C already, so nothing moves (a quota
    # handed out by member order would have moved one of C's partitions to A).
    members = group(
        member("A", ["t"], {"t": [0, 1]}),
        member("B", ["t"], {"t": [2, 3]}),
        member("C", ["t"], {"t": [4, 5, 6]}))
    result = UNIFORM.assign(members, {"t": 7})
    assert result == {m: dict(sub.owned) for m, sub in members.items()}


def test_uniform_drops_owned_partitions_that_no_longer_stand() -> None:
    # p9 is out of range (topic recreated smaller); p1 is claimed twice and stays with A.
    members = group(
        member("A", ["t"], {"t": [0, 1, 9]}),
        member("B", ["t"], {"t": [1, 2]}))
    result = UNIFORM.assign(members, {"t": 4})
    check_valid(members, {"t": 4}, result)
    assert result["A"]["t"] >= {0, 1}
    assert 2 in result["B"]["t"]
    assert [size(result[m]) for m in "AB"] == [2, 2]


def test_uniform_missing_topic_counts_as_empty() -> None:
    members = group(member("A", ["t", "gone"]), member("B", ["t", "gone"]))
    assert UNIFORM.assign(members, {"t": 2}) == {"A": a(t=[0]), "B": a(t=[1])}


# ---- uniform, mixed subscriptions ----

def test_uniform_heterogeneous_first_assignment() -> None:
    members = group(member("A", ["t1", "t3"]), member("B", ["t3"]))
    counts = {"t1": 3, "t3": 6}
    result = UNIFORM.assign(members, counts)
    check_valid(members, counts, result)
    assert result["A"]["t1"] == {0, 1, 2}  # only A can take t1
    assert abs(size(result["A"]) - size(result["B"])) <= 1


def test_uniform_heterogeneous_more_members_than_partitions() -> None:
    members = group(member("A", ["t3"]), member("B", ["t3"]), member("C", ["t1"]))
    assert UNIFORM.assign(members, {"t1": 2, "t3": 1}) == {
        "A": a(t3=[0]), "B": {}, "C": a(t1=[0, 1])}


def test_uniform_heterogeneous_balances_an_unbalanced_previous_assignment() -> None:
    members = group(
        member("A", ["t1"], {"t1": [0, 1, 2]}),
        member("B", ["t1", "t2"], {"t1": [3], "t2": [0]}),
        member("C", ["t1", "t2", "t3"], {"t1": [4, 5], "t2": [1, 2, 3], "t3": [0, 1, 2, 3]}))
    counts = {"t1": 6, "t2": 4, "t3": 4}
    result = UNIFORM.assign(members, counts)
    check_valid(members, counts, result)
    assert sorted(size(x) for x in result.values()) == [4, 5, 5]
    assert moved(members, result) == 4  # C sheds 4 of its 9; nothing else moves
    assert result["C"]["t3"] == {0, 1, 2, 3}


def test_uniform_heterogeneous_member_leaving_keeps_the_others_partitions() -> None:
    # C (t2: 0-2, 7) left; B is t2's only subscriber now.
    members = group(
        member("A", ["t1", "t3"], {"t1": [0, 1, 2], "t3": [0, 1]}),
        member("B", ["t2"], {"t2": [3, 4, 5, 6]}))
    result = UNIFORM.assign(members, {"t1": 3, "t2": 8, "t3": 3})
    assert result == {"A": a(t1=[0, 1, 2], t3=[0, 1, 2]), "B": a(t2=list(range(8)))}


def test_uniform_heterogeneous_member_joining_takes_the_fewest_moves() -> None:
    members = group(
        member("A", ["t1"], {"t1": [0, 1, 2, 3]}),
        member("B", ["t1", "t2"], {"t1": [4, 5], "t2": [0, 1, 2, 3]}),
        member("C", ["t1", "t2"]))
    counts = {"t1": 6, "t2": 4}
    result = UNIFORM.assign(members, counts)
    check_valid(members, counts, result)
    # 10 partitions over three members: 3/3/4 at best, so C needs 3 and exactly 3 move.
    assert sorted(size(x) for x in result.values()) == [3, 3, 4]
    assert moved(members, result) == 3


def test_uniform_heterogeneous_unsubscribed_topic_is_revoked() -> None:
    members = group(
        member("A", ["t1"], {"t1": [0, 2], "t2": [1, 3]}),
        member("B", ["t1", "t2"], {"t1": [1], "t2": [0, 2, 4]}))
    assert UNIFORM.assign(members, {"t1": 3, "t2": 5}) == {
        "A": a(t1=[0, 1, 2]), "B": a(t2=[0, 1, 2, 3, 4])}


# ---- range ----

def test_range_co_partitions_topics_of_equal_size() -> None:
    members = group(member("A", ["t1", "t2"]), member("B", ["t1", "t2"]))
    assert RANGE.assign(members, {"t1": 3, "t2": 3}) == {
        "A": a(t1=[0, 1], t2=[0, 1]), "B": a(t1=[2], t2=[2])}


def test_range_one_member_and_more_members_than_partitions() -> None:
    assert RANGE.assign(group(member("A", ["t"])), {"t": 3}) == {"A": a(t=[0, 1, 2])}
    members = group(member("A", ["t"]), member("B", ["t"]), member("C", ["t"]))
    assert RANGE.assign(members, {"t": 2}) == {"A": a(t=[0]), "B": a(t=[1]), "C": {}}


def test_range_per_topic_over_its_subscribers() -> None:
    members = group(member("A", ["t1", "t2"]), member("B", ["t1", "t2", "t3"]),
                    member("C", ["t2", "t3"]), member("D", []))
    assert RANGE.assign(members, {"t1": 3, "t2": 3, "t3": 5}) == {
        "A": a(t1=[0, 1], t2=[0]),
        "B": a(t1=[2], t2=[1], t3=[0, 1, 2]),
        "C": a(t2=[2], t3=[3, 4]),
        "D": {}}


def test_range_static_members_come_first_by_instance_id() -> None:
    members = group(member("a", ["t"]), member("b", ["t"], instance_id="i2"),
                    member("c", ["t"], instance_id="i1"))
    assert RANGE.assign(members, {"t": 4}) == {
        "c": a(t=[0, 1]), "b": a(t=[2]), "a": a(t=[3])}


def test_range_member_joining_keeps_co_partitioning_and_moves_least() -> None:
    members = group(
        member("A", ["t1", "t2"], {"t1": [0, 1, 2, 3], "t2": [0, 1, 2, 3]}),
        member("B", ["t1", "t2"]))
    result = RANGE.assign(members, {"t1": 4, "t2": 4})
    assert result == {"A": a(t1=[0, 1], t2=[0, 1]), "B": a(t1=[2, 3], t2=[2, 3])}


def test_range_member_leaving_keeps_the_others_partitions() -> None:
    # B (t: 2, 3) left.
    members = group(member("A", ["t"], {"t": [0, 1]}), member("C", ["t"], {"t": [4, 5]}))
    result = RANGE.assign(members, {"t": 6})
    assert result == {"A": a(t=[0, 1, 2]), "C": a(t=[3, 4, 5])}
    assert moved(members, result) == 0


def test_range_extra_partition_stays_with_the_member_owning_it() -> None:
    members = group(member("A", ["t"], {"t": [0, 1]}), member("B", ["t"], {"t": [2, 3, 4]}))
    result = RANGE.assign(members, {"t": 5})
    assert result == {"A": a(t=[0, 1]), "B": a(t=[2, 3, 4])}


# ---- both ----

@pytest.mark.parametrize("assignor", [UNIFORM, RANGE], ids=["uniform", "range"])
def test_output_does_not_depend_on_input_order(assignor) -> None:
    subs = [member("m2", ["x", "y"], {"x": [3]}), member("m1", ["y", "z"], {"z": [0, 1]}),
            member("m3", ["x", "z"]), member("m0", ["x", "y", "z"], {"y": [2]})]
    counts = {"x": 5, "y": 4, "z": 7}
    first = assignor.assign(group(*subs), counts)
    check_valid(group(*subs), counts, first)
    second = assignor.assign(group(*reversed(subs)), dict(reversed(counts.items())))
    assert first == second
    assert list(second) == sorted(second)


# Calls the two assignments may make per member subscription and partition of the input. Today's
# worst is 9.7 (uniform, mixed subscriptions); an assignor that visits every member for each
# partition would make over 100. The time they take is bench.assignors' figure.
CALLS_PER_INPUT = 12


@pytest.mark.parametrize("name", ["uniform", "range"])
def test_thousand_partitions_hundred_members_cost_calls_linear_in_the_input(name: str) -> None:
    counts, by_kind = groups(topics=100, partitions_per_topic=10, members=100)
    for kind, members in by_kind.items():
        # The member that leaves hands its partitions to the rest (the sticky path).
        calls, again = count_calls(lambda: assign_twice(name, members, counts))  # noqa: B023
        rest = {m: sub for m, sub in list(members.items())[1:]}
        check_valid(rest, counts, again)
        subscriptions = sum(len(sub.topics) for sub in members.values())
        budget = CALLS_PER_INPUT * (subscriptions + sum(counts.values()))
        assert calls <= budget, f"{name}, {kind}: two assignments made {calls} calls"


def test_assignors_by_name() -> None:
    assert {n: x.name for n, x in ASSIGNORS.items()} == {"uniform": "uniform", "range": "range"}


def test_assignor_names() -> None:
    assert assignor_names(["uniform", "range"]) == ["uniform", "range"]
    assert assignor_names([
        "org.apache.kafka.coordinator.group.assignor.RangeAssignor",
        " org.apache.kafka.coordinator.group.assignor.UniformAssignor",
        "range"]) == ["range", "uniform"]
    with pytest.raises(ValueError, match="sticky"):
        assignor_names(["uniform", "sticky"])
    with pytest.raises(ValueError, match="org.example.MyAssignor"):
        assignor_names(["org.example.MyAssignor"])
    with pytest.raises(ValueError, match="at least one"):
        assignor_names([])
