"""`stratalog topics reassign|reassignments|elect`, and the --replica-assignment syntax of
`topics create|alter`: where an operator puts a partition's replicas and its leader.

ElectLeaders goes through confluent-kafka's AdminClient, like the other topic commands.
confluent-kafka has no AlterPartitionReassignments nor ListPartitionReassignments, so those
two are sent with the project's own codec over `transactions.Connection` (which speaks the
same --command-config TLS and SASL settings); any gateway answers them.
"""

from __future__ import annotations

import argparse

from confluent_kafka import ElectionType, KafkaError, TopicPartition

from stratalog.gateway.protocol.catalog import ApiKey
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.infra.cli.common import CliError, print_table
from stratalog.infra.cli.kafka import Cluster, add_connection_options, reason
from stratalog.infra.cli.transactions import Connection, bootstrap_connection


def replica_assignment(text: str) -> list[list[int]]:
    """argparse type of --replica-assignment, kafka-topics' syntax: partitions separated by
    ',', each partition's broker ids by ':' (the first its preferred leader): `1:2,2:3`."""
    out = []
    for n, part in enumerate(text.split(",")):
        try:
            ids = [int(b) for b in part.split(":")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"partition {n}: {part!r} is not broker ids separated by ':' "
                                             "(e.g. 1:2,2:3)") from None
        if len(set(ids)) != len(ids):
            raise argparse.ArgumentTypeError(f"partition {n}: a broker id is listed twice in {part!r}")
        out.append(ids)
    if len({len(ids) for ids in out}) > 1:
        raise argparse.ArgumentTypeError("every partition needs the same number of replicas")
    return out


def broker_ids(text: str) -> list[int]:
    """argparse type of --replicas: broker ids separated by ','."""
    try:
        return [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not broker ids separated by ',' (e.g. 3,1)") from None


def add_actions(actions) -> None:
    p = actions.add_parser("reassign", help="move a partition's replicas (or cancel a move under way)",
                           description="Give a partition new replicas (AlterPartitionReassignments); the "
                                       "first is its preferred leader. No data is copied: the move ends "
                                       "once the new gateways tail the partition.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("partition", type=int, metavar="PARTITION")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--replicas", type=broker_ids, metavar="ID,ID,...", help="the new replicas")
    what.add_argument("--cancel", action="store_true", help="go back to the replicas before the move under way")
    add_connection_options(p)
    p.set_defaults(run=run_reassign)

    p = actions.add_parser("reassignments", help="reassignments under way",
                           description="List partition reassignments under way (ListPartitionReassignments).")
    p.add_argument("name", nargs="?", metavar="NAME", help="one topic (default: every topic)")
    add_connection_options(p)
    p.set_defaults(run=run_reassignments)

    p = actions.add_parser("elect", help="give partitions back to their preferred replicas",
                           description="Elect leaders (ElectLeaders): the preferred replica (the first "
                                       "assigned), or with --unclean a live replica for partitions "
                                       "without a live leader.")
    p.add_argument("name", nargs="?", metavar="NAME", help="the topic")
    p.add_argument("partitions", nargs="*", type=int, metavar="PARTITION",
                   help="its partitions (default: all of them)")
    p.add_argument("--all", action="store_true", help="every partition of every topic")
    p.add_argument("--unclean", action="store_true", help="an unclean election instead of the preferred one")
    add_connection_options(p)
    p.set_defaults(run=run_elect)


def run_reassign(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    replicas = None if args.cancel else args.replicas
    body = {"timeout_ms": cluster.timeout_ms,
            "topics": [{"name": args.name, "partitions": [{"partition_index": args.partition,
                                                           "replicas": replicas}]}]}
    with bootstrap_connection(cluster, ReplicaConnection) as conn:
        got = conn.call(ApiKey.ALTER_PARTITION_REASSIGNMENTS, body)
    what = f"cannot {'cancel the reassignment of' if args.cancel else 'reassign'} {args.name}-{args.partition}"
    if got.error_code:
        raise CliError(f"{what}: {got.error_message or _name(got.error_code)}")
    for t in got.responses:
        for p in t.partitions:
            if p.error_code:
                raise CliError(f"{what}: {p.error_message or _name(p.error_code)}")
    if args.cancel:
        print(f"cancelled the reassignment of {args.name}-{args.partition}")
    else:
        print(f"reassigning {args.name}-{args.partition} to {','.join(map(str, replicas or []))}")
    return 0


def run_reassignments(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    with bootstrap_connection(cluster, ReplicaConnection) as conn:
        topics = None
        if args.name is not None:
            metadata = conn.call(ApiKey.METADATA, {"topics": [{"name": args.name}],
                                                   "allow_auto_topic_creation": False})
            [t] = metadata.topics
            if t.error_code:
                raise CliError(f"topic {args.name!r}: {_name(t.error_code)}")
            topics = [{"name": args.name, "partition_indexes": [p.partition_index for p in t.partitions]}]
        got = conn.call(ApiKey.LIST_PARTITION_REASSIGNMENTS, {"timeout_ms": cluster.timeout_ms, "topics": topics})
    if got.error_code:
        raise CliError(f"cannot list reassignments: {got.error_message or _name(got.error_code)}")
    rows = [[t.name, p.partition_index, _ids(p.replicas), _ids(p.adding_replicas), _ids(p.removing_replicas)]
            for t in got.topics for p in t.partitions]
    if not rows:
        print("no reassignment under way")
        return 0
    print_table(["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"], sorted(rows))
    return 0


def run_elect(args: argparse.Namespace) -> int:
    if args.all == (args.name is not None):
        raise CliError("name a topic (and partitions), or give --all")
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    partitions = None
    if not args.all:
        topic = cluster.topic(cluster.metadata(admin), args.name)
        chosen = args.partitions or sorted(topic.partitions)
        missing = [p for p in chosen if p not in topic.partitions]
        if missing:
            raise CliError(f"topic {args.name!r} has no partition {missing[0]}")
        partitions = [TopicPartition(args.name, p) for p in chosen]
    election = ElectionType.UNCLEAN if args.unclean else ElectionType.PREFERRED
    # (confluent-kafka 2.16 refuses keyword arguments here; cluster.wait bounds the wait.)
    future = admin.elect_leaders(election, partitions)
    results = cluster.wait(future, "cannot elect leaders")
    failed = 0
    rows = []
    for tp, err in sorted(results.items(), key=lambda i: (i[0].topic, i[0].partition)):
        if err is None:
            outcome = "elected"
        elif err.code() == KafkaError.ELECTION_NOT_NEEDED:
            outcome = "not needed: already led by its preferred replica" if not args.unclean else "not needed"
        else:
            failed += 1
            outcome = reason(err)
        rows.append([tp.topic, tp.partition, outcome])
    if not rows:
        print("every partition is led by its preferred replica" if not args.unclean else "nothing to elect")
        return 0
    print_table(["TOPIC", "PARTITION", "RESULT"], rows)
    return 1 if failed else 0


class ReplicaConnection(Connection):
    """A Connection that also speaks the reassignment APIs."""

    SPOKEN = {**Connection.SPOKEN,
              ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
              ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0)}


def _name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


def _ids(nodes) -> str:
    return ",".join(str(n) for n in nodes) or "-"
