"""Stopping asyncio tasks for sure, and saying where a stop that did not end is waiting.

Before Python 3.12, asyncio.wait_for swallows a cancellation that arrives in the same loop
turn as the result of the call it waits for: the task carries on (a loop goes round again)
as if it had never been cancelled, and whoever awaits it waits for ever. `cancel_and_wait`
cancels again until every task has ended. When a stop still does not end within
shutdown.timeout.ms, the log names the line each task waits on (`suspended_at`)."""

from __future__ import annotations

import asyncio
import os
from typing import Any


async def cancel_and_wait(tasks, retry_s: float = 1.0) -> None:
    """Cancel the tasks and wait until every one has ended, cancelling again any that is
    still running after `retry_s` (it swallowed the cancellation). Their exceptions are
    not raised: the caller is stopping them."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=retry_s)
    for t in tasks:
        if not t.cancelled():
            t.exception()  # retrieved, so asyncio does not log it as never retrieved


def suspended_at(task: asyncio.Task) -> str:
    """The coroutines the task waits in, outermost first, each as `name (file:line)`."""
    steps = []
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        name = getattr(coro, "__qualname__", type(coro).__name__)
        steps.append(f"{name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " -> ".join(steps) or "(not started or finished)"


def pending_tasks(limit: int = 20) -> list[str]:
    """Every other unfinished task of the running loop: `name: where`, at most `limit`."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    out = [f"{t.get_name()}: {suspended_at(t)}" for t in tasks[:limit]]
    if len(tasks) > limit:
        out.append(f"... and {len(tasks) - limit} more")
    return out
