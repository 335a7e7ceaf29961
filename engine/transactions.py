"""Transactions as one partition sees them: which producers have one open here, which were
aborted, and the last stable offset (LSO) that read_committed consumers stop at.

A transaction is open on a partition from its first transactional batch until its marker;
it stays in the LSO until the marker is committed too (below the high watermark), so a
consumer never reads an aborted transaction's records before the abort is listed for it.
"""

from __future__ import annotations

import bisect

from stratalog.tiering.txn import AbortedTxn


class PartitionTxns:
    def __init__(self) -> None:
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self._closing: list[tuple[int, int]] = []  # (marker offset, first offset), uncommitted
        self.aborted: list[AbortedTxn] = []  # in marker order

    def data(self, producer_id: int, base_offset: int) -> None:
        """A transactional batch was appended."""
        self.open.setdefault(producer_id, base_offset)

    def marker(self, producer_id: int, offset: int, commit: bool) -> None:
        """A marker was appended at `offset` (one for a transaction not open here changes
        nothing: the coordinator writes one to every partition it was told of)."""
        first = self.open.pop(producer_id, None)
        if first is None:
            return
        self._closing.append((offset, first))
        if not commit:
            lso = min([first, *self.open.values()])
            self.aborted.append(AbortedTxn(producer_id, first, offset, lso))

    def committed(self, high_watermark: int) -> None:
        if self._closing:
            self._closing = [c for c in self._closing if c[0] >= high_watermark]

    def last_stable_offset(self, high_watermark: int) -> int:
        if not self.open and not self._closing:
            return high_watermark
        return min(high_watermark, *self.open.values(), *(first for _, first in self._closing))

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [start, end): what a read_committed fetch
        of that range must be told to skip."""
        i = bisect.bisect_left([a.last_offset for a in self.aborted], start)
        return [a for a in self.aborted[i:] if a.first_offset < end]

    def aborted_in(self, base_offset: int, next_offset: int) -> list[AbortedTxn]:
        """Aborts whose marker lies in [base_offset, next_offset): one segment's .txnindex."""
        return [a for a in self.aborted if base_offset <= a.last_offset < next_offset]

    def forget_before(self, log_start_offset: int) -> None:
        """Drop aborts whose marker retention or DeleteRecords removed."""
        if self.aborted and self.aborted[0].last_offset < log_start_offset:
            self.aborted = [a for a in self.aborted if a.last_offset >= log_start_offset]

    def snapshot(self) -> dict[str, int]:
        """Open transactions, stored with each sealed segment's producer snapshot."""
        return {str(pid): first for pid, first in self.open.items()}

    def restore(self, open_txns: dict[str, int], aborted: list[AbortedTxn]) -> None:
        self.open = {int(pid): first for pid, first in open_txns.items()}
        self.aborted = sorted(aborted, key=lambda a: a.last_offset)
