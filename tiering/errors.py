"""Errors shared by the object formats of `tiering`."""

from __future__ import annotations


class CorruptObject(Exception):
    """An object's bytes fail their checks (magic, version, CRC, bounds): never serve them.

    `key`, `position` and `offset` say where, when the check knows: the object, the byte
    in it and the first offset of the damaged batch."""

    def __init__(self, message: str = "", *, key: str | None = None, position: int | None = None,
                 offset: int | None = None) -> None:
        super().__init__(message)
        self.key, self.position, self.offset = key, position, offset


class UnsupportedFormat(CorruptObject):
    """An intact object in a format version this Stratalog cannot read (written by a newer
    one). Refused like a corrupt object, so it is never misread, but the message says to
    upgrade instead of calling it damaged."""


def unsupported_version(what: str, found: object, oldest: int, newest: int) -> str:
    """The one wording of every refusal of a format version, naming both versions."""
    reads = f"version {newest}" if oldest == newest else f"versions {oldest}-{newest}"
    advice = "upgrade the gateway" if isinstance(found, int) and found > newest else \
        "it was not written by a Stratalog this one can read"
    return f"{what} has format version {found}; this Stratalog reads {reads}: {advice}"
