"""Log compaction on Spark for ``cleanup.policy=compact`` topics.

The job follows Kafka's cleaner, with segments in the object store:

1. Plan (driver). From each partition's newest manifest, the *cleanable* segments are the
   sealed ones before the first whose newest record is younger than
   ``min.compaction.lag.ms`` or which reaches the last stable offset (a transaction still
   open); the active segment and unsealed WAL data are never seen.
   Consecutive cleanable segments are grouped (up to ``segment.bytes`` of input, 2^31
   offsets) and each group gets a fresh key base for its rewrite.
2. Key map (executors, one task per partition). The cleanable offsets are read through
   the `stratalog` data source's planning and reader, read_committed (records of aborted
   transactions are removed); per key the newest offset survives, unless that record is a
   tombstone older than ``delete.retention.ms``. Keyless records are kept. As in Kafka's
   cleaner the map is built in memory, one partition at a time, so a worker holds one
   entry per distinct key of its partition (Arrow's hash aggregation, per slice and then
   over the slices); no shuffle, and no record crosses to the JVM.
3. Rewrite (the same task, right after its partition's key map). Each group's segments are copied batch by batch: a batch whose
   records all survive is copied byte for byte; otherwise it is rebuilt with its surviving
   records, their offsets (offset deltas with gaps), timestamps, headers, codec, producer
   fields and its original last offset delta; a batch left empty is dropped, except the
   group's last, which stays as an empty batch so the new segment still ends at the old
   last offset. Control batches (transaction markers) are copied. `tiering.segment.ActiveSegment` writes the
   new `.log` with its `.index`/`.timeindex`, which are uploaded under the new key base.
4. Swap (driver). Per partition, one POST to the leader gateway's admin endpoint replaces
   the old segments with the new ones; the gateway rewrites the manifest and deletes the
   old objects after a grace period. A 409 (a segment to remove is gone: retention ran,
   or another compaction won) or any other refusal deletes the new objects.

Examples
--------
>>> from stratalog.spark.session import get_session
>>> from stratalog.spark.compaction import compact
>>> report = compact(get_session(), "s3://bucket/prefix", "users",
...                  "http://127.0.0.1:9644", bootstrap="127.0.0.1:9092")  # doctest: +SKIP
>>> print(report.table())  # doctest: +SKIP
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from stratalog.tiering import layout
from stratalog.tiering.batch import (LOG_APPEND_TIME, BatchHeader, CorruptBatch, build_batch, decode_records,
                           set_log_append_time)
from stratalog.tiering.manifest import SegmentRecord
from stratalog.tiering.sealed import Batch, SegmentObject, Take, read_sync, walk
from stratalog.tiering.segment import ActiveSegment

from stratalog.spark.columns import NotVectorisable, batch_offsets
from stratalog.spark.metadata import ManifestMetadata
from stratalog.spark.objects import StoreSpec

MAX_OFFSET_SPAN = 2**31 - 1  # indexes keep offsets relative to the base in 32 bits
KAFKA_DEFAULTS = {
    "delete.retention.ms": 86_400_000,
    "min.compaction.lag.ms": 0,
    "segment.bytes": 64 * 1024 * 1024,
    "index.interval.bytes": 4096,
}


class CompactionError(RuntimeError):
    """The job cannot run (not a compacted topic, bad settings) or failed as a whole."""


@dataclass(frozen=True)
class Settings:
    """The topic configs compaction obeys."""

    delete_retention_ms: int
    min_compaction_lag_ms: int
    segment_bytes: int
    index_interval_bytes: int

    @classmethod
    def from_configs(cls, configs: dict) -> "Settings":
        policy = str(configs.get("cleanup.policy", ""))
        if "compact" not in {p.strip() for p in policy.split(",")}:
            raise CompactionError(f"topic has cleanup.policy={policy or '?'}; compaction applies only "
                                  "to cleanup.policy=compact topics")
        values = {}
        for name, default in KAFKA_DEFAULTS.items():
            raw = configs.get(name, default)
            try:
                values[name] = int(raw)
            except (TypeError, ValueError):
                raise CompactionError(f"topic config {name}={raw!r} is not a whole number") from None
            if values[name] < 0:
                raise CompactionError(f"topic config {name}={raw} is negative")
        return cls(values["delete.retention.ms"], values["min.compaction.lag.ms"],
                   max(values["segment.bytes"], 1), values["index.interval.bytes"])


@dataclass(frozen=True)
class Group:
    """Consecutive segments of one partition rewritten into one new segment."""

    group_id: int
    partition: int
    inputs: tuple[SegmentRecord, ...]
    key_base: str  # of the new segment

    @property
    def base_offset(self) -> int:
        return self.inputs[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.inputs[-1].last_offset

    @property
    def leader_epoch(self) -> int:
        return self.inputs[-1].leader_epoch

    def new_keys(self) -> list[str]:
        return [self.key_base + ext for ext in layout.SEGMENT_EXTENSIONS]


@dataclass(frozen=True)
class Plan:
    topic: str
    topic_id: uuid.UUID
    spec: StoreSpec
    settings: Settings
    now_ms: int
    groups: tuple[Group, ...]
    skipped: dict[int, str] = field(default_factory=dict)  # partition -> why nothing to do

    def partitions(self) -> list[int]:
        return sorted({g.partition for g in self.groups})

    def groups_of(self, partition: int) -> list[Group]:
        return [g for g in self.groups if g.partition == partition]


@dataclass
class PartitionResult:
    partition: int
    status: str  # compacted | unchanged | conflict | refused | unknown | skipped
    segments_in: int = 0
    segments_out: int = 0
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    message: str = ""


@dataclass
class Report:
    topic: str
    results: list[PartitionResult]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.status in ("compacted", "unchanged", "skipped") for r in self.results)


# ---- 1. plan -------------------------------------------------------------------------


def fetch_topic_configs(bootstrap: str, topic: str, timeout_s: float = 15.0) -> dict[str, str]:
    """A topic's effective configs through Kafka's DescribeConfigs."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
    except Exception as exc:  # KafkaException, timeouts: all mean we cannot know the policy
        raise CompactionError(f"cannot read the configs of topic {topic!r} from {bootstrap}: {exc}") from exc
    return {name: entry.value for name, entry in entries.items()}


def plan_compaction(spec: StoreSpec, topic: str, settings: Settings, *, now_ms: int,
                    partitions: list[int] | None = None) -> Plan:
    """Which segments of which partitions to rewrite, and where the rewrites go."""
    store = spec.open()
    snapshot = ManifestMetadata(store, topic).snapshot()
    groups: list[Group] = []
    skipped: dict[int, str] = {}
    horizon = now_ms - settings.min_compaction_lag_ms
    for p, snap in sorted(snapshot.partitions.items()):
        if partitions is not None and p not in partitions:
            continue
        cleanable = []
        for seg in snap.segments:
            if seg.max_timestamp > horizon:
                break  # this and later segments hold records within min.compaction.lag.ms
            if seg.last_offset >= snap.stable_end:
                break  # records of a transaction not yet decided: kept until it is
            cleanable.append(seg)
        if not cleanable:
            skipped[p] = ("no sealed segments" if not snap.segments
                          else "every sealed segment holds records within min.compaction.lag.ms")
            continue
        run: list[SegmentRecord] = []
        for seg in cleanable + [None]:
            fits = (seg is not None and run
                    and sum(s.size for s in run) + seg.size <= settings.segment_bytes
                    and seg.last_offset - run[0].base_offset <= MAX_OFFSET_SPAN)
            if run and not fits:
                unique = uuid.uuid4().hex
                key_base = layout.segment_key_base(topic, snapshot.topic_id, p, run[0].base_offset,
                                                   run[-1].leader_epoch, unique)
                groups.append(Group(len(groups), p, tuple(run), key_base))
                run = []
            if seg is not None:
                run.append(seg)
    return Plan(topic, snapshot.topic_id, spec, settings, now_ms, tuple(groups), skipped)


# ---- 2. key map ----------------------------------------------------------------------


def _read_options(plan: Plan) -> dict[str, str]:
    """The `stratalog` read of the key map: every cleanable offset, read_committed."""
    last = {p: max(g.last_offset for g in plan.groups_of(p)) for p in plan.partitions()}
    options = {"topic": plan.topic, "topicId": str(plan.topic_id),
               # From the log start: records below it are already deleted, so no key map keeps them.
               "startingOffsets": "earliest",
               # Aborted records never enter the key map, so they are removed, and never
               # shadow an older committed value of their key (Kafka's cleaner does the same).
               "kafka.isolation.level": "read_committed",
               "assign": json.dumps({plan.topic: plan.partitions()}),
               "endingOffsets": json.dumps({plan.topic: {str(p): o + 1 for p, o in last.items()}}),
               "path": plan.spec.url}
    if plan.spec.endpoint:
        options["endpoint"] = plan.spec.endpoint
    if plan.spec.region:
        options["region"] = plan.spec.region
    if plan.spec.path_style is not None:
        options["pathStyle"] = str(plan.spec.path_style).lower()
    return options


def _newest(table):
    """Per key, the columns of its last row (rows in offset order)."""
    # Without threads Arrow's "last" is the last row in input order.
    newest = table.group_by("key", use_threads=False).aggregate(
        [("offset", "last"), ("tombstone", "last"), ("us", "last")])
    return newest.rename_columns({"offset_last": "offset", "tombstone_last": "tombstone", "us_last": "us"})


def surviving_offsets(slices: list, spec: StoreSpec, delete_before_us: int) -> np.ndarray:
    """The sorted offsets that survive compaction among the records of `slices` (one
    partition's, in offset order)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from stratalog.spark.reading import read_input

    newest, keyless = [], []
    for s in slices:
        parts = []
        for rows in read_input(s, spec):
            keyed = pc.is_valid(rows.column("key"))
            keyless.append(rows.column("offset").filter(pc.invert(keyed)).to_numpy())
            rows = rows.filter(keyed)
            parts.append(pa.table({"key": rows.column("key"), "offset": rows.column("offset"),
                                   "tombstone": pc.is_null(rows.column("value")),
                                   "us": rows.column("timestamp").cast(pa.int64())}))
        if parts:
            newest.append(_newest(pa.concat_tables(parts)))
    kept = [np.zeros(0, np.int64), *keyless]
    if newest:
        table = _newest(pa.concat_tables(newest)) if len(newest) > 1 else newest[0]
        expired = pc.and_(table.column("tombstone"), pc.less(table.column("us"), delete_before_us))
        kept.append(table.column("offset").filter(pc.invert(expired)).to_numpy())
    return np.sort(np.concatenate(kept))


# ---- 3. rewrite ----------------------------------------------------------------------


def _rebuilt(h: BatchHeader, kept: list) -> bytes:
    """The batch `h` holding only `kept` records, as the original producer framed it."""
    common = dict(base_offset=h.base_offset, producer_id=h.producer_id,
                  producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
                  partition_leader_epoch=h.partition_leader_epoch,
                  is_transactional=h.is_transactional, last_offset_delta=h.last_offset_delta)
    if not kept:
        # No records and no codec: the batch only keeps the segment's last offset.
        return build_batch([], timestamp_ms=h.max_timestamp, **common)
    data = bytearray(build_batch(kept, compression=h.compression, **common))
    if h.timestamp_type == LOG_APPEND_TIME:
        set_log_append_time(data, 0, h.max_timestamp)
    return bytes(data)


def _batches(store, seg) -> Iterator[Batch]:
    """Every batch of a segment, read whole in one GET; framing, offsets and size checked."""
    obj = SegmentObject(seg.key_base, seg.base_offset, seg.last_offset, seg.size)
    steps = walk(obj, lambda h: Take.TAKE, chunk_bytes=max(seg.size, 1))
    return read_sync(steps, lambda g: store.get(g.key, g.start, g.end))


def _kept(offsets: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Which of `offsets` are in `keep` (sorted)."""
    at = np.minimum(np.searchsorted(keep, offsets), max(len(keep) - 1, 0))
    return keep[at] == offsets if len(keep) else np.zeros(len(offsets), dtype=bool)


def rewrite_group(store, group: Group, keep, index_interval_bytes: int,
                  workdir: Path, *, now_ms: int) -> dict:
    """Write the compacted segment of one group and upload it under `group.key_base`.

    `keep` holds the offsets that survive (any collection of ints). A batch is decoded in
    full only when some but not all of its records survive: the others are copied or
    dropped from their offsets alone.
    """
    keep = np.unique(np.asarray(list(keep) if isinstance(keep, (set, frozenset)) else keep, dtype=np.int64))
    directory = Path(tempfile.mkdtemp(prefix=f"compact-{group.group_id}-", dir=workdir))
    try:
        out = ActiveSegment.create(directory, group.base_offset,
                                   index_interval_bytes=index_interval_bytes, now_ms=now_ms)
        records_in = records_out = bytes_in = 0
        unchanged = len(group.inputs) == 1
        for n, seg in enumerate(group.inputs):
            bytes_in += seg.size
            for batch in _batches(store, seg):
                h, whole = batch.header, batch.data
                last_of_group = n == len(group.inputs) - 1 and batch.position + h.size == seg.size
                if h.is_control:
                    out.append(whole)
                    continue
                records = None
                try:
                    offsets = batch_offsets(h, whole)  # checks the CRC before anything is copied
                except NotVectorisable:
                    records = decode_records(whole)  # names what is wrong, or reads it
                    offsets = np.array([r.offset for r in records], dtype=np.int64)
                survives = _kept(offsets, keep)
                count = int(survives.sum())
                records_in += len(offsets)
                records_out += count
                if count == len(offsets):
                    out.append(whole)
                elif count or last_of_group:
                    records = decode_records(whole) if records is None else records
                    out.append(_rebuilt(h, [r for r, kept in zip(records, survives) if kept]))
                    unchanged = False
                else:
                    unchanged = False
        sealed = out.seal()
        out.close()
        if sealed.last_offset != group.last_offset:
            raise CorruptBatch(f"rewrite of {group.inputs[0].key_base} ends at {sealed.last_offset}, "
                               f"expected {group.last_offset}")
        if not unchanged:
            # The stores here upload files; a seal gives the sidecars as bytes.
            out.index_path.write_bytes(sealed.index_bytes)
            out.timeindex_path.write_bytes(sealed.timeindex_bytes)
            store.put_file(group.key_base + layout.INDEX, out.index_path)
            store.put_file(group.key_base + layout.TIMEINDEX, out.timeindex_path)
            store.put_file(group.key_base + layout.LOG, out.log_path)
        return dict(group_id=group.group_id, partition=group.partition, base_offset=group.base_offset,
                    last_offset=sealed.last_offset, key_base=group.key_base, size=sealed.size,
                    min_timestamp=sealed.min_timestamp, max_timestamp=sealed.max_timestamp,
                    leader_epoch=group.leader_epoch, records_in=records_in, records_out=records_out,
                    bytes_in=bytes_in, unchanged=unchanged)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


_RESULT_FIELDS = [(name.split()[0], name.split()[1]) for name in
                  ("group_id long, partition long, base_offset long, last_offset long, key_base string, "
                   "size long, min_timestamp long, max_timestamp long, leader_epoch long, "
                   "records_in long, records_out long, bytes_in long, unchanged boolean").split(", ")]
RESULT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in _RESULT_FIELDS)


class _PartitionCompactor:
    """The function Spark runs (`mapInArrow` over partition numbers; picklable: plain data
    plus this module's code): a partition's key map, then each of its groups rewritten."""

    def __init__(self, plan: Plan, slices: list) -> None:
        self.spec = plan.spec
        self.partitions = plan.partitions()  # by the task numbers of `rewrite`
        self.groups = {p: plan.groups_of(p) for p in plan.partitions()}
        self.slices = {p: sorted((s for s in slices if getattr(s, "partition", None) == p),
                                 # a large segment's byte ranges share its start offset
                                 key=lambda s: (s.start_offset, getattr(s, "byte_start", 0)))
                       for p in plan.partitions()}
        self.interval = plan.settings.index_interval_bytes
        self.now_ms = plan.now_ms
        self.delete_before_us = (plan.now_ms - plan.settings.delete_retention_ms) * 1000

    def __call__(self, ids):
        import pyarrow as pa

        kinds = {"long": pa.int64(), "string": pa.string(), "boolean": pa.bool_()}
        schema = pa.schema([(name, kinds[kind]) for name, kind in _RESULT_FIELDS])
        store = self.spec.open()
        for chunk in ids:
            for p in (self.partitions[i] for i in chunk.column(0).to_pylist()):
                keep = surviving_offsets(self.slices[p], self.spec, self.delete_before_us)
                for group in self.groups[p]:
                    row = rewrite_group(store, group, keep, self.interval, Path(tempfile.gettempdir()),
                                        now_ms=self.now_ms)
                    yield pa.RecordBatch.from_pylist([row], schema=schema)


def rewrite(spark, plan: Plan) -> list[dict]:
    """Run steps 2 and 3 on Spark, one task per partition; one result row per group."""
    if not plan.groups:
        return []
    from stratalog.spark.datasource import StratalogReader

    slices = list(StratalogReader(_read_options(plan)).partitions())
    partitions = plan.partitions()
    worker = _PartitionCompactor(plan, slices)
    # One Spark partition per topic partition: range's numbers are split evenly.
    ids = spark.range(len(partitions), numPartitions=len(partitions))
    rows = ids.mapInArrow(worker, RESULT_SCHEMA).collect()
    return [row.asDict() for row in rows]


# ---- 4. swap -------------------------------------------------------------------------


def _post(url: str, body: dict, timeout_s: float, token: str | None = None) -> tuple[int | None, str]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
        return None, str(getattr(exc, "reason", exc))


def _error_text(body: str) -> str:
    try:
        return str(json.loads(body).get("error", body))
    except (ValueError, AttributeError):
        return body.strip()[:200]


def swap(plan: Plan, rows: list[dict], admin_url: str, *, timeout_s: float = 30.0,
         admin_token: str | None = None) -> list[PartitionResult]:
    """Replace each partition's old segments with its rewrites through the leader gateway."""
    store = plan.spec.open()
    by_group = {r["group_id"]: r for r in rows}
    results = []
    # The gateway names segments to remove by base offset, which a rewrite keeps; the key
    # bases tell whether another job swapped them since this plan was made.
    current = ManifestMetadata(store, plan.topic, str(plan.topic_id)).snapshot().partitions
    for p in plan.partitions():
        every = plan.groups_of(p)
        # A group copied byte for byte was not uploaded: it stays as it is.
        groups = [g for g in every if not by_group[g.group_id]["unchanged"]]
        done = [by_group[g.group_id] for g in groups]
        result = PartitionResult(
            p, "compacted", segments_in=sum(len(g.inputs) for g in groups), segments_out=len(groups),
            records_in=sum(r["records_in"] for r in done), records_out=sum(r["records_out"] for r in done),
            bytes_in=sum(r["bytes_in"] for r in done), bytes_out=sum(r["size"] for r in done))
        new_keys = [k for g in groups for k in g.new_keys()]
        if not groups:
            result = PartitionResult(p, "unchanged", segments_in=len(every), segments_out=len(every),
                                     message="nothing to remove")
            results.append(result)
            continue
        body = {
            "remove": [s.base_offset for g in groups for s in g.inputs],
            "remove_keys": [s.key_base for g in groups for s in g.inputs],
            "add": [{k: r[k] for k in ("base_offset", "last_offset", "key_base", "size",
                                        "min_timestamp", "max_timestamp", "leader_epoch")}
                    for r in sorted(done, key=lambda r: r["base_offset"])],
        }
        live = {s.key_base for s in current[p].segments} if p in current else set()
        stale = [s.key_base for g in groups for s in g.inputs if s.key_base not in live]
        if stale:
            store.delete(new_keys)
            result.status = "conflict"
            result.message = (f"segment {stale[0]} is no longer in the log (retention or another "
                              "compaction replaced it); new objects deleted")
            results.append(result)
            continue
        url = f"{admin_url.rstrip('/')}/v1/topics/{plan.topic}/partitions/{p}/segments/replace"
        status, text = _post(url, body, timeout_s, admin_token)
        if status == 200:
            results.append(result)
            continue
        if status is None:
            # The gateway may or may not have applied it: deleting could remove live data.
            result.status = "unknown"
            result.message = f"no answer from {admin_url} ({text}); new objects kept under {groups[0].key_base}..."
        else:
            store.delete(new_keys)
            result.status = "conflict" if status == 409 else "refused"
            result.message = f"HTTP {status}: {_error_text(text)}; new objects deleted"
        results.append(result)
    return results


# ---- all together --------------------------------------------------------------------


def compact(spark, object_store_url: str, topic: str, admin_url: str, *,
            endpoint: str | None = None, region: str | None = None, path_style: bool | None = None,
            bootstrap: str | None = None, configs: dict | None = None,
            partitions: list[int] | None = None, clock: Callable[[], float] = time.time,
            timeout_s: float = 30.0, admin_token: str | None = None) -> Report:
    """Compact a ``cleanup.policy=compact`` topic's sealed segments.

    Parameters
    ----------
    spark : SparkSession
    object_store_url : str
        ``file:///dir`` or ``s3://bucket/prefix`` (plus `endpoint`, `region`, `path_style`).
    topic : str
    admin_url : str
        The partition leader gateway's HTTP address, e.g. ``http://127.0.0.1:9644``.
    admin_token : str, optional
        The bearer token of the gateway's ``http.admin.token.file``, if it has one.
    bootstrap : str, optional
        A gateway's Kafka address to read the topic's configs from (DescribeConfigs).
    configs : dict, optional
        Topic configs that override (or, without `bootstrap`, replace) the fetched ones;
        must say ``cleanup.policy`` one way or the other.
    partitions : list of int, optional
        Only these partitions.
    clock : callable
        Wall-clock seconds; decides which records are past the lag and retention times.

    Returns
    -------
    Report
        One `PartitionResult` per partition; `Report.ok` is False after any conflict.
    """
    started = time.monotonic()
    merged = dict(fetch_topic_configs(bootstrap, topic)) if bootstrap else {}
    merged.update(configs or {})
    if "cleanup.policy" not in merged:
        raise CompactionError(f"cannot tell whether {topic!r} is a compacted topic: give bootstrap= "
                              "(to read its configs) or configs={'cleanup.policy': 'compact', ...}")
    settings = Settings.from_configs(merged)
    spec = StoreSpec(object_store_url, endpoint=endpoint, region=region, path_style=path_style)
    plan = plan_compaction(spec, topic, settings, now_ms=int(clock() * 1000), partitions=partitions)
    try:
        rows = rewrite(spark, plan)
    except BaseException:
        spec.open().delete([k for g in plan.groups for k in g.new_keys()])
        raise
    results = swap(plan, rows, admin_url, timeout_s=timeout_s, admin_token=admin_token)
    results += [PartitionResult(p, "skipped", message=why) for p, why in plan.skipped.items()]
    results.sort(key=lambda r: r.partition)
    return Report(topic, results, time.monotonic() - started)


__all__ = ["compact", "plan_compaction", "rewrite", "swap", "rewrite_group", "Settings", "Plan",
           "Group", "Report", "PartitionResult", "CompactionError", "fetch_topic_configs"]
