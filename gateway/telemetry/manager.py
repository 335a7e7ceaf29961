"""Client telemetry (KIP-714): which client instances the gateway knows, what they must
send and how often, and the latest value of each metric they pushed.

Every resource a client can make this spend is bounded by a setting: instances kept
(`client.metrics.max.instances`, the least recently heard from is forgotten first),
series kept in all (`client.metrics.max.series`) and per instance
(`client.metrics.max.series.per.instance`; past either, new series are dropped and
counted), the size of a push (`telemetry.max.bytes`, ten times that once decompressed),
and how long a silent instance is kept (`client.metrics.instance.expiry.ms`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator

from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.tiering.compression import NONE

from .payload import BadPayload, Labels, Point, decode
from .subscription import ACCEPTED_COMPRESSION, Subscription

log = logging.getLogger(__name__)

ZERO_UUID = uuid.UUID(int=0)
RESERVED_IDS = (ZERO_UUID, uuid.UUID(int=1))  # Kafka's reserved UUIDs: never a client instance
DECOMPRESSED_FACTOR = 10  # a push may inflate to this many times telemetry.max.bytes
# Pushes a little early are timer jitter, not abuse: too often is sooner than this share of
# the interval after the previous push (or GetTelemetrySubscriptions).
EARLY_SLACK = 0.9
MAX_CLIENT_ID = 200
# A push refused with these tells the client to fetch the subscription again: that fetch is
# answered even within the interval.
ASK_AGAIN = (ErrorCode.UNKNOWN_SUBSCRIPTION_ID, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)

SeriesKey = tuple[str, Labels]


@dataclass(slots=True)
class ClientInstance:
    instance_id: uuid.UUID
    client_id: str
    subscription_id: int
    seen_ms: float  # the last request from it: what expiry counts from
    last_get_ms: float | None = None
    last_push_ms: float | None = None
    last_error: int = 0  # of its last push (ASK_AGAIN: it may fetch the subscription at once)
    terminating: bool = False
    series: dict[SeriesKey, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TelemetryLimits:
    max_bytes: int
    max_instances: int
    max_series: int
    max_series_per_instance: int
    expiry_ms: int

    @classmethod
    def from_config(cls, config) -> "TelemetryLimits":
        return cls(config["telemetry.max.bytes"], config["client.metrics.max.instances"],
                   config["client.metrics.max.series"], config["client.metrics.max.series.per.instance"],
                   config["client.metrics.instance.expiry.ms"])


class ClientTelemetry:
    def __init__(self, subscription: Subscription, limits: TelemetryLimits,
                 clock: Callable[[], float] = time.monotonic):
        self.subscription = subscription
        self.limits = limits
        self.clock = clock  # seconds
        self.instances: OrderedDict[uuid.UUID, ClientInstance] = OrderedDict()  # least recently heard first
        self.series_count = 0
        self.dropped_series = 0  # new series refused by a series cap
        self.evicted = 0  # instances forgotten by the instance cap before their expiry
        self.refused: dict[str, int] = {}  # pushes and subscription requests refused, by error

    @classmethod
    def from_config(cls, config) -> "ClientTelemetry":
        return cls(Subscription.parse(config["client.metrics.metrics"], config["client.metrics.interval.ms"]),
                   TelemetryLimits.from_config(config))

    def _now_ms(self) -> float:
        return self.clock() * 1000

    # ---- the two APIs -------------------------------------------------------------------

    def get_subscriptions(self, instance_id: uuid.UUID | None, client_id: str | None) -> dict:
        """GetTelemetrySubscriptions: the subscription, assigning an instance id to a client
        that sends the zero one."""
        now = self._now_ms()
        self.expire()
        if instance_id is None or instance_id == ZERO_UUID:
            instance_id = self._new_id()
        inst = self._instance(instance_id, client_id, now)
        sub = self.subscription
        code = 0
        if (inst.last_get_ms is not None and inst.last_error not in ASK_AGAIN
                and now - inst.last_get_ms < sub.interval_ms * EARLY_SLACK):
            code = self._refuse(ErrorCode.THROTTLING_QUOTA_EXCEEDED)
        else:
            inst.last_get_ms = now
            inst.last_error = 0
        return {"throttle_time_ms": 0, "error_code": code, "client_instance_id": instance_id,
                "subscription_id": inst.subscription_id, "accepted_compression_types": list(ACCEPTED_COMPRESSION),
                "push_interval_ms": sub.interval_ms, "telemetry_max_bytes": self.limits.max_bytes,
                # Cumulative sums: the latest value of a counter is then its value.
                "delta_temporality": False, "requested_metrics": list(sub.metrics)}

    def push(self, instance_id: uuid.UUID | None, subscription_id: int, terminating: bool,
             compression: int, metrics: bytes, client_id: str | None) -> tuple[int, str | None]:
        """PushTelemetry in one step: keep the pushed values; the error code and why."""
        code, why, inst = self.admit_push(instance_id, subscription_id, terminating, compression, metrics, client_id)
        if inst is None:
            return code, why
        return self.finish_push(inst, self.decode(compression, metrics))

    def admit_push(self, instance_id: uuid.UUID | None, subscription_id: int, terminating: bool,
                   compression: int, metrics: bytes,
                   client_id: str | None) -> tuple[int, str | None, ClientInstance | None]:
        """PushTelemetry's checks: the refusal, or the instance whose payload is to be decoded
        (`decode`, which may run off the event loop) and kept (`finish_push`)."""
        now = self._now_ms()
        self.expire()
        if instance_id is None or instance_id in RESERVED_IDS:
            return self._refuse(ErrorCode.INVALID_REQUEST), "a push needs the client instance id it was given", None
        inst = self._instance(instance_id, client_id, now)
        code, why = self._check_push(inst, subscription_id, terminating, compression, metrics, now)
        if terminating:
            inst.terminating = True  # the client is leaving, whether or not this push is taken
        if code:
            inst.last_error = self._refuse(code)
            return code, why, None
        return 0, None, inst

    def decode(self, compression: int, metrics: bytes) -> list[Point] | BadPayload:
        """The payload's points, or why it cannot be read; touches no state."""
        try:
            return decode(compression, metrics, limit=self.limits.max_bytes * DECOMPRESSED_FACTOR)
        except BadPayload as err:
            return err

    def finish_push(self, inst: ClientInstance, points: list[Point] | BadPayload) -> tuple[int, str | None]:
        if isinstance(points, BadPayload):
            inst.last_error = self._refuse(ErrorCode.INVALID_RECORD)
            return ErrorCode.INVALID_RECORD, str(points)
        inst.last_error = 0
        if self.instances.get(inst.instance_id) is inst:  # not forgotten while its payload was decoded
            self._keep(inst, points)
        return 0, None

    def _check_push(self, inst: ClientInstance, subscription_id: int, terminating: bool, compression: int,
                    metrics: bytes, now: float) -> tuple[int, str | None]:
        if inst.terminating:
            return ErrorCode.INVALID_REQUEST, "the client instance already sent its terminating push"
        # The first push after a subscription was fetched is welcome; later ones wait the interval.
        last = inst.last_push_ms
        fresh = last is None or (inst.last_get_ms is not None and inst.last_get_ms > last)
        too_soon = last is not None and not fresh and now - last < self.subscription.interval_ms * EARLY_SLACK
        if too_soon and not terminating:
            return ErrorCode.THROTTLING_QUOTA_EXCEEDED, "pushed sooner than the push interval"
        if subscription_id != inst.subscription_id:
            return ErrorCode.UNKNOWN_SUBSCRIPTION_ID, "the subscription changed: ask for it again"
        if compression != NONE and compression not in ACCEPTED_COMPRESSION:
            return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"compression type {compression} is not accepted"
        if len(metrics) > self.limits.max_bytes:
            return ErrorCode.TELEMETRY_TOO_LARGE, f"{len(metrics)} bytes, telemetry.max.bytes is {self.limits.max_bytes}"
        inst.last_push_ms = now
        return 0, None

    # ---- instances and series ---------------------------------------------------------------

    def _new_id(self) -> uuid.UUID:
        while True:
            candidate = uuid.uuid4()
            if candidate not in self.instances and candidate not in RESERVED_IDS:
                return candidate

    def _instance(self, instance_id: uuid.UUID, client_id: str | None, now: float) -> ClientInstance:
        inst = self.instances.get(instance_id)
        if inst is None:
            while len(self.instances) >= self.limits.max_instances:
                self._forget(next(iter(self.instances)))
                self.evicted += 1
            inst = ClientInstance(instance_id, (client_id or "")[:MAX_CLIENT_ID],
                                  self.subscription.id_for(instance_id), now)
            self.instances[instance_id] = inst
        inst.seen_ms = now
        self.instances.move_to_end(instance_id)
        return inst

    def _forget(self, instance_id: uuid.UUID) -> None:
        inst = self.instances.pop(instance_id)
        self.series_count -= len(inst.series)

    def expire(self) -> None:
        """Forget instances not heard from for client.metrics.instance.expiry.ms."""
        cutoff = self._now_ms() - self.limits.expiry_ms
        while self.instances:
            oldest = next(iter(self.instances.values()))
            if oldest.seen_ms > cutoff:
                break
            self._forget(oldest.instance_id)

    def _keep(self, inst: ClientInstance, points) -> None:
        for p in points:
            if not self.subscription.wants(p.name):
                continue
            key = (p.name, p.labels)
            previous = inst.series.get(key)
            if previous is None:
                if (self.series_count >= self.limits.max_series
                        or len(inst.series) >= self.limits.max_series_per_instance):
                    self.dropped_series += 1
                    continue
                self.series_count += 1
                inst.series[key] = p.value
            else:
                inst.series[key] = previous + p.value if p.delta else p.value

    def _refuse(self, code: int) -> int:
        name = ErrorCode(code).name
        self.refused[name] = self.refused.get(name, 0) + 1
        return code

    def samples(self) -> Iterator[tuple[str, Labels, float, ClientInstance]]:
        """Every kept value: metric name, the point's labels, value, and whose it is."""
        self.expire()
        for inst in list(self.instances.values()):
            for (name, labels), value in inst.series.items():
                yield name, labels, value, inst
