"""`stratalog quotas describe|alter`: client quotas (producer_byte_rate,
consumer_byte_rate, request_percentage, controller_mutation_rate) on users and client ids,
as Kafka's `kafka-configs --entity-type users|clients` sets them.

confluent-kafka's AdminClient has no client-quota calls, so these send DescribeClientQuotas
and AlterClientQuotas with the project's own codec (`transactions.Connection`, which also
speaks TLS and SASL from --command-config). They need DESCRIBE_CONFIGS (describe) or
ALTER_CONFIGS (alter) on the cluster when ACLs are on."""

from __future__ import annotations

import argparse

from stratalog.gateway.protocol.catalog import ApiKey
from stratalog.gateway.quotas.rules import CLIENT_ID, QUOTA_KEYS, USER
from stratalog.infra.cli.common import CliError, UsageError, print_table
from stratalog.infra.cli.kafka import Cluster, add_connection_options
from stratalog.infra.cli.transactions import Connection, _error_name

MATCH_EXACT, MATCH_DEFAULT = 0, 1
DEFAULT = "<default>"


class QuotaConnection(Connection):
    SPOKEN = {**Connection.SPOKEN, ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 1), ApiKey.ALTER_CLIENT_QUOTAS: (0, 1)}


def add_parser(subparsers) -> None:
    quotas = subparsers.add_parser("quotas", help="describe and alter client quotas",
                                   description=__doc__.splitlines()[0] + " " + " ".join(__doc__.splitlines()[1:3]))
    actions = quotas.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("describe", help="the quotas set (all, or those of an entity)",
                           description="List the entities with quotas and their values; --user and "
                                       "--client-id narrow it to entities naming them.")
    _entity_options(p)
    p.add_argument("--strict", action="store_true", help="only entities with exactly the types named")
    add_connection_options(p)
    p.set_defaults(run=run_describe)

    p = actions.add_parser("alter", help="set or remove quotas of one entity",
                           description="Set (--add-config) or remove (--delete-config) quotas of a user, a "
                                       "client id, or a user's client id; --user-default / --client-default "
                                       "name the default that applies to every one without its own.")
    _entity_options(p)
    p.add_argument("--add-config", metavar="KEY=VALUE,...", default="",
                   help=f"quotas to set: {', '.join(QUOTA_KEYS)} (bytes or partitions per second; "
                        "request_percentage in percent of the event loop)")
    p.add_argument("--delete-config", metavar="KEY,...", default="", help="quotas to remove")
    add_connection_options(p)
    p.set_defaults(run=run_alter)


def run(args: argparse.Namespace) -> int:  # every action binds its own run_*
    raise CliError("choose an action: describe or alter")


def _entity_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("entity")
    user = g.add_mutually_exclusive_group()
    user.add_argument("--user", metavar="NAME", help="a user (the SASL or certificate principal's name)")
    user.add_argument("--user-default", action="store_true", help="the default for every user")
    client = g.add_mutually_exclusive_group()
    client.add_argument("--client-id", metavar="ID", help="a client id (the client's client.id)")
    client.add_argument("--client-default", action="store_true", help="the default for every client id")


def _entity(args) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    if args.user is not None or args.user_default:
        out.append((USER, None if args.user_default else args.user))
    if args.client_id is not None or args.client_default:
        out.append((CLIENT_ID, None if args.client_default else args.client_id))
    return out


def parse_configs(add: str, delete: str) -> list[dict]:
    """--add-config and --delete-config as AlterClientQuotas ops; UsageError when malformed."""
    ops: list[dict] = []
    for item in filter(None, (s.strip() for s in add.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise UsageError(f"--add-config: expected KEY=VALUE, got {item!r}")
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"--add-config: {key}={value!r} is not a number") from None
        ops.append({"key": key, "value": number, "remove": False})
    for key in filter(None, (s.strip() for s in delete.split(","))):
        ops.append({"key": key, "value": 0.0, "remove": True})
    for op in ops:
        if op["key"] not in QUOTA_KEYS:
            raise UsageError(f"unknown quota {op['key']!r} (known: {', '.join(QUOTA_KEYS)})")
    return ops


def _name(name: str | None) -> str:
    return DEFAULT if name is None else name


def run_describe(args: argparse.Namespace) -> int:
    cluster = Cluster.from_args(args)
    components = [{"entity_type": t, "match_type": MATCH_DEFAULT if n is None else MATCH_EXACT, "match": n}
                  for t, n in _entity(args)]
    with QuotaConnection(cluster, cluster.bootstrap.split(",")[0].strip()) as conn:
        got = conn.call(ApiKey.DESCRIBE_CLIENT_QUOTAS, {"components": components, "strict": args.strict})
    if got.error_code:
        raise CliError(f"describe quotas: {got.error_message or _error_name(got.error_code)}")
    rows = []
    for e in got.entries or []:
        names = dict((c.entity_type, c.entity_name) for c in e.entity)
        for v in e.values:
            rows.append((_name(names[USER]) if USER in names else "",
                         _name(names[CLIENT_ID]) if CLIENT_ID in names else "", v.key, f"{v.value:g}"))
    rows.sort()
    print_table(("USER", "CLIENT-ID", "QUOTA", "VALUE"), rows)
    return 0


def run_alter(args: argparse.Namespace) -> int:
    entity = _entity(args)
    if not entity:
        raise UsageError("name the entity: --user/--user-default and/or --client-id/--client-default")
    ops = parse_configs(args.add_config, args.delete_config)
    if not ops:
        raise UsageError("nothing to change: give --add-config and/or --delete-config")
    cluster = Cluster.from_args(args)
    body = {"entries": [{"entity": [{"entity_type": t, "entity_name": n} for t, n in entity], "ops": ops}],
            "validate_only": False}
    with QuotaConnection(cluster, cluster.bootstrap.split(",")[0].strip()) as conn:
        got = conn.call(ApiKey.ALTER_CLIENT_QUOTAS, body)
    for e in got.entries:
        if e.error_code:
            raise CliError(f"alter quotas: {e.error_message or _error_name(e.error_code)}")
    who = ", ".join(f"{t} {_name(n)}" for t, n in entity)
    print(f"altered the quotas of {who}")
    return 0
