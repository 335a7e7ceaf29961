"""What transactions cost: produce throughput of one transactional producer (transactions of
100 and of 10,000 records) beside an idempotent producer, and the commit latency
(commit_transaction, from the call to its return) p50/p99, against one `stratalog serve`
on the embedded store, same client, same data, in one run; and for each transactional mode
where a transaction's own round trips go, as the gateway timed them (its mean
AddPartitionsToTxn and EndTxn, from /metrics).

    .venv/bin/python bench/transactions.py [--mib 32] [--runs 3]

The three modes are measured in turn, the order rotating from run to run; each
throughput is also shown as a fraction of idempotent produce in the same run. Prints
figures; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.infra.processes import free_port

from common import prometheus
from produce_fetch import RECORD, wait_port

PARTITIONS = 8
MODES = ("idempotent", "txn-100", "txn-10000")
# The requests a transaction adds to producing, as the gateway's /metrics names them.
TXN_APIS = ("AddPartitionsToTxn", "EndTxn")


def start_gateway(work: Path) -> tuple[subprocess.Popen, str, str]:
    """The gateway, its bootstrap address and its /metrics URL."""
    port, http = free_port(), free_port()
    cmd = [sys.executable, "-m", "stratalog.infra.cli", "serve", "--data-dir", str(work / "data"),
           "--listen", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{http}",
           "--set", "log.segment.bytes=16777216"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(work / "gateway.log", "w"))
    proc.stdout.readline()
    wait_port(port)
    return proc, f"127.0.0.1:{port}", f"http://127.0.0.1:{http}/metrics"


def api_seconds(metrics_url: str) -> dict[str, tuple[float, float]]:
    """(requests answered, seconds spent answering them) of each of TXN_APIS so far."""
    samples = prometheus(metrics_url)
    return {api: (samples.get(f'stratalog_request_seconds_count{{api="{api}"}}', 0.0),
                  samples.get(f'stratalog_request_seconds_sum{{api="{api}"}}', 0.0)) for api in TXN_APIS}


def mean_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], api: str) -> float:
    count, seconds = (a - b for a, b in zip(after[api], before[api]))
    return seconds / count * 1000 if count else float("nan")


def produce(bootstrap: str, topic: str, mib: int, txn_size: int | None) -> tuple[float, list[float]]:
    """(MiB/s, commit latencies in ms) of `mib` MiB of 1 KiB records; `txn_size` None
    produces idempotently without transactions."""
    conf = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
            "batch.size": 1 << 20, "queue.buffering.max.kbytes": 1 << 20}
    if txn_size is not None:
        conf["transactional.id"] = f"{topic}-producer"
    p = Producer(conf)
    # Warm up outside the clock: connections, metadata and the producer id.
    if txn_size is not None:
        p.init_transactions(30)
        p.begin_transaction()
    p.produce(topic, value=b"warm-up", partition=0)
    p.commit_transaction(30) if txn_size is not None else p.flush(30)
    value = b"x" * RECORD
    total = mib * 1024 * 1024 // RECORD
    commits: list[float] = []
    began = time.perf_counter()
    sent = 0
    while sent < total:
        n = min(txn_size or total, total - sent)
        if txn_size is not None:
            p.begin_transaction()
        for i in range(n):
            while True:
                try:
                    p.produce(topic, value=value, partition=(sent + i) % PARTITIONS)
                    break
                except BufferError:
                    p.poll(0.01)
            p.poll(0)
        if txn_size is not None:
            t = time.perf_counter()
            p.commit_transaction(60)
            commits.append((time.perf_counter() - t) * 1000)
        sent += n
    p.flush(60)
    seconds = time.perf_counter() - began
    return mib / seconds, commits


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=32, help="MiB produced per mode and run (1 KiB records)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stratalog-bench-txn-"))
    proc, bootstrap, metrics_url = start_gateway(work)
    rows, gateway = [], []
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for run in range(args.runs):
            order = MODES[run % 3:] + MODES[:run % 3]
            figures, seen = {}, {}
            for mode in order:
                topic = f"txn-bench-{mode}-{run}"
                admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
                size = None if mode == "idempotent" else int(mode.split("-")[1])
                before = api_seconds(metrics_url)
                figures[mode] = produce(bootstrap, topic, args.mib, size)
                seen[mode] = [mean_ms(before, api_seconds(metrics_url), api) for api in TXN_APIS]
            rows.append(figures)
            gateway.append(seen)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.mib} MiB of {RECORD}-byte records per mode and run, {PARTITIONS} partitions, "
          "one confluent-kafka producer, linger.ms=5, embedded store; MiB/s (fraction of idempotent "
          "in the same run), commit_transaction latency p50/p99 ms\n")
    print(f"{'run':>3} | {'idempotent':>10} | {'txn of 100':>14} | {'commit p50/p99':>15} | "
          f"{'txn of 10000':>14} | {'commit p50/p99':>15}")
    for i, f in enumerate(rows, 1):
        base = f["idempotent"][0]
        cells = [f"{base:10.1f}"]
        for mode in MODES[1:]:
            mibs, commits = f[mode]
            cells += [f"{mibs:6.1f} ({mibs / base:4.2f}x)",
                      f"{_pct(commits, 0.5):6.1f}/{_pct(commits, 0.99):6.1f}"]
        print(f"{i:>3} | " + " | ".join(cells))
    print("\nthe gateway's own mean time per request, ms: " + ", ".join(TXN_APIS) + "\n")
    print(f"{'run':>3} | " + " | ".join(f"{m:>20}" for m in MODES[1:]))
    for i, seen in enumerate(gateway, 1):
        print(f"{i:>3} | " + " | ".join(f"{' / '.join(f'{v:5.1f}' for v in seen[m]):>20}" for m in MODES[1:]))
    medians = {m: statistics.median(r[m][0] for r in rows) for m in MODES}
    print("\nmedian MiB/s: " + ", ".join(f"{m} {v:.1f}" for m, v in medians.items()))


if __name__ == "__main__":
    main()
