"""Per-connection response sequencer: responses leave in request order, whatever finishes first.

Kafka's clients match responses to requests by order on the socket (correlation ids are only
checked), so a fast metadata answer must wait behind a slow produce sent before it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any


class Slot:
    __slots__ = ("payload", "size", "stats", "received", "ready")

    def __init__(self, size: int) -> None:
        self.payload: bytes | None = None
        self.size = size  # request bytes held until this response is written
        # Metrics on: the request's stats and times (parsed, response ready), copied here
        # rather than referencing the Request, which references this slot (no cycle).
        self.stats: Any = None
        self.received = 0.0
        self.ready = 0.0


class ResponseSequencer:
    """A queue of reserved slots; `complete` fills one and writes every ready slot at the head."""

    __slots__ = ("_slots", "_write", "_on_sent")

    def __init__(self, write: Callable[[bytes], None], on_sent: Callable[[Slot], None]) -> None:
        self._slots: deque[Slot] = deque()
        self._write = write
        self._on_sent = on_sent

    def reserve(self, request_size: int) -> Slot:
        slot = Slot(request_size)
        self._slots.append(slot)
        return slot

    def complete(self, slot: Slot, payload: bytes) -> None:
        slot.payload = payload
        slots = self._slots
        while slots and slots[0].payload is not None:
            head = slots.popleft()
            self._write(head.payload)  # type: ignore[arg-type]
            head.payload = b""
            self._on_sent(head)

    def __len__(self) -> int:
        return len(self._slots)

    def clear(self) -> list[Slot]:
        """Drop every pending slot (connection closed); returns them to release their bytes."""
        dropped = list(self._slots)
        self._slots.clear()
        return dropped
