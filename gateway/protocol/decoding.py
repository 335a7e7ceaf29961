"""Decoders compiled from the message descriptions: one plain Python function per struct
and version, generated once and cached by `schema.Schema`.

A request is decoded on every round trip, and a small produce request has a dozen fields:
walking a plan of closures cost more than the rest of the request's handling (17 µs, where
the compiled function takes a fifth of that). The generated function reads the fields in
order with the `Reader`'s own checks (a short buffer raises the same `DecodeError`, with
the same message), fills absent fields with their defaults and reads or skips tagged
fields; `schema.py`'s module docstring says what a decoded `Message` holds.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from .wire import _F64, _I8, _I16, _I32, _I64, _U16, _U32, DecodeError, Reader

Decoder = Callable[[Reader], Any]

# Fixed-width fields are read inline: a bounds check and an unpack, no call.
_FIXED = {"int8": _I8, "int16": _I16, "uint16": _U16, "int32": _I32, "uint32": _U32,
          "int64": _I64, "float64": _F64}
_numbers = itertools.count()  # names of generated functions, for tracebacks


def compile_struct_decoder(fields: tuple, version: int, flexible: bool, message: type,
                           struct_decoder: Callable[[tuple, int, bool], Decoder]) -> Decoder:
    """The decoder of a struct (or message body) with these `Field`s at `version`;
    `struct_decoder` gives the decoders of nested structs (cached by the caller)."""
    env: dict[str, Any] = {"Message": message, "DecodeError": DecodeError, "Reader": Reader}
    lines: list[str] = []
    absent = []
    tagged: dict[int, tuple[str, Decoder]] = {}
    for f in fields:
        if flexible and f.tag is not None and f.is_tagged(version):
            tagged[f.tag] = (f.name, _field_function(f, version, flexible, env, struct_decoder))
            absent.append(f)
        elif f.present(version) and f.tag is None:
            lines += _read(f"d[{f.name!r}]", f, version, flexible, env, struct_decoder)
        else:
            absent.append(f)
    # Defaults of absent fields: immutable ones are shared, lists and structs made afresh
    # for each message (a handler may fill them in).
    fresh = [f for f in absent if _fresh_default(f)]
    env["shared"] = {f.name: f.default_value() for f in absent if not _fresh_default(f)}
    env["fresh"] = fresh
    env["tagged"] = tagged
    head = ["msg = Message()", "d = msg.__dict__"]
    if env["shared"]:
        head.append("d.update(shared)")
    for i, f in enumerate(fresh):
        head.append(f"d[{f.name!r}] = fresh[{i}].default_value()")
    if lines:
        head.append("buf = r.buf")
    tail = []
    if flexible:
        if not lines:
            head.append("buf = r.buf")
        tail = ["p = r.pos",
                "if p < r.end and not buf[p]:  # no tagged fields, as mostly",
                "    r.pos = p + 1",
                "else:",
                "    for _ in range(r.uvarint()):",
                "        tag = r.uvarint()",
                "        size = r.uvarint()",
                "        if size > r.remaining():",
                "            raise DecodeError(f'tagged field {tag} of {size} bytes overruns the buffer')",
                "        known = tagged.get(tag)",
                "        if known is None:",
                "            r.pos += size  # unknown tags are skipped, as the protocol requires",
                "            continue",
                "        d[known[0]] = known[1](Reader(r.buf, r.pos, r.pos + size))",
                "        r.pos += size"]
    return _define(f"decode_struct_{next(_numbers)}", head + lines + tail + ["return msg"], env)


def _define(name: str, body: list[str], env: dict[str, Any]) -> Decoder:
    source = f"def {name}(r):\n" + "".join(f"    {line}\n" for line in body)
    exec(compile(source, f"<decoder {name}>", "exec"), env)  # noqa: S102 - our own generated code
    return env[name]


def _field_function(f, version: int, flexible: bool, env: dict[str, Any], struct_decoder) -> Decoder:
    """One field alone (a tagged field's value, read from its own slice)."""
    inner = dict(env)
    lines = ["buf = r.buf", *_read("v", f, version, flexible, inner, struct_decoder), "return v"]
    return _define(f"decode_field_{next(_numbers)}", lines, inner)


def _read(target: str, f, version: int, flexible: bool, env: dict[str, Any], struct_decoder) -> list[str]:
    """Lines that read field `f` into `target` (`buf` is the reader's buffer)."""
    compact = flexible and not f.never_flexible
    nullable = f.is_nullable(version)
    if f.type == "struct":
        inner = _name(env, struct_decoder(f.fields, version, flexible))
        if nullable:
            return [f"{target} = None if r.int8() < 0 else {inner}(r)"]
        return [f"{target} = {inner}(r)"]
    if f.type.startswith("[]"):
        elem_t = f.type[2:]
        if elem_t == "struct":
            elem = f"{_name(env, struct_decoder(f.fields, version, flexible))}(r)"
        else:
            elem = _primitive(elem_t, compact, False)
        if compact:  # a length of one byte, not null, within the buffer: read here
            length = ["p = r.pos",
                      "if p < r.end and 0 < buf[p] < 0x80 and buf[p] < r.end - p:",
                      "    n = buf[p] - 1",
                      "    r.pos = p + 1",
                      "else:",
                      f"    n = r.array_length(True, {nullable})"]
        else:
            length = [f"n = r.array_length(False, {nullable})"]
        return length + [f"{target} = None if n is None else [{elem} for _ in range(n)]"]
    if f.type == "string":  # a short non-null string, whole in the buffer: read here
        env["I16"] = _I16
        if compact:
            fits = ["p = r.pos",
                    "if p < r.end and 0 < buf[p] < 0x80 and p + buf[p] <= r.end:",
                    "    e = p + buf[p]",
                    "    r.pos = e",
                    f"    {target} = r._text(buf[p + 1:e])"]
        else:
            fits = ["p = r.pos",
                    "n = I16.unpack_from(buf, p)[0] if p + 2 <= r.end else -1",
                    "if n >= 0 and p + 2 + n <= r.end:",
                    "    r.pos = p + 2 + n",
                    f"    {target} = r._text(buf[p + 2:p + 2 + n])"]
        return fits + ["else:  # nulls, long strings and errors, as the reader has them",
                       f"    {target} = {_primitive('string', compact, nullable)}"]
    fixed = _FIXED.get(f.type)
    if fixed is not None:
        s = _name(env, fixed)
        return ["p = r.pos",
                f"if p + {fixed.size} > r.end:",
                f"    r._take({fixed.size})  # raises the reader's DecodeError",
                f"r.pos = p + {fixed.size}",
                f"{target} = {s}.unpack_from(buf, p)[0]"]
    return [f"{target} = {_primitive(f.type, compact, nullable)}"]


def _primitive(t: str, compact: bool, nullable: bool) -> str:
    """An expression reading one primitive value from `r`."""
    if t in _FIXED or t in ("bool", "uuid"):
        return f"r.{t}()"
    if t == "string":
        return f"r.{'compact_string' if compact else 'string'}({nullable})"
    if t == "bytes":
        return f"r.{'compact_bytes' if compact else 'bytes'}({nullable})"
    if t == "records":
        return f"r.records({compact})"
    raise ValueError(f"unknown type {t}")


def _name(env: dict[str, Any], value: Any) -> str:
    """A global of the generated code that holds `value`."""
    for k, v in env.items():
        if v is value:
            return k
    name = f"g{len(env)}"
    env[name] = value
    return name


def _fresh_default(f) -> bool:
    return f.default_value() is not None and (f.type == "struct" or f.type.startswith("[]"))
