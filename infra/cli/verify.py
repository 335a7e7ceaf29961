"""`stratalog segments verify TOPIC`: scrub a topic's sealed objects in the object store.

Every `.log` is walked batch by batch through tiering's sealed-segment reader with CRC-32C
checks on (the same checks a gateway makes before serving a batch); `.index` and
`.timeindex` sidecars, which carry no checksum of their own, are parsed and their positions
checked against their `.log`; `.txnindex` sidecars are decoded. On S3 every object also
carries the CRC32C the store kept at upload, checked on whole-object reads. One line per
damaged object, then a summary; any damage ends the command with a non-zero status.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from stratalog.tiering import layout
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.index import OffsetIndex, TimeIndex
from stratalog.tiering.objectstore.base import ObjectInfo
from stratalog.tiering.sealed import SegmentObject, Take, read_async, walk
from stratalog.tiering.txn import decode_txnindex

CHUNK_BYTES = 4 * 1024 * 1024
_NO_LAST_OFFSET = 2**63 - 1  # the walk needs a bound; the listing does not know the last offset


@dataclass
class Report:
    """What a scrub found: objects and batches checked, and `key: what is wrong` per damage."""

    objects: int = 0
    batches: int = 0
    damage: list[str] = field(default_factory=list)


async def verify_topic(store, topic: str, partition: int | None = None) -> Report:
    """Check every sealed object of `topic` (of one partition if given) in `store`.

    ObjectStoreError propagates (the store failing is not damage); every CorruptObject
    or malformed sidecar is recorded in the report and the scrub goes on."""
    segments: dict[str, dict[str, ObjectInfo]] = defaultdict(dict)
    for info in await store.list(layout.TOPICS_ROOT):
        try:
            parsed = layout.parse_segment_key(info.key)
        except ValueError:
            continue
        if parsed.topic == topic and (partition is None or parsed.partition == partition):
            segments[info.key[: len(info.key) - len(parsed.ext)]][parsed.ext] = info
    report = Report()
    for key_base in sorted(segments):
        files = segments[key_base]
        base_offset = layout.parse_segment_key(key_base + layout.LOG).base_offset
        log = files.get(layout.LOG)
        if log is None:
            report.damage.append(f"{key_base}: sidecars without a {layout.LOG} object")
        else:
            report.objects += 1
            await _check_log(store, SegmentObject(key_base, base_offset, _NO_LAST_OFFSET, log.size), report)
        for ext in (layout.INDEX, layout.TIMEINDEX, layout.TXNINDEX):
            if ext in files:
                report.objects += 1
                await _check_sidecar(store, key_base + ext, ext, base_offset,
                                     log.size if log is not None else None, report)
    return report


async def _check_log(store, seg: SegmentObject, report: Report) -> None:
    async def get(g):
        return await store.get(g.key, g.start or 0, g.end)

    try:
        async for _ in read_async(walk(seg, lambda h: Take.TAKE, chunk_bytes=CHUNK_BYTES, check_crc=True), get):
            report.batches += 1
    except CorruptObject as exc:
        report.damage.append(str(exc))


async def _check_sidecar(store, key: str, ext: str, base_offset: int, log_size: int | None,
                         report: Report) -> None:
    try:
        data = await store.get(key)
        if ext == layout.TXNINDEX:
            decode_txnindex(data, key)
            return
        if ext == layout.INDEX:
            positions = [p for _, p in OffsetIndex.from_bytes(base_offset, data).entries()]
        else:
            TimeIndex.from_bytes(base_offset, data)
            positions = []
    except CorruptObject as exc:
        report.damage.append(str(exc))
        return
    except ValueError as exc:
        report.damage.append(f"{key}: {exc}")
        return
    beyond = [p for p in positions if log_size is not None and not 0 <= p < log_size]
    if beyond:
        report.damage.append(f"{key}: position {beyond[0]} is outside its {log_size}-byte {layout.LOG}")
