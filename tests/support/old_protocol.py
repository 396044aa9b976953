"""Test helpers: the oracle for the versions Kafka 4 removed, which kio lacks.

kafka-python keeps hand-written structs of the old versions
(``kafka.protocol.old``), written from Kafka's protocol guide independently of
kfan's ``removed_versions.json``: requests and answers of those versions are
drawn from and checked against them.
"""

from __future__ import annotations

import importlib
import io
import pkgutil
from functools import cache
from typing import Any

from hypothesis import strategies as st
from kafka.protocol.old import types as kp

from proxy.kafka import schema

_INTS = {kp.Int8: 8, kp.Int16: 16, kp.Int32: 32, kp.Int64: 64}


@cache
def _classes() -> dict[tuple[int, int, str], type]:
    import kafka.protocol.old as old

    found: dict[tuple[int, int, str], type] = {}
    for mod in pkgutil.iter_modules(old.__path__):
        module = importlib.import_module(f"kafka.protocol.old.{mod.name}")
        for value in vars(module).values():
            if isinstance(value, type) and hasattr(value, "API_KEY") and isinstance(getattr(value, "API_VERSION", None), int):
                kind = "request" if value.__name__.endswith(f"Request_v{value.API_VERSION}") else "response"
                found[(value.API_KEY, value.API_VERSION, kind)] = value
    return found


def removed_versions() -> list[tuple[int, int]]:
    """Every (api key, version) kfan serves from removed_versions.json."""
    out = []
    for api_key in sorted(schema.API_NAMES):
        kio = schema.kio_versions(api_key)
        known = schema.known_versions(api_key)
        if kio is not None and known is not None:
            out.extend((api_key, v) for v in range(known.start, kio.start))
    return out


# Where kafka-python's struct disagrees with Kafka's definition, Kafka's wins:
# DescribeLogDirsRequest v0's partitions are "[]int32" (DescribeLogDirsRequest.json,
# every version), not one int32 (kafka-python never sends this request).
_ERRATA = {
    (35, 0, "request"): kp.Schema(("topics", kp.Array(("topic", kp.String("utf-8")), ("partitions", kp.Array(kp.Int32))))),
}


def old_schema(api_key: int, version: int, kind: str) -> Any:
    """kafka-python's Schema of one old request or response."""
    return _ERRATA.get((api_key, version, kind)) or _classes()[(api_key, version, kind)].SCHEMA


def _values(t: Any) -> st.SearchStrategy[Any]:
    if isinstance(t, kp.Schema):
        return st.tuples(*(_values(f) for f in t.fields))
    if isinstance(t, kp.Array):
        return st.lists(_values(t.array_of), max_size=3)
    if t in _INTS:
        bits = _INTS[t]
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if t is kp.Boolean:
        return st.booleans()
    if isinstance(t, kp.String):
        return st.text(max_size=12)
    if t is kp.Bytes:
        return st.binary(max_size=64)
    raise TypeError(f"no strategy for {t!r}")


def bodies(api_key: int, version: int, kind: str) -> st.SearchStrategy[bytes]:
    """Message bodies of an old version, as kafka-python encodes them."""
    s = old_schema(api_key, version, kind)
    return _values(s).map(s.encode)


def oracle_round_trip(api_key: int, version: int, kind: str, body: bytes | memoryview) -> bytes:
    """Decode ``body`` with kafka-python and encode it again: the oracle's reading of it.

    Raises (ValueError, struct.error) when the bytes are not a whole message by the oracle.
    """
    return encode(api_key, version, kind, decode(api_key, version, kind, bytes(body)))


def encode(api_key: int, version: int, kind: str, value: tuple[Any, ...]) -> bytes:
    """kafka-python's encoding of ``value`` (its fields in schema order, arrays as lists)."""
    return old_schema(api_key, version, kind).encode(value)  # type: ignore[no-any-return]


def decode(api_key: int, version: int, kind: str, body: bytes) -> tuple[Any, ...]:
    """kafka-python's reading of a whole message body (fields in schema order)."""
    buf = io.BytesIO(body)
    value = old_schema(api_key, version, kind).decode(buf)
    if buf.read(1):
        raise ValueError("bytes after the message")
    return value  # type: ignore[no-any-return]
