"""Fast encoders compiled from the message descriptions: one plain Python function per
struct and version, for the dicts handlers answer with.

`schema.Schema.encode` tries the compiled encoder first and falls back to the checked one
(`schema._struct_encoder`) when it raises anything: the checked encoder then writes the
same bytes or raises the precise `EncodeError` (the module docstring of `schema.py` gives
the rules). So the compiled code only writes what is plainly right (a dict with known
keys, lists of elements, values of the field's type) and raises `Unusual` for the rest.
A small Produce answer encodes several times faster so. A struct whose version has tagged
fields is compiled too: a dict that gives any of them a value is left to the checked
encoder, which decides whether it differs from the default and writes it.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from .wire import _F64, _I8, _I16, _I32, _I64, _U16, _U32, Writer, encode_uvarint

Encoder = Callable[[Writer, Any], None]

_FIXED = {"int8": _I8, "int16": _I16, "uint16": _U16, "int32": _I32, "uint32": _U32,
          "int64": _I64, "float64": _F64}
_NONE_TAKING = ("string", "bytes", "records", "bool")  # writers that would take None silently
_numbers = itertools.count()


class Unusual(Exception):
    """The value is not one the compiled encoder writes: the checked encoder decides."""


def compile_struct_encoder(fields: tuple, version: int, flexible: bool, *, checked: Encoder,
                           nested: Callable[[tuple, int, bool], Encoder], empty_value: Callable[[Any], Any],
                           as_uuid: Callable[[Any], Any], message: type) -> Encoder:
    """The compiled encoder of a struct (or message body) at `version`: dicts are written
    here, anything else by `checked`; `nested` gives the compiled encoders of inner
    structs, `empty_value` what a null default goes out as where there is no null."""
    tagged = tuple(f.name for f in fields if flexible and f.tag is not None and f.is_tagged(version))
    env: dict[str, Any] = {"checked": checked, "Unusual": Unusual, "MISSING": _MISSING, "I32": _I32,
                           "encode_uvarint": encode_uvarint, "as_uuid": as_uuid, "Message": message,
                           "known": frozenset(f.name for f in fields)}
    body = ["if type(obj) is not dict:",
            "    return checked(w, obj)",
            "if not known.issuperset(obj):",
            "    raise Unusual('unknown key')",
            "get = obj.get"]
    # A tagged field given a value goes to the checked encoder; absent, it is its default,
    # which is not written: the answer then ends with "no tagged fields", as mostly.
    body += [f"if {name!r} in obj: raise Unusual('tagged field')" for name in tagged]
    for i, f in enumerate(fields):
        if not f.present(version) or f.tag is not None:
            continue
        body += [f"v = get({f.name!r}, MISSING)",
                 "if v is MISSING:",
                 f"    v = {_default(f, i, env)}"]
        body += _write(f, i, version, flexible, env, nested, empty_value)
    if flexible:
        body.append("w.buf.append(0)  # no tagged fields")
    name = f"encode_struct_{next(_numbers)}"
    source = f"def {name}(w, obj):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(source, f"<encoder {name}>", "exec"), env)  # noqa: S102 - our own generated code
    return env[name]


_MISSING = object()


def _default(f, i: int, env: dict[str, Any]) -> str:
    if f.type == "struct" or f.type.startswith("[]"):
        env[f"field{i}"] = f
        return f"field{i}.default_value()"  # made afresh, as the checked encoder does
    env[f"default{i}"] = f.default_value()
    return f"default{i}"


def _write(f, i: int, version: int, flexible: bool, env: dict[str, Any], nested, empty_value) -> list[str]:
    """Lines that write `v` as field `f` (the checks of `schema._field_encoder`)."""
    compact = flexible and not f.never_flexible
    if f.is_nullable(version):
        if f.type == "struct":
            env[f"enc{i}"] = nested(f.fields, version, flexible)
            return ["if v is None:", "    w.buf.append(255)  # -1: null",
                    "else:", "    w.buf.append(1)", f"    enc{i}(w, v)"]
        if f.type.startswith("[]"):
            return ["if v is None:", f"    w.buf += {_length(compact, 'None')}",
                    "else:", *("    " + line for line in _array(f, i, version, flexible, compact, env, nested))]
        return _value(f.type, compact, env)
    lines = []
    if f.default_value() is None:
        env[f"empty{i}"] = empty_value(f)
        lines.append(f"if v is None: v = empty{i}")
    elif f.type in _NONE_TAKING:
        lines.append("if v is None: raise Unusual('None')")
    if f.type == "struct":
        env[f"enc{i}"] = nested(f.fields, version, flexible)
        return lines + [f"enc{i}(w, v)"]
    if f.type.startswith("[]"):
        return lines + _array(f, i, version, flexible, compact, env, nested)
    return lines + _value(f.type, compact, env)


def _array(f, i: int, version: int, flexible: bool, compact: bool, env: dict[str, Any], nested) -> list[str]:
    elem_t = f.type[2:]
    lines = ["if type(v) is not list and type(v) is not tuple: raise Unusual('not a list')",
             f"w.buf += {_length(compact, 'len(v)')}"]
    if elem_t == "struct":
        env[f"enc{i}"] = nested(f.fields, version, flexible)
        return lines + ["for item in v:", f"    enc{i}(w, item)"]
    write = _value(elem_t, compact, env, "item")
    check = ["    if item is None: raise Unusual('None')"] if elem_t in _NONE_TAKING else []
    return lines + ["for item in v:", *check, *("    " + line for line in write)]


def _length(compact: bool, n: str) -> str:
    """An expression: the bytes of an array length (`n`, or a null for 'None')."""
    if n == "None":
        return "b'\\x00'" if compact else "b'\\xff\\xff\\xff\\xff'"
    return f"encode_uvarint({n} + 1)" if compact else f"I32.pack({n})"


def _value(t: str, compact: bool, env: dict[str, Any], v: str = "v") -> list[str]:
    """Lines that write the primitive in variable `v`."""
    fixed = _FIXED.get(t)
    if fixed is not None:
        env[t] = fixed
        return [f"w.buf += {t}.pack({v})"]
    if t == "bool":
        return [f"w.buf.append(1 if {v} else 0)"]
    if t == "uuid":
        return [f"w.uuid(as_uuid({v}))"]
    if t == "string":
        return [f"w.{'compact_string' if compact else 'string'}({v})"]
    if t in ("bytes", "records"):
        return [f"w.{'compact_bytes' if compact else 'bytes'}({v})"]
    raise ValueError(f"unknown type {t}")
