"""The planner of `format("stratalog-jvm")`, run by the JVM reader as
``python -m stratalog.spark.jvm_plan``: one JSON request on stdin, one JSON answer on
stdout. The slices are exactly the Python reader's (`spark.planning`), described so a
reader on the JVM can fetch them without Python: the object's location (a file URL, or a
GET presigned for `PRESIGN_SECONDS`) and the byte range to walk.

Requests:

    {"mode": "plan", "options": {...}}      every slice of a batch read
    {"mode": "replan", "options": {...}, "slice": {...}, "after": N, "seek_ts": T}
        a WAL slice whose object was collected, from offset N + 1 on, as the segments
        that now hold it (`spark.walread.segment_slices`)

Answers: {"slices": [...]}, or {"error": "<Kind>: <message>"} for what the Python reader
would raise to the user (a bad option, an unknown topic, data loss, a corrupt object).
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict, replace

from stratalog.tiering import layout
from stratalog.tiering.compression import MAX_DECOMPRESSED_BYTES

from stratalog.spark.options import OptionError, parse_options
from stratalog.spark.planning import SegmentSlice, WalSlice, plan_read, segment_index

# How long a presigned GET stays valid: a scan's tasks must start within it.
PRESIGN_SECONDS = 6 * 3600


def answer(request: dict) -> dict:
    """The answer to one request (see the module docstring)."""
    options = parse_options(request["options"])
    store = options.store.open()
    if request["mode"] == "plan":
        slices = plan_read(options, store)
    elif request["mode"] == "replan":
        from stratalog.spark.walread import segment_slices

        gone = WalSlice(**{**request["slice"], "aborted": tuple(map(tuple, request["slice"]["aborted"]))})
        gone = replace(gone, start_offset=max(gone.start_offset, int(request["after"]) + 1),
                       seek_ts=request.get("seek_ts"))
        slices = segment_slices(gone)
    else:
        raise OptionError(f"unknown planner request {request['mode']!r}")
    return {"slices": [describe(s, store) for s in slices]}


def describe(s: SegmentSlice | WalSlice, store) -> dict:
    """One slice as the JVM reader takes it."""
    common = {
        "topic": s.topic, "partition": s.partition, "base_offset": s.base_offset,
        "last_offset": s.last_offset, "start_offset": s.start_offset, "end_offset": s.end_offset,
        "seek_ts": s.seek_ts, "stop_ts": s.stop_ts, "aborted": [list(a) for a in s.aborted],
        "fail_on_data_loss": s.fail_on_data_loss, "chunk_bytes": s.chunk_bytes,
        "max_decompressed_bytes": MAX_DECOMPRESSED_BYTES,
    }
    if isinstance(s, WalSlice):
        return {**common, "key": s.key, "location": store.locate(s.key, PRESIGN_SECONDS),
                "byte_start": s.position, "byte_end": s.position + s.length, "replan": asdict(s)}
    key = s.key_base + layout.LOG
    return {**common, "key": key, "location": store.locate(key, PRESIGN_SECONDS),
            "byte_start": _first_byte(s, store), "byte_end": s.size if s.byte_end is None else s.byte_end,
            "replan": None}


def _first_byte(s: SegmentSlice, store) -> int:
    """Where the walk starts: for a whole segment read from an offset inside it, the batch
    the `.index` names (the Python reader seeks the same way); the reader checks every
    batch from there, so an unusable index only costs reading from the start."""
    if s.byte_end is not None or s.start_offset <= s.base_offset:
        return s.byte_start
    index = segment_index(s, store)
    return s.byte_start if index is None else max(s.byte_start, index.lookup(s.start_offset)[1])


def respond(request: dict, *, trace: bool = True) -> dict:
    """`answer`, or the error the JVM raises to the user, as the Python reader would
    (with its traceback on stderr if `trace`)."""
    try:
        return answer(request)
    except Exception as exc:
        if trace:
            traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}


class DriverPlanner:
    """The planner inside a PySpark driver, called by the JVM through Py4J's callback
    server: no interpreter started, no module imported again, per query."""

    def answer(self, request: str) -> str:
        return json.dumps(respond(json.loads(request), trace=False))

    class Java:
        implements = ["io.stratalog.spark.PlanService"]


def register(spark) -> None:
    """Plan the JVM reader's queries of this session's driver in this process."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    spark.sparkContext._jvm.io.stratalog.spark.Planner.register(DriverPlanner())


def main() -> int:
    json.dump(respond(json.load(sys.stdin)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
