"""Named deadlines on an injected clock: the group coordinator's only notion of time.

A timer is a key, an absolute deadline (in the clock's seconds) and an action. Scheduling
a key again replaces its deadline, so "reset the session timer" is one call. Nothing here
sleeps: `fire_due(now)` runs what is due, and whoever owns the clock decides when to call
it (a background task in production, the test itself with a fake clock).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from typing import Callable, Hashable

log = logging.getLogger(__name__)

MAX_IDLE_S = 1.0  # a driving task re-checks at least this often


class Timers:
    """Deadlines keyed by name; a heap with lazy removal of replaced or cancelled entries."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Hashable]] = []
        self._live: dict[Hashable, tuple[float, int, Callable[[], None]]] = {}
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def schedule(self, key: Hashable, deadline: float, action: Callable[[], None]) -> bool:
        """Set (or replace) the timer `key`; True when it is now the earliest deadline."""
        seq = next(self._seq)
        self._live[key] = (deadline, seq, action)
        heapq.heappush(self._heap, (deadline, seq, key))
        return self.next_deadline() == deadline

    def cancel(self, key: Hashable) -> None:
        self._live.pop(key, None)

    def deadline(self, key: Hashable) -> float | None:
        entry = self._live.get(key)
        return None if entry is None else entry[0]

    def next_deadline(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def fire_due(self, now: float) -> int:
        """Run every action whose deadline is at or before `now`; returns how many ran.

        Timers that an action schedules during this call wait for the next call even if
        already due, so an action that re-arms itself at `now` cannot spin forever.
        """
        horizon = next(self._seq)
        fired = 0
        later: list[tuple[float, int, Hashable]] = []
        while True:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now:
                break
            entry = heapq.heappop(self._heap)
            if entry[1] > horizon:
                later.append(entry)
                continue
            _, _, action = self._live.pop(entry[2])
            action()
            fired += 1
        for entry in later:
            heapq.heappush(self._heap, entry)
        return fired

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            deadline, seq, key = heap[0]
            live = self._live.get(key)
            if live is not None and live[1] == seq:
                return
            heapq.heappop(heap)


async def drive(timers: Callable[[], Timers], clock: Callable[[], float], wakeup: asyncio.Event,
                what: str, after_tick: Callable[[], None] = lambda: None) -> None:
    """Fire due timers for ever, sleeping until the next deadline or until `wakeup` is set
    (a new earliest deadline). `timers` is asked each turn, so its owner may replace them."""
    while True:
        try:
            timers().fire_due(clock())
            after_tick()
        except Exception:  # a bug in one timer must not stop every other one
            log.exception("%s failed", what)
        nxt = timers().next_deadline()
        wait = MAX_IDLE_S if nxt is None else min(max(nxt - clock(), 0.0), MAX_IDLE_S)
        wakeup.clear()
        try:
            await asyncio.wait_for(wakeup.wait(), wait)
        except TimeoutError:
            pass
