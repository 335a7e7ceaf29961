"""The gateway's HTTP side: health, readiness and Prometheus metrics of real traffic."""

from __future__ import annotations

import urllib.request
import uuid

import pytest

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Producer  # noqa: E402


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read().decode()


def test_health_ready_and_metrics(gateway):
    assert gateway.http_url
    assert _get(gateway.http_url + "/healthz")[0] == 200
    status, body = _get(gateway.http_url + "/readyz")
    assert status == 200 and '"ready": true' in body
    topic = f"metrics-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": gateway.bootstrap, "acks": "all"})
    for _ in range(10):
        p.produce(topic, value=b"x" * 100)
    assert p.flush(20) == 0
    _, text = _get(gateway.http_url + "/metrics")
    assert 'stratalog_request_seconds_count{api="Produce"}' in text
    assert 'stratalog_wal_flush_seconds_count' in text
    assert 'stratalog_partitions_led 1.0' in text
    assert 'stratalog_object_store_requests_total{operation="put"}' in text


def test_replace_rejects_bad_requests(gateway):
    req = urllib.request.Request(gateway.http_url + "/v1/topics/none/partitions/0/segments/replace",
                                 data=b"not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    req = urllib.request.Request(gateway.http_url + "/v1/topics/none/partitions/0/segments/replace",
                                 data=b'{"remove": [0], "add": []}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 404
