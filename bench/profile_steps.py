"""A gateway's event loop time split by step, from py-spy's samples: the benchmarks name
each step of a request by the functions whose samples it takes (`Steps`), and a sample
goes to the step of its innermost frame that names one, so a handler's own lines count as
glue and the parts it calls as theirs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

# (step, function names): a name ending in "_" or "." also takes the functions it begins.
Steps = tuple[tuple[str, tuple[str, ...]], ...]
THE_LOOP = "the event loop itself (uvloop, GC)"


NO_PY_SPY = "py-spy is not installed: pip install -e '.[bench]' adds it"


def py_spy_binary() -> str | None:
    return shutil.which("py-spy", path=Path(sys.executable).parent) or shutil.which("py-spy")


def py_spy(pid: int, output: Path) -> subprocess.Popen:
    """py-spy sampling a process into `output` (collapsed stacks) until it gets SIGINT."""
    binary = py_spy_binary()
    if binary is None:
        raise SystemExit(NO_PY_SPY)
    spy = subprocess.Popen([binary, "record",
                            "--format", "raw", "--rate", "250", "--nonblocking", "--threads",
                            "--pid", str(pid), "--output", str(output)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached
    return spy


def breakdown(profile: Path, steps: Steps) -> tuple[list[tuple[str, float]], float]:
    """The event loop's (main thread's) samples by step, as fractions of them (the rest is
    the loop itself: its socket calls, scheduling, garbage collection), and the other
    threads' samples (file writes and reads, fsyncs, coordinator commits) as a fraction of
    the main thread's."""
    main = other = 0
    counts = dict.fromkeys([step for step, _ in steps] + [THE_LOOP], 0)
    for line in profile.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if "MainThread" not in frames[0]:
            other += int(n)
            continue
        main += int(n)
        counts[_step(frames[1:], steps)] += int(n)
    return [(step, count / max(main, 1)) for step, count in counts.items()], other / max(main, 1)


def _step(frames: list[str], steps: Steps) -> str:
    for frame in reversed(frames):
        function = frame.split(" (", 1)[0]
        for step, names in steps:
            if any(function == n or (n.endswith(("_", ".")) and function.startswith(n)) for n in names):
                return step
    return THE_LOOP
