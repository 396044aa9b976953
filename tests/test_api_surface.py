"""Every API kfan advertises, at every version it knows, is handled — or not advertised.

For each routed API and random requests of every version (drawn by the
independent codec of tests/support/oracle.py: kio, or kafka-python's structs
for the versions Kafka 4 removed): planning succeeds; every sub-request is one
frame with one size prefix that the oracle decodes; random broker answers
merge into an answer the oracle decodes. The README's API table is checked against the code, so
the two cannot drift apart.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core import Context, LocalReply, NeedCoordinators, Response, advertised_versions, plan_request
from proxy.core.leader import layouts_of
from proxy.core.routes import ROUTES
from proxy.core.topology import Topology
from proxy.kafka import apis, schema
from proxy.kafka.frames import frame
from proxy.kafka.headers import parse_request_header, request_head, response_header
from tests.support import oracle
from tests.support.core_inputs import ALL_VERSIONS, BROKERS, IDENTITY, body_of, policy

ROOT = Path(__file__).resolve().parent.parent
ROUTED = sorted(k for k, route in ROUTES.items() if policy(route) != "local")


def _leaders_for(api_key: int, version: int, request: dict[str, Any], data: st.DataObject) -> Topology:
    if policy(ROUTES[api_key]) != "leader":
        return Topology(brokers=BROKERS)
    layout, _ = layouts_of(ROUTES[api_key], version)
    leaders: dict[str, dict[int, int]] = {}
    topic_ids = {}
    for key, p in layout.entries(request):
        name = str(key)
        if not isinstance(key, str):
            topic_ids[key] = name
        leaders.setdefault(name, {})[layout.partition_index(p)] = data.draw(st.sampled_from([1, 2, 3]))
    return Topology(brokers=BROKERS, leaders=leaders, topic_ids=topic_ids)


@pytest.mark.parametrize("api_key", ROUTED)
@settings(max_examples=12, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_every_known_version_plans_forwards_and_merges(api_key: int, data: st.DataObject) -> None:
    lo, hi = ALL_VERSIONS[api_key]
    version = data.draw(st.integers(lo, hi), label="version")
    body = data.draw(oracle.bodies(api_key, version, "request"), label="request")
    request = schema.decode_body(schema.request_spec(api_key, version), body)
    if api_key == apis.PRODUCE and request["acks"] == 0:
        return  # no answer to merge; covered in test_split_merge
    topology = _leaders_for(api_key, version, request, data)
    payload = oracle.payload(api_key, version, body)
    plan = plan_request(Context(IDENTITY, topology, ALL_VERSIONS, validate_records=False), payload)
    if isinstance(plan, NeedCoordinators):
        # A batch naming several groups or transactions: once kfan has looked their coordinators up.
        found = {
            c: data.draw(st.sampled_from([1, 2, 3, None]), label=f"coordinator of {c.key}") for c in sorted(plan.coordinators, key=str)
        }
        ctx = Context(IDENTITY, topology, ALL_VERSIONS, found.get, coordinators_looked_up=True, validate_records=False)
        plan = plan_request(ctx, payload)
    assert not isinstance(plan, NeedCoordinators)
    answers: dict[Any, Any] = {}
    for target, sub in ({} if isinstance(plan, LocalReply) else plan.subs).items():
        wire = frame([request_head(sub.api_key, sub.api_version), struct.pack(">i", 9), *sub.tail])
        assert struct.unpack_from(">i", wire)[0] == len(wire) - 4
        hdr = parse_request_header(wire[4:])
        assert (hdr.api_key, hdr.api_version, hdr.correlation_id) == (api_key, version, 9)
        oracle.read_back(api_key, version, "request", wire[4:], hdr.body_offset)
        answer = data.draw(oracle.bodies(api_key, version, "response"), label=f"answer from {target}")
        answers[target] = Response(response_header(api_key, version, 9) + answer)
    body_parts = body_of(plan, answers)
    oracle.read_back(api_key, version, "response", b"".join(bytes(p) for p in body_parts))


def _readme_table() -> dict[int, tuple[str, int, int, str]]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## API routing", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \| (\d+) \| (\d+)–(\d+) \| ([a-z ]+) \|$", section, re.M)
    return {int(key): (name, int(lo), int(hi), policy) for name, key, lo, hi, policy in rows}


def test_readme_api_table_matches_the_code() -> None:
    implemented = advertised_versions([], telemetry=True)
    expected = {k: (apis.api_name(k), lo, hi, policy(ROUTES[k])) for k, (lo, hi) in implemented.items()}
    assert _readme_table() == expected


def test_every_routed_api_is_implemented_at_some_version() -> None:
    assert set(advertised_versions([], logins=True, telemetry=True)) == set(ROUTES)
    # The login APIs only when kfan authenticates its clients, the telemetry APIs only when it has subscriptions
    # (it answers them itself then).
    assert set(advertised_versions([])) == {k for k, route in ROUTES.items() if route.login is None and not route.telemetry}
