"""cancel_and_wait: an owner stopping a background task. The owner may itself be cancelled
while it waits (a broker shutting down cancels the loop that was stopping a fetcher); that
cancellation must reach the owner, or the owner carries on and its own stop never ends."""

from __future__ import annotations

import asyncio

import pytest

from broker.cluster.store import cancel_and_wait


async def _slow_to_stop(cleaned: asyncio.Event) -> None:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)  # a clean-up that takes a while
        cleaned.set()
        raise


async def test_the_task_is_cancelled_and_waited_for() -> None:
    cleaned = asyncio.Event()
    task = asyncio.create_task(_slow_to_stop(cleaned))
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled() and cleaned.is_set()


async def test_a_cancellation_of_the_caller_while_it_waits_reaches_the_caller() -> None:
    cleaned = asyncio.Event()
    child = asyncio.create_task(_slow_to_stop(cleaned))
    await asyncio.sleep(0)
    went_on: list[str] = []

    async def owner() -> None:
        await cancel_and_wait(child)
        went_on.append("after the wait")

    stopping = asyncio.create_task(owner())
    await asyncio.sleep(0.01)  # the owner is inside the wait, the child cleaning up
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert went_on == []
    await asyncio.wait([child])
    assert child.cancelled() and cleaned.is_set()


async def test_a_failure_of_the_task_is_raised() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise RuntimeError("failed while stopping") from None

    task = asyncio.create_task(fails_on_cancel())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="failed while stopping"):
        await cancel_and_wait(task)


async def test_none_is_nothing_to_stop() -> None:
    await cancel_and_wait(None)
