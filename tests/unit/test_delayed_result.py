"""Completion: a delayed operation's future, synchronous for the broker's own continuations and
an ordinary asyncio future for everything else (await, gather, wait, shield, callbacks)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from broker.replica.delayed_result import Completion, DelayedResult, all_of, completed
from purgatory import ManualClock, Purgatory, Timer


class Op(DelayedResult[int]):
    def __init__(self, delay_ms: int, value: int | Exception = 7) -> None:
        super().__init__(delay_ms)
        self.value = value
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def result(self) -> int:
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


async def test_on_done_runs_inside_the_completing_call() -> None:
    c: Completion[int] = Completion()
    seen: list[int] = []
    c.on_done(lambda done: seen.append(done.result()))
    c.set_result(3)
    assert seen == [3], "no loop hop: the continuation ran inside set_result"
    c.on_done(lambda done: seen.append(done.result() + 1))
    assert seen == [3, 4], "on a done Completion it runs at once"


async def test_add_done_callback_is_scheduled_like_asyncio_with_its_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    c: Completion[int] = Completion()
    seen: list[str] = []
    ctx = contextvars.copy_context()
    ctx.run(var.set, "theirs")
    c.add_done_callback(lambda _c: seen.append(var.get()), context=ctx)
    c.set_result(1)
    assert seen == [], "a foreign callback never runs inside the completing code"
    await asyncio.sleep(0)
    assert seen == ["theirs"]
    removed: list[int] = []
    d: Completion[int] = Completion()
    d.add_done_callback(removed.append)
    assert d.remove_done_callback(removed.append) == 1
    d.set_result(2)
    await asyncio.sleep(0)
    assert removed == []


async def test_awaited_by_tasks_gather_wait_and_shield() -> None:
    a: Completion[int] = Completion()
    b: Completion[int] = Completion()
    assert asyncio.isfuture(a) and asyncio.ensure_future(a) is a

    async def waiter() -> int:
        return await a + 1

    task = asyncio.ensure_future(waiter())
    gathered = asyncio.gather(a, b)
    shielded = asyncio.shield(b)
    await asyncio.sleep(0)
    a.set_result(1)
    done, pending = await asyncio.wait([a, b], timeout=0.01)
    assert done == {a} and pending == {b}
    b.set_result(2)
    assert await task == 2
    assert await gathered == [1, 2]
    assert await shielded == 2


async def test_wait_for_timeout_cancels_it_and_the_error_reaches_the_awaiter() -> None:
    c: Completion[int] = Completion()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(c, 0.01)
    assert c.cancelled()
    with pytest.raises(asyncio.CancelledError):
        c.result()
    failing: Completion[int] = Completion()
    failing.set_exception(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        await failing
    assert isinstance(failing.exception(), ValueError)


async def test_not_done_refuses_result_and_completing_twice() -> None:
    c: Completion[int] = Completion()
    with pytest.raises(asyncio.InvalidStateError):
        c.result()
    with pytest.raises(asyncio.InvalidStateError):
        c.exception()
    c.set_result(1)
    with pytest.raises(asyncio.InvalidStateError):
        c.set_result(2)
    assert not c.cancel()


async def test_then_maps_the_result_and_passes_failures_through() -> None:
    ok: Completion[int] = Completion()
    mapped = ok.then(lambda v: v * 10)
    ok.set_result(4)
    assert mapped.done() and mapped.result() == 40
    failed: Completion[int] = Completion()
    mapped = failed.then(lambda v: v * 10)
    failed.set_exception(KeyError("k"))
    assert isinstance(mapped.exception(), KeyError)
    broken: Completion[int] = Completion()
    mapped = broken.then(lambda v: 1 // 0)
    broken.set_result(1)
    assert isinstance(mapped.exception(), ZeroDivisionError)
    cancelled: Completion[int] = Completion()
    mapped = cancelled.then(lambda v: v)
    cancelled.cancel()
    assert mapped.cancelled()


async def test_a_failing_continuation_does_not_cost_the_others() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    try:
        c: Completion[int] = Completion()
        seen: list[int] = []
        c.on_done(lambda _c: 1 // 0)
        c.on_done(lambda done: seen.append(done.result()))
        c.set_result(5)
        assert seen == [5]
        assert isinstance(reported[0]["exception"], ZeroDivisionError)
    finally:
        loop.set_exception_handler(None)


async def test_then_chains_a_delayed_operation_synchronously() -> None:
    op = Op(1000, value=2)
    answer = op.future.then(lambda v: v + 1)
    assert isinstance(answer, Completion) and not answer.done()
    op.force_complete()
    assert answer.result() == 3, "built inside the completion, no loop hop"


async def test_a_completed_answer_is_built_at_once() -> None:
    now = completed(5)
    assert now.done() and now.result() == 5
    built = now.then(lambda v: v * 2)
    assert built.done() and built.result() == 10
    broken = now.then(lambda v: v // 0)
    assert isinstance(broken.exception(), ZeroDivisionError)
    assert await completed("awaitable") == "awaitable"


async def test_exceptionally_answers_a_failure_with_its_value() -> None:
    failed: Completion[int] = Completion()
    recovered = failed.exceptionally(-1)
    failed.set_exception(RuntimeError("log closed"))
    assert recovered.result() == -1
    cancelled: Completion[int] = Completion()
    recovered = cancelled.exceptionally(-1)
    cancelled.cancel()
    assert recovered.result() == -1
    assert completed(4).exceptionally(-1).result() == 4


async def test_all_of_waits_for_every_one_in_order() -> None:
    first: Completion[int] = Completion()
    second: Completion[int] = Completion()
    both = all_of([first, completed(1), second])
    second.set_result(2)
    assert not both.done()
    first.set_result(0)
    assert both.result() == [0, 1, 2]
    assert all_of([]).result() == []
    failing: Completion[int] = Completion()
    either = all_of([completed(1), failing])
    failing.set_exception(KeyError("k"))
    assert isinstance(either.exception(), KeyError)


async def test_delayed_result_through_the_purgatory_on_completion_and_on_timeout() -> None:
    clock = ManualClock()
    purgatory: Purgatory[Op] = Purgatory("test", Timer(clock))
    op = Op(100, value=9)
    order: list[str] = []
    op.future.on_done(lambda _c: order.append("answered"))
    assert not purgatory.try_complete_else_watch(op, ["k"])
    op.ready = True
    purgatory.check_and_complete("k")
    order.append("after check")
    assert order == ["answered", "after check"]
    assert op.future.result() == 9
    failing = Op(100, value=RuntimeError("log closed"))
    assert not purgatory.try_complete_else_watch(failing, ["k"])
    clock.advance(100)
    assert isinstance(failing.future.exception(), RuntimeError)
