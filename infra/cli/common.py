"""What every `stratalog` command shares: its error type, KEY=VALUE arguments, tables."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence


class CliError(Exception):
    """A failure to report as one `stratalog: error: ...` line, then exit with `exit_code`."""

    exit_code = 1


class UsageError(CliError):
    """The command line itself is wrong (bad flag, missing argument)."""

    exit_code = 2


def key_value(text: str) -> tuple[str, str]:
    """argparse type for KEY=VALUE: the key must be non-empty, the value may be empty."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1, got 0")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def unique_pairs(pairs: Iterable[tuple[str, str]], what: str) -> dict[str, str]:
    """KEY=VALUE arguments as a dict; a key given twice is an error, not a silent override."""
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            raise CliError(f"{what} {key!r} given twice")
        out[key] = value
    return out


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart; the last column is not padded."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths)] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    print(format_table(headers, rows))


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def note(message: str) -> None:
    """A remark for the person at the terminal (stderr), never mixed into data on stdout."""
    print(f"stratalog: {message}", file=sys.stderr)


def enum_label(value: object) -> str:
    """`ConsumerGroupState.PREPARING_REBALANCE` -> `PreparingRebalance`."""
    name = getattr(value, "name", None) or str(value)
    return "".join(part.capitalize() for part in name.split("_"))


def add_s3_options(p: argparse.ArgumentParser) -> None:
    """`--s3-endpoint`, `--s3-region`, `--s3-path-style` (read with s3_store_options)."""
    s3 = p.add_argument_group("S3")
    s3.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint (default: the AWS configuration)")
    s3.add_argument("--s3-region", metavar="REGION", help="S3 region (default: the AWS configuration)")
    s3.add_argument("--s3-path-style", action="store_true", help="address buckets by path, not by host")


def s3_store_options(args) -> dict:
    """Object-store options from the `--s3-endpoint`, `--s3-region`, `--s3-path-style` flags."""
    options = {}
    if getattr(args, "s3_endpoint", None):
        options["endpoint_url"] = args.s3_endpoint
    if getattr(args, "s3_region", None):
        options["region"] = args.s3_region
    if getattr(args, "s3_path_style", False):
        options["path_style"] = True
    return options
