"""Idempotent producer state of one partition: who wrote what, so retries are not appended twice.

For each producer id we keep its epoch and the sequence ranges and offsets of its last
five batches (the most a producer keeps in flight per partition). A batch whose sequence
range matches one of them is a duplicate and is answered with the original offset; any
other batch must continue the sequence exactly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Container

CACHED_BATCHES = 5
MAX_SEQUENCE = 0x7FFFFFFF


class OutOfOrderSequence(Exception):
    pass


class InvalidProducerEpoch(Exception):
    pass


@dataclass(slots=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_timestamp: int
    batches: deque = field(default_factory=lambda: deque(maxlen=CACHED_BATCHES))

    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


def _next_seq(seq: int) -> int:
    return 0 if seq == MAX_SEQUENCE else seq + 1


def _last_seq(first: int, count: int) -> int:
    return (first + count - 1) % (MAX_SEQUENCE + 1)


class ProducerTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int, count: int) -> BatchMeta | None:
        """The original batch if this one is a duplicate, None if it may be appended.

        Raises InvalidProducerEpoch for a fenced (older) epoch and OutOfOrderSequence for a
        gap or a sequence that is neither next nor one of the cached batches.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            return None
        if epoch < entry.epoch:
            raise InvalidProducerEpoch(f"producer {producer_id} epoch {epoch} < {entry.epoch}")
        if epoch > entry.epoch:
            if first_seq != 0:
                raise OutOfOrderSequence(
                    f"producer {producer_id} new epoch {epoch} starts at sequence {first_seq}")
            return None
        last = _last_seq(first_seq, count)
        for b in entry.batches:
            if b.first_seq == first_seq and b.last_seq == last:
                return b
        expected = _next_seq(entry.last_seq())
        if entry.batches and first_seq != expected:
            raise OutOfOrderSequence(
                f"producer {producer_id} sent sequence {first_seq}, expected {expected}")
        return None

    def record(self, producer_id: int, epoch: int, first_seq: int, count: int,
               base_offset: int, last_offset: int, timestamp: int) -> None:
        entry = self.producers.get(producer_id)
        if entry is None or entry.epoch != epoch:
            entry = self.producers[producer_id] = ProducerEntry(epoch, timestamp)
        entry.last_timestamp = timestamp
        entry.batches.append(BatchMeta(first_seq, _last_seq(first_seq, count), base_offset, last_offset))

    def fence(self, producer_id: int, epoch: int, timestamp: int) -> None:
        """A transaction marker at `epoch`: batches of older epochs are refused from now
        on (a bumped epoch starts its sequences anew)."""
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            self.producers[producer_id] = ProducerEntry(epoch, timestamp)
        else:
            entry.last_timestamp = timestamp

    def expire(self, now_ms: int, max_idle_ms: int, keep: Container[int] = ()) -> None:
        """Forget producers idle longer than max_idle_ms, except those in `keep` (producers
        with a transaction open: their entry carries it into segment snapshots)."""
        for pid in [p for p, e in self.producers.items()
                    if now_ms - e.last_timestamp > max_idle_ms and p not in keep]:
            del self.producers[pid]

    def snapshot(self) -> dict:
        """JSON-ready state, stored with each sealed segment so a new leader starts from it."""
        return {
            str(pid): {"epoch": e.epoch, "ts": e.last_timestamp,
                       "batches": [[b.first_seq, b.last_seq, b.base_offset, b.last_offset]
                                   for b in e.batches]}
            for pid, e in self.producers.items()
        }

    @classmethod
    def restore(cls, snap: dict | None) -> "ProducerTable":
        table = cls()
        for pid, e in (snap or {}).items():
            entry = ProducerEntry(e["epoch"], e["ts"])
            entry.batches.extend(BatchMeta(*b) for b in e["batches"])
            table.producers[int(pid)] = entry
        return table
