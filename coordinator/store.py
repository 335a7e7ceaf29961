"""`KVClusterStore`: the cluster model of `coordinator.model` over any `KV` backend.

Keys live under `/stratalog/<cluster>/` as model.py lists them, values are compact JSON
(UUIDs as strings, names percent-quoted inside keys). These keys are added to that list:

    keyspace_version                  -> KEYSPACE_VERSION of the layout below (absent: 1)
    partitions/<topic_id>/<p>/epoch   -> leader epoch as a decimal integer
    fence_generation                  -> rewritten whenever any leader epoch changes
    index_deletions                   -> rewritten by every transaction that deletes
                                         topic, log, segment or WAL keys; an opaque
                                         value (a collection pass writes one of its own:
                                         delete_wal_objects)
    users/<user>/<mechanism>          -> a SCRAM credential (salt, iterations, stored and
                                         server keys, base64): never a password
    acls/<digest>                     -> one ACL binding (digest: SHA-256 of its fields)
    client_quotas/<type>=<name>/...   -> one client-quota entity's values (ClientQuota):
                                         components sorted by type, names percent-quoted,
                                         `<default>` for a type's default (quoting turns a
                                         name's own `<` into %3C, so they never collide)
    transactions/<transactional id>   -> a transaction's state (coordinator.transactions)
    groups/<group>/txn/<producer id>  -> offsets a transaction committed for the group,
                                         applied to its offsets when it commits
    groups/<group>/consumer           -> a consumer-protocol group's state (KIP-848: epochs,
                                         members, assignments), JSON the gateway owns
                                         (gateway.groups.consumer_group); bytes here
    groups/<group>/classic            -> a classic group's state (generation, leader,
                                         members, assignments), JSON the gateway owns
                                         (gateway.groups.classic_state); bytes here;
                                         absent while the group is Empty
    groups/<group>/empty_since        -> when offset expiry first found the group without
                                         members (ms, decimal); removed when it has some
                                         (gateway.groups.expiry)
    migration                         -> where `stratalog migrate` brought the cluster
                                         from, and whether it finished
                                         (coordinator.migration); gateways never read it

`keyspace_version` versions every key and value here, the idempotent producer snapshot in
segment entries (gateway.producers) included: a change to any of them bumps
KEYSPACE_VERSION. 0.1.0 wrote no such key, so a keyspace without it is version 1;
`check_keyspace` refuses a version outside OLDEST_READABLE_KEYSPACE..KEYSPACE_VERSION and
marks an unmarked keyspace. Additions that older readers ignore (a new field in a JSON
value, a new key outside the prefixes they read) need no bump: a WAL entry's `format`
(the WAL object's format version, absent: 1) is one, a partition state's `offline`
(the reason it is offline, absent while it serves) another, its `assigned`, `adding` and
`removing` (an operator's replica assignment, absent when the controller places it) more.

The epoch key exists so a commit can be fenced by a value compare: ISR-only changes rewrite
`partitions/<topic_id>/<p>` without touching it, so they never fence a leader.

A WAL object that fits one transaction is one key, `wal/<gw>/<seq:020>`, written with one
compare per partition on its epoch key. A larger one is written as part keys
`wal/<gw>/<seq:020>/<i:06>` (each with the compares of its own partitions) and then the
header key, which alone makes it visible; every one of these transactions also requires
`fence_generation` to be unchanged since before the first, so no epoch anywhere moved
in between and the per-part compares stayed true until the header landed.

Reads of log state (log start, high watermark, WAL ranges, segments, WAL objects) come from
an in-memory index refreshed with one `snapshot` per call: only keys modified since the
index's revision travel, and a changed `index_deletions` makes it reload in full (deletions
leave nothing behind to be seen by a modified-since read), unless the change is this
store's own collection pass, whose deletions it has already taken out. The high watermark
is derived: one past the largest last offset over the partition's WAL ranges and segments,
never below the log start offset.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import uuid
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence, Union
from urllib.parse import quote, unquote

from stratalog.coordinator.kv import (
    KV, CoordinatorError, CoordinatorUnavailable, Delete, DeletePrefix, Op, Put,
    RequestTooLarge, UnsupportedFormat, Watch, absent, exists, mod_is, request_bytes,
    unsupported_version, value_is)
from stratalog.coordinator.model import (
    AclBinding, ClientQuota, CommittedOffset, Fenced, LogState, PartitionState, ScramCredential, SegmentEntry, TopicExists,
    TopicInfo, UnknownTopic, WalObject, WalRange)
from stratalog.coordinator.transactions import TxnState

TP = tuple[uuid.UUID, int]

# Share of the backend's request limit one of our transactions may fill; the rest covers
# what our size estimate does not see (protobuf framing, raft envelope).
_REQUEST_BUDGET = 0.85
# A large WAL commit retries this often when unrelated leadership changes interrupt it.
_SPLIT_COMMIT_ATTEMPTS = 8
# WAL entries removed by one transaction of a collection pass: about 2 ms of the embedded
# coordinator's writer on the build machine.
WAL_DELETES_PER_TXN = 64
# Long passes over the log index (a reload after a collection, the search for obsolete WAL
# objects) let the event loop run after this many entries: a few milliseconds of work.
YIELD_EVERY = 2048
# WAL objects an index forgets between two turns of the event loop (a few ranges each).
_FORGET_YIELD_EVERY = 256
# What decoding a malformed stored value can raise.
_BAD = (KeyError, TypeError, ValueError, AttributeError)

KEYSPACE_VERSION = 1  # written; readers take OLDEST_READABLE_KEYSPACE..KEYSPACE_VERSION
OLDEST_READABLE_KEYSPACE = 1


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _loads(key: str, value: bytes) -> Any:
    try:
        return json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CoordinatorError(f"corrupt coordinator value at {key}: {e}") from None


def _q(name: str) -> str:
    return quote(name, safe="")


# --- JSON codecs ------------------------------------------------------------------------

def _topic_json(t: TopicInfo) -> bytes:
    return _dumps({"name": t.name, "topic_id": str(t.topic_id), "partitions": t.partitions,
                   "replication_factor": t.replication_factor, "configs": t.configs})


def _topic(key: str, value: bytes) -> TopicInfo:
    d = _loads(key, value)
    try:
        return TopicInfo(d["name"], uuid.UUID(d["topic_id"]), int(d["partitions"]),
                         int(d["replication_factor"]), dict(d["configs"]))
    except _BAD as e:
        raise CoordinatorError(f"corrupt topic at {key}: {e!r}") from None


def _state_json(s: PartitionState) -> bytes:
    d: dict[str, Any] = {"leader": s.leader, "leader_epoch": s.leader_epoch,
                         "replicas": list(s.replicas), "isr": list(s.isr)}
    if s.offline:
        d["offline"] = s.offline  # absent while serving: older readers ignore it
    # Absent unless an operator assigned replicas: older readers ignore them.
    for name in ("assigned", "adding", "removing"):
        if getattr(s, name):
            d[name] = list(getattr(s, name))
    return _dumps(d)


def _state(key: str, value: bytes) -> PartitionState:
    d = _loads(key, value)
    try:
        return PartitionState(int(d["leader"]), int(d["leader_epoch"]),
                              tuple(int(x) for x in d["replicas"]),
                              tuple(int(x) for x in d["isr"]), str(d.get("offline") or ""),
                              *(tuple(int(x) for x in d.get(name, ())) for name in ("assigned", "adding", "removing")))
    except _BAD as e:
        raise CoordinatorError(f"corrupt partition state at {key}: {e!r}") from None


def _range_dict(r: WalRange) -> dict:
    return {"topic_id": str(r.topic_id), "partition": r.partition,
            "base_offset": r.base_offset, "last_offset": r.last_offset,
            "position": r.position, "length": r.length, "max_timestamp": r.max_timestamp}


# Topic ids as the index reads them, thousands of times over for a few topics: parsed once
# each, and equal ids are then one object (dict lookups on them compare by identity first).
_topic_id = lru_cache(maxsize=1 << 16)(uuid.UUID)


def _ranges(key: str, items: Any, format_version: int = 1) -> list[WalRange]:
    try:
        return [WalRange(_topic_id(d["topic_id"]), int(d["partition"]), int(d["base_offset"]),
                         int(d["last_offset"]), int(d["position"]), int(d["length"]),
                         int(d["max_timestamp"]), format_version) for d in items]
    except _BAD as e:
        raise CoordinatorError(f"corrupt WAL ranges at {key}: {e!r}") from None


def _segment_json(s: SegmentEntry) -> bytes:
    return _dumps({"base_offset": s.base_offset, "last_offset": s.last_offset,
                   "key_base": s.key_base, "size": s.size, "min_timestamp": s.min_timestamp,
                   "max_timestamp": s.max_timestamp, "leader_epoch": s.leader_epoch,
                   "producers": s.producers,
                   **({"aborted_txns": s.aborted_txns} if s.aborted_txns else {})})


def _segment(key: str, value: bytes) -> SegmentEntry:
    d = _loads(key, value)
    try:
        return SegmentEntry(int(d["base_offset"]), int(d["last_offset"]), str(d["key_base"]),
                            int(d["size"]), int(d["min_timestamp"]), int(d["max_timestamp"]),
                            int(d["leader_epoch"]), dict(d.get("producers") or {}),
                            int(d.get("aborted_txns", 0)))
    except _BAD as e:
        raise CoordinatorError(f"corrupt segment entry at {key}: {e!r}") from None


def _offset_json(o: CommittedOffset) -> bytes:
    return _dumps({"offset": o.offset, "leader_epoch": o.leader_epoch, "metadata": o.metadata,
                   "commit_timestamp": o.commit_timestamp})


def _offset(key: str, value: bytes) -> CommittedOffset:
    d = _loads(key, value)
    try:
        return CommittedOffset(int(d["offset"]), int(d["leader_epoch"]), str(d["metadata"]),
                               int(d["commit_timestamp"]))
    except _BAD as e:
        raise CoordinatorError(f"corrupt committed offset at {key}: {e!r}") from None


def _credential_json(c: ScramCredential) -> bytes:
    b64 = base64.b64encode
    return _dumps({"mechanism": c.mechanism, "salt": b64(c.salt).decode(), "iterations": c.iterations,
                   "stored_key": b64(c.stored_key).decode(), "server_key": b64(c.server_key).decode()})


def _credential(key: str, value: bytes) -> ScramCredential:
    d = _loads(key, value)
    try:
        return ScramCredential(str(d["mechanism"]), base64.b64decode(d["salt"]), int(d["iterations"]),
                               base64.b64decode(d["stored_key"]), base64.b64decode(d["server_key"]))
    except (*_BAD, binascii.Error) as e:
        raise CoordinatorError(f"corrupt credential at {key}: {e!r}") from None


_ACL_FIELDS = ("resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission")


def _acl_json(b: AclBinding) -> bytes:
    return _dumps({f: getattr(b, f) for f in _ACL_FIELDS})


def _acl(key: str, value: bytes) -> AclBinding:
    d = _loads(key, value)
    try:
        return AclBinding(int(d["resource_type"]), str(d["resource_name"]), int(d["pattern_type"]),
                          str(d["principal"]), str(d["host"]), int(d["operation"]), int(d["permission"]))
    except _BAD as e:
        raise CoordinatorError(f"corrupt ACL at {key}: {e!r}") from None


_DEFAULT_NAME = "<default>"


def _quota_rel(entity: tuple[tuple[str, str | None], ...]) -> str:
    return "/".join(f"{_q(t)}={_DEFAULT_NAME if n is None else _q(n)}" for t, n in sorted(entity))


def _quota_json(q: ClientQuota) -> bytes:
    return _dumps({"entity": [list(c) for c in q.entity], "values": q.values})


def _quota(key: str, value: bytes) -> ClientQuota:
    d = _loads(key, value)
    try:
        entity = tuple(sorted((str(t), None if n is None else str(n)) for t, n in d["entity"]))
        return ClientQuota(entity, {str(k): float(v) for k, v in d["values"].items()})
    except _BAD as e:
        raise CoordinatorError(f"corrupt client quota at {key}: {e!r}") from None


def _int(key: str, value: bytes) -> int:
    v = _loads(key, value)
    if not isinstance(v, int) or isinstance(v, bool):
        raise CoordinatorError(f"corrupt coordinator value at {key}: expected an integer")
    return v


def _leased(rel: str) -> bool:
    """Keys put under a lease: a gateway's registration and the controller key."""
    return rel.startswith("brokers/") or rel == "controller"


# A decoded coordinator value under topics/ or partitions/ (None: not a partition state).
_Decoded = Union[TopicInfo, tuple[uuid.UUID, int, PartitionState], None]


def _parse_tp(key: str, tid: str, p: str) -> TP:
    try:
        return _topic_id(tid), int(p)
    except ValueError:
        raise CoordinatorError(f"malformed coordinator key {key}") from None


def _wal_part_key(header_key: str, part: int) -> str:
    """The key of one part of a WAL object committed in parts (module docstring)."""
    return f"{header_key}/{part:06d}"


def _wal_entry(key: str, parts: list[str]) -> tuple[tuple[int, int], int]:
    """(gateway id, sequence) and part number (-1: the header) of a key under wal/."""
    try:
        return (int(parts[1]), int(parts[2])), int(parts[3]) if len(parts) == 4 else -1
    except ValueError:
        raise CoordinatorError(f"malformed coordinator key {key}") from None


def _check_range(r: WalRange) -> None:
    if r.partition < 0 or r.base_offset < 0 or r.last_offset < r.base_offset \
            or r.position < 0 or r.length <= 0:
        raise ValueError(f"invalid WAL range {r}")


def _cut_ranges(ranges: list[WalRange], tp: TP, end_offset: int, obj_key: str,
                shortened: tuple[str, WalRange] | None) -> list[WalRange]:
    """`ranges` without the partition's offsets from `end_offset` on; `shortened` replaces
    the range of the same object and base offset that it shortens."""
    out = []
    for r in ranges:
        if (r.topic_id, r.partition) != tp:
            out.append(r)
        elif shortened is not None and shortened[0] == obj_key and shortened[1].base_offset == r.base_offset:
            if shortened[1].last_offset < end_offset:
                out.append(replace(shortened[1], format_version=r.format_version))
        elif r.last_offset < end_offset:
            out.append(r)
    return out


# --- the log index ----------------------------------------------------------------------

def _without(found: dict[tuple[int, int], tuple[str, list[WalRange]]], dropped: set[tuple[int, int]],
             most: bool, last: int) -> tuple[dict, bool]:
    """One partition's WAL entries without the dropped objects (`most`: they are most of
    the index's), and whether one of those may have held the partition's last offset
    `last`. After a collection pass nearly every object went, after a truncation a few:
    what is kept is found by a set difference in the first case and what went by lookups
    of the dropped in the second, and neither hashes a partition key once per range."""
    if most:
        kept = {ws: found[ws] for ws in sorted(found.keys() - dropped)}
        if len(kept) == len(found):
            return kept, False
        # The newest entries come last, and one of them holds the last offset if any does.
        return kept, not any(r.last_offset >= last for _, ranges in reversed(kept.values()) for r in ranges)
    gone = [ws for ws in dropped if ws in found]
    kept = dict(found)
    for ws in gone:
        del kept[ws]
    return kept, any(r.last_offset >= last for ws in gone for r in found[ws][1])


@dataclass
class _Index:
    """What is known of topics and logs as of `revision` (0: nothing loaded yet).

    Each key's decoded value is kept with its mod revision (`decoded`). A read of what
    changed cannot show what was deleted, so after a deletion the index reads every key
    again; it then drops what is gone and decodes only keys whose revision moved (a key
    written again gets a new one) onto a copy of itself (`carried`), instead of decoding
    everything: a WAL collection pass, a deletion, runs every minute, and decoding a WAL
    object's ranges is what a read of thousands of them costs."""

    revision: int = 0
    topics: dict[uuid.UUID, TopicInfo] = field(default_factory=dict)
    log_start: dict[TP, int] = field(default_factory=dict)
    segments: dict[TP, dict[int, SegmentEntry]] = field(default_factory=dict)
    wal_heads: dict[tuple[int, int], dict] = field(default_factory=dict)
    wal_parts: dict[tuple[int, int], dict[int, list[WalRange]]] = field(default_factory=dict)
    objects: dict[tuple[int, int], WalObject] = field(default_factory=dict)
    by_tp: dict[TP, dict[tuple[int, int], tuple[str, list[WalRange]]]] = \
        field(default_factory=dict)
    max_last: dict[TP, int] = field(default_factory=dict)
    decoded: dict[str, tuple[int, Any]] = field(default_factory=dict)  # key: (mod revision, value)
    # The last revision that may have made a WAL object obsolete: a topic, log start or
    # segment written, or a topic deleted (`KVClusterStore.wal_settled_revision`).
    settled: int = 0
    # The deletion mark's mod revision as of `revision` (0: no mark yet).
    mark_mod: int = 0

    def apply(self, rel: str, key: str, value: bytes, mod: int, touched: set) -> None:
        """Take in one key as of its mod revision; `touched` gathers the WAL objects whose
        keys were taken in."""
        parts = rel.split("/")
        kind = parts[0]
        item: Any
        if kind in ("topics", "logs", "segments"):
            self.settled = max(self.settled, mod)
        if kind == "topics" and len(parts) == 2:
            item = _topic(key, value)
            self.topics[item.topic_id] = item
        elif kind == "logs" and len(parts) == 3:
            d = _loads(key, value)
            try:
                item = (_parse_tp(key, parts[1], parts[2]), int(d["log_start_offset"]))
            except _BAD as e:
                raise CoordinatorError(f"corrupt log state at {key}: {e!r}") from None
            self.log_start[item[0]] = item[1]
        elif kind == "segments" and len(parts) == 4:
            tp, seg = item = (_parse_tp(key, parts[1], parts[2]), _segment(key, value))
            self.segments.setdefault(tp, {})[seg.base_offset] = seg
            self._note_last(tp, seg.last_offset)
        elif kind == "wal" and len(parts) in (3, 4):
            ws, part = _wal_entry(key, parts)
            d = _loads(key, value)
            if not isinstance(d, dict):
                raise CoordinatorError(f"corrupt WAL entry at {key}")
            self._drop_object(ws)  # taken again below, from what this key now says
            if part < 0:
                item = self.wal_heads[ws] = d
            else:
                item = self.wal_parts.setdefault(ws, {})[part] = _ranges(key, d.get("ranges"))
            touched.add(ws)
        else:
            return
        self.decoded[key] = (mod, item)

    async def carried(self, stale: set[str], prefix_len: int, touched: set) -> _Index:
        """A copy of this index without the `stale` keys (gone, or written again); WAL
        objects that had one go into `touched`, to be assembled again from the keys left
        and the new values (and refused, as a full decode would, if a part is missing).
        The copy's last offset of a partition is recounted where a dropped key may have
        held it (a truncation lowers it). After a collection pass that is tens of
        thousands of keys: the work lets the event loop run every YIELD_EVERY keys and
        after each partition, and nothing changes this index meanwhile (the refresh that
        calls this holds the sync lock; readers keep reading this index until then)."""
        new = _Index(topics=dict(self.topics), log_start=dict(self.log_start),
                     segments={tp: dict(segs) for tp, segs in self.segments.items()},
                     wal_heads=dict(self.wal_heads),
                     wal_parts={ws: dict(parts) for ws, parts in self.wal_parts.items()},
                     objects=dict(self.objects), max_last=dict(self.max_last),
                     decoded=dict(self.decoded), settled=self.settled, mark_mod=self.mark_mod)
        lowered: set[TP] = set()
        dropped: set[tuple[int, int]] = set()
        for n, key in enumerate(stale):
            if n % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            _, item = new.decoded.pop(key)
            parts = key[prefix_len:].split("/")
            if parts[0] == "topics":
                new.topics.pop(item.topic_id, None)
            elif parts[0] == "logs":
                new.log_start.pop(item[0], None)
            elif parts[0] == "segments":
                segs = new.segments.get(item[0], {})
                segs.pop(item[1].base_offset, None)
                if not segs:
                    new.segments.pop(item[0], None)
                if item[1].last_offset >= self.max_last.get(item[0], -1):
                    lowered.add(item[0])
            else:
                ws, part = _wal_entry(key, parts)
                dropped.add(ws)
                if part < 0:
                    new.wal_heads.pop(ws, None)
                else:
                    new.wal_parts.get(ws, {}).pop(part, None)
        for ws in dropped:
            new.objects.pop(ws, None)
        most = 2 * len(dropped) > len(self.objects)
        for tp, found in self.by_tp.items():
            new.by_tp[tp], held_last = _without(found, dropped, most, self.max_last.get(tp, -1))
            if held_last:
                lowered.add(tp)
            await asyncio.sleep(0)
        touched |= dropped
        new.recount_last(lowered)
        return new

    async def forget_wal(self, keys: list[tuple[int, int]], wal_key: Callable[[int, int], str]) -> None:
        """Drop WAL objects whose keys this process deleted, in place: the keys a read of
        what changed cannot show. Readers may meanwhile see some of them still; they are
        obsolete, so nothing reads what they point at."""
        lowered: set[TP] = set()
        for n, ws in enumerate(keys):
            if n % _FORGET_YIELD_EVERY == _FORGET_YIELD_EVERY - 1:
                await asyncio.sleep(0)
            head = wal_key(*ws)
            self.decoded.pop(head, None)
            self.wal_heads.pop(ws, None)
            for part in self.wal_parts.pop(ws, {}):
                self.decoded.pop(_wal_part_key(head, part), None)
            obj = self._drop_object(ws)
            if obj is None:
                continue
            for r in obj.ranges:
                tp = (r.topic_id, r.partition)
                if r.last_offset >= self.max_last.get(tp, -1):
                    lowered.add(tp)
        self.recount_last(lowered)

    def _drop_object(self, ws: tuple[int, int]) -> WalObject | None:
        """Take a WAL object out of the object and partition maps; the object, if it was there."""
        obj = self.objects.pop(ws, None)
        if obj is not None:
            for r in obj.ranges:
                self.by_tp.get((r.topic_id, r.partition), {}).pop(ws, None)
        return obj

    def _note_last(self, tp: TP, last: int) -> None:
        if last > self.max_last.get(tp, -1):
            self.max_last[tp] = last

    def recount_last(self, tps: set[TP]) -> None:
        """These partitions' last offsets anew, from their segments and WAL ranges."""
        for tp in tps:
            self.max_last.pop(tp, None)
            segs = self.segments.get(tp)
            if segs:
                self.max_last[tp] = max(seg.last_offset for seg in segs.values())
            found = self.by_tp.get(tp)
            if found:
                self._note_last(tp, max(r.last_offset for _, rs in found.values() for r in rs))

    def assemble(self, touched: set) -> None:
        """Make WAL objects visible once their header (and every part it names) is known."""
        for ws in touched:
            head = self.wal_heads.get(ws)
            if head is None:
                continue
            key = f"wal/{ws[0]}/{ws[1]:020d}"
            fmt = head.get("format", 1)  # 0.1.0 wrote no format: version 1
            n = head.get("parts") or 0
            if not isinstance(n, int) or not isinstance(head.get("key"), str) \
                    or not isinstance(fmt, int) or isinstance(fmt, bool):
                raise CoordinatorError(f"corrupt WAL entry at {key}")
            ranges = _ranges(key, head.get("ranges") or [], fmt)
            parts = self.wal_parts.get(ws, {})
            if any(i not in parts for i in range(n)):
                raise CoordinatorError(f"WAL entry {key} names {n} parts but some are missing")
            for i in range(n):
                ranges += [replace(r, format_version=fmt) for r in parts[i]]
            obj = WalObject(ws[0], ws[1], str(head.get("key")), tuple(ranges), fmt)
            self.objects[ws] = obj
            # Every WAL commit passes here once (a few hundred a second): one pass over its
            # ranges, no dict of its own.
            max_last = self.max_last
            for r in ranges:
                tp = (r.topic_id, r.partition)
                found = self.by_tp.get(tp)
                if found is None:
                    found = self.by_tp[tp] = {}
                entry = found.get(ws)
                if entry is None:
                    found[ws] = (obj.key, [r])
                else:
                    entry[1].append(r)
                if r.last_offset > max_last.get(tp, -1):
                    max_last[tp] = r.last_offset

    def seg_last(self, tp: TP) -> int:
        segs = self.segments.get(tp)
        return max((s.last_offset for s in segs.values()), default=-1) if segs else -1

    def log_state(self, tp: TP) -> LogState:
        start = self.log_start.get(tp, 0)
        last = self.max_last.get(tp)
        return LogState(start, start if last is None else max(start, last + 1))


@dataclass
class _Chunk:
    tps: list[TP] = field(default_factory=list)
    ranges: list[dict] = field(default_factory=list)
    size: int = 0


@dataclass
class GroupKeys:
    """A group's keys, summed up (`KVClusterStore.group_keys`)."""

    offsets: int = 0
    newest_commit_ms: int = -1
    classic: bool = False  # a classic group's state: kept only while it has members
    consumer: bytes | None = None  # a consumer-protocol group's state, kept while empty too
    empty_since_ms: int | None = None  # when offset expiry first saw the group empty
    pending_txn: bool = False  # offsets an open transaction committed


class KVClusterStore:
    """The `ClusterStore` of model.py over a `KV` (layout and fencing: module docstring)."""

    def __init__(self, kv: KV, cluster: str = "default"):
        if not cluster or "/" in cluster:
            raise ValueError(f"bad cluster name {cluster!r}: non-empty, without '/'")
        self.kv = kv
        self.cluster = cluster
        self.prefix = f"/stratalog/{cluster}/"
        self._cluster_id: str | None = None
        self._index = _Index()
        # Topic and partition-state values decoded, by key, with the mod revision they were
        # decoded at: the controller and every gateway read all of them several times a
        # second, and with thousands of partitions decoding would be most of the work.
        self._decoded: dict[str, tuple[int, _Decoded]] = {}
        # all_partition_states() as last read, with the fingerprint it was read under.
        self._all_states: tuple[tuple, dict] | None = None
        self._sync_lock = asyncio.Lock()
        self._sync_wanted = 0
        self._sync_served = 0
        # The value of the last deletion mark this store wrote after removing what it
        # deleted from its own index (`delete_wal_objects`).
        self._own_mark: bytes | None = None

    # --- keys ----------------------------------------------------------------------------

    def _k(self, rel: str) -> str:
        return self.prefix + rel

    def _topic_key(self, name: str) -> str:
        return self._k(f"topics/{_q(name)}")

    def _part_key(self, tid: uuid.UUID, p: int) -> str:
        return self._k(f"partitions/{tid}/{p}")

    def _epoch_key(self, tid: uuid.UUID, p: int) -> str:
        return self._k(f"partitions/{tid}/{p}/epoch")

    def _log_key(self, tid: uuid.UUID, p: int) -> str:
        return self._k(f"logs/{tid}/{p}")

    def _seg_key(self, tid: uuid.UUID, p: int, base: int) -> str:
        return self._k(f"segments/{tid}/{p}/{base:020d}")

    def _wal_key(self, gw: int, seq: int) -> str:
        return self._k(f"wal/{gw}/{seq:020d}")

    def _group_prefix(self, group: str) -> str:
        return self._k(f"groups/{_q(group)}/")

    def _offset_key(self, group: str, topic: str, p: int) -> str:
        return f"{self._group_prefix(group)}offsets/{_q(topic)}/{p}"

    @property
    def _gen_key(self) -> str:
        return self._k("fence_generation")

    @property
    def _deletions_key(self) -> str:
        return self._k("index_deletions")

    def _deletion_mark(self) -> Put:
        return Put(self._deletions_key, b"1")

    def _generation_bump(self) -> Put:
        return Put(self._gen_key, b"1")

    @property
    def _budget(self) -> int:
        return int(self.kv.max_request_bytes * _REQUEST_BUDGET)

    async def _batched(self, ops: Sequence[Op], extra: Sequence[Op] = (), most: int | None = None) -> None:
        """Apply ops in as few unconditional transactions as the limits allow (and at most
        `most` ops each), each one carrying `extra` too (e.g. the deletion mark)."""
        extra = list(extra)
        room = self.kv.max_txn_ops - len(extra)
        if most is not None:
            room = min(room, most)
        base = request_bytes([], extra)
        batch: list[Op] = []
        size = base  # the batch's request bytes, kept as it grows (thousands of partitions)
        for op in ops:
            op_size = request_bytes([], [op])
            if batch and (len(batch) >= room or size + op_size > self._budget):
                await self.kv.txn([], batch + extra)
                batch, size = [], base
            batch.append(op)
            size += op_size
        if batch:
            await self.kv.txn([], batch + extra)

    async def close(self) -> None:
        await self.kv.close()

    # --- cluster -------------------------------------------------------------------------

    async def check_keyspace(self, mark: bool = True) -> int:
        """The keyspace's format version, 1 when unmarked (as 0.1.0 left it); UnsupportedFormat
        for one this code does not read. With `mark`, an unmarked keyspace (0.1.0's, or a
        new one) is marked with KEYSPACE_VERSION."""
        key = self._k("keyspace_version")
        while True:
            got = await self.kv.get(key)
            if got is not None:
                version = _loads(key, got[0])
                if not isinstance(version, int) or isinstance(version, bool):
                    raise CoordinatorError(f"corrupt coordinator value at {key}: {got[0]!r}")
                if not OLDEST_READABLE_KEYSPACE <= version <= KEYSPACE_VERSION:
                    raise UnsupportedFormat(unsupported_version(
                        f"coordinator keyspace {self.prefix}", version, OLDEST_READABLE_KEYSPACE,
                        KEYSPACE_VERSION))
                return version
            if not mark:
                return 1
            # Version 1 is 0.1.0's layout unchanged, so marking is all an unmarked keyspace
            # needs; whoever bumps KEYSPACE_VERSION migrates version 1 here first.
            if await self.kv.txn([absent(key)], [Put(key, _dumps(KEYSPACE_VERSION))]):
                return KEYSPACE_VERSION
            # Another gateway marked it meanwhile: read what it wrote.

    async def cluster_id(self) -> str:
        if self._cluster_id is None:
            key = self._k("cluster_id")
            while True:
                got = await self.kv.get(key)
                if got is not None:
                    cid = _loads(key, got[0])
                    if not isinstance(cid, str):
                        raise CoordinatorError(f"corrupt coordinator value at {key}")
                    self._cluster_id = cid
                    break
                await self.kv.txn([absent(key)], [Put(key, _dumps(str(uuid.uuid4())))])
        return self._cluster_id

    async def grant_lease(self, ttl_s: int) -> int:
        """A lease that ends ttl_s seconds after its last keepalive."""
        return await self.kv.grant_lease(ttl_s)

    async def keepalive(self, lease: int) -> bool:
        """Renew a lease; False once it has ended."""
        return await self.kv.keepalive(lease)

    async def revoke_lease(self, lease: int) -> None:
        """End a lease now, removing the keys attached to it."""
        await self.kv.revoke(lease)

    async def register_broker(self, broker_id: int, host: str, port: int, rack: str | None,
                              lease: int, lagging: Sequence[str] = (),
                              endpoints: dict[str, tuple[str, int]] | None = None) -> None:
        """Announce a live broker under a lease (it disappears when the lease ends), with the
        partitions ("topic_id/p") whose committed data it has not yet caught up on and its
        advertised address per listener name."""
        info: dict[str, Any] = {"host": host, "port": port, "rack": rack, "lagging": list(lagging)}
        if endpoints:
            info["endpoints"] = {name: [h, p] for name, (h, p) in endpoints.items()}
        await self.kv.put(self._k(f"brokers/{broker_id}"), _dumps(info), lease)

    async def brokers(self) -> dict[int, dict]:
        """Live brokers by id: {"host", "port", "rack"}."""
        out = {}
        for key, value, _ in await self.kv.range(self._k("brokers/")):
            out[int(key.rsplit("/", 1)[1])] = _loads(key, value)
        return out

    async def claim_controller(self, broker_id: int, lease: int) -> int:
        """Become controller if nobody is; returns the controller's broker id."""
        key = self._k("controller")
        await self.kv.txn([absent(key)], [Put(key, _dumps(broker_id), lease)])
        got = await self.kv.get(key)
        return _int(key, got[0]) if got else -1

    # --- SASL/SCRAM users ------------------------------------------------------------------

    def _user_key(self, user: str, mechanism: str) -> str:
        return self._k(f"users/{_q(user)}/{mechanism}")

    async def put_scram_credential(self, user: str, credential: ScramCredential) -> None:
        await self.kv.put(self._user_key(user, credential.mechanism), _credential_json(credential))

    async def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        key = self._user_key(user, mechanism)
        got = await self.kv.get(key)
        return None if got is None else _credential(key, got[0])

    async def delete_scram_credential(self, user: str, mechanism: str) -> bool:
        return await self.kv.delete(self._user_key(user, mechanism))

    async def scram_users(self) -> dict[str, list[ScramCredential]]:
        """Every user with a SCRAM credential, and theirs (one per mechanism)."""
        out: dict[str, list[ScramCredential]] = {}
        for key, value, _ in await self.kv.range(self._k("users/")):
            user = unquote(key[len(self._k("users/")):].split("/", 1)[0])
            out.setdefault(user, []).append(_credential(key, value))
        return out

    # --- ACLs -----------------------------------------------------------------------------

    def _acl_key(self, b: AclBinding) -> str:
        return self._k("acls/" + hashlib.sha256(_acl_json(b)).hexdigest()[:40])

    async def put_acls(self, bindings: Sequence[AclBinding]) -> None:
        """Add ACLs (adding one that exists changes nothing), in one transaction per batch."""
        await self._batched([Put(self._acl_key(b), _acl_json(b)) for b in bindings])

    async def delete_acls(self, bindings: Sequence[AclBinding]) -> None:
        await self._batched([Delete(self._acl_key(b)) for b in bindings])

    async def acls(self) -> list[AclBinding]:
        return [_acl(k, v) for k, v, _ in await self.kv.range(self._k("acls/"))]

    async def watch_acls(self) -> Watch:
        """Changes to the ACLs, from now on (read `acls()` after making the watch)."""
        return await self.kv.watch_prefix(self._k("acls/"))

    # --- client quotas --------------------------------------------------------------------

    def _quota_key(self, entity: tuple[tuple[str, str | None], ...]) -> str:
        return self._k("client_quotas/" + _quota_rel(entity))

    async def client_quotas(self) -> list[ClientQuota]:
        return [_quota(k, v) for k, v, _ in await self.kv.range(self._k("client_quotas/"))]

    async def alter_client_quota(self, entity: tuple[tuple[str, str | None], ...],
                                 changes: dict[str, float | None]) -> None:
        entity = tuple(sorted(entity))
        key = self._quota_key(entity)
        while True:  # read, change, write unless someone else wrote it in between
            got = await self.kv.get(key)
            values = dict(_quota(key, got[0]).values) if got else {}
            for name, value in changes.items():
                if value is None:
                    values.pop(name, None)
                else:
                    values[name] = float(value)
            op: Op = Put(key, _quota_json(ClientQuota(entity, values))) if values else Delete(key)
            if await self.kv.txn([mod_is(key, got[1] if got else 0)], [op]):
                return

    async def watch_client_quotas(self) -> Watch:
        """Changes to client quotas, from now on (read `client_quotas()` after making it)."""
        return await self.kv.watch_prefix(self._k("client_quotas/"))

    # --- topics --------------------------------------------------------------------------

    def _partition_ops(self, tid: uuid.UUID, assignments: dict[int, PartitionState]
                       ) -> list[Op]:
        ops: list[Op] = []
        for p in sorted(assignments):
            s = assignments[p]
            if s.leader_epoch < 0:
                raise ValueError(f"partition {p}: leader epoch must be >= 0")
            ops += [Put(self._part_key(tid, p), _state_json(s)),
                    Put(self._epoch_key(tid, p), _dumps(s.leader_epoch))]
        return ops

    def _fits(self, compares: list, ops: list[Op]) -> bool:
        return (len(ops) <= self.kv.max_txn_ops and len(compares) <= self.kv.max_txn_ops
                and request_bytes(compares, ops) <= self._budget)

    async def create_topic(self, name: str, partitions: int, replication_factor: int,
                           configs: dict[str, str], assignments: dict[int, PartitionState],
                           topic_id: uuid.UUID | None = None) -> TopicInfo:
        """`topic_id` is given only to bring back a topic whose objects carry its id
        (engine.bucket_recovery); new topics get a fresh one."""
        if not name:
            raise ValueError("topic name must not be empty")
        if partitions < 1 or replication_factor < 1:
            raise ValueError(f"topic {name}: partitions and replication factor must be >= 1")
        if set(assignments) != set(range(partitions)):
            raise ValueError(f"topic {name}: assignments must cover partitions 0..{partitions - 1}")
        info = TopicInfo(name, topic_id or uuid.uuid4(), partitions, replication_factor, dict(configs))
        key = self._topic_key(name)
        if await self.kv.get(key) is not None:
            raise TopicExists(name)
        ops = self._partition_ops(info.topic_id, assignments)
        topic_put = Put(key, _topic_json(info))
        if self._fits([absent(key)], ops + [topic_put]):
            if not await self.kv.txn([absent(key)], ops + [topic_put]):
                raise TopicExists(name)
            return info
        # Too big for one transaction: the partition keys sit under a fresh topic id nobody
        # can name until the topic key, written last, points at it.
        await self._batched(ops)
        if not await self.kv.txn([absent(key)], [topic_put]):
            await self.kv.delete_prefix(self._k(f"partitions/{info.topic_id}/"))
            raise TopicExists(name)
        return info

    async def topics(self) -> dict[str, TopicInfo]:
        out = {}
        for key, value, _ in await self.kv.range(self._k("topics/")):
            t = _topic(key, value)
            out[t.name] = t
        return out

    async def topic(self, name: str) -> TopicInfo | None:
        key = self._topic_key(name)
        got = await self.kv.get(key)
        return _topic(key, got[0]) if got else None

    async def _topic_rev(self, name: str) -> tuple[TopicInfo, int]:
        key = self._topic_key(name)
        got = await self.kv.get(key)
        if got is None:
            raise UnknownTopic(name)
        return _topic(key, got[0]), got[1]

    async def delete_topic(self, name: str) -> TopicInfo:
        key = self._topic_key(name)
        while True:
            info, rev = await self._topic_rev(name)
            tid = info.topic_id
            ok = await self.kv.txn([mod_is(key, rev)], [
                Delete(key),
                DeletePrefix(self._k(f"partitions/{tid}/")),
                DeletePrefix(self._k(f"logs/{tid}/")),
                DeletePrefix(self._k(f"segments/{tid}/")),
                self._generation_bump(), self._deletion_mark()])
            if ok:
                break
        # Committed offsets name the topic, not its id: drop every group's.
        mark = f"/offsets/{_q(name)}/"
        stale = [Delete(k) for k, _, _ in await self.kv.range(self._k("groups/")) if mark in k]
        await self._batched(stale)
        return info

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> TopicInfo:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in configs.items()):
            raise ValueError(f"topic {name}: configs must map strings to strings")
        key = self._topic_key(name)
        while True:
            info, rev = await self._topic_rev(name)
            new = TopicInfo(info.name, info.topic_id, info.partitions, info.replication_factor,
                            dict(configs))
            if await self.kv.txn([mod_is(key, rev)], [Put(key, _topic_json(new))]):
                return new

    async def add_partitions(self, name: str, new_total: int,
                             assignments: dict[int, PartitionState]) -> TopicInfo:
        key = self._topic_key(name)
        while True:
            info, rev = await self._topic_rev(name)
            if new_total <= info.partitions:
                raise ValueError(f"topic {name} has {info.partitions} partitions; "
                                 f"cannot grow it to {new_total}")
            if set(assignments) != set(range(info.partitions, new_total)):
                raise ValueError(f"topic {name}: assignments must cover partitions "
                                 f"{info.partitions}..{new_total - 1}")
            new = TopicInfo(info.name, info.topic_id, new_total, info.replication_factor,
                            info.configs)
            ops = self._partition_ops(info.topic_id, assignments)
            topic_put = Put(key, _topic_json(new))
            if self._fits([mod_is(key, rev)], ops + [topic_put]):
                if await self.kv.txn([mod_is(key, rev)], ops + [topic_put]):
                    return new
                continue
            # partition_states() hides partitions beyond the topic's count, so these
            # are invisible until the topic key grows.
            await self._batched(ops)
            if await self.kv.txn([mod_is(key, rev)], [topic_put]):
                return new

    # --- partitions ----------------------------------------------------------------------

    async def partition_states(self, topic_id: uuid.UUID) -> dict[int, PartitionState]:
        _, kvs = await self.kv.snapshot([self._k(f"partitions/{topic_id}/"),
                                         self._k("topics/")])
        count = None
        states: dict[int, PartitionState] = {}
        for key, value, _ in kvs:
            rel = key[len(self.prefix):].split("/")
            if rel[0] == "topics":
                t = _topic(key, value)
                if t.topic_id == topic_id:
                    count = t.partitions
            elif len(rel) == 3:
                states[_parse_tp(key, rel[1], rel[2])[1]] = _state(key, value)
        if count is None:
            raise UnknownTopic(str(topic_id))
        return {p: s for p, s in states.items() if p < count}

    async def all_partition_states(self) -> dict[uuid.UUID, dict[int, PartitionState]]:
        """Partition states of every topic, read at one revision. Unchanged since the last
        call (a fingerprint of the keys says so), the same dict is returned: callers must
        not change it."""
        prefixes = [self._k("partitions/"), self._k("topics/")]
        mark = await self.kv.fingerprint(prefixes)
        if self._all_states is not None and self._all_states[0] == mark:
            return self._all_states[1]
        _, kvs = await self.kv.snapshot(prefixes)
        counts: dict[uuid.UUID, int] = {}
        states: dict[uuid.UUID, dict[int, PartitionState]] = {}
        decoded: dict[str, tuple[int, _Decoded]] = {}  # what is still there, for the next read
        for key, value, mod in kvs:
            got = self._decoded.get(key)
            if got is None or got[0] != mod:
                got = (mod, self._decode_metadata(key, value))
            if got[1] is None:
                continue  # another key under partitions/ (an epoch)
            decoded[key] = got
            item = got[1]
            if isinstance(item, TopicInfo):
                counts[item.topic_id] = item.partitions
            else:
                tid, p, st = item
                states.setdefault(tid, {})[p] = st
        self._decoded = decoded
        # Read after the fingerprint: a change in between only makes the next call read again.
        result = {tid: {p: s for p, s in states.get(tid, {}).items() if p < n} for tid, n in counts.items()}
        self._all_states = (mark, result)
        return result

    def _decode_metadata(self, key: str, value: bytes) -> _Decoded:
        """A topic's TopicInfo, a partition's (topic id, partition, state), or None."""
        rel = key[len(self.prefix):].split("/")
        if rel[0] == "topics":
            return _topic(key, value)
        if len(rel) == 3:
            tid, p = _parse_tp(key, rel[1], rel[2])
            return tid, p, _state(key, value)
        return None

    async def set_partition_state(self, topic_id: uuid.UUID, partition: int,
                                  state: PartitionState, expect_epoch: int | None = None,
                                  expect_state: PartitionState | None = None) -> None:
        ekey = self._epoch_key(topic_id, partition)
        pkey = self._part_key(topic_id, partition)
        while True:
            got = await self.kv.get(ekey)
            current = _int(ekey, got[0]) if got else None
            compares = [mod_is(ekey, got[1] if got else 0)]
            if expect_state is not None:
                # Compared decoded, then pinned by the key's revision: a value written by
                # another release may encode the same state differently.
                stored = await self.kv.get(pkey)
                if stored is None:
                    raise UnknownTopic(f"{topic_id}/{partition}")
                if _state(pkey, stored[0]) != expect_state:
                    raise Fenced(f"{topic_id}/{partition}: partition state changed since it was read")
                compares.append(mod_is(pkey, stored[1]))
            if expect_epoch is not None:
                if current is None:
                    raise UnknownTopic(f"{topic_id}/{partition}")
                if current != expect_epoch:
                    raise Fenced(f"{topic_id}/{partition}: leader epoch is {current}, "
                                 f"not {expect_epoch}")
            if current is not None and state.leader_epoch < current:
                raise ValueError(f"{topic_id}/{partition}: leader epoch cannot go back from "
                                 f"{current} to {state.leader_epoch}")
            ops: list[Op] = [Put(pkey, _state_json(state))]
            if current != state.leader_epoch:
                ops += [Put(ekey, _dumps(state.leader_epoch)), self._generation_bump()]
            if await self.kv.txn(compares, ops):
                return

    async def _epoch_mismatches(self, epochs: dict[TP, int]) -> list[str]:
        """Partitions whose stored leader epoch is not the one given."""
        stored: dict[TP, int] = {}
        for tid in {tid for tid, _ in epochs}:
            for key, value, _ in await self.kv.range(self._k(f"partitions/{tid}/")):
                rel = key[len(self.prefix):].split("/")
                if len(rel) == 4 and rel[3] == "epoch":
                    stored[_parse_tp(key, rel[1], rel[2])] = _int(key, value)
        return [f"{tid}/{p} (epoch {stored.get((tid, p), 'gone')}, not {e})"
                for (tid, p), e in sorted(epochs.items(), key=lambda i: (str(i[0][0]), i[0][1]))
                if stored.get((tid, p)) != e]

    # --- logs ----------------------------------------------------------------------------

    async def _sync(self) -> None:
        """Bring the index up to a revision read after this call began (linearizable),
        sharing one refresh among concurrent callers."""
        local = self.kv.local_revision()
        if local is not None and local == self._index.revision:
            return
        self._sync_wanted += 1
        ticket = self._sync_wanted
        async with self._sync_lock:
            if self._sync_served >= ticket:
                return
            covers = self._sync_wanted
            await self._refresh()
            self._sync_served = covers

    async def _refresh(self) -> None:
        prefixes = [self._k(p) for p in ("topics/", "logs/", "segments/", "wal/")]
        prefixes.append(self._deletions_key)
        idx, reload = self._index, not self._index.revision
        if not reload:
            rev, kvs = await self.kv.snapshot(prefixes, idx.revision + 1)
            mark = next(((v, m) for k, v, m in kvs if k == self._deletions_key), None)
            # A deletion this index has already taken out needs no reload (delete_wal_objects).
            reload = mark is not None and mark[0] != self._own_mark
            if mark is not None and not reload:
                idx.mark_mod = mark[1]
        if reload:
            rev, kvs = await self.kv.snapshot(prefixes, 0)
        try:
            touched: set = set()
            if reload and idx.revision:
                found = {k: m for k, _, m in kvs}
                stale = {k for k, (m, _) in idx.decoded.items() if found.get(k) != m}
                topics = self._k("topics/")
                dropped_topic = any(k.startswith(topics) and k not in found for k in stale)
                if 30 * (len(idx.decoded) - len(stale)) < len(stale):
                    # Nearly every key went: decoding the few left costs less than removing
                    # what went (decoding a WAL entry costs about thirty removals).
                    idx = _Index()
                else:
                    idx = await idx.carried(stale, len(self.prefix), touched)
                    kvs = [(k, v, m) for k, v, m in kvs if k not in idx.decoded]
                if dropped_topic:
                    idx.settled = rev
            if reload:
                idx.mark_mod = 0  # until the mark is among the keys read
            for key, value, mod in kvs:
                if key != self._deletions_key:
                    idx.apply(key[len(self.prefix):], key, value, mod, touched)
                elif reload:
                    idx.mark_mod = mod
            idx.assemble(touched)
        except BaseException:
            self._index = _Index()  # half-applied: the next call reloads in full
            raise
        idx.revision = rev
        self._index = idx

    @property
    def in_process(self) -> bool:
        return self.kv.local_revision() is not None

    async def wal_settled_revision(self) -> int:
        await self._sync()
        return self._index.settled

    async def catch_up(self) -> None:
        # Each WAL commit's entry is decoded once the index reads it: at a few hundred
        # flushes a second, a minute of them left to the next collection pass took it
        # seconds of event loop at once.
        if self.in_process:
            await self._sync()

    async def log_state(self, topic_id: uuid.UUID, partition: int) -> LogState:
        await self._sync()
        if topic_id not in self._index.topics:
            raise UnknownTopic(str(topic_id))
        return self._index.log_state((topic_id, partition))

    async def log_states(self, partitions: Iterable[TP]) -> dict[TP, LogState]:
        """log_state of many partitions for the price of one refresh."""
        await self._sync()
        out = {}
        for tp in partitions:
            if tp[0] not in self._index.topics:
                raise UnknownTopic(str(tp[0]))
            out[tp] = self._index.log_state(tp)
        return out

    async def set_log_start_offset(self, topic_id: uuid.UUID, partition: int, offset: int) -> None:
        key = self._log_key(topic_id, partition)
        ekey = self._epoch_key(topic_id, partition)
        while True:
            got = await self.kv.get(key)
            state = _loads(key, got[0]) if got else {"log_start_offset": 0, "producers": {}}
            if not isinstance(state, dict) or not isinstance(state.get("log_start_offset"), int):
                raise CoordinatorError(f"corrupt log state at {key}")
            if offset <= state["log_start_offset"]:
                return
            state["log_start_offset"] = offset
            if await self.kv.txn([mod_is(key, got[1] if got else 0), exists(ekey)],
                                 [Put(key, _dumps(state))]):
                return
            if await self.kv.get(ekey) is None:
                raise UnknownTopic(f"{topic_id}/{partition}")

    # --- WAL objects ---------------------------------------------------------------------

    async def commit_wal(self, obj: WalObject, epochs: dict[TP, int]) -> None:
        if obj.gateway_id < 0 or obj.sequence < 0 or not obj.key:
            raise ValueError(f"invalid WAL object identity {obj.gateway_id}/{obj.sequence}")
        grouped: dict[TP, list[dict]] = {}
        for r in obj.ranges:
            _check_range(r)
            tp = (r.topic_id, r.partition)
            if tp not in epochs:
                raise ValueError(f"WAL object {obj.key} has a range of {tp[0]}/{tp[1]} "
                                 "but no leader epoch for it")
            grouped.setdefault(tp, []).append(_range_dict(r))
        order = sorted(epochs, key=lambda tp: (str(tp[0]), tp[1]))
        compares = [value_is(self._epoch_key(*tp), _dumps(epochs[tp])) for tp in order]
        wkey = self._wal_key(obj.gateway_id, obj.sequence)
        whole = Put(wkey, _dumps({"key": obj.key, "format": obj.format_version,
                                  "ranges": [_range_dict(r) for r in obj.ranges]}))
        if self._fits(compares, [whole]):
            if not await self.kv.txn(compares, [whole]):
                if await self._already_committed(whole):
                    return
                bad = await self._epoch_mismatches(epochs)
                raise Fenced(f"WAL object {obj.key} not committed: leadership moved for "
                             + (", ".join(bad) or "one of its partitions"))
            return
        await self._commit_wal_split(obj, epochs, order, grouped, wkey)

    def _plan_chunks(self, order: list[TP], epochs: dict[TP, int],
                     grouped: dict[TP, list[dict]]) -> list[_Chunk]:
        room = self.kv.max_txn_ops - 1  # one compare is the fence generation
        chunks = [_Chunk()]
        for tp in order:
            size = len(_dumps(grouped.get(tp, []))) + len(self._epoch_key(*tp)) + 40
            if size > self._budget:
                raise RequestTooLarge(f"partition {tp[0]}/{tp[1]} has {size} bytes of ranges "
                                      "in one WAL object; that exceeds one etcd request")
            c = chunks[-1]
            if c.tps and (len(c.tps) >= room or c.size + size > self._budget):
                chunks.append(c := _Chunk())
            c.tps.append(tp)
            c.ranges += grouped.get(tp, [])
            c.size += size
        return chunks

    async def _commit_wal_split(self, obj: WalObject, epochs: dict[TP, int], order: list[TP],
                                grouped: dict[TP, list[dict]], wkey: str) -> None:
        chunks = self._plan_chunks(order, epochs, grouped)
        header = Put(wkey, _dumps({"key": obj.key, "format": obj.format_version, "ranges": [],
                                   "parts": len(chunks)}))
        for _ in range(_SPLIT_COMMIT_ATTEMPTS):
            got = await self.kv.get(self._gen_key)
            fence = mod_is(self._gen_key, got[1] if got else 0)
            ok = True
            for i, c in enumerate(chunks):
                ok = await self.kv.txn(
                    [fence] + [value_is(self._epoch_key(*tp), _dumps(epochs[tp])) for tp in c.tps],
                    [Put(_wal_part_key(wkey, i), _dumps({"ranges": c.ranges}))])
                if not ok:
                    break
            if ok and await self.kv.txn([fence], [header]):
                return
            # Parts without a header are invisible: remove them before deciding. A header
            # that is already there came from an earlier attempt whose reply was lost.
            if not await self.kv.txn([absent(wkey)],
                                     [DeletePrefix(wkey + "/"), self._deletion_mark()]):
                if await self._already_committed(header):
                    return
                raise CoordinatorError(f"{wkey} holds a different WAL object")
            bad = await self._epoch_mismatches(epochs)
            if bad:
                raise Fenced(f"WAL object {obj.key} not committed: leadership moved for "
                             + ", ".join(bad))
        raise CoordinatorUnavailable(f"WAL object {obj.key}: commit kept colliding with "
                                     "leadership changes elsewhere; retry")

    async def _already_committed(self, put: Put) -> bool:
        """A retried commit whose first attempt landed although its reply was lost."""
        got = await self.kv.get(put.key)
        return got is not None and got[0] == put.value

    async def wal_objects(self) -> list[WalObject]:
        await self._sync()
        return [self._index.objects[ws] for ws in sorted(self._index.objects)]

    async def oldest_wal_sequence(self, gateway_id: int) -> int | None:
        # The WAL writer asks this every PRUNE_CONFIRMATIONS_S in its flush: a look at the
        # keys, not a sorted list of every WAL object (tens of milliseconds at a minute's).
        await self._sync()
        return min((seq for gw, seq in self._index.objects if gw == gateway_id), default=None)

    async def wal_ranges(self, topic_id: uuid.UUID, partition: int, from_offset: int
                         ) -> list[tuple[str, WalRange]]:
        await self._sync()
        tp = (topic_id, partition)
        sealed = self._index.seg_last(tp)
        found = [(r.base_offset, ws, key, r)
                 for ws, (key, rs) in self._index.by_tp.get(tp, {}).items() for r in rs
                 if r.last_offset >= from_offset and r.last_offset > sealed]
        found.sort(key=lambda f: (f[0], f[1]))
        return [(key, r) for _, _, key, r in found]

    async def truncate_wal(self, topic_id: uuid.UUID, partition: int, end_offset: int,
                           expect_epoch: int, shortened: tuple[str, WalRange] | None = None) -> None:
        """Each WAL entry (header or part key) holding ranges of the partition past
        `end_offset` is rewritten without them, in one transaction compared on the epoch key
        and on every rewritten key's revision; the deletion mark makes every index reload,
        so the derived high watermark goes back."""
        tp = (topic_id, partition)
        ekey = self._epoch_key(topic_id, partition)
        while True:
            await self._sync()
            idx = self._index
            compares = [value_is(ekey, _dumps(expect_epoch))]
            ops: list[Op] = []
            for ws in sorted(idx.by_tp.get(tp, {})):
                obj_key = idx.objects[ws].key
                head = idx.wal_heads[ws]
                sources: list[tuple[str, dict | None, list[WalRange]]] = [
                    (self._wal_key(*ws), head, _ranges(obj_key, head.get("ranges") or []))]
                sources += [(_wal_part_key(self._wal_key(*ws), i), None, rs)
                            for i, rs in sorted(idx.wal_parts.get(ws, {}).items())]
                for key, entry, ranges in sources:
                    kept = _cut_ranges(ranges, tp, end_offset, obj_key, shortened)
                    if kept == ranges:
                        continue
                    value = dict(entry) if entry is not None else {}
                    value["ranges"] = [_range_dict(r) for r in kept]
                    got = await self.kv.get(key)
                    if got is None:
                        break  # collected meanwhile: the next pass sees the index without it
                    compares.append(mod_is(key, got[1]))
                    ops.append(Put(key, _dumps(value)))
            if not ops:
                if await self.kv.get(ekey) is None:
                    raise UnknownTopic(f"{topic_id}/{partition}")
                return
            if not self._fits(compares, ops + [self._deletion_mark()]):
                raise RequestTooLarge(f"{topic_id}/{partition}: truncating rewrites {len(ops)} WAL "
                                      "entries, more than one transaction holds")
            if await self.kv.txn(compares, ops + [self._deletion_mark()]):
                return
            got = await self.kv.get(ekey)
            if got is None or _int(ekey, got[0]) != expect_epoch:
                raise Fenced(f"{topic_id}/{partition}: leader epoch is "
                             f"{_int(ekey, got[0]) if got else 'gone'}, not {expect_epoch}")
            # A WAL entry changed under us (collected, or another partition's range): again.

    async def obsolete_wal_objects(self) -> list[WalObject]:
        """WAL objects none of whose ranges is still needed: each belongs to a deleted topic,
        lies below its partition's log start, or is covered by a sealed segment."""
        await self._sync()
        idx = self._index
        # Partition by partition: its first offset still read from the WAL is worked out
        # once (a max over its segments), then its ranges are compared with it; a pass looks
        # at a minute of WAL objects, tens of thousands of ranges of a few partitions.
        # The event loop runs every YIELD_EVERY entries: the index may take commits
        # meanwhile, so each partition's entries are listed first.
        needed: set[tuple[int, int]] = set()
        objects = list(idx.objects)
        for tp, found in list(idx.by_tp.items()):
            topic = idx.topics.get(tp[0])
            if topic is None or tp[1] >= topic.partitions:
                continue
            start = max(idx.log_start.get(tp, 0), idx.seg_last(tp) + 1)
            entries = list(found.items())
            for at in range(0, len(entries), YIELD_EVERY):
                for ws, (_, ranges) in entries[at:at + YIELD_EVERY]:
                    for r in ranges:
                        if r.last_offset >= start:
                            needed.add(ws)
                            break
                await asyncio.sleep(0)
        return [o for ws in sorted(objects) if ws not in needed and (o := idx.objects.get(ws)) is not None]

    async def delete_wal_objects(self, keys: list[tuple[int, int]]) -> None:
        """Remove the entries of obsolete WAL objects (`obsolete_wal_objects`),
        WAL_DELETES_PER_TXN to a transaction: the gateway's WAL commits queue behind each
        one, so a collection pass of a minute of WAL objects must not be a single long
        transaction. The deletion mark is written once, after the last: each mark makes
        every other reader's index read every key again (tens of milliseconds of a gateway's
        event loop with a minute of WAL objects), and an obsolete entry is never read, so
        one that lingers in an index until the pass ends is harmless."""
        if not keys:
            return
        try:
            await self._batched([DeletePrefix(self._wal_key(gw, seq)) for gw, seq in keys],
                                most=WAL_DELETES_PER_TXN)
        except BaseException:
            # What was deleted should still be seen; the pass's own error is what is raised.
            with contextlib.suppress(Exception):
                await self.kv.txn([], [self._deletion_mark()])
            raise
        # This store's own index can take out what it deleted instead of reading every key
        # again, unless another deletion's mark came after the last one the index saw (its
        # keys would go unseen): the mark is then written as anyone's, and read in full.
        # (An index not loaded yet, or dropped after an error, reads in full at its next
        # refresh whatever the mark says.)
        own = uuid.uuid4().hex.encode()
        seen = self._index
        if not await self.kv.txn([mod_is(self._deletions_key, seen.mark_mod)],
                                 [Put(self._deletions_key, own)], [self._deletion_mark()]):
            return
        async with self._sync_lock:
            await self._index.forget_wal(keys, self._wal_key)
            self._own_mark = own

    # --- segments ------------------------------------------------------------------------

    async def commit_segment(self, topic_id: uuid.UUID, partition: int, entry: SegmentEntry,
                             leader_epoch: int) -> None:
        if entry.base_offset < 0 or entry.last_offset < entry.base_offset or entry.size < 0:
            raise ValueError(f"invalid segment entry {entry.base_offset}..{entry.last_offset}")
        ekey = self._epoch_key(topic_id, partition)
        ok = await self.kv.txn([value_is(ekey, _dumps(leader_epoch))],
                               [Put(self._seg_key(topic_id, partition, entry.base_offset),
                                    _segment_json(entry))])
        if not ok:
            got = await self.kv.get(ekey)
            now = _int(ekey, got[0]) if got else "gone"
            raise Fenced(f"segment {entry.key_base} of {topic_id}/{partition} not committed: "
                         f"leader epoch is {now}, not {leader_epoch}")

    async def log_views(self, topic_id: uuid.UUID, partitions: Iterable[int]
                        ) -> dict[int, tuple[LogState, list[SegmentEntry], list[tuple[str, WalRange]]]]:
        """Per partition: log state, segments and the WAL ranges after them, all as of one
        revision (separate calls could straddle a seal and miss the range it moved) and for
        one refresh; for readers outside the gateways (Spark)."""
        await self._sync()
        if topic_id not in self._index.topics:
            raise UnknownTopic(str(topic_id))
        out = {}
        for p in partitions:
            tp = (topic_id, p)
            segs = self._index.segments.get(tp, {})
            sealed = self._index.seg_last(tp)
            wal = sorted(((r.base_offset, ws, key, r)
                          for ws, (key, rs) in self._index.by_tp.get(tp, {}).items() for r in rs
                          if r.last_offset > sealed), key=lambda f: (f[0], f[1]))
            out[p] = (self._index.log_state(tp), [segs[b] for b in sorted(segs)],
                      [(key, r) for _, _, key, r in wal])
        return out

    async def segments(self, topic_id: uuid.UUID, partition: int) -> list[SegmentEntry]:
        await self._sync()
        segs = self._index.segments.get((topic_id, partition), {})
        return [segs[b] for b in sorted(segs)]

    async def delete_segments(self, topic_id: uuid.UUID, partition: int,
                              base_offsets: list[int]) -> None:
        await self._batched([Delete(self._seg_key(topic_id, partition, b)) for b in base_offsets],
                            [self._deletion_mark()])

    async def replace_segments(self, topic_id: uuid.UUID, partition: int,
                               remove: list[int], add: list[SegmentEntry]) -> None:
        for e in add:
            if e.base_offset < 0 or e.last_offset < e.base_offset:
                raise ValueError(f"invalid segment entry {e.base_offset}..{e.last_offset}")
        added = {e.base_offset for e in add}
        compares = [exists(self._seg_key(topic_id, partition, b)) for b in remove]
        # A rewritten segment keeping its base offset is a put; etcd refuses put+delete.
        ops: list[Op] = [Delete(self._seg_key(topic_id, partition, b))
                         for b in remove if b not in added]
        ops += [Put(self._seg_key(topic_id, partition, e.base_offset), _segment_json(e))
                for e in add]
        ops.append(self._deletion_mark())
        if not self._fits(compares, ops):
            raise RequestTooLarge(f"replacing {len(remove)} segments with {len(add)} does not "
                                  "fit one transaction; swap fewer at a time")
        if not await self.kv.txn(compares, ops):
            raise Fenced(f"{topic_id}/{partition}: a segment to replace is already gone")

    # --- groups --------------------------------------------------------------------------

    async def commit_offsets(self, group: str,
                             offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        ops: list[Op] = [Put(self._offset_key(group, t, p), _offset_json(o))
                         for (t, p), o in sorted(offsets.items())]
        # One transaction when it fits; beyond etcd's limits each batch is still whole.
        await self._batched(ops)

    async def fetch_offsets(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        base = self._group_prefix(group) + "offsets/"
        out = {}
        for key, value, _ in await self.kv.range(base):
            topic, _, p = key[len(base):].rpartition("/")
            try:
                out[(unquote(topic), int(p))] = _offset(key, value)
            except ValueError:
                raise CoordinatorError(f"malformed coordinator key {key}") from None
        return out

    async def delete_offsets(self, group: str, partitions: list[tuple[str, int]] | None = None
                             ) -> None:
        if partitions is None:
            await self.kv.delete_prefix(self._group_prefix(group))
            return
        await self._batched([Delete(self._offset_key(group, t, p)) for t, p in partitions])

    async def groups_with_offsets(self) -> list[str]:
        base = self._k("groups/")
        names = {unquote(key[len(base):].split("/", 1)[0])
                 for key, _, _ in await self.kv.range(base)}
        return sorted(names)

    async def group_keys(self) -> dict[str, "GroupKeys"]:
        """What the store holds for every group, from one read: for offset expiry."""
        base = self._k("groups/")
        out: dict[str, GroupKeys] = {}
        for key, value, _ in await self.kv.range(base):
            name, _, rest = key[len(base):].partition("/")
            g = out.setdefault(unquote(name), GroupKeys())
            if rest.startswith("offsets/"):
                g.offsets += 1
                g.newest_commit_ms = max(g.newest_commit_ms, _offset(key, value).commit_timestamp)
            elif rest == "classic":
                g.classic = True
            elif rest == "consumer":
                g.consumer = value
            elif rest == "empty_since":
                g.empty_since_ms = _int(key, value)
            elif rest.startswith("txn/"):
                g.pending_txn = True
        return out

    async def mark_group_empty(self, group: str, now_ms: int) -> None:
        """Start an Empty group's expiry clock, unless it runs already."""
        key = f"{self._group_prefix(group)}empty_since"
        await self.kv.txn([absent(key)], [Put(key, _dumps(now_ms))])

    async def unmark_group_empty(self, group: str) -> None:
        await self.kv.delete(f"{self._group_prefix(group)}empty_since")

    def _consumer_group_key(self, group: str) -> str:
        return f"{self._group_prefix(group)}consumer"

    def _classic_group_key(self, group: str) -> str:
        return f"{self._group_prefix(group)}classic"

    async def consumer_group_ids(self) -> list[str]:
        """Groups with a stored consumer-protocol state."""
        return await self._group_ids_with("consumer")

    async def classic_group_ids(self) -> list[str]:
        """Groups with a stored classic state."""
        return await self._group_ids_with("classic")

    async def _group_ids_with(self, leaf: str) -> list[str]:
        base = self._k("groups/")
        found = (key[len(base):].split("/") for key, _, _ in await self.kv.range(base))
        return sorted(unquote(parts[0]) for parts in found if parts[1:] == [leaf])

    async def consumer_group(self, group: str) -> bytes | None:
        """A consumer-protocol group's stored state, as `put_consumer_group` wrote it."""
        return await self._get_value(self._consumer_group_key(group))

    async def put_consumer_group(self, group: str, value: bytes | None,
                                 expected: bytes | None) -> bool:
        """Replace (None: delete) a consumer-protocol group's state if it still is
        `expected` (None: absent); False if another gateway changed it meanwhile."""
        return await self._swap_value(self._consumer_group_key(group), value, expected)

    async def classic_group(self, group: str) -> bytes | None:
        """A classic group's stored state, as `put_classic_group` wrote it."""
        return await self._get_value(self._classic_group_key(group))

    async def put_classic_group(self, group: str, value: bytes | None,
                                expected: bytes | None) -> bool:
        """Replace (None: delete) a classic group's state if it still is `expected`
        (None: absent); False if another gateway changed it meanwhile."""
        return await self._swap_value(self._classic_group_key(group), value, expected)

    async def _get_value(self, key: str) -> bytes | None:
        got = await self.kv.get(key)
        return None if got is None else got[0]

    async def _swap_value(self, key: str, value: bytes | None, expected: bytes | None) -> bool:
        """Compare-and-set of one key's value (None: absent, or delete it)."""
        compare = absent(key) if expected is None else value_is(key, expected)
        if value is None:
            return expected is None or await self.kv.txn([compare], [Delete(key)])
        return await self.kv.txn([compare], [Put(key, value)])

    def _pending_key(self, group: str, producer_id: int) -> str:
        return f"{self._group_prefix(group)}txn/{producer_id}"

    async def put_pending_offsets(self, group: str, producer_id: int,
                                  offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        """Offsets a transaction commits for a group: kept aside until it ends (a later
        commit in the same transaction replaces a partition's earlier one)."""
        key = self._pending_key(group, producer_id)
        while True:
            got = await self.kv.get(key)
            merged = {} if got is None else _loads(key, got[0])
            merged.update({f"{_q(t)}/{p}": _loads(key, _offset_json(o)) for (t, p), o in offsets.items()})
            if await self.kv.txn([mod_is(key, got[1] if got else 0)], [Put(key, _dumps(merged))]):
                return

    async def pending_offsets(self, group: str) -> dict[int, dict[tuple[str, int], CommittedOffset]]:
        """Offsets of transactions not yet ended, by producer id (OffsetFetch's require_stable)."""
        base = self._group_prefix(group) + "txn/"
        return {_int(key, key[len(base):].encode()): self._decode_pending(key, value)
                for key, value, _ in await self.kv.range(base)}

    def _decode_pending(self, key: str, value: bytes) -> dict[tuple[str, int], CommittedOffset]:
        out = {}
        for tp, o in _loads(key, value).items():
            topic, _, p = tp.rpartition("/")
            out[(unquote(topic), int(p))] = _offset(key, _dumps(o))
        return out

    async def end_pending_offsets(self, group: str, producer_id: int, commit: bool) -> None:
        """Apply (commit) or drop (abort) a transaction's offsets for a group. Done again
        after a crash it changes nothing more: the pending key is gone once applied."""
        key = self._pending_key(group, producer_id)
        got = await self.kv.get(key)
        if got is None:
            return
        ops: list[Op] = [Delete(key)]
        if commit:
            ops += [Put(self._offset_key(group, t, p), _offset_json(o))
                    for (t, p), o in sorted(self._decode_pending(key, got[0]).items())]
        if len(ops) <= self.kv.max_txn_ops and request_bytes([], ops) <= self._budget:
            await self.kv.txn([mod_is(key, got[1])], ops)
        else:  # offsets first, the pending key last: a crash in between applies them again
            await self._batched(ops[1:])
            await self.kv.txn([mod_is(key, got[1])], ops[:1])

    # --- transactions --------------------------------------------------------------------

    def _txn_key(self, transactional_id: str) -> str:
        return self._k(f"transactions/{_q(transactional_id)}")

    async def transaction(self, transactional_id: str) -> tuple[TxnState, int] | None:
        """A transactional id's state and the revision to compare-and-swap against."""
        key = self._txn_key(transactional_id)
        got = await self.kv.get(key)
        return None if got is None else (TxnState.from_json(key, got[0]), got[1])

    async def put_transaction(self, state: TxnState, revision: int) -> bool:
        """Write a state if the key is still at `revision` (0: absent); False if not."""
        key = self._txn_key(state.transactional_id)
        return await self.kv.txn([mod_is(key, revision)], [Put(key, state.to_json())])

    async def delete_transaction(self, transactional_id: str, revision: int) -> bool:
        """Forget a transactional id if its key is still at `revision`; False if not."""
        key = self._txn_key(transactional_id)
        return await self.kv.txn([mod_is(key, revision)], [Delete(key)])

    def transactional_id_of(self, key: str) -> str:
        """The transactional id of a key `watch_transactions` reported."""
        return unquote(key[len(self._k("transactions/")):])

    async def transactions(self) -> list[tuple[TxnState, int]]:
        return [(TxnState.from_json(k, v), rev)
                for k, v, rev in await self.kv.range(self._k("transactions/"))]

    async def watch_transactions(self) -> Watch:
        """Changes to transaction states, from now on (read `transactions()` after)."""
        return await self.kv.watch_prefix(self._k("transactions/"))

    # --- backup and restore ----------------------------------------------------------------

    async def read_keyspace(self) -> tuple[int, list[tuple[str, bytes]]]:
        """Every key of the cluster that outlives a gateway (not the leased registrations and
        controller key), as (key relative to the prefix, value), all read at one revision;
        and that revision."""
        revision, kvs = await self.kv.snapshot([self.prefix])
        rels = ((k[len(self.prefix):], v) for k, v, _ in kvs)
        return revision, [(rel, v) for rel, v in rels if not _leased(rel)]

    async def check_empty(self) -> None:
        """CoordinatorError unless the cluster has no key at all (restores go only there)."""
        (_, brokers), (_, total) = await self.kv.fingerprint([self._k("brokers/"), self.prefix])
        if brokers:
            raise CoordinatorError(f"{brokers} gateway(s) are registered in {self.prefix}: stop "
                                   "every gateway of the cluster before restoring")
        if total:
            raise CoordinatorError(f"{self.prefix} holds {total} keys: a restore goes only into an "
                                   "empty cluster (delete its keys first, or restore under "
                                   "another --cluster name)")

    async def write_keyspace(self, keys: Sequence[tuple[str, bytes]]) -> None:
        """Write keys (relative to the prefix) into an empty cluster, in transactions within
        the backend's limits. Topic keys go last: a topic key is what makes its partitions,
        logs and segments visible, so a gateway started during the writes sees each topic
        whole or not at all."""
        await self.check_empty()
        for rel, _ in keys:
            if _leased(rel):
                raise ValueError(f"{rel} is a leased key; it cannot be restored")
        topics = [Put(self._k(rel), v) for rel, v in keys if rel.startswith("topics/")]
        await self._batched([Put(self._k(rel), v) for rel, v in keys if not rel.startswith("topics/")])
        await self._batched(topics)
        self._index = _Index()
        self._all_states = None

    async def converge_keyspace(self, keys: Sequence[tuple[str, bytes]],
                                keep: Sequence[str] = ()) -> tuple[int, int]:
        """Make the cluster's non-leased keys exactly `keys` (relative to the prefix), but
        those named in `keep`: put what differs, delete what `keys` lacks. Calling it again
        finishes a call that stopped half way (coordinator.migration). Topic keys are
        deleted first and put last, as in write_keyspace. Returns (keys put, keys deleted)."""
        for rel, _ in keys:
            if _leased(rel):
                raise ValueError(f"{rel} is a leased key; it cannot be written")
        _, current = await self.read_keyspace()
        have, want = dict(current), dict(keys)
        # The deletion mark is rewritten by the deletes themselves.
        kept = {*keep, "index_deletions"}
        gone = sorted((rel for rel in have if rel not in want and rel not in kept),
                      key=lambda rel: not rel.startswith("topics/"))
        changed = [(rel, v) for rel, v in sorted(want.items()) if have.get(rel) != v]
        if gone:
            await self._batched([Delete(self._k(rel)) for rel in gone], [self._deletion_mark()])
        await self._batched([Put(self._k(rel), v) for rel, v in changed if not rel.startswith("topics/")])
        await self._batched([Put(self._k(rel), v) for rel, v in changed if rel.startswith("topics/")])
        self._index = _Index()
        self._all_states = None
        return len(changed), len(gone)

    # --- producer ids --------------------------------------------------------------------

    async def allocate_broker_id(self, first: int = 1000) -> int:
        """A broker id nobody has been given, for gateways started without --broker-id."""
        key = self._k("broker_ids/next")
        while True:
            got = await self.kv.get(key)
            nxt = _int(key, got[0]) if got else first
            if await self.kv.txn([mod_is(key, got[1] if got else 0)], [Put(key, _dumps(nxt + 1))]):
                return nxt

    async def allocate_producer_ids(self, count: int) -> int:
        if count < 1:
            raise ValueError(f"producer id block size must be >= 1, got {count}")
        key = self._k("producer_ids/next")
        while True:
            got = await self.kv.get(key)
            start = _int(key, got[0]) if got else 0
            if await self.kv.txn([mod_is(key, got[1] if got else 0)],
                                 [Put(key, _dumps(start + count))]):
                return start
