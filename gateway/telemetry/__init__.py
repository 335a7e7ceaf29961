"""Client telemetry (KIP-714): the subscription clients are given, the bounded store of
what they push, and its exposition on /metrics."""

from .manager import ClientTelemetry, TelemetryLimits
from .subscription import Subscription

__all__ = ["ClientTelemetry", "Subscription", "TelemetryLimits"]
