"""One array of a message read as byte slices, without building its entries.

A batched answer (ConsumerGroupDescribe, DescribeGroups, OffsetFetch v8+ ...)
is merged by moving its entries, not by rebuilding them: each entry is found
by walking the schema over its bytes, reading only its key and its error
codes (at any depth). Every length and count is checked as :mod:`.schema`
checks them, so a spliced entry is well formed; strings other than the key are
not decoded, so an entry's text reaches the client as the broker wrote it, as
it does when one coordinator answers a whole request. Decoding and encoding
16,000 groups took a second of CPU; walking them takes a fraction of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .schema import FIXED, FieldSpec, Struct, StructSpec, read_tagged
from .wire import Malformed, Reader

# A walker moves a reader over one value, appending the error codes it holds.
Walk = Callable[[Reader, list[int]], None]


@dataclass(slots=True)
class Entry:
    """One array entry as it is on the wire: its key, its bytes and the error codes in it."""

    key: Any
    raw: memoryview
    error_codes: list[int]


def split(spec: StructSpec, r: Reader, array: str, key: str) -> Struct:
    """Decode a message except its field ``array``, whose entries come out as :class:`Entry`."""
    out: Struct = {}
    for f in spec.fields:
        if f.name != array:
            out[f.name] = f.read(r)
            continue
        sub = f.struct
        assert f.array and sub is not None, f"{spec.name}.{array} is not an array of structs"
        n = r.compact_array_len(sub.min_size) if spec.flexible else r.array_len(sub.min_size)
        if n < 0 and not f.nullable:
            raise Malformed(f"null in non-nullable array {spec.name}.{array}")
        read_key, rest = _keyed(sub, key)
        entries = []
        for _ in range(max(n, 0)):
            start = r.pos
            codes: list[int] = []
            k = read_key(r, codes)
            rest(r, codes)
            entries.append(Entry(k, r.buf[start : r.pos], codes))
        out[f.name] = None if n < 0 else entries
    if spec.flexible:
        read_tagged(spec, r, out)
    return out


def fixed_size(kafka_type: str | None) -> int | None:
    """The wire size of a fixed-size primitive type; None for strings, bytes and structs."""
    fixed = FIXED.get(kafka_type) if kafka_type is not None else None
    return None if fixed is None else fixed[1]


_keyed_walkers: dict[tuple[int, str], tuple[Callable[[Reader, list[int]], Any], Walk]] = {}


def _keyed(spec: StructSpec, key: str) -> tuple[Callable[[Reader, list[int]], Any], Walk]:
    """Walkers for an entry: up to and including its key (returning it), and the rest."""
    found = _keyed_walkers.get((id(spec), key))
    if found is None:
        found = _keyed_walkers[(id(spec), key)] = _compile_keyed(spec, key)
    return found


def _compile_keyed(spec: StructSpec, key: str) -> tuple[Callable[[Reader, list[int]], Any], Walk]:
    i = next(i for i, f in enumerate(spec.fields) if f.name == key)
    before, key_field, after = _steps(spec.fields[:i], spec.flexible), spec.fields[i], _steps(spec.fields[i + 1 :], spec.flexible)

    assert key_field.struct is None and not key_field.array, f"{spec.name}.{key}: a key is a single value"
    is_code = fixed_size(key_field.kafka_type) is not None and key.endswith("error_code")

    def read_key(r: Reader, codes: list[int]) -> Any:
        for step in before:
            step(r, codes)
        value = key_field.read(r)
        if is_code:
            codes.append(value)
        return value

    return read_key, _sequence(after, spec if spec.flexible else None)


_walkers: dict[int, Walk] = {}  # by id of a (cached, never freed) StructSpec


def walker(spec: StructSpec) -> Walk:
    """The walker of a whole struct (compiled once per struct)."""
    w = _walkers.get(id(spec))
    if w is None:
        w = _walkers[id(spec)] = _sequence(_steps(spec.fields, spec.flexible), spec if spec.flexible else None)
    return w


def _sequence(steps: list[Walk], tagged_of: StructSpec | None) -> Walk:
    def walk(r: Reader, codes: list[int]) -> None:
        for step in steps:
            step(r, codes)
        if tagged_of is not None and not r.empty_tags():
            _walk_tagged(tagged_of, r, codes)

    return walk


def _steps(fields: tuple[FieldSpec, ...], flexible: bool) -> list[Walk]:
    """One walker per field, runs of fixed-size fields that hold no error code skipped at once."""
    steps: list[Walk] = []
    run = 0
    for f in fields:
        size = fixed_size(f.kafka_type) if f.struct is None and not f.array else None
        if size is not None and not f.name.endswith("error_code"):
            run += size
            continue
        if run:
            steps.append(_skip(run))
            run = 0
        steps.append(_field(f, flexible))
    if run:
        steps.append(_skip(run))
    return steps


def _skip(n: int) -> Walk:
    def skip(r: Reader, codes: list[int]) -> None:
        r.skip(n)

    return skip


def _error_code(r: Reader, codes: list[int]) -> None:
    codes.append(r.int16())


def _field(f: FieldSpec, flexible: bool) -> Walk:
    sub = f.struct
    if f.array:
        return _array(f, flexible)
    if sub is not None:
        inner = walker(sub)
        if not f.nullable:
            return inner

        def nullable_struct(r: Reader, codes: list[int]) -> None:
            if r.int8() >= 0:
                inner(r, codes)

        return nullable_struct
    size = fixed_size(f.kafka_type)
    if size is not None:
        return _error_code if f.name.endswith("error_code") else _skip(size)
    return _sized(f, flexible)


def _sized(f: FieldSpec, flexible: bool) -> Walk:
    """A string or bytes field: its length, checked, then skipped."""
    nullable, what = f.nullable, f"{f.kafka_type} {f.name}"
    if flexible:

        def compact(r: Reader, codes: list[int]) -> None:
            p = r.pos
            if p < r.end and r.buf[p] < 0x80:  # a length under 127: one byte
                r.pos = p + 1
                n = r.buf[p] - 1
            else:
                n = r.uvarint() - 1
            if n >= 0:
                r.skip(n)
            elif not nullable:
                raise Malformed(f"null in a non-nullable {what}")

        return compact
    read_len = Reader.int16 if f.kafka_type == "string" else Reader.int32

    def legacy(r: Reader, codes: list[int]) -> None:
        n = read_len(r)
        if n >= 0:
            r.skip(n)
        elif not nullable:
            raise Malformed(f"null in a non-nullable {what}")

    return legacy


def _array(f: FieldSpec, flexible: bool) -> Walk:
    sub = f.struct
    read_len = Reader.compact_array_len if flexible else Reader.array_len
    # Arrays of fixed-size items (partition indexes, offsets) are skipped whole; error codes
    # are looked for in structs only, as in decoded messages (proxy.core.answers.error_codes).
    size = fixed_size(f.kafka_type) if sub is None else None
    if sub is not None:
        elem, elem_min = walker(sub), sub.min_size
    elif size is not None:
        elem, elem_min = _skip(size), size
    else:
        elem, elem_min = _sized(f, flexible), 1 if flexible else (2 if f.kafka_type == "string" else 4)
    nullable = f.nullable

    def array(r: Reader, codes: list[int]) -> None:
        n = read_len(r, elem_min)
        if n < 0:
            if not nullable:
                raise Malformed(f"null in non-nullable array {f.name}")
        elif size is not None:
            r.skip(n * size)
        else:
            for _ in range(n):
                elem(r, codes)

    return array


def _walk_tagged(spec: StructSpec, r: Reader, codes: list[int]) -> None:
    n = r.uvarint()
    if n > r.remaining():
        raise Malformed(f"{n} tagged fields cannot fit")
    for _ in range(n):
        tag = r.uvarint()
        body = r.raw(r.uvarint())
        tf = spec.tagged.get(tag)
        if tf is not None:  # tagged fields are rare: compiled as they come
            _field(tf, True)(Reader(body), codes)


# The keys of a partition-keyed message, or None: it holds a non-zero error code or a tagged field where it may name
# a broker (at its top, topic or partition level).
PartitionKeys = Callable[[Reader], "list[tuple[Any, int]] | None"]
_partition_keys: dict[tuple[int, str, str, str, str | None], PartitionKeys] = {}


def partition_keys(spec: StructSpec, topics: str, topic_key: str, partitions: str, index: str | None) -> PartitionKeys:
    """A reader of ``topics[topic_key].partitions[index]``'s keys, in order, when nothing else in the message needs
    reading: every error code zero and no tagged field at the three levels. Lengths are checked as the decoder
    checks them; strings are skipped, not decoded. Compiled once per message version and layout."""
    found = _partition_keys.get((id(spec), topics, topic_key, partitions, index))
    if found is None:
        found = _partition_keys[(id(spec), topics, topic_key, partitions, index)] = _compile_partition_keys(
            spec, topics, topic_key, partitions, index
        )
    return found


def _around(spec: StructSpec, first: str, last: str) -> tuple[list[Walk], FieldSpec, list[Walk], FieldSpec, list[Walk]]:
    """Walkers before field ``first``, between it and ``last`` (the same field or a later one), and after ``last``."""
    names = [f.name for f in spec.fields]
    i, j = names.index(first), names.index(last)
    assert i <= j, f"{spec.name}: {first} comes after {last}"
    fields, flexible = spec.fields, spec.flexible
    return _steps(fields[:i], flexible), fields[i], _steps(fields[i + 1 : j], flexible), fields[j], _steps(fields[j + 1 :], flexible)


def _compile_partition_keys(spec: StructSpec, topics: str, topic_key: str, partitions: str, index: str | None) -> PartitionKeys:
    flexible = spec.flexible
    read_len = Reader.compact_array_len if flexible else Reader.array_len
    top_before, topics_field, _, _, top_after = _around(spec, topics, topics)
    tspec = topics_field.struct
    assert topics_field.array and tspec is not None
    t_before, key_field, t_mid, partitions_field, t_after = _around(tspec, topic_key, partitions)
    pspec = partitions_field.struct
    p_before: list[Walk] = []
    p_after: list[Walk] = []
    read_index = Reader.int32  # partitions as bare int32 indexes
    if pspec is not None:
        assert index is not None
        p_before, index_field, _, _, p_after = _around(pspec, index, index)
        read_index = index_field.read
    t_min, p_min, read_key = tspec.min_size, 4 if pspec is None else pspec.min_size, key_field.read

    def keys(r: Reader) -> list[tuple[Any, int]] | None:
        codes: list[int] = []
        for step in top_before:
            step(r, codes)
        out: list[tuple[Any, int]] = []
        n = read_len(r, t_min)
        if n < 0:
            return None  # null: the decoder decides whether that is allowed
        for _ in range(n):
            for step in t_before:
                step(r, codes)
            key = read_key(r)
            for step in t_mid:
                step(r, codes)
            m = read_len(r, p_min)
            if m < 0:
                return None
            for _ in range(m):
                for step in p_before:
                    step(r, codes)
                out.append((key, read_index(r)))
                for step in p_after:
                    step(r, codes)
                if flexible and pspec is not None and not r.empty_tags():
                    return None
            for step in t_after:
                step(r, codes)
            if flexible and not r.empty_tags():
                return None
        for step in top_after:
            step(r, codes)
        if flexible and not r.empty_tags():
            return None
        return None if any(codes) else out

    return keys
