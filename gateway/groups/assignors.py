"""Server-side partition assignors of consumer-protocol groups (KIP-848), by the names a
client asks for with `group.remote.assignor`: `uniform` and `range`.

An assignor is a pure function from the group's subscriptions to a target assignment. It
never sees epochs or who owns what right now: reconciling members towards the target,
revoking before assigning, is `consumer_group.py`'s job. Both are deterministic (same
input, same output), so a coordinator that recomputes a target after a move agrees with
the one before it.

Members are sorted by their instance id when they have one (a static member keeps its
place across restarts, whatever member id it comes back with), else by member id.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Callable, Mapping

Topic = uuid.UUID  # topics are named by id: a topic deleted and made again is another one
TopicPartitions = dict[Topic, frozenset[int]]


@dataclass(frozen=True)
class MemberSpec:
    """What an assignor knows of one member."""

    member_id: str
    instance_id: str | None
    topics: frozenset[Topic]  # subscribed topics that exist (names, regexes resolved)
    current: Mapping[Topic, frozenset[int]]  # its previous target, for stickiness

    @property
    def sort_key(self) -> tuple[str, str]:
        return (self.instance_id or "", self.member_id) if self.instance_id else ("\uffff", self.member_id)


Assignor = Callable[[list[MemberSpec], Mapping[Topic, int]], dict[str, TopicPartitions]]


def _freeze(assignment: dict[str, dict[Topic, set[int]]]) -> dict[str, TopicPartitions]:
    return {m: {t: frozenset(ps) for t, ps in topics.items() if ps}
            for m, topics in assignment.items()}


def range_assign(members: list[MemberSpec], partitions: Mapping[Topic, int]
                 ) -> dict[str, TopicPartitions]:
    """Per topic, contiguous ranges of partitions over the members that subscribe to it,
    in member order; the first `n % m` get one more. Topics with equal partition counts
    and the same subscribers are co-partitioned: a member gets the same partition numbers
    of each."""
    out: dict[str, dict[Topic, set[int]]] = {m.member_id: {} for m in members}
    ordered = sorted(members, key=lambda m: m.sort_key)
    for topic in sorted(partitions):
        subscribers = [m for m in ordered if topic in m.topics]
        if not subscribers:
            continue
        count = partitions[topic]
        share, extra = divmod(count, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            size = share + (1 if i < extra else 0)
            out[m.member_id][topic] = set(range(start, start + size))
            start += size
    return _freeze(out)


def uniform_assign(members: list[MemberSpec], partitions: Mapping[Topic, int]
                   ) -> dict[str, TopicPartitions]:
    """Spread every subscribed partition so that no member holds two more than another
    that could take one of them, moving as few partitions from their previous owner as
    that allows (sticky). Works for members subscribed to different topics."""
    ordered = sorted(members, key=lambda m: m.sort_key)
    owned: dict[str, dict[Topic, set[int]]] = {m.member_id: {} for m in ordered}
    load = {m.member_id: 0 for m in ordered}
    subscribers = {t: [m.member_id for m in ordered if t in m.topics] for t in partitions}
    taken: set[tuple[Topic, int]] = set()

    def give(member: str, topic: Topic, p: int) -> None:
        owned[member].setdefault(topic, set()).add(p)
        load[member] += 1
        taken.add((topic, p))

    # 1. Keep what each member had, while it still subscribes and the partition exists.
    for m in ordered:
        for topic, ps in sorted(m.current.items()):
            if topic in m.topics and topic in partitions:
                for p in sorted(ps):
                    if p < partitions[topic] and (topic, p) not in taken:
                        give(m.member_id, topic, p)
    # 2. Hand out the rest, topics with the fewest subscribers first (they have the
    #    fewest choices), each partition to the least loaded member that may take it.
    for topic in sorted(partitions, key=lambda t: (len(subscribers[t]), t)):
        if not subscribers[topic]:
            continue
        for p in range(partitions[topic]):
            if (topic, p) not in taken:
                give(min(subscribers[topic], key=lambda mid: load[mid]), topic, p)
    # 3. Balance: move a partition from a member holding two or more than another that
    #    subscribes to its topic. Each move narrows the spread, so this ends; the bound is
    #    a guard.
    for _ in range(sum(partitions.values()) * max(len(ordered), 1)):
        if not _move_one(owned, load, subscribers):
            break
    return _freeze(owned)


def _move_one(owned: dict[str, dict[Topic, set[int]]], load: dict[str, int],
              subscribers: dict[Topic, list[str]]) -> bool:
    for heavy in sorted(load, key=lambda mid: -load[mid]):
        for topic in sorted(owned[heavy]):
            ps = owned[heavy][topic]
            if not ps:
                continue
            light = min(subscribers[topic], key=lambda mid: load[mid])
            if load[heavy] - load[light] > 1:
                p = max(ps)
                ps.discard(p)
                load[heavy] -= 1
                owned[light].setdefault(topic, set()).add(p)
                load[light] += 1
                return True
    return False


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform_assign, "range": range_assign}
# Kafka's class names for group.consumer.assignors, so a copied broker config works.
CLASS_NAMES = {
    "org.apache.kafka.coordinator.group.assignor.UniformAssignor": "uniform",
    "org.apache.kafka.coordinator.group.assignor.RangeAssignor": "range",
}


def assignor_names(setting: str) -> tuple[str, ...]:
    """group.consumer.assignors as short names; the first is the default."""
    names = []
    for raw in setting.split(","):
        name = CLASS_NAMES.get(raw.strip(), raw.strip())
        if not name:
            continue
        if name not in ASSIGNORS:
            raise ValueError(f"unknown assignor {raw.strip()!r}; known: {', '.join(ASSIGNORS)}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("at least one assignor is needed")
    return tuple(names)
