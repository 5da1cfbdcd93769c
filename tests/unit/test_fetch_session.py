"""FetchSessionCache (KIP-227): create/get/remove, bounded slots, LRU eviction after idleness.

The cache's clock is `time.monotonic` of broker.replica.fetch_session, replaced here by a
manual one.
"""

from __future__ import annotations

import pytest

from broker.replica import fetch_session
from broker.replica.fetch_session import CachedPartition, FetchSessionCache


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(fetch_session.time, "monotonic", c)
    return c


def parts(*names: str) -> dict:
    return {(n, 0): CachedPartition(n, None, 0, fetch_offset=0, max_bytes=1024) for n in names}


def test_create_get_remove(clock: Clock) -> None:
    cache = FetchSessionCache(max_slots=4, eviction_ms=1000)
    partitions = parts("a", "b")
    session = cache.create(partitions)
    assert session is not None
    assert 0 < session.session_id < 2**31  # a positive int32; 0 means "no session"
    assert session.epoch == 1  # the first incremental request carries epoch 1
    assert session.partitions == partitions
    assert len(cache) == 1

    assert cache.get(session.session_id) is session
    assert cache.get(session.session_id + 1) is None

    cache.remove(session.session_id)
    assert cache.get(session.session_id) is None
    assert len(cache) == 0
    cache.remove(session.session_id)  # removing twice is harmless
    cache.remove(12345)


def test_session_ids_are_distinct(clock: Clock) -> None:
    cache = FetchSessionCache(max_slots=500, eviction_ms=1000)
    ids = [cache.create(parts("t")).session_id for _ in range(500)]  # type: ignore[union-attr]
    assert len(set(ids)) == 500
    assert all(0 < i < 2**31 for i in ids)


def test_full_cache_of_recent_sessions_refuses_new_ones(clock: Clock) -> None:
    cache = FetchSessionCache(max_slots=2, eviction_ms=1000)
    a, b = cache.create(parts("a")), cache.create(parts("b"))
    assert a is not None and b is not None
    clock.now += 0.999  # still under eviction_ms since last use
    assert cache.create(parts("c")) is None
    assert len(cache) == 2
    assert cache.get(a.session_id) is a
    assert cache.get(b.session_id) is b


def test_lru_session_evicted_only_after_idle_eviction_ms(clock: Clock) -> None:
    cache = FetchSessionCache(max_slots=2, eviction_ms=1000)
    a = cache.create(parts("a"))
    clock.now += 0.5
    b = cache.create(parts("b"))
    assert a is not None and b is not None

    clock.now += 0.4  # a idle 0.9 s: not evictable yet
    assert cache.get(a.session_id) is a  # a is used again: b becomes least recently used
    clock.now += 0.7  # b idle 1.1 s, a idle 0.7 s
    c = cache.create(parts("c"))
    assert c is not None, "b was idle past eviction_ms and should have given up its slot"
    assert cache.get(b.session_id) is None, "the least recently used session goes first"
    assert cache.get(a.session_id) is a
    assert cache.get(c.session_id) is c
    assert len(cache) == 2

    # Both remaining sessions were just used: no slot for a fourth.
    assert cache.create(parts("d")) is None
    clock.now += 1.001
    d = cache.create(parts("d"))
    assert d is not None
    assert len(cache) == 2
    # a was touched before c in the calls above, so a was the least recently used.
    assert cache.get(a.session_id) is None
    assert cache.get(c.session_id) is c


def test_get_refreshes_idleness(clock: Clock) -> None:
    cache = FetchSessionCache(max_slots=1, eviction_ms=1000)
    a = cache.create(parts("a"))
    assert a is not None
    for _ in range(5):  # used every 0.8 s: never idle long enough to lose its slot
        clock.now += 0.8
        assert cache.get(a.session_id) is a
        assert cache.create(parts("x")) is None
    clock.now += 1.0
    assert cache.create(parts("x")) is not None
    assert cache.get(a.session_id) is None
