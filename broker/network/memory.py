"""The broker's memory budget for requests and responses, with a fair share per connection.

Kafka bounds the bytes of requests it has read and not yet answered (queued.max.request.bytes,
its MemoryPool) and mutes a connection that would pass it. Here the same budget also counts
response bytes until the socket has taken them, so a client that never reads cannot make the
broker hold its responses without bound; and no connection may hold more than its share
(the budget split between the connections holding bytes), so one greedy client cannot take the
whole budget while others wait.

Invariant: ``used`` is the sum of every connection's ``held_bytes``; a connection holding more
than its share is muted (MEMORY) and read again once it is back under. Only connections over
their share can take ``used`` past the budget (a Fetch answers its first batch even past the
allowance, as Kafka does), so they alone are muted for it, and a connection's allowance for
responses is what is left of its own share: a calm connection within its share is never
starved, of reads or of fetched bytes, by clients that stopped reading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.network.mute import MuteReason

if TYPE_CHECKING:
    from broker.network.connection import Connection


class MemoryBudget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes  # negative: unbounded
        self.used = 0
        self.holders = 0  # connections holding at least one byte
        self.muted: set[Connection] = set()

    @property
    def bounded(self) -> bool:
        return self.max_bytes >= 0

    def share(self) -> int:
        """What one connection may hold: the budget split between the connections holding."""
        return self.max_bytes // max(self.holders, 1)

    def allowance(self, conn: Connection) -> int:
        """Bytes this connection may still take before it passes its share.

        Not capped by what is left of the whole budget: only connections over their share can
        take the total past it, and a calm connection's fetch must not be answered empty for as
        long as clients that never read hold the overage."""
        if not self.bounded:
            return 1 << 62
        return max(0, self.share() - conn.held_bytes)

    def hold(self, conn: Connection, size: int) -> None:
        if size <= 0:
            if size < 0:
                self.release(conn, -size)
            return
        if conn.held_bytes == 0:
            self.holders += 1
        conn.held_bytes += size
        self.used += size
        if self.bounded and conn.held_bytes > self.share():
            self.muted.add(conn)
            conn.set_mute(MuteReason.MEMORY)

    def release(self, conn: Connection, size: int) -> None:
        size = min(size, conn.held_bytes)  # a closed connection has already given all back
        if size <= 0:
            return
        conn.held_bytes -= size
        self.used -= size
        if conn.held_bytes == 0:
            self.holders -= 1
        if self.muted:
            share = self.share()
            for c in [c for c in self.muted if c.held_bytes <= share]:
                self.muted.discard(c)
                c.clear_mute(MuteReason.MEMORY)

    def forget(self, conn: Connection) -> None:
        """A closed connection gives back everything it held."""
        self.muted.discard(conn)
        self.release(conn, conn.held_bytes)
