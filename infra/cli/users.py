"""`stratalog users add|list|delete`: SASL/SCRAM users, kept in the coordinator.

Like Kafka's `kafka-storage format --add-scram`, this writes the coordinator directly: with
the embedded coordinator while no gateway runs on the data directory, with etcd at any
time (gateways read credentials at each authentication, so a change counts at once). Only
the salted SCRAM credential is stored; the password is read from a file or standard input
(or `--password`, which other users of the machine can see in the process list).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from stratalog.infra.cli.common import CliError, UsageError, print_table
from stratalog.infra.cli.coordinator_access import add_coordinator_options, open_coordinator_store

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
    add_coordinator_options(p)
    p.set_defaults(run=run_add)

    p = actions.add_parser("list", help="list users and their mechanisms (never a secret)")
    add_coordinator_options(p)
    p.set_defaults(run=run_list)

    p = actions.add_parser("delete", help="delete a user's credentials")
    p.add_argument("name")
    p.add_argument("--mechanism", choices=(*MECHANISMS, "all"), default="all")
    add_coordinator_options(p)
    p.set_defaults(run=run_delete)


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
        store = open_coordinator_store(args)
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
        store = open_coordinator_store(args)
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
        store = open_coordinator_store(args)
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
