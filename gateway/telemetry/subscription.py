"""The client metrics subscription every client gets (KIP-714).

Kafka configures subscriptions per CLIENT_METRICS resource (`kafka-client-metrics.sh`:
`metrics`, `interval.ms`, `match`); here one subscription, from the broker settings
`client.metrics.metrics` and `client.metrics.interval.ms`, applies to every client.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import crc32c

from stratalog.tiering.compression import GZIP, LZ4, SNAPPY, ZSTD

ALL_METRICS = "*"
# What a PushTelemetry may be compressed with, best first (the client picks the first it
# supports); uncompressed pushes are always accepted.
ACCEPTED_COMPRESSION = (ZSTD, LZ4, GZIP, SNAPPY)


@dataclass(frozen=True, slots=True)
class Subscription:
    metrics: tuple[str, ...]  # name prefixes; empty: none, ("*",): every metric
    interval_ms: int

    @classmethod
    def parse(cls, metrics: str, interval_ms: int) -> "Subscription":
        prefixes = tuple(sorted({p.strip() for p in metrics.split(",") if p.strip()}))
        if ALL_METRICS in prefixes:
            prefixes = (ALL_METRICS,)
        return cls(prefixes, interval_ms)

    def wants(self, name: str) -> bool:
        """Whether a pushed metric is one this subscription asked for (a client may send
        more; only these are kept)."""
        if self.metrics == (ALL_METRICS,):
            return True
        return any(name.startswith(p) for p in self.metrics)

    def id_for(self, client_instance_id: uuid.UUID) -> int:
        """The subscription id a client must push with: a hash of what is asked, how often
        and of whom, so a change of the settings gives every client a new id (its next push
        is refused UNKNOWN_SUBSCRIPTION_ID and it asks again)."""
        text = f"{','.join(self.metrics)}|{self.interval_ms}|{client_instance_id}"
        value = crc32c.crc32c(text.encode())
        return value - 2**32 if value >= 2**31 else value
