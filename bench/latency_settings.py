"""acks=all latency of `produce_fetch.py`'s two latency cases on the embedded store, for
gateway settings side by side: each variant runs a fresh gateway, variants alternate (the
order reversed every other round), with what the gateway saw during each run.

    .venv/bin/python bench/latency_settings.py [--rounds 3] [--seconds 5] NAME[=KEY:VALUE[,KEY:VALUE...]] ...

A variant named alone is the defaults: `now` beside `spaced=wal.flush.ms:5`. `--seconds`
is each case's measured window (after its 2 s warm-up): past 60 it includes the WAL
collection passes and the log index a long-running gateway holds. Prints figures; never
passes or fails on time.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from produce_fetch import LATENCY_CASES, create, latency_case, start_stratalog


def variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, spec = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME[=KEY:VALUE[,KEY:VALUE...]]")
    settings = {}
    for pair in filter(None, spec.split(",")):
        key, sep, value = pair.partition(":")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{pair!r}: give KEY:VALUE")
        settings[key] = value
    return name, settings


def run(name: str, settings: dict[str, str], seconds: float) -> list[str]:
    work = Path(tempfile.mkdtemp(prefix="stratalog-latency-"))
    proc, port, http = start_stratalog(work / "data", settings)
    try:
        bootstrap = f"127.0.0.1:{port}"
        create(bootstrap, "latency", 8)
        lines = []
        for label, mbps, idempotent in LATENCY_CASES:
            p50, p99, got, seen = latency_case(bootstrap, proc.pid, http, mbps, idempotent, seconds)
            lines.append(f"{name:>12} {label:>20}: p50 {p50:7.1f} ms, p99 {p99:7.1f} ms, {got:5.1f} MB/s "
                         f"delivered | {seen}")
        return lines
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured window of each case")
    ap.add_argument("variants", nargs="+", type=variant, help="NAME[=KEY:VALUE[,KEY:VALUE...]]")
    args = ap.parse_args()
    if args.seconds <= 0:
        ap.error("--seconds must be positive")
    for r in range(args.rounds):
        order = args.variants if r % 2 == 0 else list(reversed(args.variants))
        for name, settings in order:
            for line in run(name, settings, args.seconds):
                print(f"round {r + 1} {line}", flush=True)


if __name__ == "__main__":
    main()
