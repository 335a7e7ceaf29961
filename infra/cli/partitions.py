"""`stratalog partitions offline|recover`: partitions whose data could not be recovered.

Both go through a gateway's HTTP side (`--admin`): `offline` reads its `/readyz`, and
`recover` its admin API (loopback, or the bearer token of http.admin.token.file). Any
gateway will do: the offline state lives in the coordinator.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from stratalog.infra.cli.common import CliError, non_negative_int, print_table
from stratalog.infra.cli.compact import DEFAULT_ADMIN, _token

TIMEOUT_S = 120.0  # a recovery reads the partition's committed WAL ranges


def add_parser(subparsers) -> None:
    partitions = subparsers.add_parser(
        "partitions", help="list offline partitions and bring them back",
        description="A partition whose committed data is damaged or missing goes offline alone "
                    "(clients get KAFKA_STORAGE_ERROR for it); these commands list and recover them.")
    actions = partitions.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("offline", help="offline partitions and why")
    _add_admin_options(p)
    p.set_defaults(run=run_offline)

    p = actions.add_parser("recover", help="bring an offline partition back",
                           description="Recover the partition again (after restoring the damaged or "
                                       "missing object), or with --truncate --accept-data-loss drop "
                                       "everything from the first unreadable offset on, so the partition "
                                       "continues from the last offset that can be read.")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("partition", type=non_negative_int, metavar="PARTITION")
    p.add_argument("--truncate", action="store_true",
                   help="give up the records that cannot be read (needs --accept-data-loss)")
    p.add_argument("--accept-data-loss", action="store_true",
                   help="confirm that truncating loses committed records")
    _add_admin_options(p)
    p.set_defaults(run=run_recover)


def _add_admin_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin", default=DEFAULT_ADMIN, metavar="URL",
                   help=f"a gateway's HTTP address (default {DEFAULT_ADMIN})")
    p.add_argument("--admin-token-file", type=Path, metavar="FILE",
                   help="file holding the gateway's admin bearer token (its http.admin.token.file)")


def run(args: argparse.Namespace) -> int:  # every action binds its own run_*
    raise CliError("choose an action: offline or recover")


def run_offline(args: argparse.Namespace) -> int:
    body = _call("GET", f"{args.admin.rstrip('/')}/readyz", None, None)
    rows = [(o["topic"], o["partition"], o["reason"]) for o in body.get("offline_partitions", [])]
    if not rows:
        print("no partition is offline")
        return 0
    print_table(["TOPIC", "PARTITION", "REASON"], rows)
    return 0


def run_recover(args: argparse.Namespace) -> int:
    if args.truncate and not args.accept_data_loss:
        raise CliError("--truncate gives up committed records: add --accept-data-loss to confirm")
    url = (f"{args.admin.rstrip('/')}/v1/topics/{urllib.parse.quote(args.topic, safe='')}"
           f"/partitions/{args.partition}/recover")
    body = _call("POST", url, {"truncate": args.truncate, "accept_data_loss": args.accept_data_loss},
                 _token(args.admin_token_file))
    name = f"{args.topic}-{args.partition}"
    if body.get("lost"):
        print(f"{name}: truncated to offset {body['high_watermark']}: {body['lost']} offsets lost; "
              "back online")
    else:
        print(f"{name}: recovered, no offsets lost (high watermark {body['high_watermark']}); back online")
    return 0


def _call(method: str, url: str, body: dict | None, token: str | None) -> dict:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            text = response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            reason = json.loads(text).get("error") or text
        except (ValueError, AttributeError):
            reason = text.strip() or exc.reason
        raise CliError(f"{reason} (HTTP {exc.code})") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach the gateway at {url}: {getattr(exc, 'reason', exc)}") from None
    try:
        out = json.loads(text)
    except ValueError:
        raise CliError(f"the gateway at {url} answered something that is not JSON") from None
    if not isinstance(out, dict):
        raise CliError(f"the gateway at {url} answered something unexpected")
    return out
