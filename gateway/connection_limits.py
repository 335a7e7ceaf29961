"""Kafka's connection quotas, across every listener of one gateway: `max.connections`,
`max.connections.per.ip` (with `max.connections.per.ip.overrides`) and
`max.connection.creation.rate`. A connection past a limit is closed as soon as it is
accepted, before anything is read from it, and counted in `refused`.

`connections.max.idle.ms` is applied by the server (a connection with nothing to read
and nothing to answer for that long is closed).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Callable

from .config import BrokerConfig, ConfigError


def parse_overrides(text: str) -> dict[str, int]:
    """`max.connections.per.ip.overrides`: "host:count,host:count" (Kafka's form)."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.strip().isdigit():
            raise ConfigError(f"max.connections.per.ip.overrides: {item!r} is not host:count")
        out[host.strip().strip("[]")] = int(count)
    return out


class ConnectionLimits:
    def __init__(self, config: BrokerConfig, clock: Callable[[], float] = time.monotonic):
        self.max_connections = config["max.connections"]
        self.per_ip = config["max.connections.per.ip"]
        self.overrides = parse_overrides(config["max.connections.per.ip.overrides"])
        self.creation_rate = config["max.connection.creation.rate"]
        self.clock = clock
        self.open: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # by reason
        self._created: deque[float] = deque()  # accept times within the last second

    @property
    def total(self) -> int:
        return sum(self.open.values())

    def admit(self, ip: str) -> str | None:
        """Count a new connection from `ip` in, or say (as the setting's name) why not."""
        now = self.clock()
        while self._created and now - self._created[0] >= 1.0:
            self._created.popleft()
        reason = None
        if self.total >= self.max_connections:
            reason = "max.connections"
        elif self.open[ip] >= self.overrides.get(ip, self.per_ip):
            reason = "max.connections.per.ip"
        elif len(self._created) >= self.creation_rate:
            reason = "max.connection.creation.rate"
        if reason is not None:
            self.refused[reason] += 1
            return reason
        self._created.append(now)
        self.open[ip] += 1
        return None

    def release(self, ip: str) -> None:
        self.open[ip] -= 1
        if self.open[ip] <= 0:
            del self.open[ip]
