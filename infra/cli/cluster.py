"""`stratalog cluster up|down|status`: a local cluster (etcd, S3 endpoint, N gateways).

The work is done by infra/cluster.py; this module turns flags into a `ClusterPlan`, prints
what a user needs (bootstrap list, object store) on stdout and progress on stderr.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from stratalog.infra.cli.common import (CliError, key_value, note, positive_float, positive_int, print_table,
                              stderr_is_terminal)

DEFAULT_DIR = Path("stratalog-cluster")


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (1-65535), got {value}")
    return value


def add_parser(subparsers) -> None:
    cluster = subparsers.add_parser(
        "cluster", help="run a local cluster: etcd, an S3 endpoint and N gateways",
        description="Start, inspect and stop a local Stratalog cluster on 127.0.0.1: one etcd, "
                    "one in-memory S3 endpoint (moto) with a bucket, and N gateways.")
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("up", help="start a cluster and wait until every gateway is ready",
                           description="Start a cluster. It stays in the foreground until Ctrl-C "
                                       "unless --detach is given. The S3 endpoint keeps objects "
                                       "in memory: each 'up' starts an empty cluster.")
    p.add_argument("--gateways", type=positive_int, default=3, metavar="N",
                   help="number of gateways (default 3)")
    _dir_option(p)
    p.add_argument("--base-port", type=_port, default=19092, metavar="PORT",
                   help="Kafka port of gateway 1; gateway N uses PORT+N-1 (default 19092)")
    p.add_argument("--http-base-port", type=_port, default=19644, metavar="PORT",
                   help="HTTP (metrics, /readyz) port of gateway 1, then +1 each (default 19644)")
    p.add_argument("--etcd-port", type=_port, default=19379, metavar="PORT",
                   help="etcd client port; the peer port is the next one (default 19379)")
    p.add_argument("--s3-port", type=_port, default=19000, metavar="PORT",
                   help="S3 endpoint port (default 19000)")
    p.add_argument("--etcd", metavar="PATH", help="etcd binary (default: /usr/bin/etcd, the "
                                                  "Python environment's etcd, or PATH)")
    p.add_argument("--set", dest="settings", action="append", default=[], type=key_value,
                   metavar="KEY=VALUE", help="a setting for every gateway (repeatable)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="gateway log level (default INFO); logs go to DIR/logs/")
    p.add_argument("--timeout", type=positive_float, default=60.0, metavar="SECONDS",
                   help="how long gateways may take to become ready (default 60)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--foreground", dest="detach", action="store_false",
                      help="stay until Ctrl-C, then stop everything (the default)")
    mode.add_argument("--detach", dest="detach", action="store_true",
                      help="return once ready; stop later with 'stratalog cluster down'")
    p.set_defaults(run=run_up, detach=False)

    p = actions.add_parser("down", help="stop the cluster recorded in DIR")
    _dir_option(p)
    p.set_defaults(run=run_down)

    p = actions.add_parser("status", help="show the processes of the cluster in DIR")
    _dir_option(p)
    p.set_defaults(run=run_status)


def _dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, metavar="DIR",
                   help="cluster directory: state file, data, logs (default ./stratalog-cluster)")


def run(args: argparse.Namespace) -> int:
    return {"up": run_up, "down": run_down, "status": run_status}[args.action](args)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def run_up(args: argparse.Namespace) -> int:
    from stratalog.infra.cluster import ClusterError, ClusterLauncher, ClusterPlan

    plan = ClusterPlan(directory=args.dir, gateways=args.gateways, base_port=args.base_port,
                       http_base_port=args.http_base_port, etcd_port=args.etcd_port,
                       s3_port=args.s3_port, etcd_binary=args.etcd, settings=list(args.settings),
                       log_level=args.log_level, ready_timeout_s=args.timeout)
    # Progress is for a person watching; in scripts a failure stays one line on stderr.
    launcher = ClusterLauncher(plan, progress=note if stderr_is_terminal() else lambda _m: None)
    # SIGTERM (e.g. from 'cluster down') stops the cluster in order, as Ctrl-C does.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        try:
            state = launcher.start()
        except ClusterError as e:
            raise CliError(str(e)) from None
        try:
            print(f"bootstrap: {state.bootstrap}")
            print(f"object store: {state.object_store}")
            print(f"s3 endpoint: {state.s3_endpoint} (path-style; any credentials)")
            print(f"coordinator: {state.coordinator}")
            print(f"state: {state.path}", flush=True)
            if args.detach:
                launcher.detach()
                return 0
            note("cluster running; press Ctrl-C to stop it")
            launcher.watch(report=note)
        except KeyboardInterrupt:
            note("stopping the cluster")
            _quiet_stop(launcher)
            return 130 if args.detach else 0
        _quiet_stop(launcher)
        raise CliError(f"every process of the cluster exited; logs in {launcher.dir / 'logs'}")
    finally:
        signal.signal(signal.SIGTERM, previous)


def _quiet_stop(launcher) -> None:
    from stratalog.infra.cluster import ClusterError

    # A second Ctrl-C must not leave half the cluster running.
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        launcher.stop()
    except ClusterError as e:
        raise CliError(str(e)) from None
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def run_down(args: argparse.Namespace) -> int:
    from stratalog.infra.cluster import ClusterError, down

    try:
        state, running = down(args.dir)
    except ClusterError as e:
        raise CliError(str(e)) from None
    print(f"stopped the cluster in {state.directory} ({running} process(es) were running)")
    return 0


def run_status(args: argparse.Namespace) -> int:
    from stratalog.infra.cluster import ClusterError, status

    try:
        state, rows = status(args.dir)
    except ClusterError as e:
        raise CliError(str(e)) from None
    mode = "detached" if state.detached else f"foreground launcher pid {state.launcher_pid}"
    print(f"cluster in {state.directory} ({state.phase}, {mode})")
    print_table(["NAME", "PID", "STATE", "ADDRESS", "HTTP", "LOG"],
                [(r.name, r.pid, cond, r.address, r.http, r.log) for r, cond in rows])
    print(f"bootstrap: {state.bootstrap}")
    print(f"object store: {state.object_store}")
    print(f"s3 endpoint: {state.s3_endpoint}")
    print(f"coordinator: {state.coordinator}", flush=True)
    down_ = [r.name for r, cond in rows if cond not in ("ready", "running")]
    if down_:
        raise CliError(f"not running or not ready: {', '.join(down_)}")
    return 0
