"""Producer id allocation for InitProducerId: ids are never reused, even after a crash.

One interface, two implementations, both handing out ids from blocks of Kafka's size (1000):
a single broker (``LocalProducerIdManager``) writes (and fsyncs) the end of its current block
to a file before any id of the block is given out, so a restart continues after the block,
never inside it. In cluster mode (``broker.cluster.producer_id_block``) each broker claims its
blocks by compare-and-swap on one etcd key, as Kafka's ZooKeeper-era ProducerIdManager did on
``/latest_producer_id_block``, so no two brokers ever hand out the same id.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from broker.log.disk import atomic_write

BLOCK_SIZE = 1000


class ProducerIdManager(ABC):
    """Hands out producer ids no one else gets."""

    def load(self) -> None:
        """Read what a restart continues after (before the first ``generate``); a manager
        that keeps nothing locally has nothing to read."""
        return None

    @abstractmethod
    def generate(self) -> int:
        """The next id; KafkaError(COORDINATOR_LOAD_IN_PROGRESS) when no block is at hand
        yet (the client retries, as Kafka's RPCProducerIdManager answers)."""


class LocalProducerIdManager(ProducerIdManager):
    FILE = "mini-broker-producer-ids"

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / self.FILE
        self._next = 0
        self._block_end = 0

    def load(self) -> None:
        if self.path.exists():
            self._next = self._block_end = int(self.path.read_text().strip())

    def generate(self) -> int:
        if self._next >= self._block_end:
            self._reserve(self._next + BLOCK_SIZE)
        pid = self._next
        self._next += 1
        return pid

    def _reserve(self, end: int) -> None:
        atomic_write(self.path, f"{end}\n".encode())
        self._block_end = end
