"""`StoredGroups`: the copy of one kind of group (classic or consumer-protocol) that the
`ClusterStore` keeps, so that a gateway taking over a group's coordination continues it
where the previous one left it.

A group is loaded on first use and written when it changes (never for a heartbeat that
only says "still here"). Every write compares against the value this gateway last read or
wrote: coordination follows each gateway's own view of who is alive, so two gateways can
serve a group for a moment, and the one whose write is refused drops its copy (the caller
answers NOT_COORDINATOR) instead of overwriting the newer state. What the group looks like
in memory and in the store belongs to the caller, through the callbacks below.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable, Generic, MutableMapping, TypeVar

from stratalog.coordinator.kv import RequestTooLarge
from stratalog.gateway.protocol.error_codes import ErrorCode

log = logging.getLogger(__name__)

E = ErrorCode
G = TypeVar("G")
# How long "the store has no such group" is believed by lookups that do not name a member
# (offset commits of groups that keep no state would otherwise read the store every time).
ABSENT_CACHE_S = 5.0
MAX_ABSENT = 10_000  # ids remembered as absent; the cache is emptied past this


class UnreadableGroupState(ValueError):
    """A stored group this gateway cannot read (corrupt, or written by a newer one)."""


def parse_state(kind: str, group_id: str, value: bytes, newest: int) -> dict:
    """A stored group's JSON object, once its `version` is one of 1..`newest`."""
    try:
        d = json.loads(value)
        version = int(d.get("version", 0))
    except (UnicodeDecodeError, ValueError, AttributeError) as e:
        raise UnreadableGroupState(f"{kind} group {group_id}: corrupt stored state: {e}") from None
    if version > newest or version < 1:
        raise UnreadableGroupState(
            f"{kind} group {group_id} has state version {version}; this Stratalog reads "
            f"version {newest}: upgrade the gateway")
    return d


class StoredGroups(Generic[G]):
    """Stored copies of the groups in `groups` (the caller's in-memory map)."""

    def __init__(self, kind: str, groups: MutableMapping[str, G], clock: Callable[[], float], *,
                 read: Callable[[str], Awaitable[bytes | None]] | None,
                 write: Callable[[str, bytes | None, bytes | None], Awaitable[bool]] | None,
                 encode: Callable[[G], bytes | None], decode: Callable[[str, bytes], G],
                 loaded: Callable[[G], None], lost: Callable[[str], None]):
        """`read`/`write` are the store's get and compare-and-set (None: nothing is
        stored); `encode` gives None for a group the store need not keep (it is deleted);
        `loaded` arms a group just brought into `groups`; `lost` drops one whose write
        was refused."""
        self.kind = kind
        self.enabled = read is not None and write is not None
        self._groups = groups
        self._clock = clock
        self._read = read
        self._write = write
        self._encode = encode
        self._decode = decode
        self._loaded = loaded
        self._lost = lost
        self._stored: dict[str, bytes | None] = {}  # group -> its value in the store
        self._locks: dict[str, asyncio.Lock] = {}
        self._absent: dict[str, float] = {}  # group -> when the store had none (a cache)
        self._writes: set[asyncio.Task] = set()
        self._dirty: set[str] = set()  # groups changed since their last successful write

    async def stop(self) -> None:
        for t in list(self._writes):
            t.cancel()
        await asyncio.gather(*self._writes, return_exceptions=True)
        self._stored.clear()

    async def written(self) -> None:
        """Wait for the writes no request waits for (`persist_soon`) under way now."""
        await asyncio.gather(*self._writes, return_exceptions=True)

    def forget(self, group_id: str) -> None:
        """This gateway no longer holds the group: its next use reads the store again
        (not believing it absent: the copy may be dropped for another's newer one)."""
        self._stored.pop(group_id, None)
        self._dirty.discard(group_id)
        self._absent.pop(group_id, None)

    def is_clean(self, group_id: str) -> bool:
        """Whether the group was loaded or written and not marked changed since."""
        return group_id in self._stored and group_id not in self._dirty

    def mark_changed(self, group_id: str) -> None:
        self._dirty.add(group_id)

    def replaced(self, group_id: str, stored: bytes | None) -> None:
        """The caller put a group of its own making in `groups` over `stored` (the value
        the store held): the next write replaces that value."""
        self._stored[group_id] = stored
        self._dirty.add(group_id)
        self._absent.pop(group_id, None)

    def _lock(self, group_id: str) -> asyncio.Lock:
        lock = self._locks.get(group_id)
        if lock is None:
            if len(self._locks) > 4 * len(self._groups) + 1024:  # unused ones go
                for g in [g for g, lk in self._locks.items() if not lk.locked() and g not in self._groups]:
                    del self._locks[g]
            lock = self._locks[group_id] = asyncio.Lock()
        return lock

    async def read(self, group_id: str) -> bytes | None:
        """The stored value, unread into memory. Store failures propagate."""
        return None if self._read is None else await self._read(group_id)

    async def load(self, group_id: str, *, cached: bool = True) -> G | None:
        """Bring a stored group into `groups` if it is not there; the group (None if the
        store has none). `cached` False reads the store even if it had no such group a
        moment ago: a request naming a member says the group exists, and the gateway that
        coordinated it until now may have just stored it. Store failures and unreadable
        values propagate."""
        if not self.enabled or not group_id or group_id in self._groups:
            return self._groups.get(group_id)
        seen = self._absent.get(group_id)
        if cached and seen is not None and self._clock() - seen < ABSENT_CACHE_S:
            return None
        async with self._lock(group_id):
            if group_id in self._groups:
                return self._groups[group_id]
            value = await self.read(group_id)
            if group_id in self._groups:
                return self._groups[group_id]
            if value is None:
                self._absent[group_id] = self._clock()
                if len(self._absent) > MAX_ABSENT:
                    self._absent.clear()
                return None
            group = self._decode(group_id, value)
            self._absent.pop(group_id, None)
            self._groups[group_id] = group
            self._stored[group_id] = value
            self._loaded(group)
            return group

    async def persist(self, group_id: str, expect: G | None = None) -> bool:
        """Store the group's current state if it changed; False if another gateway
        changed it meanwhile (then this copy is dropped), or if `expect` (the copy a
        request changed) is no longer the one in memory. Store failures propagate."""
        if not self.enabled:
            return True
        assert self._write is not None
        async with self._lock(group_id):
            group = self._groups.get(group_id)
            if expect is not None and group is not expect:
                return False
            if group is None:
                return True
            value = self._encode(group)
            before = self._stored.get(group_id)
            if value == before and group_id in self._stored:
                self._dirty.discard(group_id)
                return True
            if value is None and group_id not in self._stored:
                return True  # nothing to keep, and nothing kept
            self._dirty.add(group_id)  # until this write is known to have landed
            try:
                written = await self._write(group_id, value, before)
            except RequestTooLarge as e:
                # Kept in memory only: the stored (older) state goes, so a gateway taking
                # over starts the group afresh rather than from that.
                log.warning("%s group %s: too large to keep in the coordinator (%s); it will "
                            "rebalance if its coordinator moves", self.kind, group_id, e)
                value = None
                written = await self._write(group_id, None, before)
            if not written:
                log.warning("%s group %s: changed by another gateway; dropping this copy",
                            self.kind, group_id)
                if self._groups.get(group_id) is group:
                    self._lost(group_id)
                    self.forget(group_id)
                return False
            if self._groups.get(group_id) is group:
                self._stored[group_id] = value
                if value is None or self._encode(group) == value:
                    self._dirty.discard(group_id)
            self._absent.pop(group_id, None)
            return True

    def persist_soon(self, group_id: str) -> None:
        """Store a change no request waits for (a timer removed a member)."""
        if not self.enabled:
            return
        self._dirty.add(group_id)
        task = asyncio.get_running_loop().create_task(self._persist_quietly(group_id))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _persist_quietly(self, group_id: str) -> None:
        try:
            await self.persist(group_id)
        except Exception as e:  # noqa: BLE001 - the next change stores it again
            log.warning("%s group %s: storing its state failed: %s", self.kind, group_id, e)

    async def store_changes(self, group_id: str, expect: G | None) -> ErrorCode | None:
        """`persist` for a request: None once stored, else the error to answer."""
        try:
            stored = await self.persist(group_id, expect)
        except Exception as e:  # noqa: BLE001 - the coordinator is unreachable: retried
            log.warning("%s group %s: storing its state failed: %s", self.kind, group_id, e)
            return E.COORDINATOR_NOT_AVAILABLE
        return None if stored else E.NOT_COORDINATOR

    async def superseded(self, group_id: str) -> bool:
        """Whether the stored state differs from the one this copy was loaded or stored as
        (another gateway changed the group meanwhile)."""
        if not self.enabled or group_id not in self._stored:
            return False
        try:
            value = await self.read(group_id)
        except Exception:  # noqa: BLE001 - unreachable: answer from the copy, as before
            return False
        return value != self._stored[group_id]

    def drop_moved(self, owned: Callable[[str], bool], forget: Callable[[str], Any]) -> None:
        """Forget the groups another gateway coordinates now: if one comes back here, it
        is loaded again as that gateway left it."""
        if not self.enabled:
            return
        for group_id in [g for g in self._groups if not owned(g)]:
            log.info("%s group %s: coordinated elsewhere now, dropping it from memory",
                     self.kind, group_id)
            forget(group_id)
            self.forget(group_id)
