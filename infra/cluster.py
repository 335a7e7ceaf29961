"""A local Stratalog cluster on 127.0.0.1: one etcd, one S3 endpoint (moto), N gateways.

`ClusterLauncher.start()` brings the parts up in dependency order (etcd, S3 and its bucket,
then every gateway at once) and returns when each gateway answers `/readyz`;
`stop_cluster()` takes them down in the reverse order: gateways first (SIGTERM, so they
flush), then S3, then etcd.

Layout of the cluster directory:

    cluster.json        the `ClusterState`: what runs, with pids, ports and log paths
    cluster.lock        held (flock) while a command changes the cluster
    data/etcd/          etcd's member data
    data/gateway-N/     gateway N's --data-dir
    logs/*.log          stdout and stderr of every process, kept after `down`

The S3 endpoint keeps objects in memory only, so metadata from an earlier run would point
at objects that are gone: every `up` starts from an empty `data/`. The state file is
written before the first process starts and after each one, so a launcher that dies
half-way still leaves enough behind for `down` to clean up.

Pids are recorded with the kernel's start time of the process (from /proc where there is
one), so a pid reused by an unrelated process is never mistaken for ours or signalled.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stratalog.infra import processes
from stratalog.infra.dirlock import DirectoryLock
from stratalog.infra.processes import LOOPBACK, http_get, log_tail

STATE_FILE = "cluster.json"
LOCK_FILE = "cluster.lock"
STATE_VERSION = 1
BUCKET = "stratalog"
PREFIX = "cluster"
# moto accepts any credentials; fixed dummy ones also keep real AWS keys from the user's
# environment away from a local endpoint.
S3_ENV = {"AWS_ACCESS_KEY_ID": "stratalog-local", "AWS_SECRET_ACCESS_KEY": "stratalog-local",
          "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
S3_ENV_DROPPED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL",
                  "AWS_ENDPOINT_URL_S3")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class ClusterError(Exception):
    """The cluster cannot be started, stopped or read; the message says why in one line."""


# -- processes ---------------------------------------------------------------------------

def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/PID/stat), None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after it do not.
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[19]


def _process_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()[0]


def pid_alive(pid: int, start_time: str | None) -> bool:
    """True when `pid` runs and is the process that was recorded (same start time)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user: the start time decides
    if Path("/proc/self/stat").exists():
        # A zombie has exited already; it only waits for its parent to reap it.
        if _process_state(pid) in (None, "Z", "X"):
            return False
        return start_time is None or process_start_time(pid) == start_time
    return True


@dataclass
class ProcessRecord:
    """One process of the cluster as the state file records it."""

    name: str                    # etcd, s3, gateway-1, ...
    role: str                    # etcd | s3 | gateway
    pid: int
    start_time: str | None
    log: str
    address: str                 # what clients connect to
    http: str | None = None      # gateways: HOST:PORT of /readyz
    broker_id: int | None = None

    def alive(self) -> bool:
        return pid_alive(self.pid, self.start_time)


@dataclass
class ClusterState:
    """Contents of `cluster.json`."""

    directory: str
    launcher_pid: int
    launcher_start_time: str | None
    detached: bool
    phase: str                   # starting | running
    bootstrap: str
    object_store: str
    s3_endpoint: str
    coordinator: str
    processes: list[ProcessRecord] = field(default_factory=list)
    version: int = STATE_VERSION

    @property
    def path(self) -> Path:
        return Path(self.directory) / STATE_FILE

    def launcher_alive(self) -> bool:
        return pid_alive(self.launcher_pid, self.launcher_start_time)

    def running(self) -> list[ProcessRecord]:
        return [p for p in self.processes if p.alive()]

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, self.path)  # readers never see half a file

    @classmethod
    def load(cls, directory: Path) -> "ClusterState | None":
        """The state in `directory`, None if there is none; ClusterError if it is unreadable."""
        path = Path(directory) / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ClusterError(f"cannot read cluster state {path}: {e}") from None
        try:
            if raw.get("version") != STATE_VERSION:
                raise ValueError(f"version {raw.get('version')!r}, expected {STATE_VERSION}")
            procs = [ProcessRecord(**p) for p in raw.pop("processes")]
            for p in procs:
                if not isinstance(p.pid, int) or not isinstance(p.name, str):
                    raise ValueError(f"bad process entry {p.name!r}")
            state = cls(**raw, processes=procs)
            if not isinstance(state.launcher_pid, int):
                raise ValueError("launcher_pid is not a number")
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ClusterError(f"cluster state {path} is malformed ({e}); if nothing of it runs, "
                               f"delete the file") from None
        return state


def terminate(records: list[ProcessRecord], children: dict[str, subprocess.Popen],
              timeout_s: float, clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> None:
    """SIGTERM each live process, wait up to `timeout_s` for all, then SIGKILL the rest."""
    live = [r for r in records if r.alive()]
    for r in live:
        _signal(r, signal.SIGTERM)
    deadline = clock() + timeout_s
    while live and clock() < deadline:
        for r in live:
            if r.name in children:
                children[r.name].poll()  # reap our own children so they stop being zombies
        live = [r for r in live if r.alive()]
        if live:
            sleep(0.05)
    for r in live:
        _signal(r, signal.SIGKILL)
    deadline = clock() + 5.0  # SIGKILL is not synchronous either
    while live and clock() < deadline:
        for r in live:
            if r.name in children:
                children[r.name].poll()
        live = [r for r in live if r.alive()]
        if live:
            sleep(0.05)


def _signal(record: ProcessRecord, sig: int) -> None:
    try:
        os.kill(record.pid, sig)
    except ProcessLookupError:
        pass


# -- the plan ----------------------------------------------------------------------------

def find_etcd(explicit: str | None) -> str:
    """The etcd binary: `explicit`, else /usr/bin/etcd, the venv's etcd, or etcd on PATH."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ClusterError(f"etcd binary not found or not executable: {explicit}")
        return str(path)
    found = processes.find_etcd()
    if found is None:
        raise ClusterError("etcd binary not found (looked in /usr/bin, the Python environment "
                           "and PATH): install etcd or pass --etcd PATH")
    return found


@dataclass
class ClusterPlan:
    """What `up` will start, checked before anything runs."""

    directory: Path
    gateways: int
    base_port: int = 19092
    http_base_port: int = 19644
    etcd_port: int = 19379       # etcd's peer port is the next one
    s3_port: int = 19000
    etcd_binary: str | None = None
    settings: list[tuple[str, str]] = field(default_factory=list)
    log_level: str = "INFO"
    ready_timeout_s: float = 60.0

    def kafka_port(self, i: int) -> int:
        return self.base_port + i

    def http_port(self, i: int) -> int:
        return self.http_base_port + i

    def ports(self) -> list[tuple[int, str]]:
        """Every port the cluster listens on, with what uses it."""
        out = [(self.etcd_port, "etcd client"), (self.etcd_port + 1, "etcd peer"),
               (self.s3_port, "S3 endpoint")]
        for i in range(self.gateways):
            out.append((self.kafka_port(i), f"gateway-{i + 1} Kafka"))
            out.append((self.http_port(i), f"gateway-{i + 1} HTTP"))
        return out

    def validate(self) -> None:
        if self.gateways < 1:
            raise ClusterError(f"--gateways must be at least 1, got {self.gateways}")
        seen: dict[int, str] = {}
        for port, what in self.ports():
            if not 1 <= port <= 65535:
                raise ClusterError(f"port {port} for {what} is outside 1-65535")
            if port in seen:
                raise ClusterError(f"port {port} is planned for both {seen[port]} and {what}; "
                                   "move --base-port, --http-base-port, --etcd-port or --s3-port")
            seen[port] = what

    def check_ports_free(self) -> None:
        for port, what in self.ports():
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                # As the servers themselves do: a port left in TIME_WAIT by the previous run
                # is free; only a live listener makes bind() fail.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((LOOPBACK, port))
                except OSError as e:
                    if e.errno == errno.EADDRINUSE:
                        raise ClusterError(f"port {port} ({what}) is already in use on {LOOPBACK}") from None
                    raise ClusterError(f"cannot use port {port} ({what}) on {LOOPBACK}: "
                                       f"{e.strerror or e}") from None

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{LOOPBACK}:{self.kafka_port(i)}" for i in range(self.gateways))

    @property
    def s3_endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.s3_port}"

    @property
    def coordinator(self) -> str:
        return f"etcd://{LOOPBACK}:{self.etcd_port}"

    @property
    def object_store(self) -> str:
        return f"s3://{BUCKET}/{PREFIX}"


def cluster_lock(directory: Path) -> DirectoryLock:
    """The lock on `<dir>/cluster.lock`, so two commands never race on one cluster."""
    return DirectoryLock(Path(directory) / LOCK_FILE, error=ClusterError,
                         busy=f"another 'stratalog cluster' command is using {directory}")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in S3_ENV_DROPPED}
    env.update(S3_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    # The gateways run `python -m stratalog.infra.cli` from this very source tree, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    return env


def gateway_ready(http: str, timeout_s: float = 1.0) -> bool:
    answer = http_get(f"http://{http}/readyz", timeout_s)
    return answer is not None and answer[0] == 200


# -- starting ----------------------------------------------------------------------------

class ClusterLauncher:
    """Starts one cluster as `plan` says and owns its processes until it stops or detaches."""

    def __init__(self, plan: ClusterPlan, progress: Callable[[str], None] = lambda _m: None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.plan = plan
        self.dir = Path(plan.directory).resolve()
        self.progress = progress
        self.clock = clock
        self.sleep = sleep
        self.children: dict[str, subprocess.Popen] = {}
        self._started: dict[str, processes.Child] = {}
        self.state: ClusterState | None = None
        self._lock = cluster_lock(self.dir)

    # The whole start: any failure (or Ctrl-C) stops what already runs, then re-raises.
    def start(self) -> ClusterState:
        self.plan.validate()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ClusterError(f"cannot use {self.dir} as the cluster directory: {e.strerror or e}") from None
        self._lock.acquire()
        try:
            self._check_no_cluster()
            etcd = find_etcd(self.plan.etcd_binary)
            if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
                raise ClusterError("the local S3 endpoint needs moto's server: "
                                   "pip install 'moto[server]'")
            self.plan.check_ports_free()
            self._fresh_directories()
            self.state = ClusterState(
                directory=str(self.dir), launcher_pid=os.getpid(),
                launcher_start_time=process_start_time(os.getpid()), detached=False,
                phase="starting", bootstrap=self.plan.bootstrap, object_store=self.plan.object_store,
                s3_endpoint=self.plan.s3_endpoint, coordinator=self.plan.coordinator)
            self.state.save()
            try:
                self._start_etcd(etcd)
                self._start_s3()
                self._start_gateways()
            except BaseException:
                self.stop()
                raise
            self.state.phase = "running"
            self.state.save()
            return self.state
        except BaseException:
            self._lock.release()
            raise

    def detach(self) -> None:
        """Leave the processes running on their own; `down` stops them from the state file."""
        assert self.state is not None
        self.state.detached = True
        self.state.save()
        self.children.clear()
        self._lock.release()

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop everything this launcher started, gateways first, and forget the cluster."""
        if self.state is not None:
            stop_cluster(self.state, self.children, timeout_s, self.clock, self.sleep)
        self._lock.release()

    def watch(self, report: Callable[[str], None]) -> None:
        """Foreground: report processes that exit; return when all have (Ctrl-C ends it sooner)."""
        assert self.state is not None
        reported: set[str] = set()
        while True:
            for rec in self.state.processes:
                if rec.name not in reported and self.children[rec.name].poll() is not None:
                    reported.add(rec.name)
                    report(f"{rec.name} exited with status {self.children[rec.name].returncode}: "
                                  f"{log_tail(rec.log, lines=1)} (log: {rec.log})")
            if len(reported) == len(self.state.processes):
                return
            self.sleep(0.2)

    def _check_no_cluster(self) -> None:
        old = ClusterState.load(self.dir)
        if old is None:
            if (self.dir / "data").exists():
                raise ClusterError(f"{self.dir / 'data'} exists but no {STATE_FILE} says it is ours; "
                                   "remove it or choose another --dir")
            return
        running = old.running()
        if running or old.launcher_alive():
            pids = ", ".join(str(p.pid) for p in running) or str(old.launcher_pid)
            raise ClusterError(f"a cluster is already running in {self.dir} (pids {pids}); stop it "
                               f"with 'stratalog cluster down --dir {self.dir}'")

    def _fresh_directories(self) -> None:
        # Only the data/ tree this launcher created earlier goes (see the module docstring).
        shutil.rmtree(self.dir / "data", ignore_errors=True)
        (self.dir / "data").mkdir()
        (self.dir / "logs").mkdir(exist_ok=True)

    def _spawn(self, name: str, role: str, cmd: list[str], address: str, **extra) -> ProcessRecord:
        log_path = self.dir / "logs" / f"{name}.log"
        log_path.unlink(missing_ok=True)
        # A session of its own: Ctrl-C at the terminal reaches only the launcher, which
        # then stops the parts in order; detached parts outlive the terminal.
        child = processes.Child(name, cmd, log_path, env=child_env(), cwd=self.dir, new_session=True)
        self.children[name] = child.popen
        self._started[name] = child
        rec = ProcessRecord(name=name, role=role, pid=child.pid, start_time=process_start_time(child.pid),
                            log=str(log_path), address=address, **extra)
        self.state.processes.append(rec)
        self.state.save()
        return rec

    def _died(self, rec: ProcessRecord) -> ClusterError:
        code = self.children[rec.name].returncode
        return ClusterError(f"{rec.name} exited with status {code} while starting: "
                            f"{log_tail(rec.log)} (log: {rec.log})")

    def _wait_until(self, rec: ProcessRecord, ready: Callable[[], bool], timeout_s: float) -> None:
        try:
            self._started[rec.name].wait_until(ready, timeout_s, "ready", clock=self.clock, sleep=self.sleep)
        except processes.ProcessFailed as e:
            if self.children[rec.name].poll() is not None:
                raise self._died(rec) from None
            raise ClusterError(str(e)) from None

    def _start_etcd(self, binary: str) -> None:
        port = self.plan.etcd_port
        self.progress(f"starting etcd on {LOOPBACK}:{port}")
        # No metrics listener is asked for, so etcd opens only its two ports.
        rec = self._spawn("etcd", "etcd", processes.etcd_command(binary, "stratalog", self.dir / "data" / "etcd",
                                                                 port, port + 1),
                          address=f"{LOOPBACK}:{port}")
        self._wait_until(rec, lambda: processes.etcd_healthy(port), 30.0)

    def _start_s3(self) -> None:
        self.progress(f"starting the S3 endpoint on {self.plan.s3_endpoint}")
        rec = self._spawn("s3", "s3", processes.moto_command(self.plan.s3_port), address=self.plan.s3_endpoint)
        self._wait_until(rec, lambda: processes.accepting(LOOPBACK, self.plan.s3_port), 30.0)
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        s3 = boto3.client("s3", endpoint_url=self.plan.s3_endpoint, region_name=S3_ENV["AWS_REGION"],
                          aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
                          config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}))
        try:
            s3.create_bucket(Bucket=BUCKET)
        except (BotoCoreError, ClientError) as e:
            raise ClusterError(f"cannot create bucket {BUCKET!r} on {self.plan.s3_endpoint}: {e}") from None

    def _start_gateways(self) -> None:
        p = self.plan
        self.progress(f"starting {p.gateways} gateway(s) on {p.bootstrap}")
        records = []
        for i in range(p.gateways):
            name = f"gateway-{i + 1}"
            listen = f"{LOOPBACK}:{p.kafka_port(i)}"
            http = f"{LOOPBACK}:{p.http_port(i)}"
            cmd = [sys.executable, "-m", "stratalog.infra.cli", "serve", "--listen", listen, "--advertised", listen,
                   "--http", http, "--data-dir", str(self.dir / "data" / name),
                   "--coordinator", p.coordinator, "--object-store", p.object_store,
                   "--s3-endpoint", p.s3_endpoint, "--s3-path-style", "--broker-id", str(i + 1),
                   "--log-level", p.log_level]
            for key, value in p.settings:
                cmd += ["--set", f"{key}={value}"]
            records.append(self._spawn(name, "gateway", cmd, address=listen, http=http, broker_id=i + 1))
        # One deadline for all: they start in parallel.
        deadline = self.clock() + p.ready_timeout_s
        waiting = list(records)
        while waiting:
            for rec in list(waiting):
                if self.children[rec.name].poll() is not None:
                    raise self._died(rec)
                if gateway_ready(rec.http, timeout_s=0.5):
                    waiting.remove(rec)
            if waiting:
                if self.clock() >= deadline:
                    rec = waiting[0]
                    raise ClusterError(f"{rec.name} did not become ready within {p.ready_timeout_s:g} s: "
                                       f"{log_tail(rec.log)} (log: {rec.log})")
                self.sleep(0.1)


# -- stopping ----------------------------------------------------------------------------

def stop_cluster(state: ClusterState, children: dict[str, subprocess.Popen] | None = None,
                 timeout_s: float = 20.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> int:
    """Stop gateways, then S3, then etcd; remove the data and the state file.

    Returns how many processes were still running. Logs stay for a look afterwards.
    """
    children = children or {}
    running = len(state.running())
    for role in ("gateway", "s3", "etcd"):
        terminate([r for r in state.processes if r.role == role], children, timeout_s, clock, sleep)
    still = state.running()
    if still:
        names = ", ".join(f"{r.name} (pid {r.pid})" for r in still)
        raise ClusterError(f"could not stop {names}")
    shutil.rmtree(Path(state.directory) / "data", ignore_errors=True)
    state.path.unlink(missing_ok=True)
    return running


def down(directory: Path, timeout_s: float = 20.0, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> tuple[ClusterState, int]:
    """Stop the cluster recorded in `directory`; (its state, how many processes ran)."""
    directory = Path(directory).resolve()
    state = ClusterState.load(directory)
    if state is None:
        raise ClusterError(f"no cluster in {directory} (no {STATE_FILE})")
    if not state.detached and state.launcher_alive() and state.launcher_pid != os.getpid():
        # A foreground launcher owns its processes: ask it to stop them in order, and wait.
        running = len(state.running())
        os.kill(state.launcher_pid, signal.SIGTERM)
        deadline = clock() + 3 * timeout_s
        while state.launcher_alive() and clock() < deadline:
            sleep(0.05)
        if ClusterState.load(directory) is None:
            return state, running
    with cluster_lock(directory):
        return state, stop_cluster(state, None, timeout_s, clock, sleep)


def status(directory: Path) -> tuple[ClusterState, list[tuple[ProcessRecord, str]]]:
    """The recorded cluster and each process's condition: ready, starting, running or exited."""
    directory = Path(directory).resolve()
    state = ClusterState.load(directory)
    if state is None:
        raise ClusterError(f"no cluster in {directory} (no {STATE_FILE}); start one with "
                           "'stratalog cluster up'")
    rows = []
    for rec in state.processes:
        if not rec.alive():
            condition = "exited"
        elif rec.role == "gateway":
            condition = "ready" if rec.http and gateway_ready(rec.http) else "starting"
        else:
            condition = "running"
        rows.append((rec, condition))
    return state, rows
