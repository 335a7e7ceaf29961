"""What TLS and SASL cost: produce and fetch throughput over PLAINTEXT, SSL and SASL_SSL
(SCRAM-SHA-512) listeners of one gateway, same client, same data, in one run.

    .venv/bin/python bench/security.py [--mib 512] [--runs 3] [--clients 2] [--consumers 2]

The listeners are measured in turn, the order rotating from run to run; each figure is
also shown as a fraction of PLAINTEXT's in the same run. Prints figures; never passes or
fails on time.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from stratalog.infra import devcerts
from stratalog.infra.processes import free_port

from produce_fetch import RECORD, fetch_throughput, positive, produce_throughput, wait_port

PARTITIONS = 8
USER, PASSWORD = "bench", "bench-password-1"
LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL")


def start_gateway(work: Path) -> tuple[subprocess.Popen, dict[str, dict]]:
    certs = devcerts.make(work / "certs")
    data = work / "data"
    py = [sys.executable, "-m", "stratalog.infra.cli"]
    subprocess.run([*py, "users", "add", USER, "--password", PASSWORD, "--mechanism", "SCRAM-SHA-512",
                    "--data-dir", str(data)], check=True, capture_output=True)
    ports = {name: free_port() for name in LISTENERS}
    settings = {"listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
                "ssl.keystore.location": str(certs.server), "log.segment.bytes": "16777216",
                "log.roll.ms": "3000"}
    cmd = [*py, "serve", "--data-dir", str(data), "--http", "off"]
    for k, v in settings.items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(work / "gateway.log", "w"))
    proc.stdout.readline()
    for port in ports.values():
        wait_port(port)
    confs = {}
    for name, port in ports.items():
        conf = {"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": name}
        if name != "PLAINTEXT":
            conf["ssl.ca.location"] = str(certs.ca)
        if name == "SASL_SSL":
            conf.update({"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USER, "sasl.password": PASSWORD})
        confs[name] = conf
    return proc, confs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="MiB produced per listener and run (1 KiB records)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clients", type=positive, default=2, help="producer processes")
    ap.add_argument("--consumers", type=positive, default=2, help="consumer processes (one decrypts more slowly "
                    "than the gateway encrypts)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stratalog-bench-security-"))
    proc, confs = start_gateway(work)
    rows = []
    try:
        admin = AdminClient(confs["PLAINTEXT"])
        for run in range(args.runs):
            order = LISTENERS[run % 3:] + LISTENERS[:run % 3]
            figures = {}
            for name in order:
                topic = f"sec-{name.lower()}-{run}"
                admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
                conf = confs[name]
                produced = produce_throughput(conf["bootstrap.servers"], topic, args.mib, PARTITIONS,
                                              idempotent=False, conf=conf, clients=args.clients)[0]
                fetched = fetch_throughput(conf["bootstrap.servers"], topic, PARTITIONS, conf=conf,
                                           consumers=args.consumers)
                figures[name] = (produced, fetched)
            rows.append(figures)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.mib} MiB of {RECORD}-byte records per listener and run, {PARTITIONS} partitions, "
          f"confluent-kafka ({args.clients} producer and {args.consumers} consumer processes), acks=all, "
          "linger.ms=5; MiB/s (fraction of PLAINTEXT in the same run)\n")
    print(f"{'run':>3} | " + " | ".join(f"{n + ' produce':>24} | {n + ' fetch':>24}" for n in LISTENERS))
    for i, figures in enumerate(rows, 1):
        base_p, base_f = figures["PLAINTEXT"]
        cells = []
        for n in LISTENERS:
            p, f = figures[n]
            cells += [f"{p:10.1f} ({p / base_p:4.2f}x)", f"{f:10.1f} ({f / base_f:4.2f}x)"]
        print(f"{i:>3} | " + " | ".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
