"""One declarative description per message, covering all its versions.

A message is a tree of `Field`s (generated into `catalog.py` from Kafka's message
specs). For a given version the tree compiles once into a plan of reader and writer
steps; flexible versions (compact lengths, tagged fields) are a property of the plan,
so no handler ever sees them.

Decoded messages are `Message` objects whose attributes are the snake_case field
names; a field absent from a version decodes to its default. Encoding reads the same
attributes from a `Message`, a dict or any object, falling back to the default, so a
handler only sets what it means.

Encoding is strict, because a message we send that its schema does not allow is a bug
on our side, and Kafka brokers never send one (see `EncodeError`). For a dict or a
`Message`, at any depth:

- a key that is a field of the message at *some* version is fine: written if the field
  is on the wire at this version, ignored otherwise (so one handler body serves every
  version: `throttle_time_ms` is simply not written at v0);
- a key that is a field of the message at *no* version raises (`eror_code`);
- a left-out key takes the field's default;
- None is written as a null where the field is nullable at this version. Where it is
  not, None is accepted only if it is the field's default (today: uuid fields, never
  nullable, whose None goes out as the all-zero UUID, Kafka's "no id") and raises
  otherwise, as do a None array element and a value of the wrong type.

Other objects are read by attribute and cannot be checked for unknown keys.
"""

from __future__ import annotations

import struct as _struct
import uuid as _uuid
from dataclasses import dataclass
from functools import lru_cache, partial
from types import SimpleNamespace
from typing import Any, Callable

from .decoding import compile_struct_decoder
from .encoding import compile_struct_encoder
from .wire import DecodeError, Reader, Writer

MAX_VERSION = 0x7FFF


class EncodeError(ValueError):
    """We were about to send a message that its schema does not allow at this version: a
    key it has at no version, a None where there is no null, a value of the wrong type.
    This is our bug, never the peer's (that is `DecodeError`).

    `path` locates the offending value, e.g. `responses[0].partition_responses[0]`;
    `schema` and `version` name the message.
    """

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.segments: list[str] = []  # innermost last, each ".name" or "[i]"
        self.schema = ""
        self.version = -1

    @property
    def path(self) -> str:
        return "".join(self.segments).lstrip(".")

    def __str__(self) -> str:
        where = f" at {self.path}" if self.segments else ""
        return f"{self.schema or 'message'} v{self.version}{where}: {self.problem}"


class Message(SimpleNamespace):
    """A decoded (or to-be-encoded) message or struct: attribute per field."""

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    type: str  # a primitive, "struct", or "[]" + primitive / "struct"
    vmin: int
    vmax: int = MAX_VERSION
    nullable: tuple[int, int] | None = None
    tag: int | None = None
    tagged: tuple[int, int] | None = None
    default: Any = None
    fields: tuple["Field", ...] | None = None
    never_flexible: bool = False  # field-level "flexibleVersions": "none"

    def present(self, version: int) -> bool:
        return self.vmin <= version <= self.vmax

    def is_nullable(self, version: int) -> bool:
        return self.nullable is not None and self.nullable[0] <= version <= self.nullable[1]

    def is_tagged(self, version: int) -> bool:
        return self.tagged is not None and self.tagged[0] <= version <= self.tagged[1]

    def default_value(self) -> Any:
        if self.type.startswith("[]"):
            return None if self.default == "null" else []
        if self.type == "struct":
            return None if self.default == "null" else _default_struct(self.fields or ())
        return self.default


class Schema:
    """A request or response body (or a header): its fields and the versions it spans."""

    __slots__ = ("name", "vmin", "vmax", "flexible_from", "fields", "_decoders", "_encoders")

    def __init__(self, name: str, vmin: int, vmax: int, flexible_from: int | None,
                 fields: tuple[Field, ...]):
        self.name = name
        self.vmin = vmin
        self.vmax = vmax
        self.flexible_from = flexible_from  # None: never flexible
        self.fields = fields
        # Plans are compiled once per version; hashing the field tree on every call
        # would cost more than decoding.
        self._decoders: dict[int, Decoder] = {}
        self._encoders: dict[int, Encoder] = {}

    def __repr__(self) -> str:
        return f"Schema({self.name} v{self.vmin}-{self.vmax})"

    def flexible(self, version: int) -> bool:
        return self.flexible_from is not None and version >= self.flexible_from

    def decode(self, reader: Reader, version: int) -> Message:
        dec = self._decoders.get(version)
        if dec is None:
            dec = self._decoders[version] = _struct_decoder(
                self.fields, version, self.flexible(version))
        return dec(reader)

    def encode(self, writer: Writer, msg: Any, version: int) -> None:
        """Append `msg` encoded at `version`; `EncodeError` if the schema does not allow it
        (the module docstring gives the rule)."""
        fast = self._encoders.get(version)
        if fast is None:
            fast = self._encoders[version] = _fast_struct_encoder(self.fields, version, self.flexible(version))
        mark = writer.mark()
        try:
            fast(writer, msg)
            return
        except Exception:  # noqa: BLE001 - the checked encoder below writes it or says what is wrong
            writer.rewind(mark)
        try:
            _struct_encoder(self.fields, version, self.flexible(version))(writer, msg)
        except EncodeError as e:
            e.schema, e.version = self.name, version
            raise

    def to_bytes(self, msg: Any, version: int) -> bytes:
        w = Writer()
        self.encode(w, msg, version)
        return w.getvalue()

    def from_bytes(self, data: bytes, version: int) -> Message:
        r = Reader(data)
        msg = self.decode(r, version)
        if r.remaining():
            raise DecodeError(f"{self.name} v{version}: {r.remaining()} trailing bytes")
        return msg


def _default_struct(fields: tuple[Field, ...]) -> Message:
    return Message(**{f.name: f.default_value() for f in fields})


def _value(obj: Any, f: Field) -> Any:
    if isinstance(obj, dict):
        v = obj.get(f.name, _MISSING)
    else:
        v = getattr(obj, f.name, _MISSING)
    return f.default_value() if v is _MISSING else v


_MISSING = object()

# ---- primitive readers and writers, by (type, compact) ------------------------------

Decoder = Callable[[Reader], Any]
Encoder = Callable[[Writer, Any], None]


def _as_uuid(v: Any) -> Any:
    if isinstance(v, str):
        return _uuid.UUID(v)
    return v


def _prim_encoder(t: str, compact: bool) -> Encoder:
    if t in ("int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "bool"):
        return getattr(Writer, t)
    if t == "uuid":
        return lambda w, v: w.uuid(_as_uuid(v))
    if t == "string":
        return Writer.compact_string if compact else Writer.string
    if t in ("bytes", "records"):
        return Writer.compact_bytes if compact else Writer.bytes
    raise ValueError(f"unknown type {t}")


# Types whose writers take None (strings and bytes write a null, bool writes false): where
# the version has no null they must refuse None themselves. The other writers fail on
# None, and `_struct_encoder` reports it.
_NONE_TAKING = ("string", "bytes", "records", "bool")


def _field_encoder(f: Field, version: int, flexible: bool) -> Encoder:
    compact = flexible and not f.never_flexible
    if f.type == "struct":
        enc = _struct_encoder(f.fields, version, flexible)
    elif f.type.startswith("[]"):
        enc = _array_encoder(f, version, flexible, compact)
    else:
        enc = _prim_encoder(f.type, compact)
    if f.is_nullable(version):
        if f.type == "struct":
            def write_struct(w: Writer, v: Any) -> None:
                w.int8(-1 if v is None else 1)
                if v is not None:
                    enc(w, v)

            return write_struct
        if f.type.startswith("[]"):
            return lambda w, v: w.array_length(None, compact) if v is None else enc(w, v)
        return enc
    if f.default_value() is None:
        # None is this field's default, so it may stand for it; the version has no null,
        # so the empty value goes out instead.
        empty = _empty_value(f)
        return lambda w, v: enc(w, empty if v is None else v)
    if f.type in _NONE_TAKING:
        return lambda w, v: enc(w, v) if v is not None else _refuse_none()
    return enc


_NOT_NULLABLE = "None, but the field is not nullable at this version"


def _refuse_none() -> None:
    raise EncodeError(_NOT_NULLABLE)


def _empty_value(f: Field) -> Any:
    """What a null default goes out as where the version has no null."""
    if f.type == "struct":
        return _default_struct(f.fields or ())
    if f.type.startswith("[]"):
        return ()
    if f.type == "uuid":
        return _uuid.UUID(int=0)  # Kafka's "no id"
    return "" if f.type == "string" else b""


def _array_encoder(f: Field, version: int, flexible: bool, compact: bool) -> Encoder:
    """A non-null array, whose elements are never null."""
    elem_t = f.type[2:]
    if elem_t == "struct":
        elem = _struct_encoder(f.fields, version, flexible)
    else:
        prim = _prim_encoder(elem_t, compact)
        elem = (lambda w, v: prim(w, v) if v is not None else _refuse_none()) \
            if elem_t in _NONE_TAKING else prim

    def write(w: Writer, v: Any) -> None:
        if isinstance(v, (dict, str, bytes, Message)):  # they have a len(), but are no array
            raise EncodeError(f"a {type(v).__name__} where an array is expected")
        w.array_length(len(v), compact)
        for i, item in enumerate(v):
            try:
                elem(w, item)
            except EncodeError as e:
                e.segments.insert(0, f"[{i}]")
                raise
            except _VALUE_ERRORS as e:
                raise _bad_value(f"[{i}]", elem_t, item, e) from e

    return write


# What the primitive writers raise for a value of the wrong type (or None).
_VALUE_ERRORS = (_struct.error, TypeError, ValueError, AttributeError, OverflowError)


def _bad_value(segment: str, t: str, v: Any, e: Exception) -> EncodeError:
    if v is None:
        err = EncodeError(_NOT_NULLABLE)
    else:
        err = EncodeError(f"{v!r} is not a valid {t} ({e})")
    err.segments.append(segment)
    return err


@lru_cache(maxsize=None)
def _struct_decoder(fields: tuple[Field, ...], version: int, flexible: bool) -> Decoder:
    return compile_struct_decoder(fields, version, flexible, Message, _struct_decoder)


@lru_cache(maxsize=None)
def _fast_struct_encoder(fields: tuple[Field, ...], version: int, flexible: bool) -> Encoder:
    """The compiled encoder (see `encoding`), which leaves anything unusual to `_struct_encoder`."""
    return compile_struct_encoder(fields, version, flexible, checked=_struct_encoder(fields, version, flexible),
                                  nested=_fast_struct_encoder, empty_value=_empty_value, as_uuid=_as_uuid,
                                  message=Message)


@lru_cache(maxsize=None)
def _struct_encoder(fields: tuple[Field, ...], version: int, flexible: bool) -> Encoder:
    plain: list[tuple[Field, Encoder]] = []
    tagged: list[tuple[int, Field, Encoder]] = []
    for f in fields:
        if flexible and f.tag is not None and f.is_tagged(version):
            tagged.append((f.tag, f, _field_encoder(f, version, flexible)))
        elif f.present(version) and f.tag is None:
            plain.append((f, _field_encoder(f, version, flexible)))
    tagged.sort(key=lambda tfe: tfe[0])
    known = frozenset(f.name for f in fields)

    def check_keys(obj: Any) -> None:
        if isinstance(obj, dict):
            keys = obj
        elif isinstance(obj, Message):
            keys = obj.__dict__
        elif obj is None:
            raise EncodeError(_NOT_NULLABLE)
        elif isinstance(obj, (str, bytes, int, float, list, tuple)):
            raise EncodeError(f"a {type(obj).__name__} where a struct is expected")
        else:
            return  # any other object is read by attribute: its keys cannot be listed
        if not known.issuperset(keys):
            unknown = ", ".join(sorted(repr(k) for k in keys if k not in known))
            raise EncodeError(f"unknown key {unknown}: not a field at any version")

    def put(w: Writer, f: Field, enc: Encoder, v: Any) -> None:
        try:
            enc(w, v)
        except EncodeError as e:
            e.segments.insert(0, "." + f.name)
            raise
        except _VALUE_ERRORS as e:
            raise _bad_value("." + f.name, f.type, v, e) from e

    steps = [(f.name, f, enc) for f, enc in plain]

    def encode(w: Writer, obj: Any) -> None:
        if type(obj) is dict:
            if not known.issuperset(obj):
                check_keys(obj)
            get = obj.get
        else:
            check_keys(obj)
            get = partial(getattr, obj)
        # put(), inlined: this loop runs for every field of every response.
        for name, f, enc in steps:
            v = get(name, _MISSING)
            if v is _MISSING:
                v = f.default_value()
            try:
                enc(w, v)
            except EncodeError as e:
                e.segments.insert(0, "." + name)
                raise
            except _VALUE_ERRORS as e:
                raise _bad_value("." + name, f.type, v, e) from e
        if not flexible:
            return
        if not tagged:
            w.buf.append(0)  # no tagged fields
            return
        present = []
        for tag, f, enc in tagged:
            v = _value(obj, f)
            if v != f.default_value():
                sub = Writer()
                put(sub, f, enc, v)
                present.append((tag, sub.getvalue()))
        w.uvarint(len(present))
        for tag, data in present:
            w.uvarint(tag)
            w.uvarint(len(data))
            w.raw(data)

    return encode
