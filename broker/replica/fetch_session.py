"""Fetch sessions (KIP-227): the broker remembers a consumer's partitions between fetches.

An incremental fetch names only the partitions whose fetch position changed; the response
carries only partitions with news (records, an error, a moved high watermark or log start).
The cache is bounded: at most `max_slots` sessions, the least recently used evicted first, and a
session idle longer than `eviction_ms` may be evicted by anyone who needs its slot.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

INITIAL_EPOCH = 0
FINAL_EPOCH = -1

PartitionKey = tuple[Any, int]  # (topic name, or topic id from Fetch v13, partition)


@dataclass(slots=True)
class CachedPartition:
    topic: str | None
    topic_id: Any
    index: int
    fetch_offset: int
    max_bytes: int
    high_watermark: int = -2  # last values sent to the client; -2: never sent
    log_start_offset: int = -2
    #: the client's current leader epoch (Fetch v9+), -1: not checked; an incremental fetch
    #: keeps the last one sent, as Kafka's CachedPartition does.
    current_leader_epoch: int = -1
    #: a follower's log start offset (Fetch v5+), -1 from a consumer (fetcherLogStartOffset).
    fetcher_log_start_offset: int = -1
    #: the epoch of the last batch the fetcher has (Fetch v12+), -1: none; kept by the session
    #: like the current leader epoch.
    last_fetched_epoch: int = -1


@dataclass(slots=True)
class FetchSession:
    session_id: int
    epoch: int  # the epoch the next request must carry
    partitions: dict[PartitionKey, CachedPartition] = field(default_factory=dict)
    last_used: float = 0.0


class FetchSessionCache:
    def __init__(self, max_slots: int = 1000, eviction_ms: int = 120_000) -> None:
        self.max_slots = max_slots
        self.eviction_s = eviction_ms / 1000
        self.sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._ids = itertools.count(random.randint(1, 2**30))

    def create(self, partitions: dict[PartitionKey, CachedPartition]) -> FetchSession | None:
        """A new session, or None when the cache is full of recently used sessions."""
        now = time.monotonic()
        if len(self.sessions) >= self.max_slots:
            oldest_id, oldest = next(iter(self.sessions.items()))
            if now - oldest.last_used < self.eviction_s:
                return None
            del self.sessions[oldest_id]
        session = FetchSession(next(self._ids) % 2**31 or 1, 1, partitions, now)
        self.sessions[session.session_id] = session
        return session

    def get(self, session_id: int) -> FetchSession | None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.last_used = time.monotonic()
            self.sessions.move_to_end(session_id)
        return session

    def remove(self, session_id: int) -> None:
        self.sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self.sessions)
