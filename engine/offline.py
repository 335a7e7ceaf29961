"""Partitions whose committed data cannot be recovered: each goes offline alone, with its
reason, until an operator decides what to do.

Damage and outage are told apart: a committed WAL range that is missing or fails its CRCs
(`is_damage`) will read the same on every try and on every gateway, so retrying it would
only keep the partition bouncing; an unreachable store or coordinator is retried.

A damaged partition is recorded in the coordinator (`mark_offline`): its state gets the
reason, no leader and a new epoch, which fences whoever led it, and the controller gives it
no leader while the reason is there. Every gateway then answers KAFKA_STORAGE_ERROR for it
and serves the rest. `repair` is the operator's command: recover again once the object is
restored, or, when asked to accept the loss, truncate the log to the last offset that can
be read (Kafka's unclean leader election: the high watermark goes back there and the log
continues from it); either way the reason is cleared and the controller elects a leader.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from stratalog.coordinator.model import ClusterStore, Fenced, UnknownTopic
from stratalog.tiering.errors import CorruptObject, UnsupportedFormat
from stratalog.tiering.objectstore.base import ObjectNotFound, ObjectStore

from .errors import CorruptLog, RepairRefused, UnknownTopicOrPartition
from .partition import PartitionLog

log = logging.getLogger(__name__)


def is_damage(exc: BaseException) -> bool:
    """Whether a failed recovery met data that is damaged or gone (not an outage, nor a
    format from a newer release, which an upgrade fixes)."""
    if isinstance(exc, UnsupportedFormat):
        return False
    return isinstance(exc, (CorruptLog, CorruptObject, ObjectNotFound))


async def mark_offline(store: ClusterStore, topic_id: uuid.UUID, partition: int, epoch: int,
                       reason: str) -> bool:
    """Record the partition offline, if its leader epoch is still `epoch`; False if the
    controller moved it meanwhile (or the topic is gone)."""
    try:
        st = (await store.partition_states(topic_id)).get(partition)
        if st is None or st.leader_epoch != epoch:
            return False
        # replace(): an operator's replica assignment outlives the partition's time offline.
        await store.set_partition_state(topic_id, partition,
                                        replace(st, leader=-1, leader_epoch=epoch + 1, isr=(), offline=reason),
                                        expect_epoch=epoch)
        return True
    except (Fenced, UnknownTopic):
        return False


@dataclass(frozen=True)
class Repaired:
    """What `repair` did: the offset the partition continues from, and how many committed
    offsets were given up (0 unless truncated)."""

    high_watermark: int
    lost: int


async def repair(store: ClusterStore, objects: ObjectStore, scratch: Path, topic: str,
                 topic_id: uuid.UUID, partition: int, *, index_interval_bytes: int, now_ms: int,
                 truncate: bool) -> Repaired:
    """Bring an offline partition back: check that it recovers now (RepairRefused, with the
    damage, if not and `truncate` is false), truncate it to its readable end if `truncate`
    and it still does not, then clear the offline reason so the controller elects a leader.
    The recovery is a trial in `scratch`: the leader elected next rebuilds it again."""
    try:
        st = (await store.partition_states(topic_id)).get(partition)
    except UnknownTopic:
        st = None
    if st is None:
        raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
    if not st.offline:
        raise RepairRefused(f"{topic}-{partition} is not offline")
    try:
        plog = await PartitionLog.recover(topic, topic_id, partition, st.leader_epoch, scratch, store, objects,
                                          index_interval_bytes=index_interval_bytes, now_ms=now_ms,
                                          salvage=truncate)
        plog.close()
    except Exception as e:
        if is_damage(e):
            raise RepairRefused(f"{topic}-{partition} is still damaged: {e}") from None
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lost = 0
    damage = plog.damage
    if damage is not None:
        lost = max(0, plog.committed_end - plog.next_offset)
        kept = None if damage.kept is None else (damage.key, damage.kept)
        await store.truncate_wal(topic_id, partition, plog.next_offset, st.leader_epoch, kept)
        log.error("%s-%d: truncated to offset %d on the operator's command: %d offsets lost (%s)",
                  topic, partition, plog.next_offset, lost, damage.reason)
    await store.set_partition_state(topic_id, partition, replace(st, offline=""), expect_epoch=st.leader_epoch)
    log.warning("%s-%d: back online on the operator's command; continues from offset %d",
                topic, partition, plog.next_offset)
    return Repaired(plog.next_offset, lost)
