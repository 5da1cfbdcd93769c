"""The server-side assignors on random groups: every subscribed partition goes to exactly one of
its subscribers whatever the members claim to own, the counts are as balanced as Kafka's
assignors make them, and an owned assignment that is already balanced does not move."""

from __future__ import annotations

import random
from collections.abc import Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.group.assignors import (
    ASSIGNORS,
    Assignment,
    MemberSubscription,
    RangeAssignor,
    UniformAssignor,
)

# Drawing a whole group is slowish; a loaded machine must not turn that into a failure.
FAST = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

TOPICS = ["t0", "t1", "t2", "t3", "t4"]
MEMBER_IDS = [f"m{i}" for i in range(10)]

counts_st = st.dictionaries(st.sampled_from(TOPICS), st.integers(min_value=0, max_value=12),
                            min_size=1)


@st.composite
def groups(draw: st.DrawFn, homogeneous: bool, noisy_owned: bool = True
           ) -> tuple[dict[str, MemberSubscription], dict[str, int]]:
    """Members with subscriptions (all equal when homogeneous) and partition counts. With
    noisy_owned each member claims random partitions, including unsubscribed topics, indexes
    out of range and partitions another member claims too."""
    counts = draw(counts_st)
    ids = draw(st.lists(st.sampled_from(MEMBER_IDS), min_size=1, max_size=8, unique=True))
    known = sorted(counts) + ["missing"]
    shared = draw(st.frozensets(st.sampled_from(known)))
    members: dict[str, MemberSubscription] = {}
    for member_id in ids:
        topics = shared if homogeneous else draw(st.frozensets(st.sampled_from(known)))
        owned: dict[str, frozenset[int]] = {}
        if noisy_owned:
            owned = draw(st.dictionaries(
                st.sampled_from(known),
                st.frozensets(st.integers(min_value=0, max_value=14), max_size=6), max_size=3))
        instance = draw(st.one_of(st.none(), st.sampled_from(["i0", "i1", "i2", "i3"])))
        members[member_id] = MemberSubscription(member_id, instance, None, topics, owned)
    return members, counts


def sizes(result: Mapping[str, Assignment]) -> dict[str, int]:
    return {m: sum(len(ps) for ps in a.values()) for m, a in result.items()}


def check_valid(members: Mapping[str, MemberSubscription], counts: Mapping[str, int],
                result: dict[str, Assignment]) -> None:
    assert set(result) == set(members)
    seen: list[tuple[str, int]] = []
    for member_id, assignment in result.items():
        for topic, parts in assignment.items():
            assert topic in members[member_id].topics, (member_id, topic)
            assert parts
            seen += [(topic, p) for p in parts]
    subscribed = {t for m in members.values() for t in m.topics}
    expected = sorted((t, p) for t in subscribed for p in range(counts.get(t, 0)))
    assert sorted(seen) == expected


def with_owned(members: Mapping[str, MemberSubscription], owned: Mapping[str, Assignment]
               ) -> dict[str, MemberSubscription]:
    return {m: MemberSubscription(s.member_id, s.instance_id, s.rack_id, s.topics,
                                  owned.get(m, {}))
            for m, s in members.items()}


@FAST
@given(data=st.data(), homogeneous=st.booleans(), name=st.sampled_from(sorted(ASSIGNORS)),
       seed=st.integers(min_value=0, max_value=2**32))
def test_valid_and_deterministic_whatever_is_owned(data, homogeneous, name, seed) -> None:
    members, counts = data.draw(groups(homogeneous))
    assignor = ASSIGNORS[name]
    result = assignor.assign(members, counts)
    check_valid(members, counts, result)
    shuffled = list(members.items())
    random.Random(seed).shuffle(shuffled)
    assert assignor.assign(dict(shuffled), counts) == result


@FAST
@given(data=st.data())
def test_uniform_homogeneous_counts_differ_by_at_most_one(data) -> None:
    members, counts = data.draw(groups(homogeneous=True))
    result = UniformAssignor().assign(members, counts)
    counted = sizes(result)
    assert max(counted.values()) - min(counted.values()) <= 1


@FAST
@given(data=st.data())
def test_uniform_heterogeneous_no_topic_can_be_balanced_further(data) -> None:
    """Kafka's guarantee for mixed subscriptions: no partition of a topic sits with a member
    holding two or more partitions more than another subscriber of that topic."""
    members, counts = data.draw(groups(homogeneous=False))
    result = UniformAssignor().assign(members, counts)
    counted = sizes(result)
    for topic in {t for m in members.values() for t in m.topics}:
        subscribers = [m for m in members if topic in members[m].topics]
        least = min(counted[m] for m in subscribers)
        for m in subscribers:
            if topic in result[m]:
                assert counted[m] - least <= 1, (topic, m, counted)


@FAST
@given(data=st.data(), homogeneous=st.booleans())
def test_range_gives_each_subscriber_its_share_of_each_topic(data, homogeneous) -> None:
    members, counts = data.draw(groups(homogeneous))
    result = RangeAssignor().assign(members, counts)
    for topic in {t for m in members.values() for t in m.topics}:
        subscribers = [m for m in members if topic in members[m].topics]
        minimum, extra = divmod(counts.get(topic, 0), len(subscribers))
        shares = sorted((len(result[m].get(topic, ())) for m in subscribers), reverse=True)
        assert shares == [minimum + 1] * extra + [minimum] * (len(subscribers) - extra)


@FAST
@given(data=st.data(), homogeneous=st.booleans(), name=st.sampled_from(sorted(ASSIGNORS)))
def test_own_result_is_kept(data, homogeneous, name) -> None:
    """Assigning again with the result as everyone's owned assignment changes nothing."""
    members, counts = data.draw(groups(homogeneous))
    assignor = ASSIGNORS[name]
    result = assignor.assign(members, counts)
    assert assignor.assign(with_owned(members, result), counts) == result


def deal(parts: list[tuple[str, int]], quotas: dict[str, int]) -> dict[str, Assignment]:
    """Hands out `parts` in order, quotas[m] to each member."""
    owned: dict[str, dict[str, set[int]]] = {m: {} for m in quotas}
    at = 0
    for member_id, quota in quotas.items():
        for topic, partition in parts[at:at + quota]:
            owned[member_id].setdefault(topic, set()).add(partition)
        at += quota
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in owned.items()}


@FAST
@given(data=st.data(), seed=st.integers(min_value=0, max_value=2**32))
def test_uniform_keeps_a_balanced_owned_assignment(data, seed) -> None:
    members, counts = data.draw(groups(homogeneous=True, noisy_owned=False))
    rnd = random.Random(seed)
    topics = next(iter(members.values())).topics
    parts = [(t, p) for t in sorted(topics) for p in range(counts.get(t, 0))]
    rnd.shuffle(parts)
    order = list(members)
    rnd.shuffle(order)
    minimum, extra = divmod(len(parts), len(order))
    owned = deal(parts, {m: minimum + (i < extra) for i, m in enumerate(order)})
    assert UniformAssignor().assign(with_owned(members, owned), counts) == owned


@FAST
@given(data=st.data(), seed=st.integers(min_value=0, max_value=2**32))
def test_range_keeps_a_balanced_owned_assignment(data, seed) -> None:
    members, counts = data.draw(groups(homogeneous=data.draw(st.booleans()), noisy_owned=False))
    rnd = random.Random(seed)
    owned: dict[str, dict[str, frozenset[int]]] = {m: {} for m in members}
    for topic in sorted({t for m in members.values() for t in m.topics}):
        subscribers = [m for m in members if topic in members[m].topics]
        rnd.shuffle(subscribers)
        parts = [(topic, p) for p in range(counts.get(topic, 0))]
        rnd.shuffle(parts)
        minimum, extra = divmod(len(parts), len(subscribers))
        dealt = deal(parts, {m: minimum + (i < extra) for i, m in enumerate(subscribers)})
        for member_id, assignment in dealt.items():
            owned[member_id].update(assignment)
    assert RangeAssignor().assign(with_owned(members, owned), counts) == owned


@FAST
@given(data=st.data(), seed=st.integers(min_value=0, max_value=2**32))
def test_uniform_homogeneous_moves_the_fewest(data, seed) -> None:
    """From any consistent owned assignment (members gone, joined, partitions added), only the
    partitions over a member's share move, with the extra slots at the members owning most."""
    members, counts = data.draw(groups(homogeneous=True, noisy_owned=False))
    rnd = random.Random(seed)
    topics = next(iter(members.values())).topics
    parts = [(t, p) for t in sorted(topics) for p in range(counts.get(t, 0))]
    rnd.shuffle(parts)
    order = list(members)
    owned: dict[str, dict[str, set[int]]] = {m: {} for m in order}
    for topic, partition in parts:
        holder = rnd.choice(order + ["gone"])  # "gone": a member that left, or unassigned
        if holder != "gone":
            owned[holder].setdefault(topic, set()).add(partition)
    frozen = {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in owned.items()}
    result = UniformAssignor().assign(with_owned(members, frozen), counts)
    check_valid(members, counts, result)
    minimum, extra = divmod(len(parts), len(order))
    held = sorted((sum(len(ps) for ps in a.values()) for a in owned.values()), reverse=True)
    fewest = sum(max(0, c - minimum - (i < extra)) for i, c in enumerate(held))
    kept = sum(len(ps & result[m].get(t, frozenset()))
               for m, a in frozen.items() for t, ps in a.items())
    assert sum(held) - kept == fewest
