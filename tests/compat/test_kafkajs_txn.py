"""KafkaJS transactions against a real `stratalog serve`, driven through
tests/clients/kafkajs/compat.js: commit, abort, commit, then read both partitions with
readUncommitted false and true."""

from __future__ import annotations

import uuid

from .test_kafkajs import b64, run, unb64  # skips the module when node or KafkaJS is missing

from .txn_scenario import TRANSACTIONS, sent  # noqa: E402


def test_commit_abort_commit(gateway):
    topic = f"js-txn-{uuid.uuid4().hex[:6]}"
    txns = [{"commit": commit,
             "records": [{"key": None, "value": b64(f"{prefix}-{i}".encode()), "partition": i % 2}
                         for i in range(n)]}
            for prefix, n, commit in TRANSACTIONS]
    committed, uncommitted = sent(committed_only=True), sent(committed_only=False)
    # a record delivered twice, or an aborted one after the last commit, arrives during the linger
    _, acks, got_committed, got_all = run(
        gateway.bootstrap,
        {"op": "createTopic", "topic": topic, "partitions": 2},
        {"op": "transactions", "topic": topic, "transactionalId": f"t-{topic}", "transactions": txns},
        {"op": "consume", "topic": topic, "groupId": f"g1-{topic}", "lingerMs": 500,
         "count": sum(map(len, committed.values()))},
        {"op": "consume", "topic": topic, "groupId": f"g2-{topic}", "lingerMs": 500,
         "count": sum(map(len, uncommitted.values())), "readUncommitted": True},
    )
    assert all(a["errorCode"] == 0 for txn in acks for a in txn)
    for msgs, expected in ((got_committed, committed), (got_all, uncommitted)):
        assert {p: [unb64(m["value"]) for m in msgs if m["partition"] == p] for p in (0, 1)} == expected
        for p in (0, 1):
            offsets = [m["offset"] for m in msgs if m["partition"] == p]
            assert offsets == sorted(set(offsets))

