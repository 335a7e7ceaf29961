"""`stratalog serve`: run one gateway (embedded coordinator and file store by default)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from stratalog.infra.cli.coordinator_access import DEFAULT_DATA_DIR

EXIT_GRACE_S = 5.0  # after shutdown.timeout.ms, for the interpreter's own exit


def _setting(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key.strip(), val.strip()


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="run a gateway",
                              description="Run a Stratalog gateway. With no flags: one gateway on "
                                          "127.0.0.1:9092 with the embedded coordinator and a file "
                                          "object store under ./stratalog-data.")
    p.add_argument("--listen", default="127.0.0.1:9092", metavar="HOST:PORT",
                   help="address to accept Kafka clients on (default 127.0.0.1:9092; port 0 picks one)")
    p.add_argument("--advertised", metavar="HOST:PORT",
                   help="address clients are told to connect to (default: the listener)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, type=Path, metavar="DIR",
                   help="local state: active segments, cache, embedded coordinator (default ./stratalog-data)")
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML file of settings")
    p.add_argument("--coordinator", metavar="URL",
                   help="etcd://HOST:PORT[,HOST:PORT] (default: embedded, under the data directory)")
    p.add_argument("--object-store", metavar="URL",
                   help="s3://BUCKET/PREFIX or file:///PATH (default: file store under the data directory)")
    p.add_argument("--broker-id", type=int, metavar="N", help="node id (default: assigned)")
    p.add_argument("--rack", help="this gateway's rack or zone, for follower fetching")
    p.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint (default: the AWS configuration)")
    p.add_argument("--s3-region", metavar="REGION", help="S3 region (default: the AWS configuration)")
    p.add_argument("--s3-path-style", action="store_true", help="address buckets by path, not by host")
    p.add_argument("--set", dest="settings", action="append", default=[], type=_setting,
                   metavar="KEY=VALUE", help="any setting, e.g. --set wal.flush.ms=50 (repeatable)")
    p.add_argument("--http", default="127.0.0.1:9644", metavar="HOST:PORT",
                   help="metrics, health and admin endpoint (default 127.0.0.1:9644; 'off' disables)")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def run(args: argparse.Namespace) -> int:
    from stratalog.gateway.app import GatewayOptions, ShutdownAbandoned, StartupError, serve_forever
    from stratalog.gateway.config import BrokerConfig, ConfigError, load_settings

    from .common import s3_store_options

    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.config, flags=dict(args.settings))
        shutdown_s = BrokerConfig(settings)["shutdown.timeout.ms"] / 1000  # a bad value fails here, in one line
    except ConfigError as e:
        print(f"stratalog: error: {e}", file=sys.stderr)
        return 2
    options = GatewayOptions(listen=args.listen, advertised=args.advertised, data_dir=args.data_dir,
                             coordinator=args.coordinator, object_store=args.object_store,
                             broker_id=args.broker_id, settings=settings,
                             store_options=s3_store_options(args), rack=args.rack,
                             http=None if args.http == "off" else args.http)
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:
        runner = asyncio.run

    async def main() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        signals = []

        def stop() -> None:
            signals.append(1)
            if len(signals) == 1:
                task.cancel()  # the stop is bounded by shutdown.timeout.ms
                # Past the bound, even a thread blocked in the kernel (a hung disk), which
                # the interpreter would wait for at exit, does not keep the process alive.
                watchdog = threading.Timer(shutdown_s + EXIT_GRACE_S, _exit_now, args=(
                    f"stratalog: still running {shutdown_s + EXIT_GRACE_S:.0f}s after the signal "
                    "(a thread blocked on the disk or the network): exiting",))
                watchdog.daemon = True
                watchdog.start()
            else:
                _exit_now("stratalog: a second signal: exiting without finishing the stop")

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        try:
            await serve_forever(options, ready=lambda line: print(line, flush=True))
        except ShutdownAbandoned as e:
            # A thread blocked on a hung disk would keep the interpreter from exiting, so
            # leave without waiting for it.
            _exit_now(f"stratalog: stopped without finishing: abandoned {e}")

    try:
        runner(main())
    except asyncio.CancelledError:
        return 0
    except StartupError as e:
        print(f"stratalog: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _exit_now(line: str) -> None:
    logging.getLogger(__name__).error(line)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
