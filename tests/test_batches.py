"""Batched coordinator APIs on the sans-IO core, with kio as the oracle.

OffsetFetch v8+, DescribeGroups, DeleteGroups, ConsumerGroupDescribe,
DescribeTransactions and AddPartitionsToTxn v4+ name several groups or
transactions, each owned by its own coordinator. For random requests of every
version and random coordinator maps: unknown coordinators are first asked for
all at once; then each sub-request carries exactly the entries its broker
coordinates, in the client's order, and decodes with kio; the merged answer
lists every requested entry exactly once, in the client's order, with the
answer of the broker that coordinates it, or NOT_COORDINATOR when that broker
failed or no coordinator was found.
Also the every-broker APIs whose answers are concatenated: ListGroups,
ListTransactions (DescribeLogDirs names its entries apart: tests/test_log_dirs.py).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema

from proxy.core import (
    ROUTES,
    Context,
    Coordinator,
    Failed,
    ForgetCoordinators,
    Forward,
    LocalReply,
    NeedCoordinators,
    Response,
    broadcast,
    plan_request,
)
from proxy.core.coordinator import batch_of
from proxy.core.topology import Topology
from proxy.kafka import errors, schema
from proxy.kafka.frames import frame
from proxy.kafka.headers import parse_request_header, request_head, response_header
from tests.support import oracle
from tests.support.core_inputs import ALL_VERSIONS, BROKERS, IDENTITY, effects_of
from tests.support.kio_oracle import kio_decode, kio_encode, request_payload

BATCHED = sorted(k for k, route in ROUTES.items() if route.batch is not None)
EVERY_BROKER = sorted(k for k, route in ROUTES.items() if route.broadcast_array is not None and route.merge is broadcast.merge)


def _batched_versions(api_key: int) -> list[int]:
    lo, hi = ALL_VERSIONS[api_key]
    batch = ROUTES[api_key].batch
    assert batch is not None
    return [v for v in range(lo, hi + 1) if schema.request_spec(api_key, v).has(batch.request_array)]


def _sub_request(api_key: int, version: int, sub: Any) -> dict[str, Any]:
    wire = frame([request_head(sub.api_key, sub.api_version), struct.pack(">i", 77), *sub.tail])
    (size,) = struct.unpack_from(">i", wire)
    assert size == len(wire) - 4, "exactly one size prefix, equal to the length"
    payload = wire[4:]
    hdr = parse_request_header(payload)
    entity = kio_decode(load_request_schema(api_key, version), payload, hdr.body_offset)
    return schema.decode_body(schema.request_spec(api_key, version), kio_encode(entity))


def _answer_entry(api_key: int, version: int, batch: Any, request_entry: Any, marker: int) -> dict[str, Any]:
    spec = schema.response_spec(api_key, version).field(batch.response_array).struct
    key = request_entry if batch.request_key is None else request_entry[batch.request_key]
    entry = {**spec.blank(), batch.response_key: key}
    if "error_code" in entry:
        entry["error_code"] = marker
    else:  # AddPartitionsToTxn v4+: per-partition results only
        entry["topic_results"] = [{"name": f"m{marker}", "results_by_partition": []}]
    return entry


def _marker_of(entry: dict[str, Any]) -> int:
    if "error_code" in entry:
        return entry["error_code"]
    results = entry["topic_results"]
    return int(results[0]["name"][1:]) if results and results[0]["name"].startswith("m") else -1


@pytest.mark.parametrize("api_key", BATCHED)
@settings(max_examples=30, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_batched_split_then_merge_keeps_every_entry_once_in_client_order(api_key: int, data: st.DataObject) -> None:
    versions = _batched_versions(api_key)
    assume(versions)
    version = data.draw(st.sampled_from(versions), label="version")
    route = ROUTES[api_key]
    batch = route.batch
    assert batch is not None
    entity = data.draw(st.from_type(load_request_schema(api_key, version)), label="request")
    # Random keys collide rarely; draw entries from a few keys so coordinators share and repeat.
    keys = data.draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=2, max_size=8), label="keys")
    assume(len(set(keys)) > 1)
    request = schema.decode_body(schema.request_spec(api_key, version), kio_encode(entity))
    if batch.request_key is None:
        request[batch.request_array] = keys
    else:
        template = request[batch.request_array][0] if request[batch.request_array] else None
        assume(template is not None)
        request[batch.request_array] = [{**template, batch.request_key: k} for k in keys]
    payload = request_payload(entity)
    hdr = parse_request_header(payload)
    payload = payload[: hdr.body_offset] + b"".join(bytes(x) for x in schema.encode_body(schema.request_spec(api_key, version), request))
    assert batch_of(route, request) is batch

    first = plan_request(Context(IDENTITY, Topology(brokers=BROKERS), ALL_VERSIONS), payload)
    assert isinstance(first, NeedCoordinators), "nothing sent before the lookup"
    assert first.coordinators == {Coordinator(batch.key_type, k) for k in keys}, "looked up all at once"
    # What the lookup found: a coordinating broker per key, or nothing (None).
    found = {k: data.draw(st.sampled_from([*sorted(BROKERS), None]), label=f"coordinator of {k}") for k in sorted(set(keys))}
    coordinator_of = {Coordinator(batch.key_type, k): b for k, b in found.items() if b is not None}
    ctx = Context(IDENTITY, Topology(brokers=BROKERS), ALL_VERSIONS, coordinator_of.get, coordinators_looked_up=True)
    plan = plan_request(ctx, payload)
    assert isinstance(plan, Forward | LocalReply)
    subs = plan.subs if isinstance(plan, Forward) else {}
    assert set(subs) == {b for b in found.values() if b is not None}
    failed_brokers = data.draw(st.sets(st.sampled_from(sorted(BROKERS))), label="failed brokers")
    failed = {k for k, b in found.items() if b is None or b in failed_brokers}
    answers: dict[Any, Any] = {}
    # Distinct, valid error codes (kio checks them) that say nothing about coordinators.
    marker = dict(zip(sorted(set(keys)), (69, 25, 22, 24), strict=False))
    for target, sub in subs.items():
        sub_request = _sub_request(api_key, version, sub)
        mine = sub_request[batch.request_array]
        assert [e if batch.request_key is None else e[batch.request_key] for e in mine] == [k for k in keys if found[k] == target]
        for name in request:
            if name != batch.request_array:
                assert sub_request.get(name) == request[name], name
        if target in failed_brokers:
            answers[target] = Failed(errors.NETWORK_EXCEPTION)
            continue
        spec = schema.response_spec(api_key, version)
        body = spec.blank()
        body[batch.response_array] = [
            _answer_entry(api_key, version, batch, e, marker[e if batch.request_key is None else e[batch.request_key]]) for e in mine
        ]
        answers[target] = Response(response_header(api_key, version, 77) + b"".join(bytes(x) for x in schema.encode_body(spec, body)))
    if not subs:
        assert isinstance(plan, LocalReply), "nothing to send: answered at once"

    body_parts = plan.body if isinstance(plan, LocalReply) else (reply := plan.merge(plan, answers)).body
    out = kio_decode(load_response_schema(api_key, version), b"".join(bytes(p) for p in body_parts))
    response = schema.decode_body(schema.response_spec(api_key, version), kio_encode(out))
    entries = response[batch.response_array]
    assert [e[batch.response_key] for e in entries] == keys
    for key, entry in zip(keys, entries, strict=True):
        if key in failed:
            codes = (
                [entry["error_code"]]
                if "error_code" in entry
                else [p["partition_error_code"] for t in entry["topic_results"] for p in t["results_by_partition"]]
            )
            assert all(c == errors.NOT_COORDINATOR for c in codes)
        else:
            assert _marker_of(entry) == marker[key]
    if isinstance(plan, Forward):
        moved = {Coordinator(batch.key_type, k) for k in keys if found[k] in failed_brokers}
        assert effects_of(reply, ForgetCoordinators) == ([ForgetCoordinators(frozenset(moved))] if moved else [])


@pytest.mark.parametrize("api_key", EVERY_BROKER)
@settings(max_examples=30, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_every_broker_answers_are_concatenated_in_broker_order(api_key: int, data: st.DataObject) -> None:
    lo, hi = ALL_VERSIONS[api_key]
    version = data.draw(st.integers(lo, hi), label="version")
    payload = oracle.payload(api_key, version, data.draw(oracle.bodies(api_key, version, "request"), label="request"))
    plan = plan_request(Context(IDENTITY, Topology(brokers=BROKERS), ALL_VERSIONS), payload)
    assert isinstance(plan, Forward)
    assert sorted(plan.subs) == sorted(BROKERS)
    for sub in plan.subs.values():
        assert b"".join(bytes(x) for x in sub.tail)[4:] == payload[8:][4:], "forwarded whole"
    array = ROUTES[api_key].broadcast_array
    assert array is not None
    failed = data.draw(st.sets(st.sampled_from(sorted(BROKERS))), label="failed brokers")
    spec = schema.response_spec(api_key, version)
    has_error = spec.has("error_code")
    assume(has_error or not failed)
    answers: dict[Any, Any] = {}
    expected: list[Any] = []
    for broker in sorted(BROKERS):
        decoded = schema.decode_body(spec, data.draw(oracle.bodies(api_key, version, "response"), label=f"answer {broker}"))
        if has_error:
            decoded["error_code"] = 0
        if broker in failed:
            answers[broker] = Failed(errors.NETWORK_EXCEPTION)
            continue
        expected.extend(decoded[array])
        answers[broker] = Response(response_header(api_key, version, 5) + b"".join(bytes(x) for x in schema.encode_body(spec, decoded)))
    out = schema.decode_body(
        spec, oracle.read_back(api_key, version, "response", b"".join(bytes(p) for p in plan.merge(plan, answers).body))
    )
    assert out[array] == expected
    if has_error:
        assert out["error_code"] == (errors.COORDINATOR_NOT_AVAILABLE if failed else 0)
