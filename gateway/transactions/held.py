"""Requests held while a transactional id's previous transaction is being completed.

After EndTxn is answered (its decision durable) the markers are still being written; the
producer's next AddPartitionsToTxn, AddOffsetsToTxn, InitProducerId or a retried EndTxn
would have to be told CONCURRENT_TRANSACTIONS and retried after a back-off. Instead the
coordinator holds it here until the id's state changes, then decides again.

A held request may also leave its decision here (`hold(..., decide)`): the gateway that
writes the completion asks `follow_on` and writes that request's new state in place of
CompleteCommit/CompleteAbort, in the same compare-and-swap, so a transaction's completion
and the next one's beginning cost one durable write. The decision on the completed state
is the one the request would take after reading it, so nothing is skipped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from stratalog.coordinator.transactions import TxnState

from .errors import TxnError

Decide = Callable[[TxnState | None], TxnState | None]


@dataclass(eq=False)
class Hold:
    """One request waiting for the next change of an id. `future` resolves to None (read
    the state again) or to the state written for it (its decision was written)."""
    future: asyncio.Future
    decide: Decide | None = None


class HeldRequests:
    """The holds per transactional id; at most one per request in flight."""

    def __init__(self) -> None:
        self._holds: dict[str, list[Hold]] = {}

    def hold(self, transactional_id: str) -> Hold:
        """A hold on the id's next change; taken before the request reads the state, so a
        change written after the read wakes it."""
        h = Hold(asyncio.get_running_loop().create_future())
        self._holds.setdefault(transactional_id, []).append(h)
        return h

    def release(self, transactional_id: str, h: Hold) -> None:
        holds = self._holds.get(transactional_id)
        if holds is not None and h in holds:
            holds.remove(h)
            if not holds:
                del self._holds[transactional_id]

    def follow_on(self, complete: TxnState, now_ms: int) -> tuple[TxnState, Hold | None]:
        """What to write in place of `complete`: the first held decision that accepts it
        (with the hold it answers), else `complete` itself."""
        for h in self._holds.get(complete.transactional_id, ()):
            if h.decide is None or h.future.done():
                continue
            try:
                new = h.decide(complete)
            except TxnError:
                continue  # it reads the completed state and answers its error itself
            if new is not None:
                return new.with_(update_ms=now_ms), h
        return complete, None

    def changed(self, transactional_id: str, written: TxnState | None = None,
                answered: Hold | None = None) -> None:
        """The id's state changed: `answered` (from `follow_on`) learns its state was
        `written`; every other hold reads the state again."""
        for h in self._holds.pop(transactional_id, ()):
            if not h.future.done():
                h.future.set_result(written if h is answered else None)
