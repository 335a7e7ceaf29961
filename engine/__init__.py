"""The log engine: every partition a gateway leads or replicates, between the Kafka
protocol (`stratalog.gateway`) and bytes at rest (`stratalog.tiering`) and metadata
(`stratalog.coordinator`).

Everything goes through one `LogEngine` (engine.py). Its operations:

- ``partition(topic, p, current_leader_epoch, followers=)`` / ``leader(...)``: the one
  check every request makes; raises `UnknownTopicOrPartition`, `NotLeader`,
  `FencedLeaderEpoch` or `UnknownLeaderEpoch` (errors.py).
- ``append(topic, p, records, now_ms=)`` -> `AppendResult`: validate, assign offsets,
  append locally and queue for the WAL (`records` as bytes, or `Batches.split(records)`
  when the caller reads the headers first: each header is parsed once a request); ``result.commit`` completes when the WAL object
  holding the batches is committed (acks=all waits for it, nothing longer).
- ``read(view, offset, max_bytes)``: whole committed batches, never past the high
  watermark; ``list_offset(log, timestamp)``: earliest, latest, max-timestamp, by time.
- ``wait_for_data(timeout_s)``: wakes on the next high-watermark advance.
- ``delete_records``, ``replace_segments`` (compaction swaps), ``drop_partitions`` and
  ``delete_objects`` (topic deletion).
- ``take_leadership(assignments)`` / ``follow(assignments)``: lead or replicate exactly
  these partitions (a new leader recovers the partition from the object store; one whose
  data is damaged or missing goes offline instead, `PartitionOffline`).
- ``found_offline()``, ``repair(topic, topic_id, p, truncate=)``: partitions found damaged
  here, and the operator's recovery of an offline one (again, or truncated).
- ``roll_due()`` and ``clean()``: the timers' work (segment.ms, retention, GC).

Inside, each job has its module: `partition` (one led log: offsets, local segments,
producer state, recovery), `wal_writer` (group commit of all partitions into one WAL
object), `sealing` (segments to the store, manifests), `cleanup` (retention,
DeleteRecords, swaps, garbage collection), `leadership` (take/drop/replicas), `replica`
(a replica's view), `producers` (idempotent producer state), `offline` (damaged
partitions: offline alone, and the operator's repair).

Beside the engine, with no gateway running: `restore.restore(backup, store, objects,
scratch)` puts a coordinator backup into an empty cluster, checking the objects it needs
(`stratalog coordinator restore`).
"""

from .engine import AppendResult, EngineSettings, LogEngine, PartitionView
from .leadership import Assignment
from .validation import Batches

__all__ = ["AppendResult", "Assignment", "Batches", "EngineSettings", "LogEngine", "PartitionView"]
