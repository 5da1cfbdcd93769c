"""Server-side partition assignors of the consumer group protocol: "uniform" and "range".

The group coordinator computes a group's target assignment itself with one of these (the member
names one in its heartbeat, else the first of group.consumer.assignors). Both are pure functions
of the members' subscriptions, the topics' partition counts and each member's current target
assignment; they return every member, assign each partition of a subscribed topic to exactly one
of its subscribers, and keep a member's owned partitions where balance allows (sticky), so a
rebalance moves few partitions. Output is deterministic for equal input (members are visited in
sorted order, never in dict or set order).

uniform, as Kafka's UniformAssignor. Members with identical subscriptions share all partitions
so that their counts differ by at most one; each keeps its owned partitions up to its quota, and
the quota's extra partitions go first to members already owning more than the minimum, so the
fewest partitions move (Kafka hands them out in member order, which can move a few more).
Members with different subscriptions keep their owned partitions of still subscribed topics; the
rest go to the least loaded subscribers, topics with most partitions per subscriber first; then
partitions move from the most to the least loaded subscribers of each topic until no member
holding one of a topic's partitions has two more than another subscriber of it (or a bounded
number of passes is spent: mixed subscriptions are balanced where possible, not perfectly).

range, as Kafka's RangeAssignor: per topic, subscribers ordered static members first (by
instance id) then by member id each get a contiguous range, the first ones one partition more,
so members with the same subscription get the same partition numbers of co-partitioned topics.
It is sticky as Kafka's server-side range assignor was before 3.9 (since then Kafka recomputes
the ranges every time): a member keeps its lowest owned partitions up to its share of the
topic, and only the rest is handed out as ranges. A fresh assignment is the same as Kafka's.

Rack awareness (Kafka's preference for partitions with a replica on the member's rack) is left
out: rack_id is carried but not used. A topic missing from partition_counts counts as having no
partitions (Kafka fails the assignment instead); owned partitions that are out of range,
unsubscribed or claimed by an earlier member are dropped.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """What an assignor knows of a member: its subscription and its current target assignment."""

    member_id: str
    instance_id: str | None
    rack_id: str | None
    topics: frozenset[str]  # subscribed topic names that exist (regex resolved)
    owned: Mapping[str, frozenset[int]]  # its current target assignment, for stickiness


Assignment = dict[str, frozenset[int]]  # topic name -> partition indexes


class ConsumerGroupAssignor(Protocol):
    name: str

    def assign(self, members: Mapping[str, MemberSubscription],
               partition_counts: Mapping[str, int]) -> dict[str, Assignment]: ...


# Kafka's balancing phase for mixed subscriptions stops after this many passes over the topics:
# overlapping subscriptions may converge slowly, and each pass roughly halves the imbalance.
MAX_BALANCE_PASSES = 16


def _valid_owned(members: Mapping[str, MemberSubscription], order: list[str],
                 partition_counts: Mapping[str, int]) -> dict[str, dict[str, list[int]]]:
    """Each member's owned partitions that still stand: subscribed, in range, and not claimed by
    a member earlier in `order` (a consistent group never has such a conflict). Sorted."""
    claimed: dict[str, set[int]] = {}
    valid: dict[str, dict[str, list[int]]] = {}
    for member_id in order:
        sub = members[member_id]
        mine: dict[str, list[int]] = {}
        for topic in sorted(sub.owned):
            if topic not in sub.topics:
                continue
            count = partition_counts.get(topic, 0)
            taken = claimed.setdefault(topic, set())
            kept = sorted(p for p in sub.owned[topic] if 0 <= p < count and p not in taken)
            if kept:
                taken.update(kept)
                mine[topic] = kept
        valid[member_id] = mine
    return valid


def _freeze(assignment: Mapping[str, Iterable[int]]) -> Assignment:
    return {topic: frozenset(parts) for topic, parts in sorted(assignment.items()) if parts}


class UniformAssignor:
    """Kafka's "uniform" assignor: balanced counts, sticky."""

    name = "uniform"

    def assign(self, members: Mapping[str, MemberSubscription],
               partition_counts: Mapping[str, int]) -> dict[str, Assignment]:
        order = sorted(members)
        if not order:
            return {}
        owned = _valid_owned(members, order, partition_counts)
        first = members[order[0]].topics
        if all(members[m].topics == first for m in order):
            return _uniform_homogeneous(order, first, partition_counts, owned)
        return _UniformHeterogeneous(members, order, partition_counts, owned).build()


def _uniform_homogeneous(order: list[str], topics: frozenset[str],
                         partition_counts: Mapping[str, int],
                         owned: dict[str, dict[str, list[int]]]) -> dict[str, Assignment]:
    """Everyone subscribes to the same topics: quotas of total // members, the remainder as one
    extra each, handed to members owning more than the minimum first (each such extra is a
    partition that does not move)."""
    total = sum(partition_counts.get(t, 0) for t in topics)
    minimum, extra = divmod(total, len(order))
    owned_count = {m: sum(len(ps) for ps in owned[m].values()) for m in order}
    quota = dict.fromkeys(order, minimum)
    for member_id in order:
        if extra and owned_count[member_id] > minimum:
            quota[member_id] += 1
            extra -= 1
    for member_id in order:
        if extra and quota[member_id] == minimum:
            quota[member_id] += 1
            extra -= 1

    result: dict[str, dict[str, list[int]]] = {}
    assigned: dict[str, set[int]] = {t: set() for t in topics}
    for member_id in order:
        room = quota[member_id]
        kept: dict[str, list[int]] = {}
        for topic, parts in owned[member_id].items():  # sorted by topic, then partition
            keep = parts[:room]  # the rest is revoked: free below
            room -= len(keep)
            if keep:
                kept[topic] = keep
                assigned[topic].update(keep)
        result[member_id] = kept

    # Partitions nobody keeps, in topic then partition order, so fresh ones go out in runs.
    free = [(t, p) for t in sorted(topics) for p in range(partition_counts.get(t, 0))
            if p not in assigned[t]]
    at = 0
    for member_id in order:
        need = quota[member_id] - sum(len(ps) for ps in result[member_id].values())
        for topic, partition in free[at:at + need]:
            result[member_id].setdefault(topic, []).append(partition)
        at += need
    return {m: _freeze(result[m]) for m in order}


class _UniformHeterogeneous:
    """Members subscribe to different topics. Members are numbered by sorted id; `sizes` holds
    each one's total partition count, `owners` each partition's owner (-1: none yet)."""

    def __init__(self, members: Mapping[str, MemberSubscription], order: list[str],
                 partition_counts: Mapping[str, int],
                 owned: dict[str, dict[str, list[int]]]) -> None:
        self.order = order
        self.counts = {t: partition_counts.get(t, 0)
                       for m in order for t in members[m].topics}
        self.subscribers: dict[str, list[int]] = {t: [] for t in sorted(self.counts)}
        for index, member_id in enumerate(order):
            for topic in members[member_id].topics:
                self.subscribers[topic].append(index)
        self.sizes = [0] * len(order)
        self.owners = {t: [-1] * n for t, n in self.counts.items()}
        self.assignment: list[dict[str, set[int]]] = [{} for _ in order]
        for index, member_id in enumerate(order):
            for topic, parts in owned[member_id].items():
                for partition in parts:
                    self._give(topic, partition, index)

    def build(self) -> dict[str, Assignment]:
        self._assign_unowned()
        self._balance()
        return {m: _freeze(self.assignment[i]) for i, m in enumerate(self.order)}

    def _topic_order(self, topics: Iterable[str]) -> list[str]:
        """Most partitions per subscriber first, then fewer subscribers, then name: the topics
        hardest to spread go out while members are still evenly loaded."""
        def key(topic: str) -> tuple[float, int, str]:
            subs = len(self.subscribers[topic])
            return (-self.counts[topic] / subs, subs, topic)
        return sorted(topics, key=key)

    def _give(self, topic: str, partition: int, index: int) -> None:
        previous = self.owners[topic][partition]
        if previous >= 0:
            parts = self.assignment[previous][topic]
            parts.discard(partition)
            if not parts:
                del self.assignment[previous][topic]
            self.sizes[previous] -= 1
        self.owners[topic][partition] = index
        self.assignment[index].setdefault(topic, set()).add(partition)
        self.sizes[index] += 1

    def _assign_unowned(self) -> None:
        """Each unowned partition goes to the topic's least loaded subscriber (ties: lowest id)."""
        for topic in self._topic_order(self.subscribers):
            free = [p for p, owner in enumerate(self.owners[topic]) if owner < 0]
            if not free:
                continue
            heap = [(self.sizes[i], i) for i in self.subscribers[topic]]
            heapq.heapify(heap)
            for partition in free:
                _, index = heapq.heappop(heap)
                self._give(topic, partition, index)
                heapq.heappush(heap, (self.sizes[index], index))

    def _balance(self) -> None:
        """Passes over the shareable topics until a whole round moves nothing."""
        topics = self._topic_order(t for t, subs in self.subscribers.items() if len(subs) > 1)
        if not topics:
            return
        last_moved = -1
        for _ in range(MAX_BALANCE_PASSES):
            for position, topic in enumerate(topics):
                if position == last_moved:
                    return  # a full round since the last move
                if self._balance_topic(topic) or last_moved < 0:
                    last_moved = position

    def _balance_topic(self, topic: str) -> int:
        """Moves this topic's partitions from its most to its least loaded subscribers until
        their totals differ by at most one or no loaded subscriber holds one of them. A giver
        never becomes a taker here: it only gives while two above the minimum, which only
        rises. Returns how many moved."""
        subs = self.subscribers[topic]
        sizes = self.sizes
        if max(sizes[i] for i in subs) - min(sizes[i] for i in subs) <= 1:
            return 0
        takers = [(sizes[i], i) for i in subs]
        givers = [(-sizes[i], -i) for i in subs if topic in self.assignment[i]]
        heapq.heapify(takers)
        heapq.heapify(givers)
        held: dict[int, list[int]] = {}  # a giver's partitions of this topic, highest last
        moved = 0
        while True:
            giver = self._pop_giver(givers, topic)
            taker = self._pop_taker(takers)
            if giver < 0 or taker < 0 or sizes[giver] - sizes[taker] <= 1:
                return moved
            parts = held.get(giver)
            if parts is None:
                parts = held[giver] = sorted(self.assignment[giver][topic])
            self._give(topic, parts.pop(), taker)
            moved += 1
            heapq.heappush(takers, (sizes[taker], taker))
            heapq.heappush(takers, (sizes[giver], giver))
            heapq.heappush(givers, (-sizes[taker], -taker))
            if parts:
                heapq.heappush(givers, (-sizes[giver], -giver))

    def _pop_giver(self, heap: list[tuple[int, int]], topic: str) -> int:
        while heap:
            negative_size, negative_index = heapq.heappop(heap)
            index = -negative_index
            if self.sizes[index] == -negative_size and topic in self.assignment[index]:
                return index
        return -1

    def _pop_taker(self, heap: list[tuple[int, int]]) -> int:
        while heap:
            size, index = heapq.heappop(heap)
            if self.sizes[index] == size:
                return index
        return -1


class RangeAssignor:
    """Kafka's "range" assignor: co-partitioned contiguous ranges per topic, sticky."""

    name = "range"

    def assign(self, members: Mapping[str, MemberSubscription],
               partition_counts: Mapping[str, int]) -> dict[str, Assignment]:
        order = sorted(members, key=lambda m: _range_rank(members[m]))
        owned = _valid_owned(members, order, partition_counts)
        owners: dict[str, dict[str, list[int]]] = {}  # topic -> member -> owned, in order
        for member_id in order:
            for topic, parts in owned[member_id].items():
                owners.setdefault(topic, {})[member_id] = parts
        subscribers: dict[str, list[str]] = {}
        if order and all(members[m].topics == members[order[0]].topics for m in order):
            subscribers = dict.fromkeys(members[order[0]].topics, order)
        else:
            for member_id in order:
                for topic in members[member_id].topics:
                    subscribers.setdefault(topic, []).append(member_id)
        result: dict[str, dict[str, list[int]]] = {m: {} for m in order}
        for topic in sorted(subscribers):
            shares = _range_topic(subscribers[topic], partition_counts.get(topic, 0),
                                  owners.get(topic, {}))
            for member_id, parts in shares.items():
                if parts:
                    result[member_id][topic] = parts
        return {m: _freeze(result[m]) for m in sorted(members)}


def _range_rank(sub: MemberSubscription) -> tuple[int, str, str]:
    """Static members first, by instance id, so a restarted one gets its old range back."""
    if sub.instance_id is not None:
        return (0, sub.instance_id, sub.member_id)
    return (1, sub.member_id, "")


def _range_topic(subs: list[str], count: int,
                 owned: dict[str, list[int]]) -> dict[str, list[int]]:
    """One topic over its subscribers (in range order): `count // len(subs)` each, the first
    `count % len(subs)` one more. An owner keeps its lowest owned partitions up to that share,
    the extra ones going first to owners holding more than the minimum; the rest goes out in
    ascending runs in member order. `owned` lists only owners, in range order."""
    minimum, extra = divmod(count, len(subs))
    shares: dict[str, list[int]] = {}
    with_extra: set[str] = set()
    taken = [False] * count
    for member_id, parts in owned.items():
        keep = minimum
        if extra and len(parts) > minimum:
            keep += 1
            extra -= 1
            with_extra.add(member_id)
        shares[member_id] = parts[:keep]
        for partition in shares[member_id]:
            taken[partition] = True
    free = [p for p in range(count) if not taken[p]]
    at = 0
    for member_id in subs:
        if at >= len(free):
            break  # the shares add up to count, so nobody further needs anything
        quota = minimum
        if member_id in with_extra:
            quota += 1
        elif extra:
            quota += 1
            extra -= 1
        kept = shares.get(member_id, [])
        need = quota - len(kept)
        if need > 0:
            shares[member_id] = kept + free[at:at + need]
            at += need
    return shares


ASSIGNORS: dict[str, ConsumerGroupAssignor] = {
    UniformAssignor.name: UniformAssignor(),
    RangeAssignor.name: RangeAssignor(),
}

# Kafka configures its assignors by class name; both spellings are accepted.
_CLASS_NAMES = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": UniformAssignor.name,
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": RangeAssignor.name,
}


def assignor_names(configured: list[str]) -> list[str]:
    """group.consumer.assignors entries as short names: "uniform"/"range" or Kafka's class names
    (org.apache.kafka.coordinator.group.assignor.UniformAssignor / RangeAssignor); ValueError
    naming the entry for anything else. Order is kept (the first is the default); a repeat is
    dropped; none at all is a ValueError too, as a group needs a default."""
    names: list[str] = []
    for entry in configured:
        name = entry.strip()
        name = _CLASS_NAMES.get(name, name)
        if name not in ASSIGNORS:
            raise ValueError(f"group.consumer.assignors: unknown assignor {entry!r}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("group.consumer.assignors: at least one assignor is needed")
    return names
