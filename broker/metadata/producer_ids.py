"""Producer id allocation for InitProducerId: ids are never reused, even after a crash.

Kafka's controller hands out blocks of ids recorded in its metadata log; here the end of the
current block is written (and fsynced) to a file before any id of the block is given out, so a
restart continues after the block, never inside it.
"""

from __future__ import annotations

from pathlib import Path

from broker.log.disk import atomic_write

BLOCK_SIZE = 1000


class ProducerIdManager:
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
