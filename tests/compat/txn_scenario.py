"""The transaction scenario every client's transaction test runs: what it produces, in which
transactions, and what read_committed and read_uncommitted consumers must see."""

from __future__ import annotations

# (value prefix, record count, commit?) per transaction; record i goes to partition i % 2.
TRANSACTIONS = [("c1", 10, True), ("ab", 6, False), ("c2", 4, True)]


def sent(committed_only: bool) -> dict[int, list[bytes]]:
    """Values per partition in offset order: the committed ones, or all."""
    out: dict[int, list[bytes]] = {0: [], 1: []}
    for prefix, n, commit in TRANSACTIONS:
        for i in range(n):
            if commit or not committed_only:
                out[i % 2].append(f"{prefix}-{i}".encode())
    return out
