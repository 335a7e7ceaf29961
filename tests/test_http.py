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
    # The process's collections are timed (gateway/gc_schedule.py): young ones have run.
    young = next(line for line in text.splitlines()
                 if line.startswith('stratalog_gc_pause_seconds_count{generation="0"}'))
    assert float(young.split()[-1]) > 0


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


def _replace(gateway, headers: dict) -> int:
    req = urllib.request.Request(gateway.http_url + "/v1/topics/none/partitions/0/segments/replace",
                                 data=b'{"remove": [0], "add": []}', method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_admin_api_needs_the_bearer_token_when_one_is_set(gateway_factory, tmp_path):
    token = "admin-token-" + uuid.uuid4().hex
    (tmp_path / "token").write_text(token + "\n")
    gw = gateway_factory(settings={"http.admin.token.file": str(tmp_path / "token")})
    assert _replace(gw, {}) == 401
    assert _replace(gw, {"Authorization": "Bearer wrong-token-of-some-length"}) == 401
    assert _replace(gw, {"Authorization": f"Bearer {token}"}) == 404  # past authentication: not led here
    assert _get(gw.http_url + "/metrics")[0] == 200  # metrics and health stay open


def test_without_a_token_the_admin_api_answers_loopback_clients_only():
    from types import SimpleNamespace

    from stratalog.gateway.http import HttpServer

    server = HttpServer(None, "0.0.0.0", 0)
    assert server._refused(SimpleNamespace(remote="127.0.0.1", headers={})) is None
    assert server._refused(SimpleNamespace(remote="::1", headers={})) is None
    assert server._refused(SimpleNamespace(remote="10.1.2.3", headers={})).status == 403


def test_a_short_or_missing_token_file_stops_serve(gateway_factory, tmp_path):
    import subprocess
    import sys

    (tmp_path / "short").write_text("abc")
    for path, message in ((tmp_path / "short", "at least 16"), (tmp_path / "absent", "No such file")):
        out = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "serve", "--data-dir", str(tmp_path / "d"),
                              "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                              "--set", f"http.admin.token.file={path}"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 1 and message in out.stderr, out.stderr


def test_replace_refuses_objects_of_another_partition(gateway_factory):
    """A swap may only name objects under the partition's own prefix: pointing a partition at
    another topic's segments would serve them past that topic's ACLs."""
    import json
    import time

    from stratalog.spark.metadata import ManifestMetadata, TopicNotFound
    from stratalog.spark.objects import StoreSpec

    gw = gateway_factory(settings={"log.roll.ms": 300})
    topic, other = f"own-{uuid.uuid4().hex[:6]}", f"secret-{uuid.uuid4().hex[:6]}"
    p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
    for t in (topic, other):
        p.produce(t, value=b"x" * 100)
    assert p.flush(20) == 0
    meta = {t: ManifestMetadata(StoreSpec((gw.data_dir / "objects").as_uri()).open(), t) for t in (topic, other)}
    deadline = time.monotonic() + 30
    segments = {}
    while len(segments) < 2 and time.monotonic() < deadline:
        for t, m in meta.items():
            try:
                segs = m.snapshot().partitions[0].segments
                if segs:
                    segments[t] = segs[0]
            except TopicNotFound:
                pass
        time.sleep(0.2)
    mine, theirs = segments[topic], segments[other]
    body = {"remove": [mine.base_offset], "add": [{
        "base_offset": mine.base_offset, "last_offset": mine.last_offset, "key_base": theirs.key_base,
        "size": theirs.size, "min_timestamp": theirs.min_timestamp, "max_timestamp": theirs.max_timestamp,
        "leader_epoch": theirs.leader_epoch}]}
    req = urllib.request.Request(gw.http_url + f"/v1/topics/{topic}/partitions/0/segments/replace",
                                 data=json.dumps(body).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 409 and "objects of this partition" in e.value.read().decode()
