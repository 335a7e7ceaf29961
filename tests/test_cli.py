"""The `stratalog` command line, run as a subprocess against a real broker and real objects.

Broker commands run against the `bootstrap` fixture below (one broker for the module).
Until the Stratalog gateway can stand in, it is a Tansu broker; two of its habits shape
the tests: it answers a group join only after half the session timeout (so group consumers
pass session.timeout.ms=6000), and it reports a partition's high watermark as the last
batch's base offset + 1 (so tests that read the log end produce one record per batch).
`segments` tests build objects with tiering's own writers in a temporary file store.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import uuid

import pytest

from conftest import ROOT, GatewayProcess, free_port, with_ctrl_c

@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    """HOST:PORT of a real `stratalog serve` the tests may create topics and groups on."""
    gw = GatewayProcess(tmp_path_factory.mktemp("cli") / "data").start()
    yield gw.bootstrap
    gw.stop()


# ---- helpers ---------------------------------------------------------------------------

GROUP_CONFIG = ["--command-config", "session.timeout.ms=6000"]
ONE_PER_BATCH = ["--command-config", "batch.num.messages=1"]


def cli(*args: str, input: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("STRATALOG_BOOTSTRAP", "STRATALOG_DEBUG")}
    return subprocess.run([sys.executable, "-m", "stratalog.infra.cli", *args], cwd=ROOT, input=input,
                          capture_output=True, timeout=timeout, env=env)


def ok(*args: str, input: bytes | None = None) -> str:
    proc = cli(*args, input=input)
    assert proc.returncode == 0, (args, proc.stderr.decode())
    return proc.stdout.decode()


def assert_one_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Non-zero exit, and stderr is exactly one `stratalog: error:` line (no traceback)."""
    err = proc.stderr.decode()
    assert proc.returncode != 0, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stratalog: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def new_topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    ok("topics", "create", name, "--partitions", str(partitions), "--bootstrap", bootstrap)
    return name


def table(text: str, header: str) -> list[dict[str, str]]:
    """Rows of the whitespace-aligned table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = lines[start].split()
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(dict(zip(names, line.split())))
    return rows


def dead_port() -> int:
    """A loopback port nothing listens on."""
    return free_port()


# ---- topics ----------------------------------------------------------------------------

def test_topics_lifecycle(bootstrap):
    b = ["--bootstrap", bootstrap]
    name = f"life-{uuid.uuid4().hex[:8]}"
    assert ok("topics", "create", name, "--partitions", "3", "--config", "retention.ms=123456", *b) \
        == f"created topic {name!r}\n"
    assert name in ok("topics", "list", *b).split()

    described = ok("topics", "describe", name, *b)
    assert described.startswith(f"topic {name}  partitions 3  replication-factor 1\n")
    rows = table(described, "PARTITION")
    assert [r["PARTITION"] for r in rows] == ["0", "1", "2"]
    for r in rows:
        assert r["LEADER"].isdigit() and r["REPLICAS"] == r["LEADER"] and r["ISR"] == r["LEADER"]
    assert "retention.ms=123456" in ok("topics", "describe", name, "--all-configs", *b)

    ok("topics", "alter", name, "--config", "retention.ms=999", *b)
    assert "retention.ms=999" in ok("topics", "describe", name, "--all-configs", *b)

    assert_one_error(cli("topics", "create", name, *b), "cannot create topic", "already exists")
    assert ok("topics", "create", name, "--if-not-exists", *b) == ""

    assert ok("topics", "delete", name, *b) == f"deleted topic {name!r}\n"
    assert name not in ok("topics", "list", *b).split()
    assert_one_error(cli("topics", "delete", name, *b), f"topic {name!r} does not exist")
    assert_one_error(cli("topics", "describe", name, *b), f"topic {name!r} does not exist")


def test_topics_alter_partitions(bootstrap):
    b = ["--bootstrap", bootstrap]
    name = new_topic(bootstrap, 2)
    assert_one_error(cli("topics", "alter", name, "--partitions", "2", *b), "can only grow")
    proc = cli("topics", "alter", name, "--partitions", "4", *b)
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(table(ok("topics", "describe", name, *b), "PARTITION")) == 4


# ---- produce and consume ---------------------------------------------------------------

def test_round_trip_with_keys_and_headers(bootstrap, tmp_path):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 3)
    records = [(f"key-{i}", f"value {i} ünïcode\twith tab") for i in range(30)]
    source = tmp_path / "in.txt"
    source.write_bytes("".join(f"{k}|{v}\n" for k, v in records).encode())
    assert ok("produce", topic, "--file", str(source), "--key-separator", "|",
              "--header", "origin=file", "--header", "n=1", "--compression", "gzip", *b) == ""
    # One more from stdin, without a trailing newline and with an empty key.
    ok("produce", topic, "--key-separator", "|", "--header", "origin=stdin", *b, input="|last".encode())

    out = ok("consume", topic, "--from-beginning", "--print-key", "--print-headers", "--print-offset",
             "--print-timestamp", "--key-separator", "=>", "--max-messages", "31", "--timeout", "10", *b)
    lines = out.splitlines()
    assert len(lines) == 31
    pattern = re.compile(r"partition:(\d+)\toffset:(\d+)\ttimestamp:(\d+)\theaders:(.*?)\t(.*?)=>(.*)")
    seen, by_partition = {}, {}
    for line in lines:
        m = pattern.fullmatch(line)
        assert m, line
        partition, offset, _ts, headers, key, value = m.groups()
        seen[key] = (value, headers)
        by_partition.setdefault(partition, []).append(int(offset))
    assert seen == {**{k: (v, "origin=file,n=1") for k, v in records}, "": ("last", "origin=stdin")}
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))
    # The Java client's murmur2 partitioner spreads these keys over every partition.
    assert len(by_partition) == 3


def test_consume_positions_and_limits(bootstrap):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 1)
    ok("produce", topic, *ONE_PER_BATCH, *b, input=b"a\nb\nc\n")
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    ok("produce", topic, *ONE_PER_BATCH, *b, input=b"d\ne\n")

    def consume(*extra: str) -> list[str]:
        return ok("consume", topic, "--timeout", "1", *extra, *b).splitlines()

    assert consume("--from-beginning") == ["a", "b", "c", "d", "e"]
    assert consume("--offset", "3", "--partition", "0") == ["d", "e"]
    assert consume("--timestamp", str(middle)) == ["d", "e"]
    assert consume("--from-beginning", "--max-messages", "2") == ["a", "b"]
    # The default position is the end: nothing old, and the idle timeout ends the wait.
    started = time.monotonic()
    assert ok("consume", topic, "--timeout", "1", *b) == ""
    assert time.monotonic() - started < 8


def test_consume_past_the_end(bootstrap):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 1)
    ok("produce", topic, *b, input=b"a\nb\n")
    assert ok("consume", topic, "--timestamp", str(int(time.time() * 1000) + 3_600_000),
              "--timeout", "1", *b) == ""
    assert_one_error(cli("consume", topic, "--offset", "99", "--partition", "0", "--timeout", "5", *b),
                     "offset 99 is out of range in partition 0")


def test_produce_reports_the_line_without_a_key_separator(bootstrap):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 1)
    line = assert_one_error(cli("produce", topic, "--key-separator", ":", *ONE_PER_BATCH, *b,
                                input=b"k1:v1\nk2:v2\nno separator here\nk4:v4\n"),
                            "line 3 has no key separator", "2 records delivered")
    assert "line 3" in line
    # What came before the bad line was delivered, nothing after it.
    assert ok("consume", topic, "--from-beginning", "--print-key", "--timeout", "1", *b).splitlines() \
        == ["k1\tv1", "k2\tv2"]


def run_with_terminal_stderr(*args: str) -> tuple[int, bytes, bytes]:
    """Run the CLI with stderr on a pseudo-terminal (as a person at a shell would)."""
    master, slave = pty.openpty()
    # A terminal of zero columns would hide any progress bar.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "stratalog.infra.cli", *args], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.stdout.read()
    proc.wait(10)
    return proc.returncode, out, b"".join(chunks)


def test_produce_shows_progress_on_a_terminal(bootstrap, tmp_path):
    topic = new_topic(bootstrap, 1)
    source = tmp_path / "lines.txt"
    source.write_bytes(b"".join(b"line %d\n" % i for i in range(2000)))
    status, out, err = run_with_terminal_stderr("produce", topic, "--file", str(source), "--bootstrap", bootstrap)
    assert status == 0 and out == b""
    assert f"{topic}:".encode() in err and b"%|" in err  # a tqdm bar named after the topic
    assert len(ok("consume", topic, "--from-beginning", "--max-messages", "2000", "--timeout", "5",
                  "--bootstrap", bootstrap).splitlines()) == 2000


# ---- groups ------------------------------------------------------------------------------

def _lag_rows(bootstrap: str, group: str) -> dict[int, tuple[str, str, str]]:
    out = ok("groups", "describe", group, "--bootstrap", bootstrap)
    return {int(r["PARTITION"]): (r["COMMITTED"], r["LOG-END"], r["LAG"])
            for r in table(out, "TOPIC")}


def test_group_consume_describe_and_reset(bootstrap):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    ok("produce", topic, *ONE_PER_BATCH, *b, input=b"".join(b"r%d\n" % i for i in range(6)))

    out = ok("consume", topic, "--group", group, "--from-beginning", "--max-messages", "4",
             "--timeout", "15", *GROUP_CONFIG, *b)
    assert out.splitlines() == ["r0", "r1", "r2", "r3"]
    assert group in ok("groups", "list", *b).split()
    described = ok("groups", "describe", group, *b)
    assert described.startswith(f"group {group}  state ")
    assert _lag_rows(bootstrap, group) == {0: ("4", "6", "2")}

    dry = cli("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", *b)
    assert dry.returncode == 0 and "dry run" in dry.stderr.decode()
    assert table(dry.stdout.decode(), "TOPIC") == [{"TOPIC": topic, "PARTITION": "0", "CURRENT": "4", "NEW": "0"}]
    assert _lag_rows(bootstrap, group) == {0: ("4", "6", "2")}  # a dry run changes nothing

    ok("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute", *b)
    assert _lag_rows(bootstrap, group) == {0: ("0", "6", "6")}
    ok("groups", "reset-offsets", group, "--topic", topic, "--to-offset", "99", "--execute", *b)
    assert _lag_rows(bootstrap, group) == {0: ("6", "6", "0")}  # clamped to the log end
    ok("groups", "reset-offsets", group, "--topic", topic, "--to-offset", "2", "--execute", *b)
    # The group resumes where its offset was reset to, and commits what it read.
    assert ok("consume", topic, "--group", group, "--max-messages", "1", "--timeout", "15",
              *GROUP_CONFIG, *b).splitlines() == ["r2"]
    assert _lag_rows(bootstrap, group) == {0: ("3", "6", "3")}
    ok("groups", "reset-offsets", group, "--topic", topic, "--to-latest", "--execute", *b)
    assert _lag_rows(bootstrap, group) == {0: ("6", "6", "0")}

    assert_one_error(cli("groups", "reset-offsets", group, "--topic", "no-such-topic", "--to-earliest", *b),
                     "topic 'no-such-topic' does not exist")
    assert ok("groups", "delete", group, *b) == f"deleted group {group!r}\n"
    assert_one_error(cli("groups", "describe", group, *b), f"group {group!r} does not exist")


def test_groups_of_both_protocols_are_listed_with_their_type(bootstrap):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 2)
    ok("produce", topic, *b, input=b"a\nb\n")
    classic, modern = f"g-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    ok("consume", topic, "--group", classic, "--from-beginning", "--max-messages", "2",
       "--timeout", "15", *GROUP_CONFIG, *b)
    ok("consume", topic, "--group", modern, "--from-beginning", "--max-messages", "2",
       "--timeout", "15", "--command-config", "group.protocol=consumer", *b)
    rows = {r["GROUP"]: r for r in table(ok("groups", "list", *b), "GROUP")}
    assert rows[classic]["TYPE"] == "Classic" and rows[modern]["TYPE"] == "Consumer"
    described = ok("groups", "describe", modern, *b)
    assert described.startswith(f"group {modern}  state Empty  type Consumer  members 0")
    assert sum(int(r["COMMITTED"]) for r in table(described, "TOPIC")) == 2  # both records committed


def _start_consumer(*args: str) -> subprocess.Popen:
    # PYTHONFAULTHANDLER: a consumer that does not end is sent SIGABRT, and prints where
    # each of its threads is (the handler needs no GIL, so it works on a stuck one too).
    env = {**{k: v for k, v in os.environ.items() if k != "STRATALOG_BOOTSTRAP"}, "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen([sys.executable, "-m", "stratalog.infra.cli", "consume", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=with_ctrl_c)


def _interrupt(member: subprocess.Popen) -> None:
    """Ctrl-C ends a consumer cleanly with status 130 (its close is bounded by
    consume.CLOSE_TIMEOUT_S, 10 s)."""
    member.send_signal(signal.SIGINT)
    try:
        _out, err = member.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        member.send_signal(signal.SIGABRT)
        _out, err = member.communicate(timeout=15)
        raise AssertionError("the consumer did not end within 15 s of SIGINT; its threads, "
                             "as faulthandler saw them on SIGABRT:\n" + err.decode(errors="replace")) from None
    assert member.returncode == 130, err.decode()
    assert err == b""


@pytest.mark.parametrize("ending, status", [("KeyboardInterrupt", 130), ("None", 0)])
def test_a_consumer_that_never_closes_does_not_hold_the_command(ending, status):
    # librdkafka's close can hang; the command still ends, with the status it was ending
    # with, once CLOSE_TIMEOUT_S has passed.
    script = f"""
import threading
from stratalog.infra.cli import consume
consume.CLOSE_TIMEOUT_S = 0.5
class Stuck:
    def close(self):
        threading.Event().wait()
try:
    if {ending} is not None:
        raise {ending}
finally:
    consume._close(Stuck())
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=60)
    assert proc.returncode == status, proc.stderr.decode()
    assert proc.stderr.decode() == "stratalog: the consumer did not close within 0.5s; exiting without it\n"


def test_ctrl_c_exits_with_130(bootstrap):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 1)
    member = _start_consumer(topic, *b)
    try:
        time.sleep(1.5)
        assert member.poll() is None  # no --timeout: it waits for records until interrupted
        _interrupt(member)
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()


def test_reset_refused_while_members_are_active(bootstrap):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 1)
    group = f"live-{uuid.uuid4().hex[:8]}"
    member = _start_consumer(topic, "--group", group, *GROUP_CONFIG, *b)
    try:
        deadline = time.monotonic() + 20
        while True:
            proc = cli("groups", "describe", group, *b)
            # Assignments are reported once the group is Stable, as Kafka does.
            if proc.returncode == 0 and "members 1" in proc.stdout.decode() \
                    and f"{topic}:0" in proc.stdout.decode():
                break
            assert time.monotonic() < deadline, "the consumer never joined its group"
            time.sleep(0.3)
        members = table(proc.stdout.decode(), "MEMBER-ID")
        assert len(members) == 1 and members[0]["ASSIGNMENT"] == f"{topic}:0"
        assert_one_error(cli("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute", *b),
                         "1 active member(s)")
        assert_one_error(cli("groups", "delete", group, *b), f"cannot delete group {group!r}")
        _interrupt(member)
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()


# ---- bad input and unreachable brokers -------------------------------------------------------

BAD_COMMAND_LINES = [
    [],
    ["no-such-command"],
    ["topics"],
    ["topics", "create"],
    ["topics", "create", "x", "--config", "no-equals-sign"],
    ["topics", "create", "x", "--partitions", "0"],
    ["topics", "create", "x", "--config", "a=1", "--config", "a=2"],
    ["topics", "alter", "x"],
    ["consume", "x", "--from-beginning", "--offset", "1"],
    ["consume", "x", "--timeout", "-1"],
    ["consume", "x", "--key-separator", ""],
    ["produce", "x", "--acks", "2"],
    ["produce", "x", "--compression", "brotli"],
    ["produce", "x", "--header", "novalue"],
    ["produce", "x", "--file", "/no/such/file"],
    ["groups", "reset-offsets", "g", "--topic", "t"],
    ["groups", "reset-offsets", "g", "--to-earliest"],
    ["segments", "dump"],
]


@pytest.mark.parametrize("argv", BAD_COMMAND_LINES, ids=lambda a: " ".join(a) or "(nothing)")
def test_bad_command_lines(argv):
    # None of these needs a broker: they fail before connecting (the port is dead anyway).
    proc = cli(*argv, *(["--bootstrap", f"127.0.0.1:{dead_port()}"] if len(argv) > 1 and argv[0] in
                        ("topics", "consume", "produce", "groups") else []))
    assert_one_error(proc)


def test_bad_input_against_a_broker(bootstrap, tmp_path):
    b = ["--bootstrap", bootstrap]
    topic = new_topic(bootstrap, 2)
    assert_one_error(cli("consume", "no-such-topic", "--timeout", "2", *b), "topic 'no-such-topic' does not exist")
    assert_one_error(cli("produce", topic, "--partition", "7", *b, input=b"x\n"), "has no partition 7 (it has 2)")
    assert_one_error(cli("consume", topic, "--partition", "7", *b), "has no partition 7")
    assert_one_error(cli("produce", topic, "--file", str(tmp_path / "missing.txt"), *b), "cannot read")
    assert_one_error(cli("topics", "list", "--command-config", "no.such.property=1", *b),
                     "bad client configuration")
    assert_one_error(cli("topics", "alter", topic, "--config", "a=1", "--delete-config", "a", *b),
                     "both set and deleted")
    assert_one_error(cli("groups", "describe", f"nobody-{uuid.uuid4().hex[:6]}", *b), "does not exist")


def test_produce_creates_a_missing_topic_like_kafkas_console_producer(bootstrap):
    b = ["--bootstrap", bootstrap]
    topic = f"auto-{uuid.uuid4().hex[:10]}"
    assert topic not in ok("topics", "list", *b).split()
    ok("produce", topic, "--key-separator", ":", *b, input=b"k1:one\nk2:two\n")
    # Created with the broker's num.partitions (1), holding what was sent.
    assert len(table(ok("topics", "describe", topic, *b), "PARTITION")) == 1
    out = ok("consume", topic, "--from-beginning", "--print-key", "--max-messages", "2", "--timeout", "20", *b)
    assert out.split() == ["k1", "one", "k2", "two"]


def test_produce_to_a_missing_topic_without_auto_creation_says_so(tmp_path):
    gw = GatewayProcess(tmp_path / "data", {"auto.create.topics.enable": "false"}).start()
    try:
        b = ["--bootstrap", gw.bootstrap]
        assert_one_error(cli("produce", "no-such-topic", *b, input=b"x\n"), "topic 'no-such-topic' does not exist")
        assert "no-such-topic" not in ok("topics", "list", *b).split()
    finally:
        gw.stop()
    # A client may also decline: librdkafka's allow.auto.create.topics=false.
    gw2 = GatewayProcess(tmp_path / "data2").start()
    try:
        b = ["--bootstrap", gw2.bootstrap, "--command-config", "allow.auto.create.topics=false"]
        assert_one_error(cli("produce", "declined", *b, input=b"x\n"), "topic 'declined' does not exist")
    finally:
        gw2.stop()


@pytest.mark.parametrize("argv", [
    ["topics", "list"],
    ["groups", "list"],
    ["produce", "t"],
    ["consume", "t"],
], ids=lambda a: " ".join(a))
def test_unreachable_broker_fails_within_the_timeout(argv):
    address = f"127.0.0.1:{dead_port()}"
    started = time.monotonic()
    proc = cli(*argv, "--bootstrap", address, "--timeout", "1", input=b"x\n", timeout=30)
    elapsed = time.monotonic() - started
    assert_one_error(proc, f"cannot reach a broker at {address} within 1s", "Connection refused")
    assert elapsed < 6


def test_help_and_entry_point():
    proc = cli("--help")
    assert proc.returncode == 0
    for command in ("topics", "produce", "consume", "groups", "transactions", "segments"):
        assert command in proc.stdout.decode()
    from stratalog.infra.cli import main

    assert main(["topics", "create"]) == 2


# ---- segments: objects written by tiering, read back by the CLI -----------------------------

TOPIC_ID = uuid.UUID("3f2b8c1e-0d4a-4e55-9a77-5b1c2d3e4f60")


@pytest.fixture
def objects(tmp_path):
    """A file store holding one WAL object, one sealed segment (+ sidecars) and a manifest."""
    from stratalog.tiering import layout
    from stratalog.tiering.batch import build_batch
    from stratalog.tiering.compression import GZIP
    from stratalog.tiering.index import OffsetIndex, TimeIndex
    from stratalog.tiering.manifest import SegmentRecord, write_manifest
    from stratalog.tiering.objectstore import open_store
    from stratalog.tiering.wal import WalBuilder

    first = build_batch([(b"k0", b"v0", [("h", b"1")]), (None, b"v1")], base_offset=0,
                        timestamps=[1000, 1001], producer_id=7, producer_epoch=2, base_sequence=0)
    second = build_batch([(b"k2", b"\x00\xff")], base_offset=2, timestamp_ms=2000, compression=GZIP)
    log = first + second
    offsets = OffsetIndex(0)
    offsets.append(1, 0)
    offsets.append(2, len(first))
    times = TimeIndex(0)
    times.append(1001, 1)
    times.append(2000, 2)
    key_base = layout.segment_key_base("orders", TOPIC_ID, 0, 0, 3, "abc123")
    manifest = write_manifest("orders", TOPIC_ID, 0, 1, 0,
                              [SegmentRecord(0, 2, key_base, len(log), 1000, 2000, 3)])
    wal = WalBuilder()
    wal.add(TOPIC_ID, 0, 0, 1, 1001, first)
    wal.add(TOPIC_ID, 1, 5, 5, 3000, build_batch([(b"x", b"y")], base_offset=5, timestamp_ms=3000))
    wal_bytes, _ = wal.build()

    root = tmp_path / "data" / "objects"
    keys = {
        "log": key_base + layout.LOG,
        "index": key_base + layout.INDEX,
        "timeindex": key_base + layout.TIMEINDEX,
        "manifest": layout.manifest_key("orders", TOPIC_ID, 0, 1),
        "wal": layout.wal_key(4, 17),
    }
    blobs = {"log": log, "index": offsets.to_bytes(), "timeindex": times.to_bytes(),
             "manifest": manifest, "wal": wal_bytes}

    async def put_all():
        store = open_store(root.as_uri())
        for name, key in keys.items():
            await store.put(key, blobs[name])
        await store.close()

    asyncio.run(put_all())
    return {"root": root, "data_dir": tmp_path / "data", "keys": keys, "blobs": blobs, "first": first}


def seg(objects, *args: str) -> subprocess.CompletedProcess:
    return cli("segments", *args, "--data-dir", str(objects["data_dir"]))


def test_segments_ls(objects):
    proc = seg(objects, "ls")
    assert proc.returncode == 0, proc.stderr.decode()
    rows = table(proc.stdout.decode(), "TYPE")
    listed = {r["KEY"]: (r["TYPE"], int(r["SIZE"])) for r in rows}
    keys, blobs = objects["keys"], objects["blobs"]
    assert listed == {keys[n]: ({"log": "log", "index": "index", "timeindex": "timeindex",
                                 "manifest": "manifest", "wal": "wal"}[n], len(blobs[n])) for n in keys}
    assert proc.stdout.decode().endswith(f"\n\n5 objects, {sum(map(len, blobs.values()))} bytes\n")

    only = table(seg(objects, "ls", "--topic", "orders").stdout.decode(), "TYPE")
    assert {r["TYPE"] for r in only} == {"log", "index", "timeindex", "manifest"}
    assert table(seg(objects, "ls", "--topic", "other").stdout.decode(), "TYPE") == []
    # --object-store with a relative file URL reads the same store.
    rel = os.path.relpath(objects["root"], ROOT)
    assert len(table(ok("segments", "ls", "--object-store", f"file://./{rel}"), "TYPE")) == 5


def test_segments_dump_log_with_records(objects):
    proc = seg(objects, "dump", objects["keys"]["log"], "--print-records")
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().splitlines()
    assert lines[0].startswith(f"log {objects['keys']['log']}  topic orders  partition 0  base-offset 0  "
                               f"leader-epoch 3  size {len(objects['blobs']['log'])}")
    first = len(objects["first"])
    assert lines[1] == (f"  batch position 0  offsets 0..1  count 2  size {first}  crc ok  codec none  "
                        "timestamp-type create  first-timestamp 1000  max-timestamp 1001  producer 7/2/0  "
                        "leader-epoch -1")
    assert lines[2] == "    offset 0  timestamp 1000  key k0  value v0  headers h=1"
    assert lines[3] == "    offset 1  timestamp 1001  key null  value v1  headers -"
    assert lines[4].startswith(f"  batch position {first}  offsets 2..2  count 1  ")
    assert "codec gzip" in lines[4] and "producer -1/-1/-1" in lines[4]
    assert lines[5] == "    offset 2  timestamp 2000  key k2  value hex:00ff  headers -"
    assert lines[6] == "  batches 2  records 3"


def test_segments_dump_wal_index_timeindex_and_manifest(objects):
    keys = objects["keys"]
    out = ok("segments", "dump", keys["wal"], keys["index"], keys["timeindex"], keys["manifest"],
             "--deep", "--data-dir", str(objects["data_dir"]))
    assert f"wal {keys['wal']}  gateway 4  sequence 17  size {len(objects['blobs']['wal'])}" in out
    assert f"  range topic-id {TOPIC_ID}  partition 0  offsets 0..1  max-timestamp 1001  position 8  " in out
    assert f"  range topic-id {TOPIC_ID}  partition 1  offsets 5..5  max-timestamp 3000  " in out
    assert "    batches 1  records 2" in out and "    batches 1  records 1" in out
    index_rows = _table_after(out.split(f"index {keys['index']}")[1], "OFFSET")
    assert index_rows == [{"OFFSET": "1", "POSITION": "0"},
                          {"OFFSET": "2", "POSITION": str(len(objects["first"]))}]
    time_rows = _table_after(out.split(f"timeindex {keys['timeindex']}")[1], "TIMESTAMP")
    assert time_rows == [{"TIMESTAMP": "1001", "OFFSET": "1"}, {"TIMESTAMP": "2000", "OFFSET": "2"}]
    assert f"  topic orders  topic-id {TOPIC_ID}  partition 0  version 1  log-start-offset 0  segments 1" in out
    assert "PROBLEM" not in out


def _table_after(text: str, header: str) -> list[dict[str, str]]:
    lines = [line.strip() for line in text.splitlines()]
    return table("\n".join(lines), header)


def test_segments_dump_prefix(objects):
    out = ok("segments", "dump", "topics/", "--data-dir", str(objects["data_dir"]))
    dumped = [line.split()[:2] for line in out.splitlines() if line and not line.startswith(" ")]
    keys = objects["keys"]
    assert dumped == [["index", keys["index"]], ["log", keys["log"]], ["timeindex", keys["timeindex"]]]


def test_segments_dump_shows_progress_on_a_terminal(objects):
    status, out, err = run_with_terminal_stderr("segments", "dump", "topics/", "manifests/", "wal/",
                                                "--data-dir", str(objects["data_dir"]))
    assert status == 0, err
    assert b"obj" in err and b"%|" in err
    assert [line.split()[0] for line in out.decode().splitlines() if line and not line.startswith(" ")] \
        == ["index", "log", "timeindex", "manifest", "wal"]


def _corrupt(objects, name: str, data: bytes) -> None:
    (objects["root"] / objects["keys"][name]).write_bytes(data)


def test_segments_dump_reports_a_crc_mismatch(objects):
    log = bytearray(objects["blobs"]["log"])
    log[70] ^= 0x01  # inside the first batch's records, covered by its CRC
    _corrupt(objects, "log", bytes(log))
    proc = seg(objects, "dump", objects["keys"]["log"], "--print-records")
    assert_one_error(proc, objects["keys"]["log"], "CRC mismatch")
    out = proc.stdout.decode()
    assert "  batch position 0  offsets 0..1  count 2" in out and "crc BAD" in out
    assert "offset 0  timestamp" not in out  # records of a damaged batch are never shown
    assert "offset 2  timestamp 2000  key k2" in out  # the intact batch still is


def test_segments_verify_reports_every_damaged_object_of_a_topic(objects):
    """A clean topic verifies with status 0; a flipped bit in a .log batch and a torn
    .index are each reported with where they are, and the status is non-zero."""
    out = seg(objects, "verify", "orders")
    assert out.returncode == 0, out.stderr.decode()
    assert "orders: 3 objects, 2 batches checked, 0 damaged" in out.stdout.decode()
    keys, first = objects["keys"], objects["first"]
    log = bytearray(objects["blobs"]["log"])
    log[len(first) + 70] ^= 0x08  # inside the second batch's records
    (objects["root"] / keys["log"]).write_bytes(bytes(log))
    (objects["root"] / keys["index"]).write_bytes(objects["blobs"]["index"][:-3])
    proc = seg(objects, "verify", "orders", "--partition", "0")
    assert_one_error(proc, "2 damaged objects in orders partition 0")
    lines = proc.stdout.decode().splitlines()
    assert lines[0] == f"DAMAGED {keys['log']} batch at byte {len(first)} (offset 2): CRC mismatch"
    assert lines[1].startswith(f"DAMAGED {keys['index']}: ") and "multiple of 8" in lines[1]
    assert lines[2] == "orders partition 0: 3 objects, 1 batches checked, 2 damaged"
    assert_one_error(seg(objects, "verify", "orders", "--partition", "1"), "no sealed segments of orders partition 1")
    assert_one_error(seg(objects, "verify", "payments"), "no sealed segments of payments")


def test_segments_dump_reports_a_torn_tail(objects):
    _corrupt(objects, "log", objects["blobs"]["log"][:-5])
    proc = seg(objects, "dump", objects["keys"]["log"])
    line = assert_one_error(proc, "not a whole batch")
    assert f"bytes at position {len(objects['first'])}" in line
    assert "batches 1  records 2" in proc.stdout.decode()


def test_segments_dump_reports_bad_sidecars_and_manifest(objects):
    keys = objects["keys"]
    _corrupt(objects, "index", objects["blobs"]["index"][:-3])
    assert_one_error(seg(objects, "dump", keys["index"]), "not a multiple of 8")

    from stratalog.tiering.index import OffsetIndex

    wrong = OffsetIndex(0)
    wrong.append(1, 5)  # not where a batch starts
    _corrupt(objects, "index", wrong.to_bytes())
    assert seg(objects, "dump", keys["index"]).returncode == 0  # only --deep reads the log
    assert_one_error(seg(objects, "dump", keys["index"], "--deep"), "no batch starts at position 5")

    manifest = bytearray(objects["blobs"]["manifest"])
    manifest[-20] ^= 0xFF
    _corrupt(objects, "manifest", bytes(manifest))
    assert_one_error(seg(objects, "dump", keys["manifest"]), keys["manifest"])

    _corrupt(objects, "manifest", objects["blobs"]["manifest"])
    (objects["root"] / keys["log"]).unlink()
    assert_one_error(seg(objects, "dump", keys["manifest"], "--deep"), "does not exist")

    wal = bytearray(objects["blobs"]["wal"])
    wal[20] ^= 0x10
    _corrupt(objects, "wal", bytes(wal))
    assert_one_error(seg(objects, "dump", keys["wal"]), "CRC mismatch")


def test_segments_bad_input(objects, tmp_path):
    missing = objects["keys"]["log"].replace("abc123", "zzz999")
    assert_one_error(seg(objects, "dump", missing), f"no object {missing!r}")
    assert_one_error(seg(objects, "dump", "nothing-under/"), "no objects under")
    assert_one_error(seg(objects, "dump", "../escape.log"), "bad object key")
    assert_one_error(seg(objects, "dump", "README.txt"), "no object 'README.txt'")
    (objects["root"] / "README.txt").write_text("not an object of ours")
    assert_one_error(seg(objects, "dump", "README.txt"), "README.txt: not a WAL object")
    assert_one_error(cli("segments", "ls", "--data-dir", str(tmp_path / "nowhere")), "no object store at")
    assert not (tmp_path / "nowhere").exists()  # inspecting never creates a store
    assert_one_error(cli("segments", "ls", "--object-store", "ftp://x/y"), "unknown object store scheme")
    assert_one_error(cli("segments", "ls", "--object-store", "file:///x", "--data-dir", "y"))
