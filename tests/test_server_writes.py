"""How the gateway hands answers to a TLS transport: in pieces of bounded size, so the TLS
layer encrypts each into a small buffer instead of a whole multi-megabyte Fetch at once."""

from __future__ import annotations

import pytest

from stratalog.gateway.server import tls_pieces

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("sizes", [[], [1], [10, 10, 10], [25], [9, 30, 1, 1, 7], [64, 3, 64], [10] * 9])
def test_pieces_keep_every_byte_in_order_and_stay_under_the_limit(sizes):
    parts = [bytes([i]) * n for i, n in enumerate(sizes)]
    pieces = list(tls_pieces(parts, 10))
    assert b"".join(bytes(p) for piece in pieces for p in piece) == b"".join(parts)
    assert all(piece and sum(len(p) for p in piece) <= 10 for piece in pieces)


def test_small_parts_share_a_piece_and_a_large_one_is_cut():
    pieces = list(tls_pieces([b"a" * 4, b"b" * 4, b"c" * 25], 10))
    assert [[len(p) for p in piece] for piece in pieces] == [[4, 4], [10], [10], [5]]
