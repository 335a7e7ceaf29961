"""Client quotas (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546, KIP-599): which quota applies
(`rules`), how usage is measured (`rate`), one gateway's counters and the values it
follows from the coordinator (`manager`), and how a throttle reaches the client
(`throttling`)."""

from .manager import ClientQuotas, user_of

__all__ = ["ClientQuotas", "user_of"]
