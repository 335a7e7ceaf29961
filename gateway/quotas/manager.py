"""One gateway's client quotas: the values set in the coordinator, followed through a
watch, and the usage counted against them here.

Each gateway counts only the requests it serves (Kafka's brokers do the same): a producer
spread over three gateways may send up to three times its producer_byte_rate in all, one
that talks to one gateway is held to it exactly. Usage counters exist only for clients a
quota applies to, and one idle past the whole quota window is dropped (its rate is zero
then, so dropping it changes nothing): their number is bounded by the clients active in
the last window.
"""

from __future__ import annotations

import time
from typing import Callable

from stratalog.gateway.following import Following

from . import rules
from .rate import TokenBucket, WindowedRate
from .rules import Entity, Tags

MAX_THROTTLE_MS = 2**31 - 1  # the protocol's int32
SWEEP_EVERY = 1024  # recordings between two sweeps of idle counters

CONSUMER = rules.CONSUMER_BYTE_RATE
# The quota types as metrics name them.
KINDS = {rules.PRODUCER_BYTE_RATE: "produce", rules.CONSUMER_BYTE_RATE: "fetch",
         rules.REQUEST_PERCENTAGE: "request", rules.CONTROLLER_MUTATION_RATE: "controller_mutation"}


def user_of(principal: str) -> str:
    """The user name of a principal (`User:alice` -> alice; ANONYMOUS when unauthenticated)."""
    return principal.split(":", 1)[1] if ":" in principal else principal


class ClientQuotas:
    """The quotas in force here and the usage counted against them; `record` returns the
    throttle time a request earns."""

    def __init__(self, store, *, samples: int, window_s: float, mutation_samples: int,
                 mutation_window_s: float, clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.samples, self.window_s = samples, window_s
        self.mutation_samples, self.mutation_window_s = mutation_samples, mutation_window_s
        self.clock = clock
        self.quotas: dict[Entity, dict[str, float]] = {}
        self._rates: dict[tuple[str, Tags], WindowedRate] = {}
        self._buckets: dict[Tags, TokenBucket] = {}
        self._recorded = 0
        self.throttled_ms: dict[str, int] = {kind: 0 for kind in KINDS.values()}  # metrics
        self.throttled: dict[str, int] = {kind: 0 for kind in KINDS.values()}
        self._following = Following("client quota", lambda: self.store.watch_client_quotas(), self.reload)

    # ---- following the coordinator ----------------------------------------------------

    async def start(self) -> None:
        await self._following.start()

    async def stop(self) -> None:
        await self._following.stop()

    async def reload(self) -> None:
        self.quotas = {q.entity: q.values for q in await self.store.client_quotas()}

    # ---- counting and throttling ------------------------------------------------------

    @property
    def any_set(self) -> bool:
        """Whether any quota is set, for any client (mostly none: then nothing is counted)."""
        return bool(self.quotas)

    def _rate(self, key: str, principal: str, client_id: str | None) -> tuple[float, WindowedRate] | None:
        if not self.quotas:  # none set anywhere, as mostly: every request asks
            return None
        found = rules.applicable(self.quotas, key, user_of(principal), client_id or "")
        if found is None:
            return None
        quota, tags = found
        sensor = self._rates.get((key, tags))
        if sensor is None:
            sensor = self._rates[(key, tags)] = WindowedRate(self.samples, self.window_s)
        return quota, sensor

    def _throttle_ms(self, key: str, seconds: float) -> int:
        if seconds <= 0:
            return 0
        ms = min(int(round(seconds * 1000)), MAX_THROTTLE_MS)
        kind = KINDS[key]
        self.throttled_ms[kind] += ms
        self.throttled[kind] += 1
        return ms

    def record(self, key: str, principal: str, client_id: str | None, value: float) -> int:
        """Count `value` (bytes, or percent of the event loop's second) against quota `key`;
        the throttle time in ms it earns (0: within the quota, or none applies)."""
        found = self._rate(key, principal, client_id)
        if found is None:
            return 0
        quota, sensor = found
        now = self.clock()
        sensor.record(value, now)
        self._maybe_sweep(now)
        return self._throttle_ms(key, min(sensor.throttle_s(quota, now), self._most_s(key)))

    def _most_s(self, key: str) -> float:
        """The longest throttle a request may earn: one window for the request quota, as
        Kafka bounds it (a client still over then is throttled again on its next request);
        the whole span for a byte rate, by when every kept window has expired (Kafka sets
        no bound there; one request far over its quota mutes a connection no longer)."""
        if key == rules.REQUEST_PERCENTAGE:
            return self.window_s
        return self.samples * self.window_s

    def unrecord(self, key: str, principal: str, client_id: str | None, value: float) -> None:
        """Take back usage recorded for a response that was not sent after all (a throttled
        Fetch is answered empty)."""
        found = self._rate(key, principal, client_id)
        if found is not None:
            found[1].record(-value, self.clock())

    def fetch_allowance(self, principal: str, client_id: str | None) -> int | None:
        """Most bytes a Fetch may return now without taking the client over its
        consumer_byte_rate (at least 1: the fetch still returns one batch, and is answered
        empty and throttled if that batch is too much); None when no quota applies. Kafka
        bounds a fetch by quota.window.num - 1 windows of the quota (bursts); what
        is left of the quota over the span keeps it even, and hands out no bytes that
        are then taken back."""
        found = self._rate(CONSUMER, principal, client_id)
        if found is None:
            return None
        quota, sensor = found
        now = self.clock()
        return max(1, int(quota * sensor.span(now) - sensor.total(now)))

    # ---- controller mutations (KIP-599) -----------------------------------------------

    def _bucket(self, principal: str, client_id: str | None) -> tuple[float, TokenBucket] | None:
        found = rules.applicable(self.quotas, rules.CONTROLLER_MUTATION_RATE, user_of(principal), client_id or "")
        if found is None:
            return None
        quota, tags = found
        bucket = self._buckets.get(tags)
        if bucket is None:
            bucket = self._buckets[tags] = TokenBucket(self.mutation_samples, self.mutation_window_s)
        return quota, bucket

    def mutation_throttle_ms(self, principal: str, client_id: str | None) -> int:
        """The throttle time while the client's mutation budget is spent (strict mode refuses
        the next topic then), 0 while it is not."""
        found = self._bucket(principal, client_id)
        if found is None:
            return 0
        quota, bucket = found
        return min(int(round(bucket.throttle_s(quota, self.clock()) * 1000)), MAX_THROTTLE_MS)

    def record_mutations(self, principal: str, client_id: str | None, count: int) -> None:
        """Take `count` partition mutations (created, deleted or added) from the budget."""
        found = self._bucket(principal, client_id)
        if found is not None and count > 0:
            now = self.clock()
            found[1].record(count, found[0], now)
            self._maybe_sweep(now)

    def mutation_throttled(self, throttle_ms: int) -> int:
        """Count a response throttled by the mutation quota (metrics); returns throttle_ms."""
        return self._throttle_ms(rules.CONTROLLER_MUTATION_RATE, throttle_ms / 1000)

    # ---- bounds ----------------------------------------------------------------------

    def _maybe_sweep(self, now: float) -> None:
        self._recorded += 1
        if self._recorded % SWEEP_EVERY:
            return
        for k in [k for k, s in self._rates.items() if s.idle(now)]:
            del self._rates[k]
        for tags in [t for t, b in self._buckets.items() if b.idle(now)]:
            del self._buckets[tags]

    def counters(self) -> int:
        """Usage counters held now (for tests and metrics)."""
        return len(self._rates) + len(self._buckets)
