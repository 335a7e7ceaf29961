"""`stratalog groups list|describe|reset-offsets|delete`."""

from __future__ import annotations

import argparse

from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import OffsetSpec

from stratalog.infra.cli.common import CliError, enum_label, non_negative_int, note, print_table
from stratalog.infra.cli.kafka import Cluster, add_connection_options, reason

_GONE = {ConsumerGroupState.DEAD, ConsumerGroupState.UNKNOWN}


def add_parser(subparsers) -> None:
    groups = subparsers.add_parser("groups", help="list, describe, reset and delete consumer groups",
                                   description="Inspect and manage consumer groups.")
    actions = groups.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("list", help="every consumer group, its state and its type (Classic or Consumer)")
    add_connection_options(p)
    p.set_defaults(run=run_list)

    p = actions.add_parser("describe", help="state, members, assignments, committed offsets and lag")
    p.add_argument("group", metavar="G")
    add_connection_options(p)
    p.set_defaults(run=run_describe)

    p = actions.add_parser(
        "reset-offsets", help="move a group's committed offsets",
        description="Plan new committed offsets for every partition of the given topics and print "
                    "the plan; with --execute, commit it. Refused while the group has active members.")
    p.add_argument("group", metavar="G")
    p.add_argument("--topic", action="append", required=True, metavar="T", help="a topic to reset (repeatable)")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the earliest offset still kept")
    target.add_argument("--to-latest", action="store_true", help="the log end offset")
    target.add_argument("--to-offset", type=non_negative_int, metavar="N",
                        help="offset N in every partition (clamped into the kept range)")
    target.add_argument("--to-timestamp", type=non_negative_int, metavar="MS",
                        help="the first record at or after MS (epoch millis); the end if none")
    p.add_argument("--execute", action="store_true", help="apply the plan (default: only print it)")
    add_connection_options(p)
    p.set_defaults(run=run_reset_offsets)

    p = actions.add_parser("delete", help="delete a group without members, with its offsets")
    p.add_argument("group", metavar="G")
    add_connection_options(p)
    p.set_defaults(run=run_delete)


def run(args: argparse.Namespace) -> int:  # every action binds its own run_*
    raise CliError("choose an action: list, describe, reset-offsets or delete")


def run_list(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    cluster.metadata(admin)
    result = cluster.wait(admin.list_consumer_groups(request_timeout=cluster.timeout), "cannot list groups")
    for err in result.errors:
        note(f"warning: a broker did not list its groups: {reason(err)}")
    listings = sorted(result.valid, key=lambda g: g.group_id)
    # TYPE: Classic (JoinGroup/SyncGroup) or Consumer (KIP-848, group.protocol=consumer).
    print_table(["GROUP", "STATE", "TYPE"],
                [[g.group_id, enum_label(g.state), enum_label(g.type)] for g in listings])
    return 0


def _describe(cluster: Cluster, admin, group: str):
    future = admin.describe_consumer_groups([group], request_timeout=cluster.timeout)[group]
    return cluster.wait(future, f"cannot describe group {group!r}")


def _committed(cluster: Cluster, admin, group: str,
               partitions: list[TopicPartition] | None = None) -> dict[tuple[str, int], int]:
    request = ConsumerGroupTopicPartitions(group, partitions)
    future = admin.list_consumer_group_offsets([request], request_timeout=cluster.timeout)[group]
    result = cluster.wait(future, f"cannot read committed offsets of group {group!r}")
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions
            if tp.error is None and tp.offset >= 0}


def _list_offsets(cluster: Cluster, admin, partitions: list[tuple[str, int]], spec,
                  strict: bool) -> dict[tuple[str, int], int]:
    """Offsets by spec per partition; a partition that fails is missing (or, if strict, an error)."""
    if not partitions:
        return {}
    request = {TopicPartition(t, p): spec for t, p in partitions}
    futures = admin.list_offsets(request, request_timeout=cluster.timeout)
    out: dict[tuple[str, int], int] = {}
    for tp, future in futures.items():
        try:
            out[(tp.topic, tp.partition)] = cluster.wait(future, f"cannot list offsets of {tp.topic}:{tp.partition}").offset
        except CliError:
            if strict:
                raise
    return out


def run_describe(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    cluster.metadata(admin)
    desc = _describe(cluster, admin, args.group)
    committed = _committed(cluster, admin, args.group)
    if desc.state in _GONE or (not desc.members and not committed
                               and desc.state == ConsumerGroupState.EMPTY):
        raise CliError(f"group {args.group!r} does not exist (no members and no committed offsets)")

    owner: dict[tuple[str, int], str] = {}
    member_rows = []
    for m in sorted(desc.members, key=lambda m: m.member_id):
        assigned = m.assignment.topic_partitions if m.assignment is not None else []
        for tp in assigned:
            owner[(tp.topic, tp.partition)] = m.member_id
        member_rows.append([m.member_id, m.client_id, m.host, _assignment(assigned)])
    partitions = sorted(set(owner) | set(committed))
    ends = _list_offsets(cluster, admin, partitions, OffsetSpec.latest(), strict=False)

    coordinator = desc.coordinator
    where = f"{coordinator.id} ({coordinator.host}:{coordinator.port})" if coordinator is not None else "unknown"
    print(f"group {desc.group_id}  state {enum_label(desc.state)}  type {enum_label(desc.type)}  "
          f"members {len(desc.members)}  assignor {desc.partition_assignor or '-'}  coordinator {where}")
    print()
    if member_rows:
        print_table(["MEMBER-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"], member_rows)
    else:
        print("no active members")
    print()
    rows = []
    for key in partitions:
        offset, end = committed.get(key), ends.get(key)
        lag = end - offset if offset is not None and end is not None else None
        rows.append([key[0], key[1], offset, end, lag, owner.get(key)])
    print_table(["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG", "MEMBER"], rows)
    return 0


def _assignment(partitions: list[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}:{','.join(str(p) for p in sorted(ps))}" for t, ps in sorted(by_topic.items())) or "-"


def run_reset_offsets(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    metadata = cluster.metadata(admin)
    topics = list(dict.fromkeys(args.topic))
    partitions = [(t, p) for t in topics for p in sorted(cluster.topic(metadata, t).partitions)]
    desc = _describe(cluster, admin, args.group)
    if desc.members:
        raise CliError(f"group {args.group!r} has {len(desc.members)} active member(s) "
                       f"(state {enum_label(desc.state)}); stop them before resetting offsets")
    current = _committed(cluster, admin, args.group, [TopicPartition(t, p) for t, p in partitions])
    earliest = _list_offsets(cluster, admin, partitions, OffsetSpec.earliest(), strict=True)
    latest = _list_offsets(cluster, admin, partitions, OffsetSpec.latest(), strict=True)
    if args.to_timestamp is not None:
        found = _list_offsets(cluster, admin, partitions, OffsetSpec.for_timestamp(args.to_timestamp), strict=True)

    plan: list[tuple[str, int, int]] = []
    for key in partitions:
        low, high = earliest[key], latest[key]
        if args.to_earliest:
            new = low
        elif args.to_latest:
            new = high
        elif args.to_offset is not None:
            new = min(max(args.to_offset, low), high)
        else:
            new = found[key] if found[key] >= 0 else high
        plan.append((key[0], key[1], new))
    print_table(["TOPIC", "PARTITION", "CURRENT", "NEW"],
                [[t, p, current.get((t, p)), new] for t, p, new in plan])
    if not args.execute:
        note("dry run: nothing changed; add --execute to apply")
        return 0
    request = ConsumerGroupTopicPartitions(args.group, [TopicPartition(t, p, new) for t, p, new in plan])
    future = admin.alter_consumer_group_offsets([request], request_timeout=cluster.timeout)[args.group]
    result = cluster.wait(future, f"cannot reset offsets of group {args.group!r}")
    failed = [tp for tp in result.topic_partitions if tp.error is not None]
    if failed:
        tp = failed[0]
        raise CliError(f"cannot reset offsets of group {args.group!r}: {len(failed)} partition(s) failed, "
                       f"first {tp.topic}:{tp.partition}: {reason(tp.error)}")
    note(f"reset {len(plan)} offset(s) of group {args.group!r}")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    cluster.metadata(admin)
    future = admin.delete_consumer_groups([args.group], request_timeout=cluster.timeout)[args.group]
    cluster.wait(future, f"cannot delete group {args.group!r}")
    print(f"deleted group {args.group!r}")
    return 0
