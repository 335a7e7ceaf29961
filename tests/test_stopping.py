"""The shutdown log names where a stop that did not end is waiting (gateway.stopping)."""

from __future__ import annotations

import asyncio

import pytest

from stratalog.gateway.stopping import cancel_and_wait, pending_tasks, suspended_at

pytestmark = pytest.mark.unit


async def _inner(event: asyncio.Event) -> None:
    await event.wait()


async def _outer(event: asyncio.Event) -> None:
    await _inner(event)


def test_a_suspended_task_is_named_down_to_the_line_it_waits_on():
    async def body():
        event = asyncio.Event()
        task = asyncio.create_task(_outer(event), name="stuck-stop")
        await asyncio.sleep(0)
        where = suspended_at(task)
        assert where.startswith("_outer (test_stopping.py:")
        assert " -> _inner (test_stopping.py:" in where
        assert "Event.wait (locks.py:" in where
        assert any(line.startswith("stuck-stop: _outer") for line in pending_tasks())
        event.set()
        await task
        assert suspended_at(task) == "(not started or finished)"
        assert not any(line.startswith("stuck-stop") for line in pending_tasks())

    asyncio.run(body())


async def _swallows_one_cancel(ticks: list) -> None:
    """A loop whose first cancellation is lost, as asyncio.wait_for loses one before 3.12."""
    swallowed = False
    while True:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True
        ticks.append(1)


async def _fails() -> None:
    raise RuntimeError("ended with an error before the stop")


def test_cancel_and_wait_ends_a_task_that_swallowed_its_cancellation():
    async def body():
        ticks: list = []
        stubborn = asyncio.create_task(_swallows_one_cancel(ticks))
        failing = asyncio.create_task(_fails())
        await asyncio.sleep(0.05)
        await asyncio.wait_for(cancel_and_wait([stubborn, failing], retry_s=0.05), 5)
        assert stubborn.cancelled() and failing.done()
        assert ticks, "the loop went round again after its first cancellation"

    asyncio.run(body())
