"""The two measures quotas are enforced with, both driven by an injected clock.

`WindowedRate` is Kafka's sampled rate: usage is added to the newest of at most `samples`
windows of `window_s` seconds (quota.window.num, quota.window.size.seconds), windows older
than all of them are forgotten, and the rate is their total over the time they span,
counted as at least `samples - 1` whole windows (so one burst on an idle client is spread
over the full span, not divided by a few milliseconds). When the rate is over the quota Q,
the client must stay quiet until it is back at Q: with total T over span W that is
T / Q - W = W * (rate - Q) / Q, the throttle time.

`TokenBucket` is KIP-599's measure for controller mutations: it holds up to
Q * samples * window_s tokens (the burst), refills at Q per second and each mutation (a
partition created or deleted) takes one; it is over its quota once it is below zero, and
the throttle time is how long the refill takes to bring it back to zero.
"""

from __future__ import annotations

from collections import deque


class WindowedRate:
    __slots__ = ("samples", "window_s", "_windows", "last_used")

    def __init__(self, samples: int, window_s: float):
        self.samples = samples
        self.window_s = window_s
        self._windows: deque[list[float]] = deque()  # [start, total], oldest first
        self.last_used = 0.0

    def _purge(self, now: float) -> None:
        horizon = now - self.samples * self.window_s
        while self._windows and self._windows[0][0] < horizon:
            self._windows.popleft()

    def record(self, value: float, now: float) -> None:
        self.last_used = now
        self._purge(now)
        if not self._windows or now >= self._windows[-1][0] + self.window_s:
            self._windows.append([now, 0.0])
            if len(self._windows) > self.samples:
                self._windows.popleft()
        self._windows[-1][1] += value

    def span(self, now: float) -> float:
        """Seconds the rate is measured over (never less than samples - 1 windows)."""
        self._purge(now)
        elapsed = now - self._windows[0][0] if self._windows else 0.0
        least = (self.samples - 1) * self.window_s
        whole = int(elapsed // self.window_s)
        if whole < self.samples - 1:
            elapsed += (self.samples - 1 - whole) * self.window_s
        return max(elapsed, least, 1e-9)

    def total(self, now: float) -> float:
        """Usage within the kept windows."""
        self._purge(now)
        return sum(w[1] for w in self._windows)

    def rate(self, now: float) -> float:
        """Usage per second over the kept windows."""
        span = self.span(now)
        return self.total(now) / span

    def throttle_s(self, quota: float, now: float) -> float:
        """How long until the rate is back at `quota`, 0 when it is not over it."""
        rate = self.rate(now)
        if rate <= quota:
            return 0.0
        return (rate - quota) / quota * self.span(now)

    def idle(self, now: float) -> bool:
        """Nothing recorded within the kept windows: its rate is 0, forgetting it is exact."""
        return now - self.last_used > self.samples * self.window_s


class TokenBucket:
    __slots__ = ("samples", "window_s", "tokens", "last_used", "_at", "_quota")

    def __init__(self, samples: int, window_s: float):
        self.samples = samples
        self.window_s = window_s
        self.tokens: float | None = None  # full until first used
        self._at = 0.0
        self._quota = 0.0
        self.last_used = 0.0

    def _refill(self, quota: float, now: float) -> float:
        burst = quota * self.samples * self.window_s
        if self.tokens is None:
            self.tokens = burst
        else:
            self.tokens = min(burst, self.tokens + max(0.0, now - self._at) * quota)
        self._at = now
        return self.tokens

    def record(self, value: float, quota: float, now: float) -> None:
        self._refill(quota, now)
        self.tokens = (self.tokens or 0.0) - value
        self.last_used, self._quota = now, quota

    def throttle_s(self, quota: float, now: float) -> float:
        """How long until the bucket is back at zero; 0 when it is not below it."""
        tokens = self._refill(quota, now)
        return 0.0 if tokens >= 0 else -tokens / quota

    def idle(self, now: float) -> bool:
        """Refilled to the full burst since last used: forgetting it is exact."""
        if self.tokens is None or self._quota <= 0:
            return True
        burst = self._quota * self.samples * self.window_s
        return self.tokens + (now - self._at) * self._quota >= burst
