"""Assemble a gateway from its settings: coordinator, object store, broker, listener."""

from __future__ import annotations

import asyncio
import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.coordinator import UnsupportedFormat, migration, open_coordinator
from stratalog.tiering.objectstore import open_store

from . import datadir
from .auth.listeners import advertised_endpoints, parse_listeners
from .auth.tls import ServerTls
from .broker import Broker, start_step
from .config import BrokerConfig, ConfigError
from .connection_limits import ConnectionLimits
from .gc_schedule import FullCollections
from .request_memory import RequestMemory
from .http import HttpServer
from .metrics import GatewayMetrics
from .server import GatewayServer
from .stopping import pending_tasks, suspended_at

log = logging.getLogger(__name__)

EMBEDDED_NODE_ID = 1


class StartupError(Exception):
    """The gateway cannot start; the message says why in one line."""


class ShutdownAbandoned(Exception):
    """The stop did not finish within shutdown.timeout.ms; the message says what was cut
    short. Threads may still be blocked (a hung disk), so the process should exit at once."""


def parse_host_port(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise StartupError(f"{what} must be HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


@dataclass
class GatewayOptions:
    listen: str = "127.0.0.1:9092"
    advertised: str | None = None
    data_dir: Path = Path("stratalog-data")
    coordinator: str | None = None
    object_store: str | None = None
    broker_id: int | None = None
    settings: dict = field(default_factory=dict)
    store_options: dict = field(default_factory=dict)
    rack: str | None = None
    http: str | None = "127.0.0.1:9644"  # metrics, health and admin; None: off


def etcd_security(config):
    """The etcd TLS files and user of the settings (None: plain etcd)."""
    from stratalog.coordinator.etcd import EtcdSecurity

    password = None
    if config["etcd.password.file"]:
        try:
            password = Path(config["etcd.password.file"]).read_text().strip()
        except OSError as e:
            raise StartupError(f"etcd.password.file: {e.strerror or e}") from None
    if config["etcd.username"] and password is None:
        raise StartupError("etcd.username needs etcd.password.file")
    security = EtcdSecurity(config["etcd.ssl.ca.location"] or None, config["etcd.ssl.certificate.location"] or None,
                            config["etcd.ssl.key.location"] or None, config["etcd.username"] or None, password)
    return None if security == EtcdSecurity() else security


class Gateway:
    def __init__(self, options: GatewayOptions):
        self.options = options
        self.config = BrokerConfig(options.settings)
        self.host, self.port = parse_host_port(options.listen, "--listen")
        self.data_dir = options.data_dir.resolve()
        self.object_store_url = options.object_store or (self.data_dir / "objects").as_uri()
        self.broker: Broker | None = None
        self.server: GatewayServer | None = None  # the first listener's
        self.servers: list[GatewayServer] = []
        self.http: HttpServer | None = None
        self.metrics = GatewayMetrics()
        self._store = None

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            datadir.check(self.data_dir)  # before anything in it is opened
        except datadir.UnsupportedDataDir as e:
            raise StartupError(str(e)) from None
        if self.options.object_store is None:
            (self.data_dir / "objects").mkdir(exist_ok=True)
        try:
            self._store = open_coordinator(self.options.coordinator, self.data_dir,
                                           etcd_security=etcd_security(self.config))
        except (ValueError, OSError, UnsupportedFormat) as e:
            raise StartupError(f"coordinator: {e}") from None
        try:
            # Before anything reads or writes the keyspace (a broker id is allocated below):
            # refuse one `stratalog migrate` is still writing, refuse a newer one, mark an old one.
            store = self._store
            await start_step("check for a migration under way", lambda: migration.check_finished(store))
            await start_step("check the coordinator's format", self._store.check_keyspace)
        except (UnsupportedFormat, migration.MigrationUnderWay) as e:
            raise StartupError(str(e)) from None
        store_options = dict(self.options.store_options)
        if self.object_store_url.startswith("s3://"):
            store_options.setdefault("connect_timeout", self.config["s3.connect.timeout.ms"] / 1000)
            store_options.setdefault("read_timeout", self.config["s3.read.timeout.ms"] / 1000)
            store_options.setdefault("max_attempts", self.config["s3.max.attempts"])
        try:
            objects = open_store(self.object_store_url, **store_options)
        except (ValueError, OSError) as e:
            raise StartupError(f"object store: {e}") from None
        node_id = self.options.broker_id
        if node_id is None or node_id < 0:
            node_id = self.config["broker.id"]
        if node_id < 0:
            node_id = (EMBEDDED_NODE_ID if self.options.coordinator in (None, "embedded")
                       else await self._allocated_broker_id())
        try:
            listeners = parse_listeners(self.config, (self.host, self.port))
            tls = ServerTls(self.config) if any(ln.tls for ln in listeners) else None
            limits = ConnectionLimits(self.config)
            memory = RequestMemory(self.config["queued.max.request.bytes"])
        except ConfigError as e:
            raise StartupError(str(e)) from None
        if self.metrics is not None:
            self.metrics.connection_limits = limits
        # Bind first: the advertised port of ":0" listeners is known only after binding.
        self.servers = [GatewayServer(None, ln, max_request_bytes=self.config["socket.request.max.bytes"],
                                      metrics=self.metrics, tls=tls, limits=limits,
                                      idle_ms=self.config["connections.max.idle.ms"], memory=memory,
                                      read_timeout_ms=self.config["request.read.timeout.ms"])
                        for ln in listeners]
        for server in self.servers:
            try:
                await server.bind()
            except OSError as e:
                raise StartupError(f"cannot listen on {server.listener}: {e.strerror or e}") from None
        self.server = self.servers[0]
        self.host, self.port = self.server.host, self.server.port
        try:
            endpoints = advertised_endpoints(
                self.config, [s.listener for s in self.servers],
                parse_host_port(self.options.advertised, "--advertised") if self.options.advertised else None)
        except ConfigError as e:
            raise StartupError(str(e)) from None
        try:
            self.broker = Broker(self.config, node_id=node_id, advertised=endpoints[self.server.listener.name],
                                 data_dir=self.data_dir, store=self._store, objects=objects, rack=self.options.rack,
                                 lease_ttl_s=max(1, round(self.config["broker.session.timeout.ms"] / 1000)),
                                 metrics=self.metrics, endpoints=endpoints)
        except ConfigError as e:
            raise StartupError(str(e)) from None
        for server in self.servers:
            server.broker = self.broker
        self.metrics.attach(self.broker)
        if self.options.http:
            host, port = parse_host_port(self.options.http, "--http")
            try:
                self.http = HttpServer(self, host, port, admin_token_file=self.config["http.admin.token.file"])
            except ConfigError as e:
                raise StartupError(str(e)) from None
            try:
                await self.http.start()
            except OSError as e:
                raise StartupError(f"cannot listen for HTTP on {host}:{port}: {e.strerror or e}") from None
        await self.broker.start()
        datadir.mark(self.data_dir)  # every format check has passed
        # Clients are accepted only now: a request before the broker knows its topics would
        # be answered wrongly (UNKNOWN_TOPIC for a topic that exists).
        for server in self.servers:
            await server.start()

    async def _allocated_broker_id(self) -> int:
        """A gateway on etcd started without a broker id: the one the cluster gave this
        data directory before, or a new one, remembered for the next start."""
        cluster_id = await self._store.cluster_id()
        try:
            node_id = datadir.remembered_broker_id(self.data_dir, cluster_id)
        except datadir.UnsupportedDataDir as e:
            raise StartupError(str(e)) from None
        if node_id is None:
            node_id = await self._store.allocate_broker_id()
            datadir.remember_broker_id(self.data_dir, cluster_id, node_id)
        return node_id

    def readiness(self) -> tuple[bool, str]:
        if self.broker is None or not self.broker.started:
            return False, "starting"
        fault = self.broker.engine.storage_fault()
        if fault is not None:
            return False, f"storage failed, produce refused: {fault}"
        offline = self.broker.offline_partitions()
        if offline:
            # Still ready: every other partition is served, and a load balancer that took
            # this gateway out would not bring the damaged one back.
            return True, f"serving; {len(offline)} partition(s) offline: " + ", ".join(
                f"{t}-{p}" for t, p, _ in offline)
        return True, "serving"

    async def stop(self, flush_timeout_s: float = 30) -> str | None:
        """Stop accepting, close connections (their requests in flight fail, and clients
        retry), flush the WAL for at most `flush_timeout_s`, then stop everything. Returns
        what the flush left uncommitted (None: nothing)."""
        abandoned = None
        if self.http is not None:
            await self.http.stop()
        for server in self.servers:
            await server.stop()
        if self.broker is not None:
            abandoned = await self.broker.stop(flush_timeout_s)
        if self._store is not None:
            await self._store.close()
        return abandoned

    def work_in_progress(self) -> list[str]:
        """What a stop now would cut short, one phrase each."""
        out = []
        if self.broker is not None:
            if not self.broker.started:
                out.append("the start (recovering led partitions)")
            out += self.broker.work_in_progress()
        busy = sum(server.requests_in_flight() for server in self.servers)
        if busy:
            out.append(f"{busy} client request(s) in flight")
        return out

    async def shutdown(self) -> None:
        """`stop`, bounded by shutdown.timeout.ms: past it, log what was abandoned and raise
        ShutdownAbandoned. Nothing acknowledged to acks=all producers is lost by that: it was
        committed before its answer."""
        bound = self.config["shutdown.timeout.ms"] / 1000
        at_signal = self.work_in_progress()
        if at_signal:
            log.warning("shutdown: stopping (at most %.1fs) while busy with: %s", bound, "; ".join(at_signal))
        # The WAL gets most of the bound, the rest stops what follows it.
        stop = asyncio.ensure_future(self.stop(flush_timeout_s=bound * 0.8))
        done, _ = await asyncio.wait({stop}, timeout=bound)
        if stop in done:
            if stop.exception() is not None:
                log.error("shutdown: a stop step failed", exc_info=stop.exception())
            elif stop.result() is not None:
                raise ShutdownAbandoned(f"the WAL flush: {stop.result()}")
            return
        left = self.work_in_progress() or ["a stop step that did not end"]
        message = f"after {bound:.1f}s (shutdown.timeout.ms): {'; '.join(left)}"
        log.error("shutdown: abandoned %s; the stop waits in %s; tasks still running: %s", message,
                  suspended_at(stop), "; ".join(pending_tasks()) or "none")
        stop.cancel()
        await asyncio.wait({stop}, timeout=1.0)
        raise ShutdownAbandoned(message)

    def banner(self) -> str:
        a = self.broker.address
        coord = self.options.coordinator or f"embedded at {self.data_dir}"
        extra = "".join(f", {s.listener.protocol} on {s.host}:{s.port}" for s in self.servers[1:])
        return (f"stratalog: serving Kafka on {self.host}:{self.port}{extra} "
                f"(advertised {a.host}:{a.port}, node {a.node_id}); "
                f"objects at {self.object_store_url}; coordinator {coord}"
                + (f"; http on {self.http.host}:{self.http.port}" if self.http else ""))


async def serve_forever(options: GatewayOptions, ready=print) -> None:
    """Run until cancelled (SIGINT/SIGTERM), then flush and stop within
    shutdown.timeout.ms (ShutdownAbandoned past it)."""
    gw = Gateway(options)
    try:
        await gw.start()
        # What starting built (modules, settings, the partitions' state) lives as long as the
        # gateway: out of the collector's sight, a full collection under load takes a
        # millisecond instead of tens, which every request in flight would wait.
        gc.freeze()
        with FullCollections(gw.metrics.gc_pauses) as full:
            collections = asyncio.create_task(full.run(), name="full garbage collections")
            try:
                ready(gw.banner())
                await asyncio.Event().wait()
            finally:
                collections.cancel()
                await asyncio.wait({collections})
    finally:
        await gw.shutdown()
