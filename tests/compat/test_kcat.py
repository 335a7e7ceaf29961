"""kcat (librdkafka's command-line client) against a real `stratalog serve`.

kcat has no way to create a topic, so topics are auto-created by the first produce with
the gateway's `num.partitions` (3 here). Its -H headers apply to every message of one run, so the
scenario records (each with its own headers) are produced one kcat run per record; a
second test produces many records in one run so librdkafka really compresses them (it
sends a batch uncompressed when compression would not make it smaller).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid

import pytest

KCAT = shutil.which("kcat")
if KCAT is None:
    pytest.skip("kcat is not installed", allow_module_level=True)


from .scenario import CODECS, records  # noqa: E402
from .stored_batches import CODEC_IDS, stored_codecs  # noqa: E402

KEY_DELIM = "|"


GATEWAY_SETTINGS = {"num.partitions": 3}


def kcat(*args: str, stdin: str | None = None, timeout: float = 30) -> str:
    proc = subprocess.run([KCAT, "-q", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"kcat {' '.join(args)} failed: {proc.stderr}"
    return proc.stdout


def produce(bootstrap: str, topic: str, lines: list[str], codec: str = "none",
            headers: list[tuple[str, bytes]] = (), null_values: bool = False, partition: int = 0,
            linger_ms: int | None = None) -> None:
    args = ["-P", "-b", bootstrap, "-t", topic, "-p", str(partition), "-K", KEY_DELIM,
            "-X", "acks=all"]
    if linger_ms is not None:
        args += ["-X", f"linger.ms={linger_ms}"]
    if codec != "none":
        args += ["-z", codec]
    if null_values:
        args.append("-Z")  # an empty value is sent as NULL
    for name, value in headers:
        args += ["-H", f"{name}={value.decode()}"]
    kcat(*args, stdin="".join(line + "\n" for line in lines))


def produce_row(bootstrap: str, topic: str, key: bytes | None, value: bytes | None,
                headers, codec: str) -> None:
    # Without the key delimiter kcat sends a NULL key; with -Z an empty value is NULL.
    line = value.decode() if value else ""
    if key is not None:
        line = key.decode() + KEY_DELIM + line
    produce(bootstrap, topic, [line], codec, headers, null_values=value is None)


def consume(*args: str) -> list[dict]:
    out = kcat("-C", "-J", "-e", *args)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def as_rows(msgs: list[dict]):
    def b(s):
        return None if s is None else s.encode()

    rows = []
    for m in msgs:
        flat = m.get("headers") or []  # kcat -J gives headers as [name, value, name, value, ...]
        rows.append((b(m["key"]), b(m["payload"]),
                     [(flat[i], flat[i + 1].encode()) for i in range(0, len(flat), 2)]))
    return rows


def test_metadata_lists_auto_created_topic(gateway):
    topic = f"kc-meta-{uuid.uuid4().hex[:6]}"
    produce(gateway.bootstrap, topic, ["k|v"])
    meta = json.loads(kcat("-L", "-J", "-b", gateway.bootstrap, "-t", topic))
    assert [b["name"] for b in meta["brokers"]] == [gateway.bootstrap]
    (t,) = meta["topics"]
    assert t["topic"] == topic
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
    assert all(p["leader"] == meta["brokers"][0]["id"] for p in t["partitions"])


@pytest.mark.parametrize("codec", CODECS)
def test_scenario_records_by_assignment(gateway, codec):
    topic = f"kc-{codec}-{uuid.uuid4().hex[:6]}"
    rows = records(codec)
    for key, value, headers in rows:
        produce_row(gateway.bootstrap, topic, key, value, headers, codec)
    msgs = consume("-b", gateway.bootstrap, "-t", topic, "-p", "0", "-o", "beginning")
    assert [m["offset"] for m in msgs] == list(range(len(rows)))
    assert as_rows(msgs) == rows
    # from an absolute offset, a count limit, and a relative offset from the end
    tail = consume("-b", gateway.bootstrap, "-t", topic, "-p", "0", "-o", "15", "-c", "3")
    assert [m["offset"] for m in tail] == [15, 16, 17]
    last = consume("-b", gateway.bootstrap, "-t", topic, "-p", "0", "-o", "-2")
    assert [m["offset"] for m in last] == [18, 19]


@pytest.mark.parametrize("codec", [c for c in CODECS if c != "none"])
def test_compressed_batches_round_trip(gateway, codec):
    topic = f"kc-bulk-{codec}-{uuid.uuid4().hex[:6]}"
    lines = [f"key-{i % 9}{KEY_DELIM}{codec} payload {i} " + "abc" * (i % 13) for i in range(500)]
    # A long linger puts all 500 in full batches even when kcat is slow to read its input (on
    # a busy machine the first record went alone, uncompressed, with the default 5 ms).
    produce(gateway.bootstrap, topic, lines, codec, headers=[("codec", codec.encode())], linger_ms=3000)
    codecs = stored_codecs(gateway.bootstrap, topic)
    assert codecs and set(codecs) == {CODEC_IDS[codec]}  # librdkafka really compressed them
    msgs = consume("-b", gateway.bootstrap, "-t", topic, "-p", "0", "-o", "beginning")
    assert [m["offset"] for m in msgs] == list(range(len(lines)))
    expected = [(line.split(KEY_DELIM)[0].encode(), line.split(KEY_DELIM)[1].encode(),
                 [("codec", codec.encode())]) for line in lines]
    assert as_rows(msgs) == expected


def test_group_commit_and_resume(gateway):
    topic = f"kc-group-{uuid.uuid4().hex[:6]}"
    values = [f"v{i}" for i in range(30)]
    for p in range(3):
        produce(gateway.bootstrap, topic, [f"k{i}{KEY_DELIM}{values[i]}" for i in range(p, 30, 3)],
                partition=p)
    group = ["-b", gateway.bootstrap, "-G", f"g-{topic}", "-X", "auto.offset.reset=earliest",
             "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500"]
    # kcat commits the offsets of the messages it printed when it leaves the group
    first = [json.loads(x) for x in kcat(*group, "-J", "-c", "12", topic).splitlines()]
    assert len(first) == 12
    # -e: leave once every assigned partition is at its end
    rest = [json.loads(x) for x in kcat(*group, "-J", "-e", topic).splitlines()]
    seen = sorted(m["payload"] for m in first + rest)
    assert seen == sorted(values)  # nothing lost, nothing twice
    again = kcat(*group, "-J", "-e", topic)
    assert again.strip() == ""  # everything was committed


def test_seek_by_timestamp(gateway):
    topic = f"kc-ts-{uuid.uuid4().hex[:6]}"
    # kcat stamps records with the producer's clock; two runs apart give two timestamps
    produce(gateway.bootstrap, topic, [f"k{KEY_DELIM}early-{i}" for i in range(5)])
    time.sleep(0.05)
    produce(gateway.bootstrap, topic, [f"k{KEY_DELIM}late-{i}" for i in range(5)])
    msgs = consume("-b", gateway.bootstrap, "-t", topic, "-p", "0", "-o", "beginning")
    stamps = [m["ts"] for m in msgs]
    assert stamps == sorted(stamps) and stamps[4] < stamps[5]
    assert all(m["tstype"] == "create" for m in msgs)
    late = stamps[5]

    found = json.loads(kcat("-Q", "-J", "-b", gateway.bootstrap, "-t", f"{topic}:0:{late}"))
    assert found[topic]["0"]["offset"] == 5
    found = json.loads(kcat("-Q", "-J", "-b", gateway.bootstrap, "-t", f"{topic}:0:{stamps[0] - 1}"))
    assert found[topic]["0"]["offset"] == 0
    found = json.loads(kcat("-Q", "-J", "-b", gateway.bootstrap, "-t", f"{topic}:0:{late + 60_000}"))
    assert found[topic]["0"]["offset"] == -1  # past the last record

    after = consume("-b", gateway.bootstrap, "-t", topic, "-p", "0", "-o", f"s@{late}")
    assert [m["payload"] for m in after] == [f"late-{i}" for i in range(5)]
    before = consume("-b", gateway.bootstrap, "-t", topic, "-p", "0", "-o", "beginning",
                     "-o", f"e@{late}")
    assert [m["payload"] for m in before] == [f"early-{i}" for i in range(5)]
