"""The one shape of a handler whose answer waits (a rebalance, a commit to __consumer_offsets).

The handler returns this awaitable at once and the request channel moves on; the response is
built from the result when it arrives and takes its place in the connection's sequence.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def answer_later(result: Awaitable[T], build: Callable[[T], R]) -> R:
    return build(await result)
