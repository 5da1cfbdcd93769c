"""The one bridge from a delayed operation to the request waiting on it.

A parked produce or fetch is answered by resolving a future that the request channel awaits.
Computing the result (re-reading a log, judging each partition) may raise; the exception is
carried by the future, so the channel closes that connection with a logged error instead of
leaving every later response on it waiting forever.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from purgatory import DelayedOperation

T = TypeVar("T")


class DelayedResult(DelayedOperation, Generic[T]):
    """A DelayedOperation whose completion resolves ``future`` with ``result()``."""

    def __init__(self, delay_ms: float) -> None:
        super().__init__(delay_ms)
        self.future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def result(self) -> T:
        raise NotImplementedError

    def on_complete(self) -> None:
        if self.future.done():
            return
        try:
            self.future.set_result(self.result())
        except Exception as exc:
            self.future.set_exception(exc)

    def on_expiration(self) -> None:
        pass
