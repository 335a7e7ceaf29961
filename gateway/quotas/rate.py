"""The two measures quotas are enforced with, both driven by an injected clock.

`WindowedRate` is Kafka's sampled rate: usage is added to the newest of at most `samples`
windows of `window_s` seconds (quota.window.num, quota.window.size.seconds), windows older
than all of them are forgotten, and the rate is their total over the time from the start
of the oldest kept one to now, counted as at least one window (so one request is not
divided by a few milliseconds). Kafka counts that time as at least `samples - 1` windows
instead, as if an idle client had been sending nothing for that long: such a client may
then send 10 s of its quota at once and get it again each time that burst's window
expires, so its rate measured over tens of seconds is well off its quota. Counting from
its first byte, a client is ahead of its quota by at most one window.

The throttle time is how long until the rate is back at the quota Q if nothing more is
recorded: with total T kept since the oldest window's start s, the time s + T / Q, or
another time when windows expire before then: each takes its usage along, and moves the
span's start to the next window. Kafka's formula, W * (rate - Q) / Q over span W, leaves
the expiries out: it says too long when the oldest window, about to go, holds much (a
throttled client is held below its quota) and too short when it holds little and a gap
follows it (the client is throttled again as soon as it is back).

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
        """Seconds the rate is measured over: from the oldest kept window's start, at least
        one window."""
        self._purge(now)
        elapsed = now - self._windows[0][0] if self._windows else 0.0
        return max(elapsed, self.window_s)

    def total(self, now: float) -> float:
        """Usage within the kept windows."""
        self._purge(now)
        return sum(w[1] for w in self._windows)

    def rate(self, now: float) -> float:
        """Usage per second over the kept windows."""
        span = self.span(now)
        return self.total(now) / span

    def throttle_s(self, quota: float, now: float) -> float:
        """How long until the rate is back at `quota` with nothing more recorded, 0 when it
        is not over it. Between two expiries the kept total T is fixed and the span grows
        with the clock, so the rate is back at Q once the span reaches T / Q; each window
        that expires first lowers T and moves the span's start to the next one."""
        self._purge(now)
        horizon = self.samples * self.window_s
        total = sum(w[1] for w in self._windows)
        earliest = now
        for start, value in self._windows:
            if total <= quota * self.window_s:
                return earliest - now  # within the quota even over the shortest span
            back = max(earliest, start + total / quota)
            if back <= start + horizon:
                return back - now
            # This window expires first: from then on the rest is measured without it.
            earliest, total = start + horizon, total - value
        return earliest - now

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
