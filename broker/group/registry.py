"""The one map of the coordinator's groups, classic and consumer protocol alike.

Kafka's GroupMetadataManager keeps one map, group id -> group of either type: a group id
names one group at most, so a classic join to a consumer group (and the reverse) finds it and
is answered by the rules of the type it finds. Invariants: every group held is live under its
own id; putting a group under an id replaces whatever held it, and it takes the map's last
place, so iterating one type keeps the order in which its groups came to be.
"""

from __future__ import annotations

from collections.abc import Iterator

from broker.group.classic_group import GroupMetadata
from broker.group.consumer_group import ConsumerGroup

Group = GroupMetadata | ConsumerGroup


class GroupRegistry:
    """Group id -> the group, of either protocol; every reader and writer of groups uses it."""

    def __init__(self) -> None:
        self._groups: dict[str, Group] = {}

    def get(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    def get_classic(self, group_id: str) -> GroupMetadata | None:
        group = self._groups.get(group_id)
        return group if isinstance(group, GroupMetadata) else None

    def get_consumer(self, group_id: str) -> ConsumerGroup | None:
        group = self._groups.get(group_id)
        return group if isinstance(group, ConsumerGroup) else None

    def classic(self, group_id: str) -> GroupMetadata:
        """The classic group under the id; KeyError if none is."""
        group = self.get_classic(group_id)
        if group is None:
            raise KeyError(group_id)
        return group

    def consumer(self, group_id: str) -> ConsumerGroup:
        """The consumer group under the id; KeyError if none is."""
        group = self.get_consumer(group_id)
        if group is None:
            raise KeyError(group_id)
        return group

    def put(self, group: Group) -> Group | None:
        """Hold ``group`` under its id; returns the group it replaced, if any."""
        previous = self._groups.pop(group.group_id, None)
        self._groups[group.group_id] = group
        return previous

    def remove(self, group_id: str) -> Group | None:
        return self._groups.pop(group_id, None)

    def clear(self) -> None:
        self._groups.clear()

    def values(self) -> list[Group]:
        return list(self._groups.values())

    def classic_groups(self) -> list[GroupMetadata]:
        return [g for g in self._groups.values() if isinstance(g, GroupMetadata)]

    def consumer_groups(self) -> list[ConsumerGroup]:
        return [g for g in self._groups.values() if isinstance(g, ConsumerGroup)]

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._groups


    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)
