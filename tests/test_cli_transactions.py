"""`stratalog transactions list|describe`, `consume --isolation-level` and `segments dump` of
transaction markers and .txnindex sidecars, run as subprocesses against real gateways
driven by confluent-kafka's transactional producer."""

from __future__ import annotations

import gc
import re
import time
import uuid

import pytest

from cluster_fixtures import etcd, start_cluster, wait_for  # noqa: F401 - etcd is a fixture
from test_cli import assert_one_error, cli, dead_port, ok, table

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Producer  # noqa: E402

SEALING = {"log.roll.ms": 500}  # segments seal half a second after their first batch


def _topic(gw, partitions: int = 1) -> str:
    name = f"tx-{uuid.uuid4().hex[:8]}"
    ok("topics", "create", name, "--partitions", str(partitions), "--bootstrap", gw.bootstrap)
    return name


def _tid(stem: str = "tid") -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def _producer(bootstrap: str, tid: str, **conf) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, **conf})
    p.init_transactions(30)
    return p


def _transaction(bootstrap: str, tid: str, topic: str, values: list[str], *, commit: bool) -> None:
    p = _producer(bootstrap, tid)
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v.encode(), partition=0)
    if commit:
        p.commit_transaction(30)
    else:
        p.flush(30)
        p.abort_transaction(30)


def _listed(*args: str) -> dict[str, dict[str, str]]:
    """Rows of `transactions list` by transactional id; a first argument without dashes is
    the --bootstrap address."""
    if args and not args[0].startswith("--"):
        args = ("--bootstrap", *args)
    out = ok("transactions", "list", *args)
    return {r["TRANSACTIONAL-ID"]: r for r in table(out, "TRANSACTIONAL-ID")}


def _described(bootstrap: str, tid: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The header line's `name value` pairs, and the partition table's rows."""
    out = ok("transactions", "describe", tid, "--bootstrap", bootstrap)
    first = out.splitlines()[0]
    fields = dict(part.split(" ", 1) for part in first.split("  "))
    fields["coordinator"] = fields["coordinator"].split()[0]  # "1 (HOST:PORT)"
    rows = table(out, "TOPIC") if "\nTOPIC" in out else []
    return fields, rows


# ---- transactions list / describe -------------------------------------------------------------

def test_list_and_describe_follow_a_transaction(gateway):
    b = gateway.bootstrap
    topic = _topic(gateway, 2)
    tid = _tid()
    p = _producer(b, tid, **{"transaction.timeout.ms": 45000})
    p.begin_transaction()
    p.produce(topic, value=b"x", partition=0)
    p.produce(topic, value=b"y", partition=1)
    p.flush(30)  # the partitions are added to the transaction by now

    row = _listed(b)[tid]
    assert row["STATE"] == "Ongoing" and row["PRODUCER-ID"].isdigit() and row["COORDINATOR"] == "1"
    pid = row["PRODUCER-ID"]
    assert tid in _listed(b, "--state", "Ongoing")
    assert tid in _listed(b, "--state", "ongoing", "--producer-id", pid)  # states in any case
    assert tid not in _listed(b, "--state", "CompleteCommit")
    assert tid not in _listed(b, "--producer-id", str(int(pid) + 1000))

    fields, partitions = _described(b, tid)
    assert fields["transactional-id"] == tid and fields["state"] == "Ongoing"
    assert fields["producer-id"] == pid and fields["producer-epoch"] == "0"
    assert fields["timeout-ms"] == "45000" and fields["coordinator"] == "1"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields["start-time"]), fields
    assert partitions == [{"TOPIC": topic, "PARTITIONS": "0,1"}]

    p.commit_transaction(30)
    assert _listed(b)[tid]["STATE"] == "CompleteCommit"
    assert tid in _listed(b, "--state", "CompleteCommit")
    assert tid not in _listed(b, "--state", "Ongoing")
    fields, _ = _described(b, tid)
    assert fields["state"] == "CompleteCommit" and fields["producer-id"] == pid

    aborted = _tid("aborted")
    _transaction(b, aborted, topic, ["z"], commit=False)
    listed = _listed(b)
    assert listed[aborted]["STATE"] == "CompleteAbort" and listed[tid]["STATE"] == "CompleteCommit"
    assert list(_listed(b, "--state", "CompleteAbort", "--state", "CompleteCommit")) \
        == sorted(t for t in listed if listed[t]["STATE"] in ("CompleteAbort", "CompleteCommit"))


def test_transactions_bad_input(gateway):
    b = ["--bootstrap", gateway.bootstrap]
    unknown = _tid("nobody")
    proc = cli("transactions", "describe", unknown, *b)
    assert proc.returncode == 1 and proc.stdout == b""
    assert_one_error(proc, f"transactional id {unknown!r} does not exist")
    proc = cli("transactions", "list", "--state", "Sleeping", *b)
    assert proc.returncode == 2
    assert_one_error(proc, "unknown state 'Sleeping'", "Ongoing")
    assert cli("transactions", "describe", *b).returncode == 2
    assert cli("transactions", *b).returncode == 2
    # A state Kafka has and Stratalog's coordinator never uses: an empty list and a warning.
    proc = cli("transactions", "list", "--state", "PrepareEpochFence", *b)
    assert proc.returncode == 0 and table(proc.stdout.decode(), "TRANSACTIONAL-ID") == []
    assert "know no state PrepareEpochFence" in proc.stderr.decode()


@pytest.mark.parametrize("argv", [["transactions", "list"], ["transactions", "describe", "t"]],
                         ids=lambda a: " ".join(a))
def test_transactions_unreachable_broker(argv):
    address = f"127.0.0.1:{dead_port()}"
    started = time.monotonic()
    assert_one_error(cli(*argv, "--bootstrap", address, "--timeout", "1", timeout=30),
                     f"cannot reach a broker at {address} within 1s", "Connection refused")
    assert time.monotonic() - started < 6


def test_list_asks_every_gateway(etcd, gateway_factory, tmp_path):  # noqa: F811 - the etcd fixture
    """Each gateway lists only the ids it coordinates; the command asks them all. (etcd is
    named first so that it is set up first and torn down last, after the gateways.)"""
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3)
    topic = _topic(gws[0], 1)
    coordinators: dict[str, str] = {}
    producers = []
    while len(set(coordinators.values())) < 3 and len(coordinators) < 30:
        tid = _tid()
        p = _producer(gws[0].bootstrap, tid)
        p.begin_transaction()
        p.produce(topic, value=b"v", partition=0)
        p.flush(30)
        producers.append(p)
        coordinators[tid] = _described(gws[1].bootstrap, tid)[0]["coordinator"]
    assert set(coordinators.values()) == {"1", "2", "3"}, coordinators
    listed = _listed(gws[2].bootstrap)
    assert {t: listed[t]["COORDINATOR"] for t in coordinators} == coordinators
    assert all(listed[t]["STATE"] == "Ongoing" for t in coordinators)
    for p in producers:
        p.abort_transaction(30)
    # Destroyed before the gateways stop: with these producers still connected, the
    # gateway they bootstrapped from often outlives SIGTERM by the 20 s the fixture waits.
    del producers, p
    gc.collect()


# ---- consume --isolation-level ---------------------------------------------------------------

def test_consume_isolation_levels(gateway):
    b = ["--bootstrap", gateway.bootstrap]
    topic = _topic(gateway, 1)
    _transaction(gateway.bootstrap, _tid(), topic, ["c1", "c2"], commit=True)
    _transaction(gateway.bootstrap, _tid(), topic, ["a1", "a2"], commit=False)
    _transaction(gateway.bootstrap, _tid(), topic, ["c3"], commit=True)

    def consume(*extra: str) -> list[str]:
        return ok("consume", topic, "--from-beginning", "--timeout", "1", *extra, *b).splitlines()

    assert consume("--isolation-level", "read_committed") == ["c1", "c2", "c3"]
    everything = ["c1", "c2", "a1", "a2", "c3"]
    assert consume("--isolation-level", "read_uncommitted") == everything
    assert consume() == everything  # the default, as kafka-console-consumer's
    assert consume("--command-config", "isolation.level=read_committed") == ["c1", "c2", "c3"]

    # An open transaction: read_committed stops before it (the last stable offset).
    p = _producer(gateway.bootstrap, _tid())
    p.begin_transaction()
    p.produce(topic, value=b"open", partition=0)
    p.flush(30)
    _transaction(gateway.bootstrap, _tid(), topic, ["c4"], commit=True)
    assert consume("--isolation-level", "read_committed") == ["c1", "c2", "c3"]
    assert consume("--isolation-level", "read_uncommitted") == [*everything, "open", "c4"]
    p.commit_transaction(30)
    assert consume("--isolation-level", "read_committed") == ["c1", "c2", "c3", "open", "c4"]

    assert "read_uncommitted" in ok("consume", "--help")
    proc = cli("consume", topic, "--isolation-level", "read_dirty", *b)
    assert proc.returncode == 2
    assert_one_error(proc, "--isolation-level", "invalid choice: 'read_dirty'")
    assert_one_error(cli("consume", topic, "--isolation-level", "read_committed", "--command-config",
                         "isolation.level=read_uncommitted", "--timeout", "1", *b),
                     "contradicts --command-config isolation.level=read_uncommitted")


# ---- segments dump: markers and .txnindex ------------------------------------------------------

def test_segments_dump_shows_markers_and_aborted_transactions(gateway_factory):
    gw = gateway_factory(SEALING)
    b = gw.bootstrap
    topic = _topic(gw, 1)
    committer, aborter = _tid("committer"), _tid("aborter")
    # One partition: c0 c1 at 0-1, COMMIT at 2, a0 a1 at 3-4, ABORT at 5.
    _transaction(b, committer, topic, ["c0", "c1"], commit=True)
    _transaction(b, aborter, topic, ["a0", "a1"], commit=False)
    pid_c = _described(b, committer)[0]["producer-id"]
    pid_a = _described(b, aborter)[0]["producer-id"]
    store = ["--data-dir", str(gw.data_dir)]

    def sealed_dump() -> str | None:
        keys = [r["KEY"] for r in table(ok("segments", "ls", "--topic", topic, *store), "TYPE")]
        logs = [k for k in keys if k.endswith(".log")]
        if not logs:
            return None
        out = ok("segments", "dump", *logs, *store)
        return out if "marker ABORT" in out and "aborted transactions (" in out else None

    out = wait_for(sealed_dump, timeout=60, what="the markers sealed in segments")
    assert re.search(rf"^    marker COMMIT  offset 2  producer {pid_c}/0  coordinator-epoch \d+$", out, re.M), out
    assert re.search(rf"^    marker ABORT  offset 5  producer {pid_a}/0  coordinator-epoch \d+$", out, re.M), out
    # Markers are not shown as records, even with --print-records.
    keys = [r["KEY"] for r in table(ok("segments", "ls", "--topic", topic, *store), "TYPE")]
    logs = [k for k in keys if k.endswith(".log")]
    records = ok("segments", "dump", *logs, "--print-records", *store)
    values = re.findall(r"^    offset (\d+)  .*  value (\S+)  headers", records, re.M)
    assert values == [("0", "c0"), ("1", "c1"), ("3", "a0"), ("4", "a1")]
    assert records.count("marker ") == 2

    txnindex = [k for k in keys if k.endswith(".txnindex")]
    assert len(txnindex) == 1, keys
    expected = {"PRODUCER-ID": pid_a, "FIRST-OFFSET": "3", "LAST-OFFSET": "5", "LSO": "3"}
    assert [r for r in table(out, "    PRODUCER-ID")] == [expected]
    direct = ok("segments", "dump", txnindex[0], *store)
    assert direct.startswith(f"txnindex {txnindex[0]}  topic {topic}  partition 0")
    assert "  aborted transactions  1\n" in direct
    assert table(direct, "    PRODUCER-ID") == [expected]

    # --deep checks the .txnindex against its log and the manifests' counts against it.
    manifests = [k for k in keys if k.endswith(".avro")]
    deep = ok("segments", "dump", *keys, "--deep", *store)
    assert "PROBLEM" not in deep
    aborted_counts = [r["ABORTED"] for r in table(ok("segments", "dump", manifests[-1], *store), "  BASE")]
    assert "1" in aborted_counts


def test_segments_dump_reports_a_txnindex_that_misses_its_markers(gateway_factory):
    gw = gateway_factory(SEALING)
    topic = _topic(gw, 1)
    _transaction(gw.bootstrap, _tid(), topic, ["a0"], commit=False)
    store = ["--data-dir", str(gw.data_dir)]

    def txnindex() -> str | None:
        keys = [r["KEY"] for r in table(ok("segments", "ls", "--topic", topic, *store), "TYPE")]
        return next((k for k in keys if k.endswith(".txnindex")), None)

    key = wait_for(txnindex, timeout=60, what="a .txnindex")
    path = gw.data_dir / "objects" / key
    data = bytearray(path.read_bytes())
    data[18:26] = (99).to_bytes(8, "big")  # lastOffset: no marker there
    path.write_bytes(bytes(data))
    assert_one_error(cli("segments", "dump", key, "--deep", *store),
                     "ends at offset 99, which is not an ABORT marker")
    path.write_bytes(bytes(data[:-1]))
    assert_one_error(cli("segments", "dump", key, *store), "not a whole number of entries")
    path.unlink()
    manifests = [r["KEY"] for r in table(ok("segments", "ls", "--topic", topic, *store), "TYPE")
                 if r["KEY"].endswith(".avro")]
    assert_one_error(cli("segments", "dump", manifests[-1], "--deep", *store), f"{key} does not exist")


# ---- over TLS and SASL ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A gateway with SASL_SSL, SSL and SASL_PLAINTEXT listeners (tests/test_security.py)."""
    security = pytest.importorskip("test_security")
    with security.SecureGateway(tmp_path_factory.mktemp("secure")) as gw:
        yield gw


@pytest.mark.parametrize("protocol, mechanism", [("SASL_SSL", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
                                                 ("SASL_SSL", "PLAIN"), ("SSL", None)])
def test_transactions_over_tls_and_sasl(secure, tmp_path, protocol, mechanism):
    plain = secure.address("PLAINTEXT")
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    ok("topics", "create", topic, "--bootstrap", plain)
    tid = _tid("secure")
    p = _producer(plain, tid)
    p.begin_transaction()
    p.produce(topic, value=b"v", partition=0)
    p.flush(30)

    conf = secure.librdkafka(protocol, mechanism)
    props = tmp_path / "client.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in conf.items() if k != "bootstrap.servers"))
    conn = ["--bootstrap", conf["bootstrap.servers"], "--command-config", str(props)]
    row = _listed(*conn)[tid]
    assert row["STATE"] == "Ongoing" and row["PRODUCER-ID"].isdigit() and row["COORDINATOR"] == "1"
    described = ok("transactions", "describe", tid, *conn)
    assert f"transactional-id {tid}  state Ongoing" in described
    assert table(described, "TOPIC") == [{"TOPIC": topic, "PARTITIONS": "0"}]
    p.abort_transaction(30)

    if mechanism is not None:
        assert_one_error(cli("transactions", "list", *conn, "--command-config", "sasl.password=wrong"),
                         f"authentication with {conf['bootstrap.servers']} failed")
