"""The `stratalog` command line.

`main` builds one argparse parser whose subcommands come from the modules in COMMANDS;
each module offers `add_parser(subparsers)` and `run(args) -> int`. Modules are imported
when the parser is built, so a module that is missing (or a heavy dependency it imports
only inside `run`) costs nothing until it is used.

Every failure is reported as one `stratalog: error: ...` line on stderr with a non-zero
exit status (2 for a bad command line, 1 otherwise); Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from stratalog.infra.cli.common import CliError, UsageError

# Subcommand modules, in help order. REGISTRATION POINT: `stratalog serve` lives in
# infra/cli/serve.py (owned by the gateway's author) and plugs in through the same
# add_parser/run pair; it is skipped if the module is absent.
COMMANDS = (
    "stratalog.infra.cli.serve",
    "stratalog.infra.cli.topics",
    "stratalog.infra.cli.partitions",
    "stratalog.infra.cli.produce",
    "stratalog.infra.cli.consume",
    "stratalog.infra.cli.groups",
    "stratalog.infra.cli.transactions",
    "stratalog.infra.cli.users",
    "stratalog.infra.cli.coordinator",
    "stratalog.infra.cli.recover",
    "stratalog.infra.cli.migrate",
    "stratalog.infra.cli.acls",
    "stratalog.infra.cli.quotas",
    "stratalog.infra.cli.segments",
    "stratalog.infra.cli.cluster",
    "stratalog.infra.cli.compact",
    "stratalog.infra.cli.export",
)
OPTIONAL_COMMANDS = {"stratalog.infra.cli.serve"}

EXIT_INTERRUPTED = 130
DEBUG_ENV = "STRATALOG_DEBUG"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors become one-line `UsageError`s."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _register(subparsers, module) -> None:
    before = set(subparsers.choices)
    module.add_parser(subparsers)
    # Bind `run` to whatever parser(s) the module added, so modules need not do it.
    for name in set(subparsers.choices) - before:
        parser = subparsers.choices[name]
        if parser.get_default("run") is None:
            parser.set_defaults(run=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="stratalog",
                    description="Stratalog: a Kafka-compatible event log kept in object storage.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if name in OPTIONAL_COMMANDS and exc.name == name:
                continue
            raise
        _register(subparsers, module)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one `stratalog` command; returns the process exit status."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        status = args.run(args)
        sys.stdout.flush()
        return 0 if status is None else int(status)
    except CliError as exc:
        _report(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BrokenPipeError:
        # The reader went away (`stratalog consume ... | head`); stop quietly, and keep
        # Python from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as exc:  # a bug: still one line, unless asked for the traceback
        if os.environ.get(DEBUG_ENV):
            raise
        _report(f"unexpected {type(exc).__name__}: {exc} (set {DEBUG_ENV}=1 for the traceback)")
        return 1


def _report(message: str) -> None:
    # Keep the promise of one line even when a message carries a newline.
    line = " ".join(message.split("\n"))
    print(f"stratalog: error: {line}", file=sys.stderr)
