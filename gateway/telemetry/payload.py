"""A PushTelemetry payload to data points: decompress (Kafka's codec numbers), then decode
OpenTelemetry's MetricsData protobuf with `opentelemetry-proto`.

Only gauges and sums carry one number per point; histograms, exponential histograms and
summaries are skipped (no client sends them under KIP-714's standard metrics)."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, MetricsData

from stratalog.tiering.batch import CorruptBatch
from stratalog.tiering.compression import CODEC_NAMES, decompress

# With these a kept series takes at most about 3 KB (name, 8 keys and values, Python's
# overhead), which is what client.metrics.max.series multiplies. Clients' standard metrics
# carry one to three short attributes and names under 100 characters.
MAX_LABELS = 8  # attributes kept per point; more are dropped
MAX_TEXT = 100  # characters kept of a metric name, attribute key or value

Labels = tuple[tuple[str, str], ...]


class BadPayload(ValueError):
    """The pushed bytes do not decompress or do not decode as MetricsData."""


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    labels: Labels  # the point's attributes, sorted by key
    value: float
    delta: bool  # a sum sent as the change since the previous push


def decode(codec: int, data: bytes, *, limit: int) -> list[Point]:
    """The gauge and sum points of a payload; `limit` bounds the decompressed size."""
    if codec not in CODEC_NAMES:
        raise BadPayload(f"unknown compression type {codec}")
    try:
        raw = decompress(codec, data, limit=limit) if data else b""
    except CorruptBatch as err:
        raise BadPayload(str(err)) from err
    if len(raw) > limit:
        raise BadPayload(f"metrics of {len(raw)} bytes are larger than {limit}")
    message = MetricsData()
    try:
        message.ParseFromString(raw)
    except (ProtobufDecodeError, RuntimeError, ValueError) as err:
        raise BadPayload(f"not OpenTelemetry MetricsData: {err}") from err
    points: list[Point] = []
    for resource in message.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                kind = metric.WhichOneof("data")
                if kind == "gauge":
                    data_points, delta = metric.gauge.data_points, False
                elif kind == "sum":
                    data_points = metric.sum.data_points
                    delta = metric.sum.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
                else:
                    continue
                name = metric.name[:MAX_TEXT]
                for p in data_points:
                    value = p.as_double if p.WhichOneof("value") == "as_double" else float(p.as_int)
                    points.append(Point(name, _labels(p.attributes), value, delta))
    return points


def _labels(attributes) -> Labels:
    out = {}
    for kv in attributes[:MAX_LABELS]:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind in ("string_value", "bool_value", "int_value", "double_value"):
            text = str(getattr(v, kind))
            out[kv.key[:MAX_TEXT]] = text[:MAX_TEXT]
    return tuple(sorted(out.items()))
