"""Golden route cases: one hand-written request -> sub-requests -> answers -> merged answer.

A :class:`Golden` case states everything literally, as decoded dicts; these
helpers only turn them into bytes with kfan's codec (filling the fields a
case leaves out with the schema's blanks, at every depth) and read the
core's bytes back, so that a case can be compared field by field.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core import Destination, Effect, Failed, FoldMetadata
from proxy.kafka import schema
from proxy.kafka.headers import decode_request, request_head, request_header_tail, response_header
from proxy.kafka.schema import Struct, StructSpec

WHOLE = "whole"  # a sub-request that is the client's own bytes, unchanged
SAME = "same"  # a merged answer that is the one broker's answer body, byte for byte
CLIENT_ID = "golden-client"
_CID = struct.Struct(">i")


@dataclass(frozen=True)
class Golden:
    """One API's golden case. ``subs`` empty: kfan answers by itself."""

    name: str  # Kafka's name for the API, e.g. "Fetch"
    api: int
    version: int
    request: Struct
    subs: Mapping[Destination, Struct | str]  # destination -> the sub-request's body (the fields that matter), or WHOLE
    answers: Mapping[Destination, Struct | Failed]  # destination -> the broker's decoded answer, or its failure
    merged: Struct | str  # the client's answer (the fields that matter), or SAME
    effects: Sequence[Effect] = ()
    unknown_topics: frozenset[Any] = frozenset()
    advertised: Mapping[int, tuple[int, int]] | None = None  # what kfan advertises, when the case needs its own
    share_sessions: Mapping[Any, Any] | None = None  # the connection's share sessions, when the case needs some
    client_identity: bool = False  # the brokers see the client as itself (--broker-identity client)


def filled(spec: StructSpec, value: Struct) -> Struct:
    """``value`` with every field it leaves out set to the schema's blank, at every depth."""
    out = spec.blank()
    for name, v in value.items():
        f = spec.field(name)  # a misspelt field fails here, not silently
        if f.struct is not None and isinstance(v, list):
            v = [filled(f.struct, e) if isinstance(e, dict) else e for e in v]
        elif f.struct is not None and isinstance(v, dict):
            v = filled(f.struct, v)
        out[name] = v
    return out


def request_payload(api: int, version: int, body: Struct, correlation_id: int = 7) -> bytes:
    """A client request frame (no size prefix)."""
    spec = schema.request_spec(api, version)
    head = request_head(api, version) + _CID.pack(correlation_id) + request_header_tail(api, version, CLIENT_ID)
    return head + b"".join(schema.encode_body(spec, filled(spec, body)))


def answer_body(api: int, version: int, body: Struct) -> bytes:
    """A response body (no header)."""
    spec = schema.response_spec(api, version)
    return b"".join(schema.encode_body(spec, filled(spec, body)))


def answer_payload(api: int, version: int, body: Struct, correlation_id: int = 0) -> bytes:
    """A broker's response frame (no size prefix)."""
    return response_header(api, version, correlation_id) + answer_body(api, version, body)


def decode_sub(api: int, version: int, tail: bytes) -> tuple[str | None, Struct]:
    """A sub-request's client id and decoded body, from its bytes after the correlation id."""
    hdr, body = decode_request(request_head(api, version) + _CID.pack(0) + tail)
    assert (hdr.api_key, hdr.api_version) == (api, version)
    return hdr.client_id, body


def decode_reply(api: int, version: int, body: bytes) -> Struct:
    return schema.decode_body(schema.response_spec(api, version), body)


def match(expected: Any, actual: Any, path: str = "") -> None:
    """``actual`` has every field ``expected`` states, with its value; lists match in length and order."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path or '.'}: expected a struct, got {actual!r}"
        for k, v in expected.items():
            assert k in actual, f"{path}.{k}: missing in {sorted(actual)}"
            match(v, actual[k], f"{path}.{k}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{path}: expected a list, got {actual!r}"
        assert len(actual) == len(expected), f"{path}: {len(actual)} entries, expected {len(expected)}: {actual!r}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            match(e, a, f"{path}[{i}]")
    elif isinstance(expected, bytes):
        assert actual is not None and bytes(actual) == expected, f"{path}: {actual!r} != {expected!r}"
    else:
        # True == 1 in Python, not on the wire: a boolean must match a boolean.
        same_kind = isinstance(actual, bool) == isinstance(expected, bool)
        assert same_kind and actual == expected, f"{path}: {actual!r} != {expected!r}"


def match_effects(expected: Sequence[Effect], actual: Sequence[Effect]) -> None:
    """Effects in order; a FoldMetadata's metadata matched by the fields the case states."""
    assert [type(e) for e in actual] == [type(e) for e in expected], f"effects {actual!r} != {expected!r}"
    for e, a in zip(expected, actual, strict=True):
        if isinstance(e, FoldMetadata):
            assert isinstance(a, FoldMetadata)
            match(e.metadata, a.metadata, "FoldMetadata")
        else:
            assert a == e, f"effect {a!r} != {e!r}"
