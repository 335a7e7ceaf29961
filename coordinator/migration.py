"""Writing one installation's keyspace into another coordinator, resumably: the metadata
half of `stratalog migrate` (infra/cli/migrate.py runs the whole of it).

The target cluster is claimed before anything else is written to it, with one key:

    migration -> {"cluster_id": <the source's cluster id>, "source": <where it came from>,
                  "state": "writing" | "complete"}

It is put only into a cluster with no key at all. A later run for the same source (same
cluster id) finds it and continues; a cluster with any other content, a marker naming
another source included, is refused, and so is one where a gateway is registered. The
keys are then written by `KVClusterStore.converge_keyspace`, which makes the target equal
to the source key for key (topics last), so a run that stopped half way is finished by
the next, even if the source changed in between. "complete" is written last and the
marker stays, recording where the cluster came from; a rerun then changes nothing. A
gateway refuses to start while the marker says "writing" (`check_finished`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from stratalog.coordinator.kv import CoordinatorError, Put, absent, mod_is
from stratalog.coordinator.store import KVClusterStore

MARKER = "migration"
NEW, RESUMING, COMPLETE = "new", "resuming", "complete"
_WRITING = "writing"


class TargetInUse(CoordinatorError):
    """The target cluster holds keys no migration of this source wrote, or has gateways."""


class MigrationUnderWay(CoordinatorError):
    """A gateway started on a cluster whose migration has not finished writing it."""


@dataclass(frozen=True)
class Marker:
    cluster_id: str
    source: str
    state: str


async def read_marker(target: KVClusterStore) -> tuple[Marker, int] | None:
    """The target's migration marker and its mod revision, or None."""
    key = target.prefix + MARKER
    got = await target.kv.get(key)
    if got is None:
        return None
    try:
        d = json.loads(got[0])
        return Marker(str(d["cluster_id"]), str(d["source"]), str(d["state"])), got[1]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise CoordinatorError(f"corrupt migration marker at {key}: {e!r}") from None


async def check_finished(store: KVClusterStore) -> None:
    """MigrationUnderWay while a migration is writing the cluster: a gateway started then
    would lead partitions whose keys are half written (run by every gateway at start)."""
    found = await read_marker(store)
    if found is not None and found[0].state != "complete":
        raise MigrationUnderWay(f"{store.prefix} is being written by `stratalog migrate` from "
                                f"{found[0].source}: start gateways once it has finished (run "
                                "it again if it was interrupted)")


def _marker_json(m: Marker) -> bytes:
    return json.dumps({"cluster_id": m.cluster_id, "source": m.source, "state": m.state},
                      separators=(",", ":"), sort_keys=True).encode()


async def claim(target: KVClusterStore, cluster_id: str, source: str) -> str:
    """Claim the target for the migration of cluster `cluster_id` (described by `source`):
    NEW (it was empty), RESUMING (an earlier run for this source stopped half way) or
    COMPLETE (done before); TargetInUse for anything else."""
    key = target.prefix + MARKER
    while True:
        (_, brokers), (_, total) = await target.kv.fingerprint([target.prefix + "brokers/", target.prefix])
        if brokers:
            raise TargetInUse(f"{brokers} gateway(s) are registered in {target.prefix}: stop every "
                              "gateway of the target cluster before migrating into it")
        found = await read_marker(target)
        if found is None:
            if total:
                raise TargetInUse(f"{target.prefix} holds {total} keys and no migration of this "
                                  "installation wrote them: migrate only into an empty cluster "
                                  "(another --cluster name, or delete its keys)")
            if await target.kv.txn([absent(key)], [Put(key, _marker_json(Marker(cluster_id, source, _WRITING)))]):
                return NEW
            continue  # someone else claimed it meanwhile: look again
        marker, _ = found
        if marker.cluster_id != cluster_id:
            raise TargetInUse(f"{target.prefix} is the target of a migration from another "
                              f"installation (cluster {marker.cluster_id}, {marker.source}), not "
                              f"of this one (cluster {cluster_id})")
        return COMPLETE if marker.state == "complete" else RESUMING


async def write(target: KVClusterStore, keys: Sequence[tuple[str, bytes]]) -> tuple[int, int]:
    """Make the claimed target's keys the source's `keys` (relative, non-leased), then mark
    the migration complete; returns (keys put, keys deleted) as converge_keyspace does."""
    found = await read_marker(target)
    if found is None or found[0].state != _WRITING:
        raise CoordinatorError(f"{target.prefix} is not claimed by a migration under way")
    marker, revision = found
    done = await target.converge_keyspace([(k, v) for k, v in keys if k != MARKER], keep=[MARKER])
    key = target.prefix + MARKER
    complete = Marker(marker.cluster_id, marker.source, "complete")
    if not await target.kv.txn([mod_is(key, revision)], [Put(key, _marker_json(complete))]):
        raise TargetInUse(f"the migration marker at {key} changed while the keys were written: "
                          "another migration runs against the same cluster")
    return done
