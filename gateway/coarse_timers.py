"""Timers for deadlines that are rarely reached and need not be exact: one event-loop timer
for every callback due within the same few milliseconds.

Every acks=all produce request has a deadline (its timeout_ms) that its WAL commit nearly
always beats; the requests waiting on one commit check theirs with one of these timers, and
every commit due within one tick shares one event-loop timer: a callback joins the set of
its deadline's tick, only the first of a tick arms a timer, and cancelling removes it.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from typing import Callable

TICK_S = 0.005  # a callback runs at most this late

_BY_LOOP: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CoarseTimers]" = weakref.WeakKeyDictionary()


class CoarseHandle:
    __slots__ = ("_group", "_callback")

    def __init__(self, group: dict, callback: Callable[[], None]):
        self._group = group
        self._callback = callback

    def cancel(self) -> None:
        self._group.pop(self, None)


class CoarseTimers:
    """The coarse timers of one event loop (`coarse_timers()` gives the running loop's)."""

    def __init__(self) -> None:
        # No reference to the loop: it is the key of _BY_LOOP, which must not keep it alive.
        self._due: dict[int, dict[CoarseHandle, None]] = {}  # tick -> callbacks due then

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> CoarseHandle:
        """Run `callback` once `delay_s` has passed (up to TICK_S later), unless cancelled;
        on the running loop, whose timers these are."""
        return self.call_at(asyncio.get_running_loop().time() + delay_s, callback)

    def call_at(self, when: float, callback: Callable[[], None]) -> CoarseHandle:
        """Run `callback` once the running loop's clock reaches `when` (up to TICK_S
        later), unless cancelled."""
        tick = math.ceil(when / TICK_S)
        group = self._due.get(tick)
        if group is None:
            group = self._due[tick] = {}
            asyncio.get_running_loop().call_at(tick * TICK_S, self._fire, tick)
        handle = CoarseHandle(group, callback)
        group[handle] = None
        return handle

    def _fire(self, tick: int) -> None:
        for handle in list(self._due.pop(tick, ())):
            handle._callback()


def coarse_timers() -> CoarseTimers:
    loop = asyncio.get_running_loop()
    timers = _BY_LOOP.get(loop)
    if timers is None:
        timers = _BY_LOOP[loop] = CoarseTimers()
    return timers
