"""Per-connection response sequencer: responses leave in request order, whatever finishes first.

Kafka's clients match responses to requests by order on the socket (correlation ids are only
checked), so a fast metadata answer must wait behind a slow produce sent before it.

Responses that become sendable are not written one by one: they gather in order until the
connection takes them all (``take``), once per loop iteration, and goes to the socket with one
write. ``on_ready`` tells the connection when the first of such a batch is there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

# A response as encoded: one bytes-like object, or a gather list of parts sent in order.
Payload = bytes | bytearray | memoryview | list[bytes | bytearray | memoryview]


class Awaiting(Protocol):
    """What waits in the sequence: a request that expects a response (its payload once built)."""

    payload: Payload | None


E = TypeVar("E", bound=Awaiting)


def payload_size(payload: Payload) -> int:
    """Bytes of a payload, a gather list's being the sum of its parts."""
    if type(payload) is list:
        return sum(map(len, payload))
    return len(payload)


class ResponseSequencer(Generic[E]):
    """Requests awaiting their responses, in request order; `complete` fills one and moves every
    filled one at the head to the ready batch."""

    __slots__ = ("_queue", "_ready", "on_ready")

    def __init__(self, on_ready: Callable[[], None]) -> None:
        # A list, not a deque: a deque's first block is ~600 bytes on every connection, and a
        # connection rarely has more than a few requests in flight (one, a parked long poll).
        self._queue: list[E] = []
        self._ready: list[E] = []  # in order, their payloads not yet written
        self.on_ready = on_ready  # called when a batch starts: write now, or schedule it

    def reserve(self, entry: E) -> E:
        entry.payload = None
        self._queue.append(entry)
        return entry

    def complete(self, entry: E, payload: Payload) -> None:
        entry.payload = payload
        queue = self._queue
        if not queue or queue[0].payload is None:
            return  # waits behind an earlier request
        ready = self._ready
        first = not ready
        n, end = 1, len(queue)
        while n < end and queue[n].payload is not None:
            n += 1
        if n == 1:
            ready.append(queue.pop(0))
        else:
            ready += queue[:n]
            del queue[:n]
        if first:
            self.on_ready()

    def take(self) -> list[E]:
        """The ready batch, in request order, for one write; the sequencer forgets it."""
        ready, self._ready = self._ready, []
        return ready

    @property
    def has_ready(self) -> bool:
        return bool(self._ready)

    def __len__(self) -> int:
        """Requests not yet handed to the socket: waiting for their response, or ready."""
        return len(self._queue) + len(self._ready)

    def clear(self) -> list[E]:
        """Drop every entry (connection closed); returns them to release their bytes."""
        dropped = [*self._ready, *self._queue]
        self._queue.clear()
        self._ready = []
        return dropped
