"""infra/: `stratalog cluster up|down|status` against real etcd, moto and gateway processes,
and static checks of infra/Dockerfile and infra/compose.yaml (no Docker engine here)."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from queue import Queue

import pytest

from conftest import with_ctrl_c
from etcd_fixture import etcd_binary
from stratalog.infra.cli import build_parser, main
from stratalog.infra.cluster import ClusterState, pid_alive, process_start_time

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "infra" / "Dockerfile"
COMPOSE = ROOT / "infra" / "compose.yaml"

needs_etcd = pytest.mark.skipif(etcd_binary() is None, reason="no etcd binary (/usr/bin/etcd or the venv's)")


# -- helpers -----------------------------------------------------------------------------

def free_block(count: int) -> int:
    """The first of `count` consecutive ports that are all free on 127.0.0.1."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


def port_flags(gateways: int) -> tuple[list[str], dict[str, int]]:
    base = free_block(2 * gateways + 3)
    ports = {"kafka": base, "http": base + gateways, "etcd": base + 2 * gateways,
             "s3": base + 2 * gateways + 2}
    return (["--gateways", str(gateways), "--base-port", str(ports["kafka"]), "--http-base-port", str(ports["http"]),
             "--etcd-port", str(ports["etcd"]), "--s3-port", str(ports["s3"])], ports)


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stratalog.infra.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def one_error_line(stderr: str, needle: str) -> str:
    """stderr is exactly one `stratalog: error: ...` line, holding needle."""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stratalog: error: "), stderr
    assert needle in lines[0], lines[0]
    return lines[0]


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def listeners_of(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket the processes hold, from /proc."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            if table == "tcp":
                addr = socket.inet_ntop(socket.AF_INET, bytes.fromhex(hex_addr)[::-1])
            else:
                addr = "ipv6:" + hex_addr
            found.append((addr, int(hex_port, 16)))
    return found


def cleanup(directory: Path) -> None:
    """Whatever a failed test left: `down`, then SIGKILL of recorded pids still ours."""
    try:
        state = ClusterState.load(directory)
    except Exception:
        return
    if state is None:
        return
    cli("down", "--dir", str(directory), timeout=60)
    for rec in state.processes:
        if pid_alive(rec.pid, rec.start_time):
            os.kill(rec.pid, signal.SIGKILL)


@pytest.fixture
def cluster_dir(tmp_path):
    d = tmp_path / "cluster"
    yield d
    cleanup(d)


def healthcheck_command() -> list[str]:
    for name, rest in final_stage(parse_dockerfile(DOCKERFILE.read_text())):
        if name == "HEALTHCHECK":
            return json.loads(rest[rest.index("CMD") + 3:].strip())
    raise AssertionError("no HEALTHCHECK")


# -- the launcher, end to end ------------------------------------------------------------

@needs_etcd
def test_up_produce_consume_status_down(cluster_dir):
    ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
    from confluent_kafka.admin import AdminClient, NewTopic
    import boto3

    flags, ports = port_flags(2)
    up = cli("cluster", "up", "--detach", "--dir", str(cluster_dir), *flags)
    assert up.returncode == 0, up.stderr
    out = dict(line.split(": ", 1) for line in up.stdout.splitlines())
    bootstrap = out["bootstrap"]
    assert bootstrap == f"127.0.0.1:{ports['kafka']},127.0.0.1:{ports['kafka'] + 1}"
    assert out["object store"] == "s3://stratalog/cluster"

    state = json.loads((cluster_dir / "cluster.json").read_text())
    assert state["detached"] is True and state["phase"] == "running"
    procs = {p["name"]: p for p in state["processes"]}
    assert sorted(procs) == ["etcd", "gateway-1", "gateway-2", "s3"]
    assert [procs[g]["broker_id"] for g in ("gateway-1", "gateway-2")] == [1, 2]
    pids = [p["pid"] for p in procs.values()]
    assert all(pid_alive(p["pid"], p["start_time"]) for p in procs.values())

    # Nothing listens anywhere but 127.0.0.1, and exactly on the planned ports.
    if Path("/proc/net/tcp").exists():
        socks = listeners_of(pids)
        assert {addr for addr, _ in socks} == {"127.0.0.1"}, socks
        assert {port for _, port in socks} == {
            ports["kafka"], ports["kafka"] + 1, ports["http"], ports["http"] + 1,
            ports["etcd"], ports["etcd"] + 1, ports["s3"]}

    # A second cluster in the same directory is refused, without disturbing the first.
    again = cli("cluster", "up", "--detach", "--dir", str(cluster_dir),
                *port_flags(1)[0])
    assert again.returncode == 1
    one_error_line(again.stderr, "already running")

    # Produce and consume through the printed bootstrap.
    topic = f"infra-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(20)
    producer = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 20000})
    delivered = []
    producer.produce(topic, key=b"k", value=b"hello stratalog", partition=1,
                     on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(20) == 0
    assert delivered == [(None, 0)]
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "infra-test",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 1, 0)])
    got = None
    deadline = time.monotonic() + 20
    while got is None and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            got = (msg.key(), msg.value(), msg.offset())
    consumer.close()
    assert got == (b"k", b"hello stratalog", 0)

    # The record went through the cluster's S3 bucket (a WAL object), not a local file store.
    s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{ports['s3']}", region_name="us-east-1",
                      aws_access_key_id="x", aws_secret_access_key="x")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="stratalog", Prefix="cluster/").get("Contents", [])]
    assert any(k.startswith("cluster/wal/") for k in keys), keys

    status = cli("cluster", "status", "--dir", str(cluster_dir))
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line.split() for line in status.stdout.splitlines()[2:6]}
    assert rows["gateway-1"][2] == "ready" and rows["gateway-2"][2] == "ready"
    assert rows["etcd"][2] == "running" and rows["s3"][2] == "running"
    assert f"bootstrap: {bootstrap}" in status.stdout

    # The image's health check, pointed at a real gateway's HTTP port, passes.
    probe = [part.replace(":9644", f":{ports['http']}") for part in healthcheck_command()]
    assert subprocess.run(probe, capture_output=True, timeout=10).returncode == 0

    down = cli("cluster", "down", "--dir", str(cluster_dir))
    assert down.returncode == 0, down.stderr
    assert "4 process(es) were running" in down.stdout
    for p in procs.values():
        assert not pid_alive(p["pid"], p["start_time"]), p["name"]
    for port in (ports["kafka"], ports["kafka"] + 1, ports["http"], ports["etcd"], ports["s3"]):
        assert not listening(port), port
    assert not (cluster_dir / "cluster.json").exists()
    assert not (cluster_dir / "data").exists()
    assert (cluster_dir / "logs" / "gateway-1.log").read_text().count("serving Kafka") == 1
    assert subprocess.run(probe, capture_output=True, timeout=10).returncode != 0

    gone = cli("cluster", "status", "--dir", str(cluster_dir))
    assert gone.returncode == 1
    one_error_line(gone.stderr, "no cluster in")


@needs_etcd
def test_foreground_cluster_stops_on_ctrl_c(cluster_dir):
    flags, ports = port_flags(1)
    launcher = subprocess.Popen([sys.executable, "-m", "stratalog.infra.cli", "cluster", "up",
                                 "--dir", str(cluster_dir), *flags],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=with_ctrl_c)
    try:
        # A thread reads stdout, so a launcher that never prints cannot hang the test.
        queue: Queue = Queue()
        threading.Thread(target=lambda: [queue.put(line) for line in launcher.stdout], daemon=True).start()
        lines = []
        while not any(line.startswith("state: ") for line in lines):
            lines.append(queue.get(timeout=60))
        assert f"bootstrap: 127.0.0.1:{ports['kafka']}\n" in lines
        state = ClusterState.load(cluster_dir)
        assert state.detached is False and state.launcher_pid == launcher.pid
        assert listening(ports["kafka"])
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(40) == 0
        assert "stopping the cluster" in launcher.stderr.read()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    for rec in state.processes:
        assert not pid_alive(rec.pid, rec.start_time), rec.name
    assert not listening(ports["kafka"]) and not listening(ports["etcd"])
    assert not (cluster_dir / "cluster.json").exists()


@needs_etcd
def test_gateway_that_fails_to_start_is_reported_with_its_log(cluster_dir):
    flags, ports = port_flags(2)
    up = cli("cluster", "up", "--detach", "--dir", str(cluster_dir), *flags,
             "--set", "wal.flush.ms=soon")
    assert up.returncode == 1
    line = one_error_line(up.stderr, "exited with status 2 while starting")
    assert "invalid value for wal.flush.ms" in line  # the tail of the gateway's log
    log = line.rsplit("(log: ", 1)[1].rstrip(")")
    assert Path(log).parent == cluster_dir.resolve() / "logs" and "wal.flush.ms" in Path(log).read_text()
    assert up.stdout == ""  # no bootstrap for a cluster that is not there
    # What had started (etcd, S3, the other gateway) was stopped again.
    assert not (cluster_dir / "cluster.json").exists()
    for port in (ports["etcd"], ports["s3"], ports["kafka"], ports["kafka"] + 1):
        assert not listening(port), port


# -- bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("argv, code, needle", [
    (["--gateways", "0"], 2, "must be at least 1"),
    (["--base-port", "70000"], 2, "1-65535"),
    (["--base-port", "many"], 2, "expected a whole number"),
    (["--detach", "--foreground"], 2, "not allowed with"),
    (["--gateways", "2", "--base-port", "20000", "--http-base-port", "20001"], 1, "planned for both"),
    (["--gateways", "3", "--base-port", "65534"], 1, "outside 1-65535"),
    (["--gateways", "1", "--etcd-port", "19092"], 1, "planned for both"),
])
def test_bad_up_arguments(capsys, tmp_path, argv, code, needle):
    got, out, err = run_main(capsys, "cluster", "up", "--dir", str(tmp_path / "c"), *argv)
    assert got == code
    one_error_line(err, needle)
    assert out == ""
    assert not (tmp_path / "c" / "cluster.json").exists()


def test_missing_etcd_binary(capsys, tmp_path):
    got, _, err = run_main(capsys, "cluster", "up", "--dir", str(tmp_path / "c"),
                           "--etcd", str(tmp_path / "no-such-etcd"), *port_flags(1)[0])
    assert got == 1
    one_error_line(err, "etcd binary not found")
    assert not (tmp_path / "c" / "logs").exists()  # nothing was started


@needs_etcd
def test_port_in_use(capsys, tmp_path):
    flags, ports = port_flags(2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", ports["kafka"] + 1))
        busy.listen()
        got, _, err = run_main(capsys, "cluster", "up", "--dir", str(tmp_path / "c"),
                               *flags)
    assert got == 1
    one_error_line(err, f"port {ports['kafka'] + 1} (gateway-2 Kafka) is already in use on 127.0.0.1")
    assert not (tmp_path / "c" / "logs").exists()
    assert not listening(ports["etcd"])


def test_directory_that_is_a_file(capsys, tmp_path):
    (tmp_path / "c").write_text("not a directory")
    got, _, err = run_main(capsys, "cluster", "up", "--dir", str(tmp_path / "c"), *port_flags(1)[0])
    assert got == 1
    one_error_line(err, "cluster directory")


def test_foreign_data_directory_is_left_alone(capsys, tmp_path):
    keep = tmp_path / "c" / "data" / "precious"
    keep.mkdir(parents=True)
    got, _, err = run_main(capsys, "cluster", "up", "--dir", str(tmp_path / "c"), *port_flags(1)[0])
    assert got == 1
    one_error_line(err, "no cluster.json says it is ours")
    assert keep.is_dir()


@pytest.mark.parametrize("action", ["down", "status"])
def test_no_cluster(capsys, tmp_path, action):
    got, out, err = run_main(capsys, "cluster", action, "--dir", str(tmp_path / "nothing"))
    assert got == 1 and out == ""
    one_error_line(err, "no cluster in")


@pytest.mark.parametrize("content, needle", [
    ("{not json", "cannot read cluster state"),
    ("[1, 2]", "is malformed"),
    (json.dumps({"version": 1, "directory": "x"}), "is malformed"),
    (json.dumps({"version": 99, "processes": []}), "is malformed"),
    ("", "cannot read cluster state"),
])
@pytest.mark.parametrize("action", ["up", "down", "status"])
def test_corrupt_state_file(capsys, tmp_path, content, needle, action):
    d = tmp_path / "c"
    d.mkdir()
    (d / "cluster.json").write_text(content)
    extra = port_flags(1)[0] if action == "up" else []
    got, _, err = run_main(capsys, "cluster", action, "--dir", str(d), *extra)
    assert got == 1
    one_error_line(err, needle)
    assert (d / "cluster.json").read_text() == content  # left for the user to look at


def test_reused_pid_is_never_signalled(capsys, tmp_path):
    """A recorded pid now held by another process (other start time) is treated as gone."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        d = tmp_path / "c"
        (d / "data").mkdir(parents=True)
        real = process_start_time(bystander.pid)
        if real is None:
            pytest.skip("no /proc: start times cannot be checked")
        fake = str(int(real) + 12345)
        rec = {"role": "gateway", "pid": bystander.pid, "start_time": fake, "log": str(d / "g.log"),
               "address": "127.0.0.1:1", "http": "127.0.0.1:1", "broker_id": 1}
        state = {"version": 1, "directory": str(d), "launcher_pid": bystander.pid,
                 "launcher_start_time": fake, "detached": False, "phase": "running",
                 "bootstrap": "127.0.0.1:1", "object_store": "s3://stratalog/cluster",
                 "s3_endpoint": "http://127.0.0.1:2", "coordinator": "etcd://127.0.0.1:3",
                 "processes": [{"name": "gateway-1", **rec}, {"name": "etcd", **rec, "role": "etcd"}]}
        (d / "cluster.json").write_text(json.dumps(state))

        got, out, err = run_main(capsys, "cluster", "status", "--dir", str(d))
        assert got == 1
        assert [line.split()[2] for line in out.splitlines()[2:4]] == ["exited", "exited"]
        one_error_line(err, "not running or not ready: gateway-1, etcd")

        got, out, err = run_main(capsys, "cluster", "down", "--dir", str(d))
        assert got == 0, err
        assert "0 process(es) were running" in out
        assert bystander.poll() is None  # untouched
        assert not (d / "cluster.json").exists() and not (d / "data").exists()
    finally:
        bystander.kill()
        bystander.wait()


# -- Dockerfile --------------------------------------------------------------------------

def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            name, _, rest = full.partition(" ")
            out.append((name.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def final_stage(instructions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    starts = [i for i, (name, _) in enumerate(instructions) if name == "FROM"]
    return instructions[starts[-1]:]


def test_dockerfile_parser_handles_continuations_and_comments():
    text = "# c\nFROM a:1 AS b\nRUN x \\\n  # inner\n  && y\n\nCMD [\"z\"]\n"
    assert parse_dockerfile(text) == [("FROM", "a:1 AS b"), ("RUN", "x  && y"), ("CMD", '["z"]')]
    with pytest.raises(AssertionError):
        parse_dockerfile("RUN x \\\n")


def test_dockerfile_has_required_instructions():
    instructions = parse_dockerfile(DOCKERFILE.read_text())
    froms = [rest.split()[0] for name, rest in instructions if name == "FROM"]
    assert froms and all(f == "python:3.11-slim" for f in froms), froms
    final = final_stage(instructions)
    by_name: dict[str, list[str]] = {}
    for name, rest in final:
        by_name.setdefault(name, []).append(rest)

    assert any("pip install" in r and "stratalog" in r for r in by_name["RUN"])
    user = by_name["USER"][-1].split(":")[0]
    assert user not in ("root", "0", ""), user
    assert json.loads(by_name["ENTRYPOINT"][-1]) == ["stratalog"]
    exposed = {p for r in by_name["EXPOSE"] for p in r.split()}
    assert {"9092", "9644"} <= exposed
    volumes = [v for r in by_name["VOLUME"] for v in json.loads(r)]

    # The default command is a valid `stratalog serve` command line.
    cmd = json.loads(by_name["CMD"][-1])
    args = build_parser().parse_args(cmd)
    assert args.command == "serve"
    assert args.listen == "0.0.0.0:9092"
    assert args.http.endswith(":9644")
    assert str(args.data_dir) in volumes

    health = by_name["HEALTHCHECK"][-1]
    assert "CMD" in health
    probe = healthcheck_command()
    assert any("http://127.0.0.1:9644/readyz" in part for part in probe), probe


def test_dockerfile_copies_every_package_it_installs():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = set(project["tool"]["setuptools"]["package-dir"].values())
    copied = set()
    for name, rest in parse_dockerfile(DOCKERFILE.read_text()):
        if name != "COPY" or rest.startswith("--from"):
            continue
        *sources, _dest = shlex.split(rest)
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: not in the build context"
            copied.add(src.strip("/"))
    assert "pyproject.toml" in copied
    assert packages <= copied, packages - copied


# -- compose.yaml ------------------------------------------------------------------------

def load_compose() -> dict:
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed")
    return yaml.safe_load(COMPOSE.read_text())


def gateway_services(compose: dict) -> dict[str, dict]:
    return {name: svc for name, svc in compose["services"].items()
            if isinstance(svc.get("command"), list) and svc["command"][:1] == ["serve"]}


def test_compose_parses_and_gateways_are_distinct():
    compose = load_compose()
    services = compose["services"]
    assert {"etcd", "s3", "create-bucket"} <= set(services)
    assert services["s3"]["image"].startswith(("motoserver/moto", "minio/minio"))
    assert services["etcd"]["image"].split("/")[-1].startswith("etcd:")
    gateways = gateway_services(compose)
    assert len(gateways) == 3

    parser = build_parser()
    seen = {"broker": set(), "advertised": set(), "host ports": set(), "volume": set()}
    for name, svc in gateways.items():
        args = parser.parse_args(svc["command"])  # the real `serve` flags, or this fails
        assert args.broker_id is not None and args.advertised, name
        assert args.coordinator == "etcd://etcd:2379"
        assert args.object_store.startswith("s3://stratalog/")
        assert args.s3_endpoint == "http://s3:5000" and args.s3_path_style
        seen["broker"].add(args.broker_id)
        seen["advertised"].add(args.advertised)
        # Each advertised address is the host side of this gateway's published Kafka port.
        kafka_port = args.listen.rsplit(":", 1)[1]
        published = {p.rsplit(":", 1)[1]: p.rsplit(":", 1)[0] for p in svc["ports"]}
        assert published[kafka_port] == args.advertised, name
        for p in svc["ports"]:
            assert p.startswith("127.0.0.1:"), p
            seen["host ports"].add(p.split(":")[1])
        seen["volume"].update(v.split(":")[0] for v in svc["volumes"])
        assert svc["depends_on"]["etcd"]["condition"] == "service_healthy"
        assert svc["depends_on"]["create-bucket"]["condition"] == "service_completed_successfully"
        env = svc["environment"]
        assert env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"] and env["AWS_REGION"]
    assert seen["broker"] == {1, 2, 3}
    assert len(seen["advertised"]) == 3
    assert len(seen["host ports"]) == 6  # Kafka and HTTP of each gateway
    assert len(seen["volume"]) == 3

    # etcd and S3 answer where the gateways look for them.
    etcd_cmd = " ".join(services["etcd"]["command"])
    assert "--listen-client-urls=http://0.0.0.0:2379" in etcd_cmd
    assert "--advertise-client-urls=http://etcd:2379" in etcd_cmd
    assert services["s3"]["entrypoint"][-2:] == ["-p", "5000"]
    assert services["create-bucket"]["depends_on"]["s3"]["condition"] == "service_healthy"
    for svc in services.values():
        for p in svc.get("ports", []):
            assert p.startswith("127.0.0.1:"), p


def test_compose_bucket_job_creates_the_bucket_against_moto(tmp_path):
    pytest.importorskip("moto", reason="moto is not installed")
    import boto3
    from moto_fixture import MotoServer

    compose = load_compose()
    job = compose["services"]["create-bucket"]
    script = job["command"][0]
    assert job["entrypoint"] == ["python", "-c"]
    bucket = gateway_services(compose)["gateway-1"]["command"]
    bucket = bucket[bucket.index("--object-store") + 1].split("/")[2]
    server = MotoServer(port=free_block(1)).start()
    try:
        endpoint = server.url
        env = {**os.environ, **job["environment"]}
        for _ in range(2):  # idempotent: a restarted job must succeed too
            done = subprocess.run([sys.executable, "-c", script.replace("http://s3:5000", endpoint)],
                                  env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="x", aws_secret_access_key="x")
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == [bucket]
    finally:
        server.stop()
