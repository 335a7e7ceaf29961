"""What a topic holds in sealed segments: from the newest Avro manifest of each partition,
or, when asked, live from the coordinator (etcd).

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

from stratalog.spark.objects import ObjectNotFound


class TopicNotFound(LookupError):
    """No manifest (or coordinator entry) names the topic."""


@dataclass(frozen=True)
class PartitionSnapshot:
    """One partition's sealed segments (sorted, non-overlapping) and its log start offset."""

    partition: int
    log_start_offset: int
    segments: tuple[SegmentRecord, ...]
    version: int = -1  # the manifest version it came from; -1 from the coordinator

    @property
    def sealed_end(self) -> int:
        """One past the last sealed offset: where unsealed data begins."""
        return self.segments[-1].last_offset + 1 if self.segments else self.log_start_offset

    @property
    def stable_end(self) -> int:
        """Where read_committed reads stop: the first offset of the oldest transaction
        still open where the sealed data ends, or the end of the sealed data."""
        last = self.segments[-1].open_txn_offset if self.segments else -1
        return last if last >= 0 else self.sealed_end

    def end(self, read_committed: bool) -> int:
        return self.stable_end if read_committed else self.sealed_end

    @property
    def start(self) -> int:
        """First readable sealed offset."""
        if not self.segments:
            return self.log_start_offset
        return max(self.log_start_offset, self.segments[0].base_offset)


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
    """Reads a topic's committed segments live from an etcd coordinator.

    The embedded coordinator is refused: its database belongs to the gateway process that
    opened it, so readers plan from manifests instead.
    """

    def __init__(self, url: str, topic: str) -> None:
        if not isinstance(url, str) or not url.startswith("etcd://"):
            raise ValueError(f"coordinator must be etcd://host:port[,host:port], got {url!r} "
                             "(the embedded coordinator is private to its gateway: omit the "
                             "coordinator option to plan from manifests)")
        self.url = url
        self.topic = topic

    def snapshot(self) -> TopicSnapshot:
        import asyncio

        return asyncio.run(self._snapshot())

    async def _snapshot(self) -> TopicSnapshot:
        import tempfile
        from pathlib import Path

        from stratalog.coordinator import open_coordinator
        from stratalog.engine.sealing import segment_record

        store = open_coordinator(self.url, Path(tempfile.gettempdir()))
        try:
            info = await store.topic(self.topic)
            if info is None:
                raise TopicNotFound(f"the coordinator at {self.url} has no topic {self.topic!r}")
            partitions = {}
            for p in range(info.partitions):
                state = await store.log_state(info.topic_id, p)
                entries = await store.segments(info.topic_id, p)
                records = tuple(segment_record(e) for e in entries)
                partitions[p] = PartitionSnapshot(p, state.log_start_offset, records)
            return TopicSnapshot(info.name, info.topic_id, partitions)
        finally:
            await store.close()


def open_metadata(store, topic: str, *, coordinator: str | None = None, topic_id: str | None = None):
    """The metadata reader the options ask for: manifests unless a coordinator is named."""
    if coordinator:
        return CoordinatorMetadata(coordinator, topic)
    return ManifestMetadata(store, topic, topic_id)
