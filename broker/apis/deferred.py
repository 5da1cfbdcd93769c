"""The one shape of a handler whose answer waits (a parked produce or fetch, a rebalance, a
commit to __consumer_offsets).

The handler returns a future at once and the request channel moves on; the response is built
from the result when it arrives and takes its place in the connection's sequence. Chained with
a done-callback rather than a coroutine: no Task per waiting request. A delayed operation's
Completion is chained synchronously (``Completion.then``): the response is built in the same
callback that completed the operation, with no loop hop at all. If building the response
raises, the future carries the exception and the channel closes that connection with a logged
error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from broker.replica.delayed_result import Completion

T = TypeVar("T")
R = TypeVar("R")


def answer_later(result: Awaitable[T], build: Callable[[T], R]
                 ) -> Completion[R] | asyncio.Future[R]:
    if isinstance(result, Completion):
        return result.then(build)
    source = asyncio.ensure_future(result)
    answer: asyncio.Future[R] = source.get_loop().create_future()

    def done(f: asyncio.Future[T]) -> None:
        if answer.done():
            return
        if f.cancelled():
            answer.cancel()
        elif (exc := f.exception()) is not None:
            answer.set_exception(exc)
        else:
            try:
                answer.set_result(build(f.result()))
            except Exception as err:
                answer.set_exception(err)

    source.add_done_callback(done)
    return answer
