"""Per-connection response sequencer: responses leave in request order, whatever finishes first.

Kafka's clients match responses to requests by order on the socket (correlation ids are only
checked), so a fast metadata answer must wait behind a slow produce sent before it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Awaiting(Protocol):
    """What waits in the sequence: a request that expects a response (its payload once built)."""

    payload: bytes | None


E = TypeVar("E", bound=Awaiting)


class ResponseSequencer(Generic[E]):
    """A queue of requests awaiting their responses; `complete` fills one and writes every
    ready one at the head."""

    __slots__ = ("_queue", "_write", "_on_sent")

    def __init__(self, write: Callable[[bytes], None], on_sent: Callable[[E], None]) -> None:
        self._queue: deque[E] = deque()
        self._write = write
        self._on_sent = on_sent

    def reserve(self, entry: E) -> E:
        entry.payload = None
        self._queue.append(entry)
        return entry

    def complete(self, entry: E, payload: bytes) -> None:
        entry.payload = payload
        queue = self._queue
        while queue and queue[0].payload is not None:
            head = queue.popleft()
            self._write(head.payload)  # type: ignore[arg-type]
            head.payload = b""
            self._on_sent(head)

    def __len__(self) -> int:
        return len(self._queue)

    def clear(self) -> list[E]:
        """Drop every waiting entry (connection closed); returns them to release their bytes."""
        dropped = list(self._queue)
        self._queue.clear()
        return dropped
