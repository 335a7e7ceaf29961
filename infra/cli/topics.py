"""`stratalog topics create|list|describe|alter|delete`."""

from __future__ import annotations

import argparse

from confluent_kafka import KafkaError
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from stratalog.infra.cli.common import CliError, key_value, positive_int, print_table, unique_pairs
from stratalog.infra.cli.kafka import Cluster, add_connection_options, error_code, reason
from stratalog.infra.cli.replicas import add_actions as add_replica_actions
from stratalog.infra.cli.replicas import replica_assignment


def add_parser(subparsers) -> None:
    topics = subparsers.add_parser("topics", help="create, list, describe, alter, delete topics; place replicas",
                                   description="Manage topics through the Kafka admin API.")
    actions = topics.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("create", help="create a topic")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--partitions", type=positive_int, metavar="N", help="partition count (default: the broker's)")
    p.add_argument("--replication-factor", type=positive_int, metavar="N",
                   help="replicas per partition (default: the broker's)")
    p.add_argument("--config", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="a topic config, e.g. retention.ms=86400000 (repeatable)")
    p.add_argument("--replica-assignment", type=replica_assignment, metavar="B:B,B:B,...",
                   help="each partition's broker ids, partitions separated by ',' and the first id of each its "
                        "preferred leader (as kafka-topics); instead of --partitions and --replication-factor")
    p.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")
    add_connection_options(p)
    p.set_defaults(run=run_create)

    p = actions.add_parser("list", help="list topic names")
    add_connection_options(p)
    p.set_defaults(run=run_list)

    p = actions.add_parser("describe", help="partitions, leaders, replicas, ISR and configs")
    p.add_argument("name", nargs="?", metavar="NAME", help="one topic (default: every topic)")
    p.add_argument("--all-configs", action="store_true", help="show default configs too")
    add_connection_options(p)
    p.set_defaults(run=run_describe)

    p = actions.add_parser("alter", help="change configs or add partitions")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--config", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="set a topic config (repeatable)")
    p.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                   help="return a topic config to its default (repeatable)")
    p.add_argument("--partitions", type=positive_int, metavar="N", help="new, larger partition count")
    p.add_argument("--replica-assignment", type=replica_assignment, metavar="B:B,B:B,...",
                   help="with --partitions: the new partitions' broker ids (or every partition's, as "
                        "kafka-topics takes them: the existing ones are skipped)")
    add_connection_options(p)
    p.set_defaults(run=run_alter)

    p = actions.add_parser("delete", help="delete a topic and its data")
    p.add_argument("name", metavar="NAME")
    add_connection_options(p)
    p.set_defaults(run=run_delete)

    add_replica_actions(actions)


def run(args: argparse.Namespace) -> int:  # every action binds its own run_*
    raise CliError("choose an action: create, list, describe, alter, delete, reassign, reassignments or elect")


def run_create(args: argparse.Namespace) -> int:
    configs = unique_pairs(args.config, "config")
    assignment = args.replica_assignment
    if assignment is not None and (args.partitions or args.replication_factor):
        raise CliError("--replica-assignment sets the partitions and their replicas: "
                       "give no --partitions nor --replication-factor with it")
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    cluster.metadata(admin)
    if assignment is not None:
        # confluent-kafka wants the count beside the lists; the request carries only the lists.
        topic = NewTopic(args.name, num_partitions=len(assignment), replica_assignment=assignment,
                         config=configs)
    else:
        topic = NewTopic(args.name,
                         num_partitions=args.partitions or -1,
                         replication_factor=args.replication_factor or -1,
                         config=configs)
    future = admin.create_topics([topic], request_timeout=cluster.timeout)[args.name]
    try:
        cluster.wait(future, f"cannot create topic {args.name!r}")
    except CliError:
        if args.if_not_exists and _already_exists(future):
            return 0
        raise
    print(f"created topic {args.name!r}")
    return 0


def _already_exists(future) -> bool:
    exc = future.exception(timeout=0)
    return error_code(exc) == KafkaError.TOPIC_ALREADY_EXISTS


def run_list(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    metadata = cluster.metadata(cluster.admin())
    for name in sorted(metadata.topics):
        print(name)
    return 0


def run_describe(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    if args.name is not None:
        metadata, topic = cluster.existing_topic(admin, args.name)
        names = [topic.topic]
    else:
        metadata = cluster.metadata(admin)
        names = sorted(metadata.topics)
    configs = _topic_configs(cluster, admin, names, args.all_configs)
    for i, name in enumerate(names):
        topic = metadata.topics[name]
        partitions = [topic.partitions[p] for p in sorted(topic.partitions)]
        replication = max((len(p.replicas) for p in partitions), default=0)
        if i:
            print()
        print(f"topic {name}  partitions {len(partitions)}  replication-factor {replication}")
        shown = configs.get(name)
        if shown is None:
            print("configs: (not available)")
        else:
            print("configs: " + (", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "(none set)"))
        print_table(
            ["PARTITION", "LEADER", "REPLICAS", "ISR", "ERROR"],
            [[p.id, p.leader if p.leader >= 0 else "none", _ids(p.replicas), _ids(p.isrs),
              _partition_error(p.error)] for p in partitions],
        )
    return 0


def _partition_error(err) -> str:
    if err is None:
        return ""
    if err.code() == KafkaError.KAFKA_STORAGE_ERROR:
        # An offline partition: its data could not be recovered.
        return "OFFLINE: data damaged or missing (stratalog partitions offline shows why)"
    return reason(err)


def _ids(nodes: list[int]) -> str:
    return ",".join(str(n) for n in nodes) or "none"


def _topic_configs(cluster: Cluster, admin, names: list[str], everything: bool) -> dict[str, dict[str, str]]:
    """Each topic's configs (only those not at their default unless `everything`).

    A topic whose configs the broker will not describe is left out rather than failing
    the whole description: partitions and leaders are still worth showing."""
    if not names:
        return {}
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
    futures = admin.describe_configs(resources, request_timeout=cluster.timeout)
    out: dict[str, dict[str, str]] = {}
    for resource, future in futures.items():
        try:
            entries = cluster.wait(future, f"cannot describe configs of topic {resource.name!r}")
        except CliError:
            continue
        out[resource.name] = {
            name: ("(sensitive)" if entry.is_sensitive else ("" if entry.value is None else entry.value))
            for name, entry in entries.items()
            if everything or not entry.is_default
        }
    return out


def run_alter(args: argparse.Namespace) -> int:
    sets = unique_pairs(args.config, "config")
    deletes = list(dict.fromkeys(args.delete_config))
    both = sorted(set(sets) & set(deletes))
    if both:
        raise CliError(f"config {both[0]!r} is both set and deleted")
    if not sets and not deletes and args.partitions is None:
        raise CliError("nothing to alter: give --config, --delete-config or --partitions")
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    _, topic = cluster.existing_topic(admin, args.name)
    if args.partitions is not None and args.partitions <= len(topic.partitions):
        raise CliError(f"topic {args.name!r} has {len(topic.partitions)} partitions; "
                       f"--partitions can only grow it, got {args.partitions}")
    assignment = args.replica_assignment
    if assignment is not None:
        if args.partitions is None:
            raise CliError("--replica-assignment places new partitions: give --partitions too "
                           "(`stratalog topics reassign` moves existing ones)")
        adding = args.partitions - len(topic.partitions)
        if len(assignment) == args.partitions:
            assignment = assignment[len(topic.partitions):]
        if len(assignment) != adding:
            raise CliError(f"--replica-assignment lists {len(args.replica_assignment)} partitions; growing "
                           f"{args.name!r} to {args.partitions} adds {adding} (list those, or all {args.partitions})")
    if sets or deletes:
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sets.items()]
        entries += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in deletes]
        resource = ConfigResource(ResourceType.TOPIC, args.name, incremental_configs=entries)
        futures = admin.incremental_alter_configs([resource], request_timeout=cluster.timeout)
        for future in futures.values():
            cluster.wait(future, f"cannot alter configs of topic {args.name!r}")
    if args.partitions is not None:
        # (confluent-kafka refuses replica_assignment=None: give it only with lists.)
        grow = (NewPartitions(args.name, args.partitions) if assignment is None else
                NewPartitions(args.name, args.partitions, replica_assignment=assignment))
        futures = admin.create_partitions([grow], request_timeout=cluster.timeout)
        cluster.wait(futures[args.name], f"cannot add partitions to topic {args.name!r}")
    print(f"altered topic {args.name!r}")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    cluster.existing_topic(admin, args.name)
    future = admin.delete_topics([args.name], request_timeout=cluster.timeout)[args.name]
    cluster.wait(future, f"cannot delete topic {args.name!r}")
    print(f"deleted topic {args.name!r}")
    return 0
