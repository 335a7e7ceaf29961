"""What the WAL objects in the bucket show, for `recover --from-bucket` (engine.bucket_recovery):
their ranges, the commits they confirm (tiering.wal), the leader epoch and transactional
batches of each range; and THE RULE that decides, from that alone, which ranges continue
a partition's log (engine.bucket_recovery's docstring states it for users).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field
from typing import Callable

from stratalog.coordinator.model import WalRange
from stratalog.tiering import layout
from stratalog.tiering.batch import scan_batches
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.errors import UnsupportedFormat as UnsupportedObjectFormat
from stratalog.tiering.objectstore.base import ObjectNotFound, ObjectStore
from stratalog.tiering.wal import CONFIRMATION_TOPIC_ID, SequenceSet, decode_confirmations, read_wal

Candidate = tuple[tuple[int, int], str, WalRange]  # ((gateway, sequence), object key, range)


@dataclass
class WalEvidence:
    """The WAL objects in the bucket: their ranges, and what they confirm."""

    ranges: dict[tuple[int, int], tuple[str, list[WalRange]]] = field(default_factory=dict)
    confirmed: dict[int, SequenceSet] = field(default_factory=dict)
    # Per (object, topic id, partition): (offset, producer id, is a marker) of each
    # transactional batch, to tell which transactions the rebuilt log leaves open.
    txn_batches: dict[tuple[tuple[int, int], uuid.UUID, int], list[tuple[int, int, bool]]] = \
        field(default_factory=dict)
    # Per (object, topic id, partition): the highest leader epoch stamped on its batches.
    epochs: dict[tuple[tuple[int, int], uuid.UUID, int], int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # objects that could not be read, why
    read: int = 0  # objects read

    def epoch(self, c: Candidate) -> int:
        return self.epochs.get((c[0], c[2].topic_id, c[2].partition), -1)


async def read_evidence(objects: ObjectStore) -> WalEvidence:
    """Read every WAL object once, whole (CRCs checked), one at a time."""
    found = WalEvidence()
    for info in await objects.list(layout.WAL_ROOT):
        try:
            gw, seq = layout.parse_wal_key(info.key)
        except ValueError:
            continue
        try:
            data = await objects.get(info.key)
            parts = read_wal(data, info.key)
        except ObjectNotFound:
            continue  # collected meanwhile
        except (CorruptObject, UnsupportedObjectFormat) as e:
            found.unreadable.append(f"{info.key}: {e}")
            continue
        found.read += 1
        version = struct.unpack_from(">H", data, 4)[0]
        ranges = []
        for r, body in parts:
            if r.topic_id == CONFIRMATION_TOPIC_ID:
                try:
                    found.confirmed.setdefault(gw, SequenceSet()).update(decode_confirmations(body, info.key))
                except (CorruptObject, UnsupportedObjectFormat) as e:
                    found.unreadable.append(f"{info.key} (its confirmations): {e}")
                continue
            ranges.append(WalRange(r.topic_id, r.partition, r.base_offset, r.last_offset, r.position,
                                   r.length, r.max_timestamp, version))
            headers = [h for _, h in scan_batches(body)[0]]
            found.epochs[((gw, seq), r.topic_id, r.partition)] = \
                max((h.partition_leader_epoch for h in headers), default=-1)
            txn = [(h.base_offset, h.producer_id, h.is_control) for h in headers if h.is_transactional]
            if txn:
                found.txn_batches[((gw, seq), r.topic_id, r.partition)] = txn
        found.ranges[(gw, seq)] = (info.key, ranges)
    return found


@dataclass
class Continuation:
    """The ranges that continue one partition from its sealed end, where its log then ends,
    what lies past it (why not restored, "" if nothing), and whether two proven ranges
    conflict (then none is taken)."""

    taken: list[Candidate]
    log_end: int
    lost: str
    conflict: bool


def continue_log(sealed_end: int, proven: list[Candidate], unproven: list[Candidate],
                 epoch: Callable[[Candidate], int]) -> Continuation:
    """THE RULE for one partition: proven ranges in offset order from `sealed_end` while
    they follow one another, gaps before a proven range filled by `fill_gap`."""
    nxt = sealed_end
    taken: list[Candidate] = []
    lost, conflict = "", False
    for ws, key, r in sorted(proven, key=lambda c: (c[2].base_offset, c[0])):
        if r.last_offset < nxt and not taken:
            continue  # sealed already
        if r.base_offset > nxt:
            filler = fill_gap(nxt, r.base_offset, epoch((ws, key, r)), unproven, epoch)
            if filler is None:
                lost = f"offsets {nxt}..{r.base_offset - 1} are in no WAL object whose commit is provable"
                break
            taken += filler
            nxt = r.base_offset
        if taken and r.base_offset < nxt:
            lost = (f"two committed WAL ranges hold offset {r.base_offset} ({taken[-1][1]} and {key}): "
                    "truncated since, which one the log kept is not provable")
            taken, nxt, conflict = [], sealed_end, True
            break
        taken.append((ws, key, r))
        nxt = r.last_offset + 1
    beyond = [(key, r) for _, key, r in unproven if r.last_offset >= nxt]
    if beyond and not lost:
        last = max(r.last_offset for _, r in beyond)
        lost = (f"offsets up to {last} in {len({k for k, _ in beyond})} WAL object(s) whose commit is "
                f"not provable (each gateway's newest flush, or fenced uploads): not restored")
    return Continuation(taken, nxt, lost, conflict)


def fill_gap(nxt: int, end: int, end_epoch: int,
              unproven: list[Candidate], epoch: Callable[[Candidate], int]) -> list[Candidate] | None:
    """Unproven ranges that exactly cover offsets nxt..end-1 before a proven range (its
    leader wrote only after every earlier offset was committed, so these offsets were), or
    None. Where several uploads hold an offset, the one of the highest leader epoch is the
    committed one: an upload fenced at those offsets carried an older epoch than the
    leader whose commit replaced it. Equal epochs, or one above the proven range's, are
    not decided."""
    out: list[Candidate] = []
    while nxt < end:
        options = [c for c in unproven if c[2].base_offset <= nxt <= c[2].last_offset < end
                   and (c[2].base_offset == nxt or not out) and epoch(c) <= end_epoch]
        if not options:
            return None
        best = max(epoch(c) for c in options)
        top = [c for c in options if epoch(c) == best]
        if len(top) != 1 or best < 0:
            return None
        out.append(top[0])
        nxt = top[0][2].last_offset + 1
    return out


def open_transactions(taken: list[Candidate], evidence: WalEvidence) -> dict[int, int]:
    """Producer id -> first offset of each transaction the taken ranges leave open."""
    open_at: dict[int, int] = {}
    for ws, _, r in taken:
        for offset, pid, marker in evidence.txn_batches.get((ws, r.topic_id, r.partition), []):
            if not r.base_offset <= offset <= r.last_offset:
                continue  # cut by a truncation the snapshot's entry records
            if marker:
                open_at.pop(pid, None)
            else:
                open_at.setdefault(pid, offset)
    return open_at
