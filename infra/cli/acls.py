"""`stratalog acls add|list|remove`: Kafka ACLs through the admin API (CreateAcls,
DescribeAcls, DeleteAcls), so they need a principal with ALTER (add, remove) or DESCRIBE
(list) on the cluster, e.g. a super user, given with --command-config."""

from __future__ import annotations

import argparse

from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                   ResourcePatternType, ResourceType)

from stratalog.infra.cli.common import CliError, UsageError, print_table
from stratalog.infra.cli.kafka import Cluster, add_connection_options, reason

OPERATIONS = [op.name for op in AclOperation if op not in (AclOperation.UNKNOWN, AclOperation.ANY)]
CLUSTER = "kafka-cluster"


def add_parser(subparsers) -> None:
    acls = subparsers.add_parser("acls", help="add, list and remove ACLs",
                                 description=__doc__.splitlines()[0])
    actions = acls.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("add", help="allow (or --deny) operations to a principal")
    p.add_argument("--principal", required=True, metavar="User:NAME", help="User:NAME, or User:* for everyone")
    p.add_argument("--operation", required=True, action="append", choices=OPERATIONS, metavar="OP",
                   help=f"one of {', '.join(OPERATIONS)} (repeatable)")
    p.add_argument("--deny", action="store_true", help="deny instead of allow (a deny wins over any allow)")
    p.add_argument("--host", default="*", help="the client address it applies to (default: any)")
    _resource_options(p, required=True)
    add_connection_options(p)
    p.set_defaults(run=run_add)

    for name, run, text in (("list", run_list, "list ACLs (all, or those matching)"),
                            ("remove", run_remove, "remove the ACLs matching")):
        p = actions.add_parser(name, help=text)
        p.add_argument("--principal", metavar="User:NAME")
        p.add_argument("--operation", choices=OPERATIONS, metavar="OP")
        p.add_argument("--host")
        _resource_options(p, required=name == "remove")
        add_connection_options(p)
        p.set_defaults(run=run)


def _resource_options(p: argparse.ArgumentParser, *, required: bool) -> None:
    which = p.add_argument_group("resource").add_mutually_exclusive_group(required=required)
    which.add_argument("--topic", metavar="NAME")
    which.add_argument("--group", metavar="NAME")
    which.add_argument("--transactional-id", metavar="ID")
    which.add_argument("--cluster", action="store_true")
    p.add_argument("--prefixed", action="store_true", help="the name is a prefix (default: literal; '*' is every name)")


def _resource(args) -> tuple[ResourceType, str | None]:
    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if args.cluster:
        return ResourceType.BROKER, CLUSTER
    return ResourceType.ANY, None


def _pattern(args, for_filter: bool) -> ResourcePatternType:
    if args.prefixed:
        return ResourcePatternType.PREFIXED
    return ResourcePatternType.ANY if for_filter else ResourcePatternType.LITERAL


def _filter(args) -> AclBindingFilter:
    rtype, name = _resource(args)
    op = AclOperation[args.operation] if args.operation else AclOperation.ANY
    return AclBindingFilter(rtype, name, _pattern(args, True), args.principal, args.host, op, AclPermissionType.ANY)


def _wait(future, cluster: Cluster, what: str):
    try:
        return future.result(cluster.timeout)
    except Exception as exc:  # noqa: BLE001 - KafkaException or a timeout, one line either way
        raise CliError(f"{what}: {reason(exc)}") from None


def run_add(args) -> int:
    if ":" not in args.principal:
        raise UsageError(f"--principal must be TYPE:NAME such as User:alice, got {args.principal!r}")
    rtype, name = _resource(args)
    permission = AclPermissionType.DENY if args.deny else AclPermissionType.ALLOW
    bindings = [AclBinding(rtype, name, _pattern(args, False), args.principal, args.host, AclOperation[op],
                           permission) for op in args.operation]
    cluster = Cluster.from_args(args)
    admin = cluster.admin()  # referenced while its futures run: a dropped handle fails them
    for binding, future in admin.create_acls(bindings, request_timeout=cluster.timeout).items():
        _wait(future, cluster, f"cannot add {binding.operation.name} for {binding.principal}")
    print(f"added {len(bindings)} ACL(s)")
    return 0


def _rows(bindings) -> list[tuple]:
    return [(b.principal, b.permission_type.name, b.operation.name, b.restype.name.replace("BROKER", "CLUSTER"),
             b.resource_pattern_type.name, b.name, b.host) for b in bindings]


HEADERS = ["PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE", "PATTERN", "NAME", "HOST"]


def run_list(args) -> int:
    cluster = Cluster.from_args(args)
    admin = cluster.admin()
    found = _wait(admin.describe_acls(_filter(args), request_timeout=cluster.timeout), cluster,
                  "cannot list ACLs")
    print_table(HEADERS, sorted(_rows(found)))
    return 0


def run_remove(args) -> int:
    cluster = Cluster.from_args(args)
    wanted = _filter(args)
    admin = cluster.admin()
    futures = admin.delete_acls([wanted], request_timeout=cluster.timeout)
    removed = _wait(futures[wanted], cluster, "cannot remove ACLs")
    print(f"removed {len(removed)} ACL(s)")
    if removed:
        print_table(HEADERS, sorted(_rows(removed)))
    return 0


def run(args) -> int:  # every action binds its own run_*
    raise CliError("choose an action: add, list or remove")
