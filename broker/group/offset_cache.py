"""The offsets' maps of the OffsetMetadataManager (Kafka's OffsetMetadataManager.Offsets).

An `Offsets` map is keyed group id -> topic -> partition, whatever protocol the group's
members speak: the group id is the offsets' key, so a group changing protocol keeps them and a
group object never carries any. The manager (offsets.py) holds one for the committed offsets,
each with the log offset of the batch it came from, so a transactional commit that completes
later than a plain commit of the same partition written after it does not overwrite it
(Kafka's OffsetAndMetadata.recordOffset); one for plain commits on their way to the log; and
one per producer id for transactional commits awaiting their transaction's marker (KIP-98).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

TopicPartition = tuple[str, int]
V = TypeVar("V")


@dataclass(slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


@dataclass(slots=True)
class LoggedOffset:
    """An offset with the log offset of its batch in __consumer_offsets: committed offsets
    always have it; a pending transactional commit has None until its append is
    acknowledged."""

    offset_and_metadata: OffsetAndMetadata
    batch_offset: int | None = None


class Offsets(Generic[V]):
    """Group id -> topic -> partition -> value. Invariant: no empty inner map is kept, so a
    group is in the map exactly while it has a value for some partition."""

    def __init__(self) -> None:
        self._by_group: dict[str, dict[str, dict[int, V]]] = {}

    def get(self, group_id: str, tp: TopicPartition) -> V | None:
        return self._by_group.get(group_id, {}).get(tp[0], {}).get(tp[1])

    def put(self, group_id: str, tp: TopicPartition, value: V) -> None:
        self._by_group.setdefault(group_id, {}).setdefault(tp[0], {})[tp[1]] = value

    def remove(self, group_id: str, tp: TopicPartition) -> V | None:
        topics = self._by_group.get(group_id)
        partitions = topics.get(tp[0]) if topics is not None else None
        if topics is None or partitions is None:
            return None
        value = partitions.pop(tp[1], None)
        if not partitions:
            del topics[tp[0]]
            if not topics:
                del self._by_group[group_id]
        return value

    def remove_group(self, group_id: str) -> dict[TopicPartition, V]:
        """Drop the group's values; returns them."""
        return {(topic, index): value
                for topic, partitions in self._by_group.pop(group_id, {}).items()
                for index, value in partitions.items()}

    def items(self, group_id: str) -> Iterator[tuple[TopicPartition, V]]:
        for topic, partitions in self._by_group.get(group_id, {}).items():
            for index, value in partitions.items():
                yield (topic, index), value

    def partitions(self, group_id: str) -> list[TopicPartition]:
        return [tp for tp, _ in self.items(group_id)]

    def topics(self, group_id: str) -> set[str]:
        return set(self._by_group.get(group_id, ()))

    def has_group(self, group_id: str) -> bool:
        return group_id in self._by_group

    def group_ids(self) -> list[str]:
        return list(self._by_group)

    def __bool__(self) -> bool:
        return bool(self._by_group)
