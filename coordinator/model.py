"""The cluster model on top of a `KV` backend: topics, partitions, log state, segments,
WAL objects, group offsets and producer ids, under `/stratalog/<cluster>/`.

Keyspace (one key per topic, partition, segment or WAL object, never per batch):

    cluster_id                                   -> uuid string
    brokers/<id>                                 -> {"host", "port", "rack"}      (leased)
    controller                                   -> broker id                     (leased)
    topics/<name>                                -> TopicInfo
    partitions/<topic_id>/<p>                    -> PartitionState (leader, epoch, replicas, isr,
                                                    offline reason, operator's assignment and
                                                    reassignment under way)
    logs/<topic_id>/<p>                          -> LogState (log start offset, producer snapshot)
    segments/<topic_id>/<p>/<base:020>           -> SegmentEntry
    wal/<gateway_id>/<seq:020>                   -> WalObject (its ranges)
    groups/<group>/offsets/<topic>/<p>           -> CommittedOffset
    producer_ids/next                            -> next free producer id block start
    client_quotas/<type>=<name>[/<type>=<name>]  -> ClientQuota values (KIP-546 entities)

Every mutation that makes data visible is fenced: `commit_wal` and `commit_segment` take
the leader epoch the writer believes it holds for each partition and fail with `Fenced`
when the controller has moved on. The high watermark of a partition is derived, never
stored: one past the last offset of its newest committed WAL range or segment.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol


class Fenced(Exception):
    """A commit named a leader epoch (or session) that is no longer current."""


class TopicExists(Exception):
    """create_topic for a name that is taken."""


class UnknownTopic(Exception):
    """The topic (by name or id) does not exist."""


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    replication_factor: int
    configs: dict[str, str]  # only the topic-level overrides; defaults live in the gateway


@dataclass(frozen=True)
class PartitionState:
    leader: int  # broker id, -1 when none
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    # Why the partition is offline (its committed data could not be recovered), or "".
    # An offline partition has no leader and the controller gives it none: only an
    # operator's `stratalog partitions recover` clears it (stratalog.engine.offline).
    offline: str = ""
    # An operator's replica assignment (CreateTopics/CreatePartitions assignments or a
    # reassignment), first the preferred leader; empty: the controller places replicas.
    assigned: tuple[int, ...] = ()
    # A reassignment under way (AlterPartitionReassignments): replicas being added to and
    # removed from the partition; `replicas` holds both sides until it completes.
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)


@dataclass(frozen=True)
class WalRange:
    """One partition's consecutive batches inside one WAL object."""

    topic_id: uuid.UUID
    partition: int
    base_offset: int
    last_offset: int
    position: int  # byte offset of the first batch in the WAL object
    length: int  # bytes of batches
    max_timestamp: int
    # The format version of the WAL object holding it (its entry's; see WalObject).
    format_version: int = 1


@dataclass(frozen=True)
class WalObject:
    gateway_id: int
    sequence: int
    key: str  # object-store key
    ranges: tuple[WalRange, ...]
    # The object's format version (tiering.wal.FORMAT_VERSION when written), stored in
    # its entry so a reader of one range can refuse a format it does not know without
    # fetching the object's header. Entries written by 0.1.0 have none: version 1.
    format_version: int = 1


@dataclass(frozen=True)
class SegmentEntry:
    """A sealed segment: `<key_base>.log`, `.index`, `.timeindex` in the object store."""

    base_offset: int
    last_offset: int
    key_base: str  # object key without extension
    size: int  # bytes of the .log object
    min_timestamp: int
    max_timestamp: int
    leader_epoch: int
    # Idempotent producer state as of last_offset: {producer_id: {...}}; opaque here.
    producers: dict[str, Any] = field(default_factory=dict)
    # Transactions aborted by markers in this segment, listed in its `.txnindex` (none: 0,
    # and no such object).
    aborted_txns: int = 0


@dataclass(frozen=True)
class LogState:
    log_start_offset: int
    high_watermark: int  # derived: one past the newest committed offset, log_start if empty


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int


@dataclass(frozen=True)
class ScramCredential:
    """A user's SCRAM secret for one mechanism (RFC 5802): never the password itself."""

    mechanism: str  # "SCRAM-SHA-256" or "SCRAM-SHA-512"
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True)
class AclBinding:
    """One ACL, in Kafka's terms and codes (resource type, pattern type, operation and
    permission are the protocol's int8 values; see `gateway.auth.acls`)."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str  # "User:alice", "User:*"
    host: str  # an IP address or "*"
    operation: int
    permission: int


@dataclass(frozen=True)
class ClientQuota:
    """The quotas set for one client-quota entity (KIP-546).

    `entity` is ((entity type, name), ...) sorted by type, where a name of None is the
    type's default (`<default>`): (("client-id", None), ("user", "alice")) is alice's
    default for every client id. `values` maps quota names (producer_byte_rate, ...) to
    their values; what the names mean is the gateway's business, not the coordinator's.
    """

    entity: tuple[tuple[str, str | None], ...]
    values: dict[str, float]


class ClusterStore(Protocol):
    """What the gateway and tools ask of the coordinator. Every method is a coroutine."""

    async def check_keyspace(self, mark: bool = True) -> int:
        """The keyspace's format version; refuses a newer one, marks an unmarked one."""

    async def cluster_id(self) -> str:
        """The cluster's id, created on first use."""

    # --- topics -----------------------------------------------------------------------
    async def create_topic(self, name: str, partitions: int, replication_factor: int,
                           configs: dict[str, str], assignments: dict[int, PartitionState]
                           ) -> TopicInfo:
        """Create a topic and its partition states atomically; TopicExists if taken."""

    async def topics(self) -> dict[str, TopicInfo]:
        """All topics by name."""

    async def topic(self, name: str) -> TopicInfo | None:
        """One topic by name."""

    async def delete_topic(self, name: str) -> TopicInfo:
        """Remove a topic with its partition, log, segment and offset keys; returns what was
        removed so the caller can delete its objects. UnknownTopic if absent."""

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> TopicInfo:
        """Replace a topic's config overrides."""

    async def add_partitions(self, name: str, new_total: int,
                             assignments: dict[int, PartitionState]) -> TopicInfo:
        """Grow a topic to new_total partitions."""

    # --- partitions and logs ----------------------------------------------------------
    async def partition_states(self, topic_id: uuid.UUID) -> dict[int, PartitionState]:
        """Leader, epoch, replicas and ISR of every partition of a topic."""

    async def set_partition_state(self, topic_id: uuid.UUID, partition: int,
                                  state: PartitionState, expect_epoch: int | None = None,
                                  expect_state: PartitionState | None = None) -> None:
        """Controller or operator write; with expect_epoch, Fenced unless the stored epoch
        matches; with expect_state, Fenced unless the stored state is still that one (a
        compare-and-set: the controller and an operator's change cannot undo each other)."""

    async def log_state(self, topic_id: uuid.UUID, partition: int) -> LogState:
        """Log start offset and high watermark."""

    async def truncate_wal(self, topic_id: uuid.UUID, partition: int, end_offset: int,
                           expect_epoch: int, shortened: tuple[str, WalRange] | None = None) -> None:
        """Forget a partition's committed WAL ranges from `end_offset` on (the high watermark
        goes back there), keeping `shortened` ((object key, range)) in place of the range it
        shortens. Fenced unless the stored leader epoch is `expect_epoch`."""

    async def set_log_start_offset(self, topic_id: uuid.UUID, partition: int, offset: int) -> None:
        """Raise the log start offset (DeleteRecords, retention); never lowers it."""

    async def commit_wal(self, obj: WalObject, epochs: dict[tuple[uuid.UUID, int], int]) -> None:
        """Make a WAL object's ranges visible, in as few transactions as etcd's limits allow.
        Fenced (and nothing visible) if any partition's leader epoch differs from `epochs`."""

    async def wal_objects(self) -> list[WalObject]:
        """Every committed WAL object."""

    async def oldest_wal_sequence(self, gateway_id: int) -> int | None:
        """The lowest sequence among one gateway's committed WAL objects (None: it has none)."""

    @property
    def in_process(self) -> bool:
        """The coordinator lives in this process (embedded): reading it costs no round trip
        and no other gateway reads it."""

    async def catch_up(self) -> None:
        """Read what changed in the log index since it was last read, where that costs no
        round trip (a single-process coordinator); a gateway calls it every maintenance
        tick, so that no call meets a long backlog to decode at once."""

    async def wal_ranges(self, topic_id: uuid.UUID, partition: int, from_offset: int
                         ) -> list[tuple[str, WalRange]]:
        """(object key, range) of committed WAL ranges of a partition that end at or after
        from_offset, in offset order."""

    async def obsolete_wal_objects(self) -> list[WalObject]:
        """WAL objects whose every range is sealed, deleted or below its log start."""

    async def wal_settled_revision(self) -> int:
        """A revision that moves whenever a WAL object may have become obsolete since (a
        segment sealed, a log start moved, a topic created or deleted): while it stays, a
        search by `obsolete_wal_objects` finds nothing new among the objects it searched."""

    async def delete_wal_objects(self, keys: list[tuple[int, int]]) -> None:
        """Forget WAL objects by (gateway id, sequence) once their ranges are obsolete."""

    async def commit_segment(self, topic_id: uuid.UUID, partition: int, entry: SegmentEntry,
                             leader_epoch: int) -> None:
        """Add a sealed segment (fenced by leader epoch like commit_wal)."""

    async def segments(self, topic_id: uuid.UUID, partition: int) -> list[SegmentEntry]:
        """Committed segments of a partition in offset order."""

    async def delete_segments(self, topic_id: uuid.UUID, partition: int,
                              base_offsets: list[int]) -> None:
        """Forget segments (retention, compaction swap)."""

    async def replace_segments(self, topic_id: uuid.UUID, partition: int,
                               remove: list[int], add: list[SegmentEntry]) -> None:
        """Atomically swap segments (compaction)."""

    # --- groups -----------------------------------------------------------------------
    async def commit_offsets(self, group: str,
                             offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        """Store committed offsets of a group, atomically."""

    async def fetch_offsets(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        """All committed offsets of a group."""

    async def delete_offsets(self, group: str, partitions: list[tuple[str, int]] | None = None
                             ) -> None:
        """Delete some (or, with None, all) committed offsets of a group."""

    async def groups_with_offsets(self) -> list[str]:
        """Names of groups that have committed offsets (or a stored consumer group)."""

    async def consumer_group_ids(self) -> list[str]:
        """Groups with a stored consumer-protocol state."""

    async def consumer_group(self, group: str) -> bytes | None:
        """A consumer-protocol group's stored state (None: none)."""

    async def put_consumer_group(self, group: str, value: bytes | None,
                                 expected: bytes | None) -> bool:
        """Compare-and-swap a consumer-protocol group's state against `expected`."""

    # --- producer ids -----------------------------------------------------------------
    async def allocate_producer_ids(self, count: int) -> int:
        """Reserve `count` consecutive producer ids; returns the first."""

    # --- client quotas ----------------------------------------------------------------
    async def client_quotas(self) -> list[ClientQuota]:
        """Every entity with quotas set."""

    async def alter_client_quota(self, entity: tuple[tuple[str, str | None], ...],
                                 changes: dict[str, float | None]) -> None:
        """Set (a value) or remove (None) quotas of one entity, atomically; an entity left
        with none is forgotten."""
