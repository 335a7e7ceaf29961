"""Cluster metadata: the `KV` boundary, its embedded and etcd backends, and the cluster model
over it. `open_coordinator` picks the backend from a URL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from stratalog.coordinator.kv import (CoordinatorError, CoordinatorUnavailable, DataDirInUse,
                                      RequestTooLarge, UnsupportedFormat)
from stratalog.coordinator.store import KVClusterStore

__all__ = ["open_coordinator", "KVClusterStore", "CoordinatorError", "CoordinatorUnavailable",
           "DataDirInUse", "RequestTooLarge", "UnsupportedFormat"]


def open_coordinator(url: str | None, data_dir: Path, cluster: str = "default",
                     clock: Callable[[], float] = time.monotonic, etcd_security=None) -> KVClusterStore:
    """None or "embedded": SQLite under data_dir; "etcd://host:port[,host:port]": etcd
    (`etcd_security`, an `EtcdSecurity`: TLS files and an etcd user)."""
    if url is None or url == "embedded":
        from stratalog.coordinator.embedded import EmbeddedKV
        return KVClusterStore(EmbeddedKV(Path(data_dir), clock=clock), cluster)
    if url.startswith("etcd://"):
        from stratalog.coordinator.etcd import EtcdKV, parse_endpoints
        spec = url[len("etcd://"):].rstrip("/")
        if not spec:
            raise ValueError(f"coordinator URL {url!r} names no etcd endpoint")
        return KVClusterStore(EtcdKV(parse_endpoints(spec), security=etcd_security), cluster)
    raise ValueError(f"unsupported coordinator URL {url!r}: use 'embedded' or "
                     "'etcd://host:port[,host:port]'")
