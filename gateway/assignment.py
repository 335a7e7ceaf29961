"""Replicas placed by an operator: manual assignments (CreateTopics, CreatePartitions),
reassignments (AlterPartitionReassignments) and leader elections (ElectLeaders), as pure
functions of a partition's state and the live gateways.

A partition with an assignment (`PartitionState.assigned`) keeps its replicas in the
operator's order; the first is its preferred leader. The controller (`decide_assigned`)
leads it from:

- the preferred replica whenever that one is alive (with auto.leader.rebalance.enable
  off, only when the current leader is not a live assigned replica: ElectLeaders moves
  it back);
- else the current leader while it is a live assigned replica, else another live one,
  caught-up ones first;
- else, with no assigned replica alive, any live gateway, as for the partitions the
  controller places: every record is in the object store, so any gateway is a clean
  leader. It is listed as a replica while it leads.

A reassignment makes the new list `assigned` at once and keeps the replicas that leave in
`removing` (and in `replicas`, the old ones first, then those being added) until it completes, in the controller's first pass where
every added replica is alive and caught up and some new replica can lead: nothing is
copied, a new replica only tails the object store. So a reassignment to live gateways
ends within a pass (the leader moves in the same pass when it has to), and one whose
added gateway died meanwhile stays listed, and may be cancelled, until that gateway is
back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Collection, Iterable, Sequence

from stratalog.coordinator.model import PartitionState

from .errors import KafkaError
from .protocol.error_codes import ErrorCode


def _invalid(message: str) -> KafkaError:
    return KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, message)


def check_replicas(replicas: Sequence[int], live: Collection[int], where: str) -> tuple[int, ...]:
    """One replica list: not empty, no broker twice, every broker a live gateway."""
    if not replicas:
        raise _invalid(f"{where}: the replica list is empty")
    seen: set[int] = set()
    for r in replicas:
        if r in seen:
            raise _invalid(f"{where}: broker {r} is listed more than once")
        if r not in live:
            known = ",".join(str(b) for b in sorted(live)) or "none"
            raise _invalid(f"{where}: broker {r} is not a live gateway (live: {known})")
        seen.add(r)
    return tuple(replicas)


def check_assignments(assignments: Iterable[tuple[int, Sequence[int]]], live: Collection[int],
                      partitions: range, replication_factor: int | None = None
                      ) -> dict[int, tuple[int, ...]]:
    """(partition, replicas) pairs that assign exactly `partitions`, each once, with the
    same number of replicas (`replication_factor` when given: a grown topic keeps its own).
    INVALID_REPLICA_ASSIGNMENT, saying what is wrong, otherwise."""
    out: dict[int, tuple[int, ...]] = {}
    for p, replicas in assignments:
        if p in out:
            raise _invalid(f"partition {p} is assigned more than once")
        if p not in partitions:
            raise _invalid(f"partition {p} is outside {partitions.start}..{partitions.stop - 1}: "
                           f"assignments must list those partitions, each once")
        out[p] = check_replicas(replicas, live, f"partition {p}")
    missing = [p for p in partitions if p not in out]
    if missing:
        raise _invalid(f"partition {missing[0]} has no assignment: assignments must list partitions "
                       f"{partitions.start}..{partitions.stop - 1}, each once")
    want = replication_factor if replication_factor is not None else len(out[partitions.start])
    for p in partitions:
        if len(out[p]) != want:
            raise _invalid(f"partition {p} has {len(out[p])} replicas where the others have {want}: "
                           f"every partition of a topic has the same number")
    return out


def assigned_states(assignments: dict[int, tuple[int, ...]]) -> dict[int, PartitionState]:
    """The first states of newly created partitions: led by their preferred replica."""
    return {p: PartitionState(r[0], 0, r, r, assigned=r) for p, r in assignments.items()}


def decide_assigned(old: PartitionState, live: Collection[int], key: str,
                    lagging_of: Callable[[int], frozenset[str]], fallback: int, *,
                    rebalance: bool = True) -> PartitionState:
    """The controller's decision for a partition with an assignment (module docstring).
    `key` is "<topic id>/<partition>" as gateways report lagging; `fallback` is the live
    gateway to lead it when no assigned replica is alive."""
    live_set = set(live)

    def caught_up(r: int) -> bool:
        return r in live_set and key not in lagging_of(r)

    target, adding, removing = old.assigned, old.adding, old.removing
    if (adding or removing) and all(caught_up(r) for r in adding) and any(r in live_set for r in target):
        adding = removing = ()  # complete: the leader moves onto a new replica below if it must

    def eligible(r: int) -> bool:
        return r in live_set and (r in target or r in removing)

    leader, preferred = old.leader, target[0]
    if preferred in live_set and (rebalance or not eligible(leader)):
        leader = preferred
    elif not eligible(leader):
        order = [*target, *removing]
        candidates = [r for r in order if caught_up(r)] or [r for r in order if eligible(r)]
        leader = candidates[0] if candidates else (leader if leader in live_set else fallback)
    # Under way, the replicas before it keep their order (a cancel restores it), then the new.
    replicas = [*_original(old), *adding] if adding or removing else list(target)
    if leader >= 0 and leader not in replicas:
        replicas.append(leader)
    isr = [leader] if leader >= 0 else []
    isr += [r for r in replicas if r != leader and caught_up(r)]
    epoch = old.leader_epoch + (leader != old.leader)
    return replace(old, leader=leader, leader_epoch=epoch, replicas=tuple(replicas), isr=tuple(isr),
                   adding=adding, removing=removing)


def _original(old: PartitionState) -> list[int]:
    """The replicas before any reassignment under way."""
    return [r for r in old.replicas if r not in old.adding]


def start_reassignment(old: PartitionState, target: tuple[int, ...]) -> PartitionState:
    """The state right after AlterPartitionReassignments asks for `target` (checked live):
    a reassignment under way, which the controller completes (module docstring). A new
    order of the same replicas changes only the preferred leader: nothing is under way."""
    original = _original(old)
    adding = tuple(r for r in target if r not in original)
    removing = tuple(r for r in original if r not in target)
    replicas = (*original, *adding) if adding or removing else target
    return replace(old, replicas=replicas, isr=tuple(r for r in old.isr if r in replicas),
                   assigned=target, adding=adding, removing=removing)


def cancel_reassignment(old: PartitionState) -> PartitionState:
    """Back to the replicas before the reassignment (which the partition then keeps as its
    assignment); NO_REASSIGNMENT_IN_PROGRESS if none is under way."""
    if not old.reassigning:
        raise KafkaError(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment of this partition is under way")
    original = tuple(_original(old))
    return replace(old, replicas=original, isr=tuple(r for r in old.isr if r in original),
                   assigned=original, adding=(), removing=())


def preferred_replica(state: PartitionState) -> int:
    """The first assigned replica (for partitions the controller places, the first replica,
    which it keeps as the leader)."""
    first = state.assigned or state.replicas
    return first[0] if first else -1


def _offline(state: PartitionState, code: ErrorCode) -> None:
    if state.offline:
        raise KafkaError(code, f"the partition is offline ({state.offline}): `stratalog partitions "
                               "recover` brings it back")


def elect_preferred(old: PartitionState, live: Collection[int]) -> PartitionState:
    """ElectLeaders PREFERRED: the preferred replica leads, with a new epoch."""
    _offline(old, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE)
    preferred = preferred_replica(old)
    if preferred >= 0 and old.leader == preferred:
        raise KafkaError(ErrorCode.ELECTION_NOT_NEEDED, f"the preferred replica {preferred} already leads")
    if preferred not in live:
        raise KafkaError(ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                         f"the preferred replica {preferred} is not a live gateway")
    isr = (preferred, *(r for r in old.isr if r != preferred))
    return replace(old, leader=preferred, leader_epoch=old.leader_epoch + 1, isr=isr)


def elect_unclean(old: PartitionState, live: Collection[int]) -> PartitionState:
    """ElectLeaders UNCLEAN: a partition without a live leader gets one, a live replica if
    any, else any live gateway (every one is a clean leader here: nothing committed is
    lost). An offline partition is not: its data is damaged, and only `stratalog partitions
    recover --truncate --accept-data-loss` gives up what cannot be read."""
    if old.leader in live and not old.offline:
        raise KafkaError(ErrorCode.ELECTION_NOT_NEEDED, f"gateway {old.leader} leads it")
    _offline(old, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE)
    candidates = [r for r in old.replicas if r in live] or sorted(live)
    if not candidates:
        raise KafkaError(ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "no gateway is alive")
    leader = candidates[0]
    replicas = old.replicas if leader in old.replicas else (leader, *old.replicas)
    return replace(old, leader=leader, leader_epoch=old.leader_epoch + 1, replicas=replicas, isr=(leader,))
