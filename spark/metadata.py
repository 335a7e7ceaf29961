"""What a topic holds: its sealed segments from the newest Avro manifest of each partition,
or, from a coordinator (etcd, or the embedded one read-only), its segments and the
committed WAL ranges after them, up to the high watermark.

Both give a `TopicSnapshot`; planning never cares where it came from. Manifests are read
with one LIST per topic plus one GET per partition whose newest manifest changed since the
last call (`ManifestMetadata` keeps what it parsed, so a stream polling every trigger only
fetches manifests the gateway rewrote).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from stratalog.tiering import layout
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.manifest import SegmentRecord, read_manifest
from stratalog.tiering.txn import AbortedTxn

from stratalog.spark.objects import ObjectNotFound


class TopicNotFound(LookupError):
    """No manifest (or coordinator entry) names the topic."""


@dataclass(frozen=True)
class WalPart:
    """One committed range of a partition's batches inside a WAL object: bytes
    [position, position + length) of `key`, offsets base_offset..last_offset."""

    key: str
    base_offset: int
    last_offset: int
    position: int
    length: int
    max_timestamp: int
    format_version: int = 1


@dataclass(frozen=True)
class PartitionSnapshot:
    """One partition's sealed segments (sorted, non-overlapping), its log start offset and,
    from the coordinator, the committed WAL ranges after the last segment (`wal`, sorted).

    `open_txns` are the (producer id, first offset) of the transactions open where the
    sealed data ends; `wal_aborted` and `wal_open_txn_offset` are what a read_committed
    scan of the WAL ranges found (`spark.walread.scan_transactions`): the transactions
    aborted there and the first offset of the oldest still open at the high watermark."""

    partition: int
    log_start_offset: int
    segments: tuple[SegmentRecord, ...]
    version: int = -1  # the manifest version it came from; -1 from the coordinator
    wal: tuple[WalPart, ...] = ()
    open_txns: tuple[tuple[int, int], ...] = ()
    wal_aborted: tuple[AbortedTxn, ...] = ()
    wal_open_txn_offset: int = -1
    wal_open_txns: tuple[tuple[int, int], ...] = ()  # (producer id, first offset) open at the end

    @property
    def sealed_end(self) -> int:
        """One past the last sealed offset: where unsealed data begins."""
        return self.segments[-1].last_offset + 1 if self.segments else self.log_start_offset

    @property
    def high_watermark(self) -> int:
        """One past the last committed offset: the end of the WAL ranges, else of the
        sealed data (exactly what a read_uncommitted consumer can reach)."""
        return max(self.sealed_end, self.wal[-1].last_offset + 1) if self.wal else self.sealed_end

    @property
    def stable_end(self) -> int:
        """Where read_committed reads stop: the first offset of the oldest transaction
        still open at the high watermark, or the high watermark."""
        if self.wal:
            last = self.wal_open_txn_offset
            return last if last >= 0 else self.high_watermark
        last = self.segments[-1].open_txn_offset if self.segments else -1
        return last if last >= 0 else self.sealed_end

    def end(self, read_committed: bool) -> int:
        return self.stable_end if read_committed else self.high_watermark

    @property
    def start(self) -> int:
        """First readable offset."""
        if self.segments:
            return max(self.log_start_offset, self.segments[0].base_offset)
        if self.wal:
            return max(self.log_start_offset, self.wal[0].base_offset)
        return self.log_start_offset


@dataclass(frozen=True)
class TopicSnapshot:
    topic: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionSnapshot] = field(default_factory=dict)

    def only(self, partitions: frozenset[int] | None) -> "TopicSnapshot":
        """The snapshot restricted to `partitions` (the `assign` option); None keeps all."""
        if partitions is None:
            return self
        return TopicSnapshot(self.topic, self.topic_id,
                             {p: s for p, s in self.partitions.items() if p in partitions})


class ManifestMetadata:
    """Reads a topic's newest manifest per partition from the object store.

    Parameters
    ----------
    store : FileStore or S3Store
        An open blocking store (`spark.objects.StoreSpec.open`).
    topic : str
        The topic name.
    topic_id : str, optional
        Pick this topic id when the store holds manifests of several incarnations of the
        topic (deleted and re-created while old objects remain).
    """

    def __init__(self, store, topic: str, topic_id: str | None = None) -> None:
        layout.partition_manifest_prefix(topic, uuid.UUID(int=0), 0)  # rejects illegal topic names
        self.store = store
        self.topic = topic
        self.topic_id = uuid.UUID(topic_id) if topic_id else None
        self._parsed: dict[str, PartitionSnapshot] = {}

    def snapshot(self) -> TopicSnapshot:
        """The newest manifest of every partition; TopicNotFound if there is none."""
        newest: dict[tuple[uuid.UUID, int], layout.ManifestKey] = {}
        keys: dict[layout.ManifestKey, str] = {}
        for info in self.store.list(f"{layout.MANIFESTS_ROOT}{self.topic}-"):
            try:
                mk = layout.parse_manifest_key(info.key)
            except ValueError:
                continue  # another topic whose name extends ours, or a stray object
            if mk.topic != self.topic or (self.topic_id and mk.topic_id != self.topic_id):
                continue
            keys[mk] = info.key
            slot = (mk.topic_id, mk.partition)
            if slot not in newest or mk.version > newest[slot].version:
                newest[slot] = mk
        ids = {tid for tid, _ in newest}
        if not ids:
            raise TopicNotFound(f"no manifest of topic {self.topic!r} in the object store "
                                "(nothing sealed yet, wrong topic, or wrong store URL)")
        if len(ids) > 1:
            raise ValueError(f"the store holds manifests of {len(ids)} topics named {self.topic!r} "
                             f"(ids {', '.join(sorted(map(str, ids)))}); choose one with the "
                             "topicId option")
        (topic_id,) = ids
        partitions = {}
        for (_, p), mk in sorted(newest.items(), key=lambda item: item[0][1]):
            partitions[p] = self._load(keys[mk], mk)
        return TopicSnapshot(self.topic, topic_id, partitions)

    def _load(self, key: str, mk: layout.ManifestKey) -> PartitionSnapshot:
        cached = self._parsed.get(key)
        if cached is not None:
            return cached
        try:
            manifest = read_manifest(self.store.get(key))
        except ObjectNotFound:
            # The gateway keeps a few versions and prunes older ones; a newer one exists.
            return self._newest_again(mk)
        except CorruptObject as exc:
            raise CorruptObject(f"manifest {key}: {exc}") from exc
        if (manifest.topic, manifest.topic_id, manifest.partition) != (mk.topic, mk.topic_id, mk.partition):
            raise CorruptObject(f"manifest {key} describes {manifest.topic}-{manifest.partition} "
                                f"({manifest.topic_id})")
        snap = PartitionSnapshot(mk.partition, manifest.log_start_offset, tuple(manifest.segments),
                                 manifest.version)
        self._parsed = {k: v for k, v in self._parsed.items() if v.partition != mk.partition}
        self._parsed[key] = snap
        return snap

    def _newest_again(self, gone: layout.ManifestKey) -> PartitionSnapshot:
        prefix = layout.partition_manifest_prefix(gone.topic, gone.topic_id, gone.partition)
        for info in reversed(self.store.list(prefix)):
            mk = layout.parse_manifest_key(info.key)
            if mk.version > gone.version:
                return self._load(info.key, mk)
        raise CorruptObject(f"manifest version {gone.version} of {gone.topic}-{gone.partition} "
                            "vanished and no newer one exists")


class CoordinatorMetadata:
    """Reads a topic's committed segments and WAL ranges live from its coordinator.

    `url` is ``etcd://host:port[,host:port]`` or the data directory of a gateway running
    the embedded coordinator, opened read-only beside it (`coordinator.embedded.
    EmbeddedReader`: no lock, one consistent revision per read). With `read_committed`,
    each snapshot also reads the WAL ranges through `store` to find their transactions.
    """

    def __init__(self, url: str, topic: str, store=None, read_committed: bool = False) -> None:
        self.url = check_coordinator(url)
        self.topic = topic
        self.store = store
        self.read_committed = read_committed
        # Kept between snapshots (a stream takes one per trigger): the cluster store's index
        # then refreshes with only the keys changed since, not the whole keyspace.
        self._loop = None
        self._cluster = None
        self._scanned: dict[int, PartitionSnapshot] = {}  # read_committed: last scan per partition

    def _run(self, work):
        import asyncio

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(work)

    def close(self) -> None:
        """Close the coordinator connection (a later snapshot opens it again)."""
        if self._loop is None:
            return
        if self._cluster is not None:
            self._loop.run_until_complete(self._cluster.close())
            self._cluster = None
        self._loop.close()
        self._loop = None

    def snapshot(self) -> TopicSnapshot:
        """Every partition; a WAL object collected while it was scanned (its range sealed
        meanwhile) makes it take a newer snapshot."""
        from stratalog.spark.walread import WalObjectGone, scan_transactions

        for _ in range(_RESNAPSHOTS):
            snapshot = self._run(self._snapshot())
            if not self.read_committed:
                return snapshot
            try:
                scanned = {p: scan_transactions(snap, self.store, self._scanned.get(p))
                           for p, snap in snapshot.partitions.items()}
            except WalObjectGone:
                continue
            self._scanned = scanned
            return TopicSnapshot(snapshot.topic, snapshot.topic_id, scanned)
        raise TopicNotFound(f"{self.topic}: WAL objects kept vanishing while they were read "
                            f"({_RESNAPSHOTS} snapshots); run the query again")

    def partition(self, topic_id: str, partition: int) -> PartitionSnapshot | None:
        """One partition of the topic incarnation `topic_id`; None once it is gone."""
        try:
            snapshot = self._run(self._snapshot(only=partition))
        except TopicNotFound:
            return None
        finally:
            self.close()
        if str(snapshot.topic_id) != topic_id:
            return None
        return snapshot.partitions.get(partition)

    def _open(self):
        import tempfile
        from pathlib import Path

        from stratalog.coordinator import KVClusterStore, open_coordinator
        from stratalog.coordinator.embedded import EmbeddedReader

        if self.url.startswith("etcd://"):
            return open_coordinator(self.url, Path(tempfile.gettempdir()))
        return KVClusterStore(EmbeddedReader(Path(self.url)))

    async def _snapshot(self, only: int | None = None) -> TopicSnapshot:
        from stratalog.engine.sealing import segment_record

        fresh = self._cluster is None
        if fresh:
            self._cluster = self._open()
        store = self._cluster
        try:
            if fresh:  # a keyspace a newer Stratalog laid out is refused, never misread
                await store.check_keyspace(mark=False)
            info = await store.topic(self.topic)
            if info is None:
                raise TopicNotFound(f"no topic {self.topic!r} in the coordinator at {self.url} "
                                    "(wrong topic, or wrong coordinator)")
            partitions = {}
            views = await store.log_views(info.topic_id, range(info.partitions) if only is None else [only])
            for p, (state, entries, ranges) in views.items():
                producers = entries[-1].producers if entries else {}
                open_txns = tuple(sorted((int(pid), int(e["txn"])) for pid, e in producers.items()
                                         if isinstance(e, dict) and "txn" in e))
                wal = tuple(WalPart(key, r.base_offset, r.last_offset, r.position, r.length,
                                    r.max_timestamp, r.format_version) for key, r in ranges)
                partitions[p] = PartitionSnapshot(p, state.log_start_offset,
                                                  tuple(segment_record(e) for e in entries),
                                                  wal=wal, open_txns=open_txns)
            return TopicSnapshot(info.name, info.topic_id, partitions)
        except BaseException:
            self._cluster = None  # reopened next time: the connection may be what failed
            await store.close()
            raise


_RESNAPSHOTS = 5


def check_coordinator(url: str) -> str:
    """An etcd URL as given, or an embedded coordinator's data directory as an absolute
    path (given as a path or a file:// URL); ValueError for anything else."""
    from pathlib import Path
    from urllib.parse import unquote, urlsplit

    if not isinstance(url, str) or not url:
        raise ValueError(f"coordinator must be etcd://host:port or a gateway's data directory, got {url!r}")
    if url.startswith("etcd://"):
        return url
    path = unquote(urlsplit(url).path) if url.startswith("file://") else url
    if "://" in path or not Path(path).is_absolute():
        raise ValueError(f"coordinator must be etcd://host:port[,host:port] or the absolute path "
                         f"of a gateway's data directory (embedded coordinator), got {url!r}")
    return str(Path(path))


def embedded_beside(store_url: str) -> str | None:
    """The data directory of `stratalog serve`'s default layout (objects in
    `<data>/objects`, the embedded coordinator in `<data>`), when `store_url` is one."""
    from pathlib import Path
    from urllib.parse import unquote, urlsplit

    from stratalog.coordinator.embedded import DB_FILE

    parts = urlsplit(store_url)
    if parts.scheme != "file":
        return None
    data = Path(unquote(parts.path)).parent
    return str(data) if (data / DB_FILE).is_file() else None


def open_metadata(store, topic: str, *, coordinator: str | None = None, topic_id: str | None = None,
                  read_committed: bool = False):
    """The metadata reader the options ask for: manifests unless a coordinator is named."""
    if coordinator:
        return CoordinatorMetadata(coordinator, topic, store, read_committed)
    return ManifestMetadata(store, topic, topic_id)
