"""Errors shared by the object formats of `tiering`."""

from __future__ import annotations


class CorruptObject(Exception):
    """An object's bytes fail their checks (magic, version, CRC, bounds): never serve them."""
