"""Which partitions of a coordinator's internal topic this broker coordinates, in cluster mode
(Kafka's GroupMetadataManager ownedPartitions / loadingPartitions, and the
TransactionStateManager's loading and loaded partitions).

Invariant: a partition is in at most one of ``owned`` and ``loading``; a key whose partition is
in neither belongs to another broker.
"""

from __future__ import annotations

from protocol.errors import ErrorCode


class PartitionOwnership:
    """The partitions led and loaded, and those led but still being loaded."""

    def __init__(self) -> None:
        self.owned: set[int] = set()
        self.loading: set[int] = set()

    def error(self, partition: int) -> ErrorCode | None:
        """COORDINATOR_LOAD_IN_PROGRESS while loading, NOT_COORDINATOR when not led, else
        None (Kafka's validateGroupStatus / getTransactionState)."""
        if partition in self.loading:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if partition not in self.owned:
            return ErrorCode.NOT_COORDINATOR
        return None

    def begin_loading(self, partition: int) -> None:
        self.owned.discard(partition)
        self.loading.add(partition)

    def loaded(self, partition: int) -> None:
        self.loading.discard(partition)
        self.owned.add(partition)

    def lost(self, partition: int) -> None:
        self.loading.discard(partition)
        self.owned.discard(partition)
