"""The gateway's HTTP side: `/metrics`, `/healthz`, `/readyz` (which lists offline
partitions), and the admin calls: the one that swaps compacted segments into a partition
this gateway leads, and the one that recovers an offline partition (any gateway: the
coordinator and the object store hold all it needs).

The admin calls change a partition's log, so they are authenticated: with
`http.admin.token.file` set it needs `Authorization: Bearer <that file's token>`; without
it, it answers only clients on the loopback interface (the default `--http` binds
127.0.0.1). Metrics and health stay open, as Prometheus and load balancers expect.

Compaction jobs go through the leader because the leader owns the partition's log
metadata (and, on the embedded coordinator, is the only process that may open it).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from pathlib import Path

from aiohttp import web

from stratalog.coordinator.kv import CoordinatorUnavailable
from stratalog.coordinator.model import Fenced, SegmentEntry, UnknownTopic
from stratalog.engine.errors import NotLeader, RepairRefused, SwapRefused, UnknownTopicOrPartition
from stratalog.tiering.objectstore.base import ObjectStoreError

log = logging.getLogger(__name__)


class HttpServer:
    def __init__(self, gateway, host: str, port: int, *, admin_token_file: str = ""):
        self.gateway = gateway
        self.host = host
        self.port = port
        self._token = _read_token(admin_token_file) if admin_token_file else None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_post("/v1/topics/{topic}/partitions/{partition}/segments/replace", self.replace)
        app.router.add_post("/v1/topics/{topic}/partitions/{partition}/recover", self.recover)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def metrics(self, request: web.Request) -> web.Response:
        body = self.gateway.metrics.render()
        return web.Response(body=body, content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        ready, reason = self.gateway.readiness()
        broker = self.gateway.broker
        offline = [{"topic": t, "partition": p, "reason": why}
                   for t, p, why in (broker.offline_partitions() if broker is not None else [])]
        return web.json_response({"ready": ready, "reason": reason, "offline_partitions": offline},
                                 status=200 if ready else 503)

    def _refused(self, request: web.Request) -> web.Response | None:
        """None if the caller may use the admin API, else the answer that says why not."""
        if self._token is not None:
            given = request.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode()):
                return None
            return web.json_response({"error": "a valid Authorization: Bearer token is required"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        peer = request.remote or ""
        try:
            if ipaddress.ip_address(peer).is_loopback:
                return None
        except ValueError:
            pass
        return web.json_response({"error": "the admin API answers only loopback clients unless "
                                           "http.admin.token.file is set"}, status=403)

    async def replace(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        broker = self.gateway.broker
        topic = request.match_info["topic"]
        try:
            partition = int(request.match_info["partition"])
            body = json.loads(await request.read())
            remove = [int(x) for x in body["remove"]]
            # Optional: the key bases the job read, so a swap planned on segments that were
            # rewritten since (same base offset, new objects) is refused.
            expect = [str(x) for x in body.get("remove_keys", [])]
            add = [SegmentEntry(int(s["base_offset"]), int(s["last_offset"]), str(s["key_base"]),
                                int(s["size"]), int(s["min_timestamp"]), int(s["max_timestamp"]),
                                int(s["leader_epoch"])) for s in body["add"]]
        except (KeyError, TypeError, ValueError) as e:
            return web.json_response({"error": f"bad request: {e}"}, status=400)
        try:
            await broker.engine.replace_segments(topic, partition, remove, add, expect_keys=expect or None)
        except (NotLeader, SwapRefused) as e:
            return web.json_response({"error": str(e)}, status=404 if isinstance(e, NotLeader) else 409)
        return web.json_response({"ok": True})

    async def recover(self, request: web.Request) -> web.Response:
        """Bring an offline partition back: body {"truncate": bool, "accept_data_loss": bool};
        truncating needs both, since it gives up committed records."""
        refused = self._refused(request)
        if refused is not None:
            return refused
        topic = request.match_info["topic"]
        try:
            partition = int(request.match_info["partition"])
            raw = await request.read()
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            truncate, accept = bool(body.get("truncate", False)), bool(body.get("accept_data_loss", False))
        except (TypeError, ValueError) as e:
            return web.json_response({"error": f"bad request: {e}"}, status=400)
        if truncate and not accept:
            return web.json_response({"error": "truncating gives up committed records: it needs "
                                               "accept_data_loss too"}, status=400)
        try:
            done = await self.gateway.broker.repair_partition(topic, partition, truncate=truncate)
        except (UnknownTopic, UnknownTopicOrPartition) as e:
            return web.json_response({"error": f"{topic}-{partition} does not exist ({e})"}, status=404)
        except (RepairRefused, Fenced) as e:
            return web.json_response({"error": str(e)}, status=409)
        except (CoordinatorUnavailable, ObjectStoreError) as e:
            return web.json_response({"error": f"try again: {e}"}, status=503)
        return web.json_response({"ok": True, "high_watermark": done.high_watermark, "lost": done.lost})


def _read_token(path: str) -> str:
    from .config import ConfigError

    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise ConfigError(f"http.admin.token.file {path}: {e.strerror or e}") from None
    if len(token) < 16:
        raise ConfigError(f"http.admin.token.file {path}: the token must be at least 16 characters")
    return token
