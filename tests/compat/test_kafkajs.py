"""KafkaJS 2.2.4 against a real `stratalog serve`, driven through tests/clients/kafkajs/compat.js.

Each test sends the script one JSON job (a list of steps) and reads one JSON answer.
KafkaJS has no manual partition assignment: "by assignment" here is a fresh group that
seeks every partition to the wanted offset, the closest thing its API offers.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest


from .scenario import CODECS, records
from .stored_batches import CODEC_IDS, stored_codecs

CLIENT_DIR = Path(__file__).resolve().parent.parent / "clients" / "kafkajs"
NODE = shutil.which("node")
if NODE is None:
    pytest.skip("node is not installed", allow_module_level=True)
if not (CLIENT_DIR / "node_modules" / "kafkajs").is_dir():
    pytest.skip("kafkajs is not installed: run `npm install` in tests/clients/kafkajs",
                allow_module_level=True)


def run(bootstrap: str, *steps: dict, timeout: float = 60, security: dict | None = None) -> list:
    """Run the steps; `security` adds KafkaJS's "ssl" and "sasl" settings to the job."""
    job = json.dumps({"brokers": [bootstrap], "steps": list(steps), **(security or {})})
    proc = subprocess.run([NODE, str(CLIENT_DIR / "compat.js")], input=job, capture_output=True,
                          text=True, timeout=timeout, cwd=CLIENT_DIR)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"kafkajs printed nothing (exit {proc.returncode}): {proc.stderr[-3000:]}"
    answer = json.loads(lines[-1])
    assert proc.returncode == 0 and "error" not in answer, f"{answer}\n{proc.stderr[-3000:]}"
    return answer["results"]


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def to_wire(rows, timestamps: list[int] | None = None) -> list[dict]:
    return [{"key": b64(k), "value": b64(v), "headers": [[n, b64(x)] for n, x in h],
             "timestamp": timestamps[i] if timestamps else None}
            for i, (k, v, h) in enumerate(rows)]


def as_rows(msgs: list[dict]):
    return [(unb64(m["key"]), unb64(m["value"]), [(n, unb64(x)) for n, x in m["headers"]])
            for m in msgs]


@pytest.fixture(scope="module")
def missing_codecs() -> dict[str, str]:
    """Codecs whose npm package is not usable, with the reason (no broker needed)."""
    return run("127.0.0.1:1", {"op": "codecs"})[0]["missing"]


@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_consume_from_offset(gateway, codec, missing_codecs):
    if codec in missing_codecs:
        pytest.skip(f"KafkaJS has no {codec} codec here: {missing_codecs[codec]}")
    topic = f"js-{codec}-{uuid.uuid4().hex[:6]}"
    rows = records(codec)
    created, sent, got = run(
        gateway.bootstrap,
        {"op": "createTopic", "topic": topic, "partitions": 1},
        {"op": "produce", "topic": topic, "codec": codec, "records": to_wire(rows)},
        {"op": "consume", "topic": topic, "groupId": f"g-{topic}", "count": len(rows),
         "seek": [{"partition": 0, "offset": 0}]},
    )
    assert created == {"created": True, "partitions": [0]}
    assert sent == [{"partition": 0, "errorCode": 0, "baseOffset": 0}]
    assert set(stored_codecs(gateway.bootstrap, topic)) == {CODEC_IDS[codec]}
    assert [m["offset"] for m in got] == list(range(len(rows)))
    assert as_rows(got) == rows
    # from the middle: a seek lands on the exact record even inside a compressed batch
    (tail,) = run(gateway.bootstrap,
                  {"op": "consume", "topic": topic, "groupId": f"g2-{topic}", "count": 5,
                   "seek": [{"partition": 0, "offset": 15}]})
    assert [m["offset"] for m in tail] == [15, 16, 17, 18, 19]
    assert as_rows(tail) == rows[15:]


def test_idempotent_producer(gateway):
    topic = f"js-idem-{uuid.uuid4().hex[:6]}"
    rows = records("none", 10)
    _, first, second, got = run(
        gateway.bootstrap,
        {"op": "createTopic", "topic": topic},
        {"op": "produce", "topic": topic, "idempotent": True, "records": to_wire(rows[:5])},
        {"op": "produce", "topic": topic, "idempotent": True, "codec": "gzip",
         "records": to_wire(rows[5:])},
        {"op": "consume", "topic": topic, "groupId": f"g-{topic}", "count": 10},
    )
    assert (first[0]["baseOffset"], second[0]["baseOffset"]) == (0, 5)
    assert as_rows(got) == rows


def test_group_commit_and_resume(gateway):
    topic = f"js-group-{uuid.uuid4().hex[:6]}"
    group = f"g-{topic}"
    rows = [(f"k{i}".encode(), f"v{i}".encode(), []) for i in range(30)]
    steps = [{"op": "createTopic", "topic": topic, "partitions": 3}]
    steps += [{"op": "produce", "topic": topic, "partition": p, "records": to_wire(rows[p::3])}
              for p in range(3)]
    steps += [
        {"op": "consume", "topic": topic, "groupId": group, "count": 12, "limit": 12, "commit": True},
        {"op": "offsets", "topic": topic, "groupId": group},
        # a re-delivered record would arrive during the linger and show up as a duplicate
        {"op": "consume", "topic": topic, "groupId": group, "count": 18, "commit": True,
         "lingerMs": 500},
        {"op": "offsets", "topic": topic, "groupId": group},
    ]
    results = run(gateway.bootstrap, *steps)
    first, after_first, rest, after_rest = results[4:]
    assert len(first) == 12
    committed = {int(p["partition"]): int(p["offset"]) for p in after_first["committed"][0]["partitions"]}
    for p in range(3):
        mine = sorted(m["offset"] for m in first if m["partition"] == p)
        assert mine == list(range(len(mine)))
        assert committed[p] == (len(mine) if mine else -1)
    seen = sorted(unb64(m["value"]) for m in first + rest)
    assert seen == sorted(v for _, v, _ in rows)  # nothing lost, nothing twice
    final = {int(p["partition"]): int(p["offset"]) for p in after_rest["committed"][0]["partitions"]}
    assert final == {0: 10, 1: 10, 2: 10}


def test_seek_by_timestamp(gateway):
    topic = f"js-ts-{uuid.uuid4().hex[:6]}"
    base = 1_700_000_000_000
    stamps = [base + i * 1000 for i in range(10)]
    rows = [(None, f"v{i}".encode(), []) for i in range(10)]
    _, _, mid, past_end = run(
        gateway.bootstrap,
        {"op": "createTopic", "topic": topic},
        {"op": "produce", "topic": topic, "records": to_wire(rows, stamps)},
        {"op": "offsets", "topic": topic, "timestamp": base + 4500},
        {"op": "offsets", "topic": topic, "timestamp": base + 99_000},
    )
    assert mid["byTimestamp"] == [{"partition": 0, "offset": "5"}]
    assert past_end["byTimestamp"] == [{"partition": 0, "offset": "10"}]  # KafkaJS: the end
    assert [(e["low"], e["high"]) for e in mid["ends"]] == [("0", "10")]
    (got,) = run(gateway.bootstrap,
                 {"op": "consume", "topic": topic, "groupId": f"g-{topic}", "count": 5,
                  "seek": [{"partition": 0, "offset": 5}]})
    assert [unb64(m["value"]) for m in got] == [f"v{i}".encode() for i in range(5, 10)]
    assert [m["timestamp"] for m in got] == stamps[5:]
