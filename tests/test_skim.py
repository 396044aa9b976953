"""proxy.kafka.skim against the full decoder, for every response of every API and version.

An array's entries read as bytes must be exactly the entries the decoder
builds, encoded again; their keys and error codes those of the decoded
entries; and on broken input the walker must refuse what the decoder refuses
(but for text, which it does not decode), so that a spliced entry is never
malformed.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core import ROUTES
from proxy.core.answers import error_codes
from proxy.kafka import schema, skim
from proxy.kafka.wire import Malformed, Reader
from tests.fuzz.mutate import Generator, _add_tags, mutate


def _arrays(spec: schema.StructSpec) -> list[tuple[str, str]]:
    """(array, key) for each top-level array of structs: its entries' first single-valued field as their key."""
    out = []
    for f in spec.fields:
        if f.array and f.struct is not None:
            keys = [k.name for k in f.struct.fields if k.struct is None and not k.array]
            out.extend((f.name, k) for k in keys[:1])
    return out


BATCHED = [
    (k, v, route.batch.response_array, route.batch.response_key)
    for k, route in ROUTES.items()
    if route.batch is not None and (versions := schema.known_versions(k))
    for v in versions
    if schema.response_spec(k, v).has(route.batch.response_array)
]
CASES = sorted(
    {
        (k, v, array, key)
        for k in schema.API_NAMES
        if (versions := schema.known_versions(k))
        for v in versions
        for array, key in _arrays(schema.response_spec(k, v))
    }
    | set(BATCHED)
)


def _encode(spec: schema.StructSpec, value: Any) -> bytes:
    return b"".join(bytes(p) for p in schema.encode_body(spec, value))


def _answer(api_key: int, version: int, seed: int) -> tuple[schema.StructSpec, bytes]:
    rng = random.Random(seed)
    spec = schema.response_spec(api_key, version)
    body = Generator(rng, answer=True).message(spec)
    if spec.flexible:
        _add_tags(spec, body, rng)  # unknown tagged fields at random struct ends
    return spec, _encode(spec, body)


def _same_as_decoded(spec: schema.StructSpec, wire: bytes, array: str, key: str, *, canonical: bool = True) -> None:
    """``canonical``: the input is as kfan's encoder writes it (else: each entry's bytes decode to the decoded entry)."""
    decoded = schema.decode_body(spec, wire)
    split = skim.split(spec, Reader(wire), array, key)
    assert {k: v for k, v in split.items() if k != array} == {k: v for k, v in decoded.items() if k != array}
    if decoded[array] is None:
        assert split[array] is None
        return
    entry_spec = spec.field(array).struct
    assert entry_spec is not None
    entries: list[skim.Entry] = split[array]
    if canonical:
        assert [bytes(e.raw) for e in entries] == [_encode(entry_spec, d) for d in decoded[array]]
    else:
        assert [schema.decode_body(entry_spec, e.raw) for e in entries] == decoded[array]
    assert [e.key for e in entries] == [d[key] for d in decoded[array]]
    assert [e.error_codes for e in entries] == [error_codes(d) for d in decoded[array]]


def test_every_batched_route_is_a_case() -> None:
    assert {k for k, *_ in BATCHED} == {k for k, route in ROUTES.items() if route.batch is not None}
    assert len({k for k, *_ in CASES}) > 30


@pytest.mark.parametrize(("api_key", "version", "array", "key"), CASES)
@settings(max_examples=8, suppress_health_check=list(HealthCheck), deadline=None)
@given(seed=st.integers(0, 2**32))
def test_entries_are_the_decoded_entries_as_bytes(api_key: int, version: int, array: str, key: str, seed: int) -> None:
    spec, wire = _answer(api_key, version, seed)
    _same_as_decoded(spec, wire, array, key)


@pytest.mark.parametrize(("api_key", "version", "array", "key"), BATCHED)
@settings(max_examples=60, suppress_health_check=list(HealthCheck), deadline=None)
@given(seed=st.integers(0, 2**32))
def test_broken_answers_are_refused_as_the_decoder_refuses_them(api_key: int, version: int, array: str, key: str, seed: int) -> None:
    spec, wire = _answer(api_key, version, seed)
    broken = mutate(wire, random.Random(seed))
    try:
        schema.decode_body(spec, broken, allow_trailing=True)
    except Malformed as e:
        refused: Malformed | None = e
    else:
        refused = None
    if refused is None:
        _same_as_decoded(spec, _trimmed(spec, broken), array, key, canonical=False)
        return
    try:
        skim.split(spec, Reader(broken), array, key)
    except Malformed:
        return
    # Accepted by the walker, refused by the decoder: only text it does not read may be at fault.
    assert "UTF-8" in str(refused), refused


def _trimmed(spec: schema.StructSpec, wire: bytes) -> bytes:
    """``wire`` without the trailing bytes a response may carry."""
    r = Reader(wire)
    spec.decode(r)
    return wire[: r.pos]


def test_a_null_in_a_non_nullable_string_is_refused() -> None:
    spec = schema.response_spec(15, 5)  # DescribeGroups v5: groups[].group_id, a compact string
    entry = {**spec.field("groups").struct.blank(), "group_id": "g"}  # type: ignore[union-attr]
    wire = bytearray(_encode(spec, {**spec.blank(), "groups": [entry]}))
    at = wire.index(b"\x02g")  # group_id "g": compact length 1 + 1
    assert wire[at + 2] == 1  # group_state, right after the key: "" (compact length 0 + 1)
    wire[at + 2] = 0  # made null
    with pytest.raises(Malformed):
        schema.decode_body(spec, bytes(wire))
    with pytest.raises(Malformed, match="null"):
        skim.split(spec, Reader(bytes(wire)), "groups", "group_id")
