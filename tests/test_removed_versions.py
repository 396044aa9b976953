"""The versions Kafka 4 removed: kfan's definitions of them (removed_versions.json)
against kio at the first version kio has, and against kafka-python's hand-written
structs of the old versions (an independent oracle) below it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from proxy.kafka import schema
from proxy.kafka.schema import StructSpec
from proxy.kafka.wire import Malformed
from tests.support.kio_oracle import kio_encode
from tests.support.old_protocol import bodies, oracle_round_trip, removed_versions

REMOVED = removed_versions()
REMOVED_APIS = sorted({k for k, _ in REMOVED})
KINDS = ("request", "response")


def _shape(spec: StructSpec) -> list[object]:
    """What a field list means on the wire and in synthesized answers, minus the closures."""
    out: list[object] = [spec.flexible, spec.min_size]
    for f in (*spec.fields, *spec.tagged.values()):
        out.append((f.name, f.tag, f.default, f.has_default, f.zero, f.kafka_type, f.array, f.nullable))
        if f.struct is not None:
            out.append(_shape(f.struct))
    return out


def test_kfan_serves_every_version_kafka_4_removed_from_the_routed_apis() -> None:
    # KIP-896's list, for the APIs kfan routes (the rest are broker-to-broker).
    assert dict.fromkeys(REMOVED_APIS) == dict.fromkeys([0, 1, 2, 8, 9, 19, 20, 23, 29, 30, 31, 32, 35])
    assert [v for k, v in REMOVED if k == 0] == [0, 1, 2]
    assert [v for k, v in REMOVED if k == 1] == [0, 1, 2, 3]
    for api_key in REMOVED_APIS:
        versions = schema.known_versions(api_key)
        assert versions is not None and versions.start == 0


@pytest.mark.parametrize("api_key", REMOVED_APIS)
@pytest.mark.parametrize("kind", KINDS)
def test_definitions_agree_with_kio_at_its_first_version(api_key: int, kind: str) -> None:
    floor = schema.kio_versions(api_key)
    assert floor is not None
    load = load_request_schema if kind == "request" else load_response_schema
    ours = schema.removed_version_spec(api_key, floor.start, kind)
    theirs = schema.compile_struct(load(api_key, floor.start))
    assert _shape(ours) == _shape(theirs)


@pytest.mark.parametrize("api_key", REMOVED_APIS)
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=15, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_kio_bytes_at_its_first_version_read_the_same_through_our_definitions(api_key: int, kind: str, data: st.DataObject) -> None:
    floor = schema.kio_versions(api_key)
    assert floor is not None
    load = load_request_schema if kind == "request" else load_response_schema
    wire = kio_encode(data.draw(st.from_type(load(api_key, floor.start))))
    ours = schema.removed_version_spec(api_key, floor.start, kind)
    decoded = schema.decode_body(ours, wire)
    assert decoded == schema.decode_body(schema.compile_struct(load(api_key, floor.start)), wire)
    assert b"".join(bytes(p) for p in schema.encode_body(ours, decoded)) == wire


@pytest.mark.parametrize(("api_key", "version"), REMOVED)
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=25, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_old_versions_decode_and_encode_byte_exact_against_kafka_python(api_key: int, version: int, kind: str, data: st.DataObject) -> None:
    wire = data.draw(bodies(api_key, version, kind))
    spec = schema.request_spec(api_key, version) if kind == "request" else schema.response_spec(api_key, version)
    decoded = schema.decode_body(spec, wire)
    assert b"".join(bytes(p) for p in schema.encode_body(spec, decoded)) == wire
    # A byte short is never a whole message.
    if wire:
        with pytest.raises(Malformed):
            schema.decode_body(spec, wire[:-1])


@pytest.mark.parametrize(("api_key", "version"), REMOVED)
def test_answers_kfan_makes_up_for_old_versions_read_back_by_kafka_python(api_key: int, version: int) -> None:
    spec = schema.response_spec(api_key, version)
    blank = b"".join(bytes(p) for p in schema.encode_body(spec, spec.blank()))
    assert oracle_round_trip(api_key, version, "response", blank) == blank


def test_old_versions_are_not_flexible() -> None:
    for api_key, version in REMOVED:
        assert not schema.is_flexible(api_key, version)
        assert not schema.response_spec(api_key, version).flexible
