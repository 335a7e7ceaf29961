"""`stratalog users add|list|delete`: SASL/SCRAM users, kept in the coordinator.

Like Kafka's `kafka-storage format --add-scram`, this writes the coordinator directly: with
the embedded coordinator while no gateway runs on the data directory, with etcd at any
time (gateways read credentials at each authentication, so a change counts at once). Only
the salted SCRAM credential is stored; the password is read from a file or standard input
(or `--password`, which other users of the machine can see in the process list).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from stratalog.infra.cli.common import CliError, UsageError, key_value, print_table

DEFAULT_DATA_DIR = "stratalog-data"
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def add_parser(subparsers) -> None:
    users = subparsers.add_parser("users", help="SASL/SCRAM users (kept in the coordinator)",
                                  description=__doc__.splitlines()[0])
    actions = users.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("add", help="add a user, or set a user's password")
    p.add_argument("name")
    secret = p.add_mutually_exclusive_group(required=True)
    secret.add_argument("--password-file", type=Path, metavar="FILE",
                        help="read the password from FILE ('-': standard input); one trailing newline is dropped")
    secret.add_argument("--password", help="the password (visible in the process list)")
    p.add_argument("--mechanism", choices=(*MECHANISMS, "all"), default="all",
                   help="the SCRAM mechanism(s) to store a credential for (default: both)")
    p.add_argument("--iterations", type=int, default=8192, help="PBKDF2 iterations, 4096-16384 (default 8192)")
    _coordinator_options(p)
    p.set_defaults(run=run_add)

    p = actions.add_parser("list", help="list users and their mechanisms (never a secret)")
    _coordinator_options(p)
    p.set_defaults(run=run_list)

    p = actions.add_parser("delete", help="delete a user's credentials")
    p.add_argument("name")
    p.add_argument("--mechanism", choices=(*MECHANISMS, "all"), default="all")
    _coordinator_options(p)
    p.set_defaults(run=run_delete)


def _coordinator_options(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("coordinator").add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR), metavar="DIR",
                       help=f"the embedded coordinator of this data directory (default ./{DEFAULT_DATA_DIR})")
    where.add_argument("--coordinator", metavar="etcd://HOST:PORT", help="an etcd coordinator")
    p.add_argument("--cluster", default="default", help="cluster name in the coordinator (default: default)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="the gateways' TOML settings file, for etcd.ssl.* and etcd.username/etcd.password.file")
    p.add_argument("--set", dest="settings", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                   help="an etcd.* setting (repeatable)")


def _open(args):
    from stratalog.coordinator import open_coordinator
    from stratalog.coordinator.kv import DataDirInUse
    from stratalog.gateway.app import StartupError, etcd_security
    from stratalog.gateway.config import BrokerConfig, ConfigError, load_settings

    try:
        config = BrokerConfig(load_settings(args.config, env={}, flags=dict(args.settings)))
        security = etcd_security(config)
    except (ConfigError, StartupError) as e:
        raise UsageError(str(e)) from None

    if args.coordinator is None:
        args.data_dir.mkdir(parents=True, exist_ok=True)  # users may come before the first start
    try:
        return open_coordinator(args.coordinator, args.data_dir, args.cluster, etcd_security=security)
    except DataDirInUse:
        raise CliError(f"a gateway is running on {args.data_dir}: stop it first (the embedded "
                       "coordinator has one user at a time), or use an etcd coordinator") from None
    except ValueError as e:
        raise UsageError(str(e)) from None


def _mechanisms(choice: str) -> tuple[str, ...]:
    return MECHANISMS if choice == "all" else (choice,)


def _password(args) -> str:
    if args.password is not None:
        return args.password
    if str(args.password_file) == "-":
        text = sys.stdin.read()
    else:
        try:
            text = args.password_file.read_text()
        except OSError as e:
            raise CliError(f"cannot read {args.password_file}: {e.strerror or e}") from None
    return text[:-1] if text.endswith("\n") else text


def run_add(args) -> int:
    from stratalog.gateway.auth.scram import make_credential

    password = _password(args)
    try:
        credentials = [make_credential(password, m, args.iterations) for m in _mechanisms(args.mechanism)]
    except ValueError as e:
        raise UsageError(str(e)) from None

    async def add():
        store = _open(args)
        try:
            await store.check_keyspace(mark=False)
            for c in credentials:
                await store.put_scram_credential(args.name, c)
        finally:
            await store.close()

    asyncio.run(add())
    print(f"user {args.name}: {', '.join(c.mechanism for c in credentials)} credential stored")
    return 0


def run_list(args) -> int:
    async def listing():
        store = _open(args)
        try:
            return await store.scram_users()
        finally:
            await store.close()

    users = asyncio.run(listing())
    print_table(["USER", "MECHANISM", "ITERATIONS"],
                [(u, c.mechanism, c.iterations) for u in sorted(users) for c in users[u]])
    return 0


def run_delete(args) -> int:
    async def delete():
        store = _open(args)
        try:
            return [m for m in _mechanisms(args.mechanism) if await store.delete_scram_credential(args.name, m)]
        finally:
            await store.close()

    gone = asyncio.run(delete())
    if not gone:
        which = "credentials" if args.mechanism == "all" else f"{args.mechanism} credential"
        raise CliError(f"user {args.name} has no {which}")
    print(f"user {args.name}: {', '.join(gone)} credential deleted")
    return 0


def run(args) -> int:  # every action binds its own run_*
    raise CliError("choose an action: add, list or delete")
