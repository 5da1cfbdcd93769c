"""The one way to answer later: a Completion, from a delayed operation to the request on it.

Every owner method that may wait (a parked produce or fetch, a rebalance, a write to a
coordinator's topic) returns a Completion, already completed when the answer is known at once,
and every handler answers ``result.then(build)``; the request channel waits on that. Computing
the result (re-reading a log, judging each partition) may raise; the exception is carried by
the Completion, so the channel closes that connection with a logged error instead of leaving
every later response on it waiting forever.

Completion is a future without the loop on its hot path: the broker's own continuations
(``on_done``, ``then``: the channel's answer, a handler's response builder) run synchronously
when the operation completes, inside the append, high-watermark move or timer callback that
completed it, with no Handle and no loop iteration in between. Everything else sees an asyncio
future: ``await``, ``ensure_future``, ``gather``, ``wait`` and ``add_done_callback(fn,
context=...)`` callbacks are scheduled with ``loop.call_soon`` as asyncio's own Future does,
because a Task woken synchronously from inside another Task's step would fail to enter.
Continuations are therefore written for re-entrancy: they only build and hand over an answer.
An owner that changes its state when its own write completes (a coordinator applying a
transition) reacts with ``add_done_callback``, on the loop, never inside the append that
completed the write.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from protocol.errors import ErrorCode
from purgatory import DelayedOperation

T = TypeVar("T")
R = TypeVar("R")

_PENDING, _FINISHED, _CANCELLED = 0, 1, 2
# A continuation: run at completion, synchronously (a callable), or scheduled on the loop
# (a (callback, context) pair, asyncio's add_done_callback).
_Callback = Callable[["Completion[Any]"], object]


class Completion(Generic[T]):
    """A future-like result of a delayed operation whose own continuations run at once."""

    __slots__ = ("_state", "_result", "_exception", "_callbacks", "_loop", "_cancel_message",
                 "_asyncio_future_blocking", "__weakref__")

    def __init__(self) -> None:
        self._state = _PENDING
        self._result: T | None = None
        self._exception: BaseException | None = None
        # None, one continuation, or a list of them: nearly every Completion gets exactly one,
        # and a parked request should not pay for a list it never needs.
        self._callbacks: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancel_message: str | None = None
        # asyncio.isfuture's mark, and what a Task awaiting this sets while it blocks on it.
        self._asyncio_future_blocking = False

    # -- the broker's side: completing, and continuing synchronously ------------------------
    def set_result(self, result: T) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError("Completion already done")
        self._result = result
        self._state = _FINISHED
        self._run_callbacks()

    def set_exception(self, exception: BaseException) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError("Completion already done")
        self._exception = exception
        self._state = _FINISHED
        self._run_callbacks()

    def on_done(self, fn: _Callback) -> None:
        """Call ``fn(self)`` when done, synchronously (now, if done already)."""
        if self._state == _PENDING:
            self._add(fn)
        else:
            self._call(fn)

    def _add(self, entry: Any) -> None:
        callbacks = self._callbacks
        if callbacks is None:
            self._callbacks = entry
        elif type(callbacks) is list:
            callbacks.append(entry)
        else:
            self._callbacks = [callbacks, entry]

    def then(self, build: Callable[[T], R]) -> Completion[R]:
        """The Completion of ``build(result)``; failures and cancellation pass through, and
        an exception raised by ``build`` becomes its exception."""
        answer: Completion[R] = Completion()
        if self._state == _FINISHED and self._exception is None:
            # Answered at once (most produces): no continuation object to make and drop.
            try:
                answer._result = build(self._result)  # type: ignore[arg-type]
            except Exception as exc:
                answer._exception = exc
            answer._state = _FINISHED
            return answer
        self.on_done(_Then(answer, build))
        return answer

    def exceptionally(self, value: T) -> Completion[T]:
        """This Completion's result, or ``value`` if it failed or was cancelled (Java's
        CompletableFuture.exceptionally): for owners whose own callers only take an answer."""
        answer: Completion[T] = Completion()
        self.on_done(_Exceptionally(answer, value))
        return answer

    def _run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, None
        if callbacks is None:
            return
        if type(callbacks) is not list:
            self._call(callbacks)
            return
        for fn in callbacks:
            self._call(fn)

    def _call(self, fn: Any) -> None:
        if type(fn) is tuple:  # asyncio's kind: never run inside the completing code
            callback, context = fn
            self.get_loop().call_soon(callback, self, context=context)
            return
        try:
            fn(self)
        except Exception as exc:  # one failed continuation must not cost the others
            self.get_loop().call_exception_handler({
                "message": "exception in a Completion continuation", "exception": exc,
                "future": self})

    # -- asyncio's Future protocol ----------------------------------------------------------
    def get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def done(self) -> bool:
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def cancel(self, msg: Any | None = None) -> bool:
        if self._state != _PENDING:
            return False
        self._state = _CANCELLED
        self._cancel_message = msg
        self._run_callbacks()
        return True

    def result(self) -> T:
        if self._state == _CANCELLED:
            raise asyncio.CancelledError(self._cancel_message)
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("Result is not set.")
        if self._exception is not None:
            raise self._exception
        return self._result  # type: ignore[return-value]

    def exception(self) -> BaseException | None:
        if self._state == _CANCELLED:
            raise asyncio.CancelledError(self._cancel_message)
        if self._state == _PENDING:
            raise asyncio.InvalidStateError("Exception is not set.")
        return self._exception

    def add_done_callback(self, fn: Callable[[Completion[T]], object], *,
                          context: contextvars.Context | None = None) -> None:
        """asyncio's semantics: ``fn`` is scheduled on the loop, never called from here."""
        entry = (fn, context if context is not None else contextvars.copy_context())
        if self._state == _PENDING:
            self._add(entry)
        else:
            self._call(entry)

    def remove_done_callback(self, fn: Callable[[Completion[T]], object]) -> int:
        callbacks = self._callbacks
        if callbacks is None:
            return 0
        if type(callbacks) is not list:
            callbacks = [callbacks]
        kept = [c for c in callbacks if not (type(c) is tuple and c[0] == fn)]
        removed = len(callbacks) - len(kept)
        self._callbacks = kept[0] if len(kept) == 1 else (kept or None)
        return removed

    def __await__(self) -> Generator[Any, None, T]:
        if self._state == _PENDING:
            self._asyncio_future_blocking = True
            yield self
        if self._state == _PENDING:
            raise RuntimeError("await wasn't used with future")
        return self.result()

    __iter__ = __await__

    def __repr__(self) -> str:
        state = ("pending", "finished", "cancelled")[self._state]
        return f"<Completion {state}>"


def completed(value: T) -> Completion[T]:
    """A Completion whose answer is known now: what an owner returns when nothing waits."""
    done: Completion[T] = Completion()
    done._result = value
    done._state = _FINISHED
    return done


def chain(first: Completion[T], then: Callable[[T], Completion[R]]) -> Completion[R]:
    """``then``'s completion, started with ``first``'s result (failed if either fails)."""
    out: Completion[R] = Completion()

    def second(c: Completion[R]) -> None:
        error = c.exception()
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(c.result())

    def first_done(c: Completion[T]) -> None:
        error = c.exception()
        if error is not None:
            out.set_exception(error)
            return
        try:
            then(c.result()).add_done_callback(second)
        except Exception as e:
            out.set_exception(e)

    first.add_done_callback(first_done)
    return out


def all_of(completions: list[Completion[T]]) -> Completion[list[T]]:
    """The results of every Completion, in order, once every one is done; otherwise the first
    failure (or cancellation) among them, in that order."""
    answer: Completion[list[T]] = Completion()
    remaining = [len(completions)]

    def one_done(_c: Completion[T]) -> None:
        remaining[0] -= 1
        if remaining[0] == 0:
            for c in completions:
                if c._state == _CANCELLED:
                    answer.cancel(c._cancel_message)
                    return
                if c._exception is not None:
                    answer.set_exception(c._exception)
                    return
            answer.set_result([c._result for c in completions])  # type: ignore[misc]

    if not completions:
        answer.set_result([])
    for c in completions:
        c.on_done(one_done)
    return answer


class _Exceptionally(Generic[T]):
    """``Completion.exceptionally``'s continuation."""

    __slots__ = ("answer", "value")

    def __init__(self, answer: Completion[T], value: T) -> None:
        self.answer = answer
        self.value = value

    def __call__(self, c: Completion[T]) -> None:
        if c._state == _CANCELLED or c._exception is not None:
            self.answer.set_result(self.value)
        else:
            self.answer.set_result(c._result)  # type: ignore[arg-type]


class _Then(Generic[T, R]):
    """``Completion.then``'s continuation: ``answer`` gets ``build(result)``. A slotted object
    rather than a closure (a function and a cell per captured name), since one waits with
    every parked request."""

    __slots__ = ("answer", "build")

    def __init__(self, answer: Completion[R], build: Callable[[T], R]) -> None:
        self.answer = answer
        self.build = build

    def __call__(self, c: Completion[T]) -> None:
        answer = self.answer
        if c._state == _CANCELLED:
            answer.cancel(c._cancel_message)
        elif c._exception is not None:
            answer.set_exception(c._exception)
        else:
            try:
                value = self.build(c._result)  # type: ignore[arg-type]
            except Exception as exc:
                answer.set_exception(exc)
            else:
                answer.set_result(value)


class DelayedResult(DelayedOperation, Generic[T]):
    """A DelayedOperation whose completion resolves ``future`` with ``result()``."""

    __slots__ = ("future",)

    def __init__(self, delay_ms: float) -> None:
        super().__init__(delay_ms)
        self.future: Completion[T] = Completion()

    def result(self) -> T:
        raise NotImplementedError

    def on_complete(self) -> None:
        future = self.future
        if future._state != _PENDING:
            return
        try:
            value = self.result()
        except Exception as exc:
            future.set_exception(exc)
        else:
            future.set_result(value)

    def on_expiration(self) -> None:
        pass


class PartitionAnswer(Protocol):
    """One partition's answer in a delayed operation: its error is set at the deadline."""

    error: ErrorCode


A = TypeVar("A", bound=PartitionAnswer)


class DelayedPartitions(DelayedResult[dict[Any, A]], Generic[A]):
    """A delayed operation over partitions (DelayedProduce, DelayedDeleteRecords): complete
    once ``_settle`` took every partition out of ``pending``; at the deadline the ones still
    pending answer REQUEST_TIMED_OUT, as Kafka's."""

    def __init__(self, delay_ms: float, results: dict[Any, A]) -> None:
        super().__init__(delay_ms)
        self.results = results
        self.pending: set[Any] = set()

    def _settle(self) -> None:
        """Take out of ``pending`` every partition whose answer is known now."""
        raise NotImplementedError

    def try_complete(self) -> bool:
        self._settle()
        if not self.pending:
            return self.force_complete()
        return False

    def result(self) -> dict[Any, A]:
        self._settle()
        for tp in self.pending:
            self.results[tp].error = ErrorCode.REQUEST_TIMED_OUT
        return self.results
