"""Schema-driven Kafka message codec, compiled from kio's message schemas.

kio carries Kafka's own message JSON schemas (as dataclasses) for every API
and version Kafka 4 has; the older versions Kafka 4 removed come from
``removed_versions.json`` (Kafka 3.9's definitions, restated, with kio's
names; :mod:`.removed_versions` reads it). This module compiles those
definitions once per (api, version) into a bounds-checked decoder and an
encoder over plain dicts. We do not use
kio's own (Rust) decoder on client bytes: a huge array length aborts the
process there, whereas here every count is checked against the bytes left.

Decoded structs are dicts keyed by kio's field names. Byte fields (record
batches above all) are ``memoryview`` slices of the input frame, never copied
or decoded. Tagged fields that are present appear under their name; unknown
tags are kept raw under ``"_tags"`` so that re-encoding loses nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map, schema_name_map

from . import removed_versions
from .wire import Malformed, Reader, Writer

Struct = dict[str, Any]
ReadFn = Callable[[Reader], Any]
WriteFn = Callable[[Writer, Any], None]

TAGS = "_tags"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    tag: int | None
    read: ReadFn
    write: WriteFn
    default: Any
    has_default: bool
    struct: StructSpec | None  # element struct for struct and struct-array fields
    zero: Any  # the value a synthesized entry gets when the schema has no default
    kafka_type: str | None  # kio's name of the primitive type (of the elements, for arrays); None for structs
    array: bool
    nullable: bool


@dataclass(frozen=True, slots=True)
class StructSpec:
    name: str
    flexible: bool
    fields: tuple[FieldSpec, ...]
    tagged: dict[int, FieldSpec]
    min_size: int

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        for f in self.tagged.values():
            if f.name == name:
                return f
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(f.name == name for f in (*self.fields, *self.tagged.values()))

    def decode(self, r: Reader) -> Struct:
        return _decode_struct(self, r)

    def encode(self, w: Writer, value: Struct) -> None:
        _encode_struct(self, w, value)

    def blank(self) -> Struct:
        """A struct of defaults (or -1, "", empty, null) for synthesized answers."""
        return {f.name: f.default if f.has_default else f.zero for f in self.fields}


# kio's fixed-size types: the Reader and Writer method, and the size on the wire.
FIXED: dict[str, tuple[str, int]] = {
    "int8": ("int8", 1),
    "bool": ("boolean", 1),
    "int16": ("int16", 2),
    "error_code": ("int16", 2),
    "uint16": ("uint16", 2),
    "int32": ("int32", 4),
    "timedelta_i32": ("int32", 4),
    "int64": ("int64", 8),
    "timedelta_i64": ("int64", 8),
    "datetime_i64": ("int64", 8),
    "float64": ("float64", 8),
    "uuid": ("uuid", 16),
}


class Encoded(list[bytes | memoryview]):
    """Array entries already in wire form (moved from another message): written as they are."""


def _prim(kafka_type: str, flexible: bool, nullable: bool) -> tuple[ReadFn, WriteFn, int]:
    if kafka_type in FIXED:
        meth, size = FIXED[kafka_type]
        return getattr(Reader, meth), getattr(Writer, meth), size
    if kafka_type == "string":
        rname, wname, size = ("compact_string", "compact_string", 1) if flexible else ("string", "string", 2)
    elif kafka_type in ("bytes", "records"):
        rname, wname, size = ("compact_bytes", "compact_bytes", 1) if flexible else ("bytes_", "bytes_", 4)
    else:
        raise TypeError(f"unknown kafka_type {kafka_type!r}")
    rd = getattr(Reader, rname)
    if nullable:
        return rd, getattr(Writer, wname), size

    def read_required(r: Reader) -> Any:
        v = rd(r)
        if v is None:
            raise Malformed(f"null in a non-nullable {kafka_type}")
        return v

    return read_required, getattr(Writer, wname), size


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


# Estimated memory of decoded values (CPython 3.11 on 64 bits), charged to the
# reader so that decoding stops before a frame of many tiny entries balloons:
# a dict per struct plus a slot per field, and per array item its list slot
# and a small object (an int, a short string, a memoryview header).
STRUCT_COST = 184
FIELD_COST = 24
ITEM_COST = 56


def _array(elem_read: ReadFn, elem_write: WriteFn, elem_min: int, flexible: bool, nullable: bool, what: str) -> tuple[ReadFn, WriteFn]:
    read_len = Reader.compact_array_len if flexible else Reader.array_len
    write_len = Writer.compact_array_len if flexible else Writer.array_len

    def read(r: Reader) -> list[Any] | None:
        n = read_len(r, elem_min)
        if n < 0:
            if nullable:
                return None
            raise Malformed(f"null in non-nullable array {what}")
        r.charge(n * ITEM_COST)
        return [elem_read(r) for _ in range(n)]

    def write(w: Writer, v: list[Any] | None) -> None:
        write_len(w, None if v is None else len(v))
        if type(v) is Encoded:
            for item in v:
                w.raw(item)
        elif v is not None:
            for item in v:
                elem_write(w, item)

    return read, write


def _field_default(f: dataclasses.Field[Any]) -> tuple[Any, bool]:
    if f.default is not dataclasses.MISSING:
        d = f.default
    elif f.default_factory is not dataclasses.MISSING:
        d = f.default_factory()
    else:
        return None, False
    return _to_plain(d), True


def _to_plain(v: Any) -> Any:
    """Turn a kio value (dataclass, tuple, phantom int) into our dict form."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _to_plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, tuple):
        return [_to_plain(x) for x in v]
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, datetime.timedelta):
        return int(v.total_seconds() * 1000)
    if isinstance(v, datetime.datetime):
        return int(v.timestamp() * 1000)
    return v


def _field(
    owner: str,
    name: str,
    kafka_type: str | None,
    *,
    flexible: bool,
    nullable: bool,
    array: bool,
    sub: StructSpec | None,
    default: Any,
    has_default: bool,
    tag: int | None = None,
) -> tuple[FieldSpec, int]:
    """One field's codec and its least size on the wire.

    ``sub`` is the struct of a struct or struct-array field; ``kafka_type``
    that of a primitive or primitive-array one.
    """
    if array:
        if sub is not None:
            er, ew, emin = sub.decode, sub.encode, sub.min_size
        else:
            assert kafka_type is not None, (owner, name)
            er, ew, emin = _prim(kafka_type, flexible, False)
        read, write = _array(er, ew, emin, flexible, nullable, f"{owner}.{name}")
        size = 1 if flexible else 4
    elif sub is not None:
        read, write, size = sub.decode, sub.encode, sub.min_size
        if nullable:
            read, write = _nullable_struct(sub)
            size = 1
    else:
        assert kafka_type is not None, (owner, name)
        read, write, size = _prim(kafka_type, flexible, nullable)
    if kafka_type == "datetime_i64" and has_default and default is None:
        default = -1  # kio models the wire's -1 ("no timestamp") as None
    zero = _zero(array, kafka_type, nullable, sub)
    return FieldSpec(
        name, tag, read, write, default, has_default, sub, zero, None if sub is not None else kafka_type, array, nullable
    ), size


def _struct(name: str, flexible: bool, fields: list[tuple[FieldSpec, int]]) -> StructSpec:
    untagged = tuple(f for f, _ in fields if f.tag is None)
    tagged = {f.tag: f for f, _ in fields if f.tag is not None}
    min_size = (1 if flexible else 0) + sum(size for f, size in fields if f.tag is None)
    return StructSpec(name, flexible, untagged, dict(sorted(tagged.items())), min_size)


@cache
def compile_struct(cls: type) -> StructSpec:
    """The codec of one kio message or struct dataclass."""
    flexible = bool(getattr(cls, "__flexible__", False))
    hints = typing.get_type_hints(cls)
    fields: list[tuple[FieldSpec, int]] = []
    for f in dataclasses.fields(cls):
        tp, nullable = _unwrap_optional(hints[f.name])
        tag = f.metadata.get("tag")
        array = typing.get_origin(tp) is tuple
        if array:
            tp, _ = _unwrap_optional(typing.get_args(tp)[0])
        sub = compile_struct(tp) if dataclasses.is_dataclass(tp) else None
        default, has_default = _field_default(f)
        fields.append(
            _field(
                cls.__name__,
                f.name,
                f.metadata.get("kafka_type"),
                flexible=flexible,
                nullable=nullable,
                array=array,
                sub=sub,
                default=default,
                has_default=has_default,
                tag=None if tag is None else int(tag),
            )
        )
    return _struct(cls.__name__, flexible, fields)


def _zero(array: bool, kafka_type: str | None, nullable: bool, sub: StructSpec | None) -> Any:
    if array:
        return []
    if sub is not None:
        return None if nullable else sub.blank()
    if kafka_type == "uuid":
        return uuid.UUID(int=0)  # never null on the wire, whatever the schema's Python type says
    if nullable:
        return None
    if kafka_type == "bool":
        return False
    if kafka_type == "string":
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "float64":
        return 0.0
    if kafka_type in ("timedelta_i32", "timedelta_i64", "datetime_i64"):
        # Durations and timestamps: 0, as Kafka's generated messages default
        # fields the schema gives no default (throttle 0, no start time).
        return 0
    return -1  # offsets, ids, epochs, timestamps: Kafka's "unknown"


def _nullable_struct(sub: StructSpec) -> tuple[ReadFn, WriteFn]:
    def read(r: Reader) -> Struct | None:
        return None if r.int8() < 0 else sub.decode(r)

    def write(w: Writer, v: Struct | None) -> None:
        if v is None:
            w.int8(-1)
        else:
            w.int8(1)
            sub.encode(w, v)

    return read, write


def _decode_struct(spec: StructSpec, r: Reader) -> Struct:
    r.charge(STRUCT_COST + FIELD_COST * len(spec.fields))
    out: Struct = {}
    for f in spec.fields:
        out[f.name] = f.read(r)
    if spec.flexible and not r.empty_tags():
        read_tagged(spec, r, out)
    return out


def read_tagged(spec: StructSpec, r: Reader, out: Struct) -> None:
    """A flexible struct's tagged fields, into ``out``."""
    n = r.uvarint()
    if n > r.remaining():
        raise Malformed(f"{n} tagged fields cannot fit")
    for _ in range(n):
        tag = r.uvarint()
        size = r.uvarint()
        body = r.raw(size)
        tf = spec.tagged.get(tag)
        if tf is None:
            r.charge(ITEM_COST + size)
            out.setdefault(TAGS, {})[tag] = bytes(body)
        else:
            # A tagged field may hold arrays too: its reader draws on the same allowance.
            sub = Reader(body, max_cost=None if r.max_cost is None else r.max_cost - r.cost)
            out[tf.name] = tf.read(sub)
            r.charge(sub.cost)


def _encode_struct(spec: StructSpec, w: Writer, value: Struct) -> None:
    for f in spec.fields:
        try:
            v = value[f.name]
        except KeyError:
            if not f.has_default:
                raise KeyError(f"{spec.name}.{f.name} missing and has no default") from None
            v = f.default
        f.write(w, v)
    if spec.flexible:
        present: list[tuple[int, bytes]] = []
        for tag, tf in spec.tagged.items():
            if tf.name in value:
                tw = Writer()
                tf.write(tw, value[tf.name])
                present.append((tag, b"".join(tw.finish())))
        unknown = value.get(TAGS)
        if unknown:
            present.extend(unknown.items())
            present.sort()
        w.uvarint(len(present))
        for tag, body in present:
            w.uvarint(tag)
            w.uvarint(len(body))
            w.raw(body)


# --- versions Kafka 4 removed ----------------------------------------------
#
# Kafka 3.9's definitions of them, read by :mod:`.removed_versions`, compiled here as kio's are.


def _compile_removed(struct: removed_versions.StructDef) -> StructSpec:
    fields = [
        _field(
            struct.name,
            f.name,
            f.kafka_type,
            flexible=False,
            nullable=f.nullable,
            array=f.array,
            sub=None if f.struct is None else _compile_removed(f.struct),
            default=f.default,
            has_default=f.has_default,
        )
        for f in struct.fields
    ]
    return _struct(struct.name, False, fields)


@cache
def removed_version_spec(api_key: int, version: int, kind: str) -> StructSpec:
    """The codec of a version Kafka 4 removed; ``kind`` is "request" or "response"."""
    return _compile_removed(removed_versions.message(api_key, version, kind))


# --- per-API lookup -------------------------------------------------------

API_NAMES: dict[int, str] = dict(api_key_map)


@cache
def _kio_ranges() -> dict[int, range]:
    out = {}
    for api_key, name in api_key_map.items():
        versions = sorted(v for v, m in schema_name_map[name].items() if len(m) >= 2)
        if versions:
            out[api_key] = range(versions[0], versions[-1] + 1)
    return out


@cache
def _known_ranges() -> dict[int, range]:
    out = dict(_kio_ranges())
    for api_key, kio in out.items():
        removed = removed_versions.versions(api_key)
        if removed is not None:
            out[api_key] = range(min(removed.start, kio.start), kio.stop)
    return out


def kio_versions(api_key: int) -> range | None:
    """The contiguous version range kio has schemas for, or None."""
    return _kio_ranges().get(api_key)


def known_versions(api_key: int) -> range | None:
    """Every version kfan has a schema for: kio's, and below them those Kafka 4 removed.

    Looked up for every request's header, so both tables are built once.
    """
    return _known_ranges().get(api_key)


def _is_removed(api_key: int, version: int) -> bool:
    kio = kio_versions(api_key)
    return kio is not None and version < kio.start


@cache
def request_spec(api_key: int, version: int) -> StructSpec:
    if _is_removed(api_key, version):
        return removed_version_spec(api_key, version, "request")
    return compile_struct(load_request_schema(api_key, version))


@cache
def response_spec(api_key: int, version: int) -> StructSpec:
    if _is_removed(api_key, version):
        return removed_version_spec(api_key, version, "response")
    return compile_struct(load_response_schema(api_key, version))


@cache
def is_flexible(api_key: int, version: int) -> bool:
    return request_spec(api_key, version).flexible


def decode_body(spec: StructSpec, buf: Any, offset: int = 0, *, allow_trailing: bool = False, max_cost: int | None = None) -> Struct:
    """Decode a whole message body; trailing bytes are malformed input.

    ``allow_trailing`` accepts bytes after the body, as Kafka does: brokers
    ignore them in requests (librdkafka pads Metadata v13 requests) and
    clients in responses (librdkafka's mock pads Metadata v9+ responses).
    ``max_cost``: refuse (:class:`Malformed`) a body whose decoded form would
    take more memory than this (estimated, see ``STRUCT_COST``).
    """
    return decode_body_costed(spec, buf, offset, allow_trailing=allow_trailing, max_cost=max_cost)[0]


def decode_body_costed(
    spec: StructSpec, buf: Any, offset: int = 0, *, allow_trailing: bool = False, max_cost: int | None = None
) -> tuple[Struct, int]:
    """:func:`decode_body`, plus the estimated memory the decoded body takes."""
    r = Reader(buf, offset, max_cost=max_cost)
    out = spec.decode(r)
    if r.remaining() and not allow_trailing:
        raise Malformed(f"{r.remaining()} trailing bytes after {spec.name}")
    return out, r.cost


def encode_body(spec: StructSpec, value: Struct) -> list[bytes | memoryview]:
    w = Writer()
    spec.encode(w, value)
    return w.finish()
