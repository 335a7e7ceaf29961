"""Transaction state as the coordinator keeps it: one value per transactional id.

    transactions/<transactional id>  -> TxnState as JSON

Every change is a compare-and-swap on the key's mod revision, so whichever gateway
coordinates the id now (or completes its markers after the coordinator died) never
overwrites a change it did not see. The state machine (Kafka's, KIP-98):

    Empty --AddPartitions/AddOffsets--> Ongoing --EndTxn--> PrepareCommit | PrepareAbort
    Prepare* --every marker written, offsets applied--> CompleteCommit | CompleteAbort
    Complete* / Empty --AddPartitions--> Ongoing ...

`pending` lists the partitions still waiting for their marker while a Prepare* state
stands; the leaders of those partitions remove themselves from it after their marker is
committed, and whoever empties it completes the transaction.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from enum import Enum

from .kv import CoordinatorError


class TxnStatus(str, Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnStatus.PREPARE_COMMIT, TxnStatus.PREPARE_ABORT)

    @property
    def open_for_new(self) -> bool:
        """A new transaction may begin from here."""
        return self in (TxnStatus.EMPTY, TxnStatus.COMPLETE_COMMIT, TxnStatus.COMPLETE_ABORT)


TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class TxnState:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    status: TxnStatus = TxnStatus.EMPTY
    partitions: tuple[TopicPartition, ...] = ()
    groups: tuple[str, ...] = ()
    pending: tuple[TopicPartition, ...] = ()  # markers still to write (Prepare* only)
    start_ms: int = -1  # when the current transaction began
    update_ms: int = -1
    # The epoch before the last bump, so a producer retrying the InitProducerId that
    # made the bump (KIP-360) is recognised instead of fenced.
    last_producer_epoch: int = -1

    def forgettable(self, now_ms: int, expiration_ms: int) -> bool:
        """No transaction open and no change for `expiration_ms` (Kafka's
        transactional.id.expiration.ms). A state written before update_ms was kept (-1)
        never is."""
        return self.status.open_for_new and 0 <= self.update_ms <= now_ms - expiration_ms

    def with_(self, **changes) -> "TxnState":
        return replace(self, **changes)

    def to_json(self) -> bytes:
        d = asdict(self)
        d["status"] = self.status.value
        d["partitions"] = [list(tp) for tp in self.partitions]
        d["pending"] = [list(tp) for tp in self.pending]
        d["groups"] = list(self.groups)
        return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, key: str, value: bytes) -> "TxnState":
        try:
            d = json.loads(value)
            return cls(
                transactional_id=d["transactional_id"], producer_id=d["producer_id"],
                producer_epoch=d["producer_epoch"], timeout_ms=d["timeout_ms"],
                status=TxnStatus(d["status"]),
                partitions=tuple((t, int(p)) for t, p in d.get("partitions", ())),
                groups=tuple(d.get("groups", ())),
                pending=tuple((t, int(p)) for t, p in d.get("pending", ())),
                start_ms=d.get("start_ms", -1), update_ms=d.get("update_ms", -1),
                last_producer_epoch=d.get("last_producer_epoch", -1))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            raise CoordinatorError(f"corrupt transaction state at {key}: {e}") from None

